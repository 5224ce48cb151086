//! NeMo's buffered streaming of offline models (`BufferedRNNTPipeline` and
//! `BufferedCTCPipeline` of `nemo.collections.asr.inference`) as a [`LiveTranscriber`].
//!
//! An offline (full-context) model has no encoder caches, so every chunk of new audio is encoded
//! again inside a buffer of left context + chunk + right context, normalised and encoded on its
//! own. Audio before the stream is stood for by the encoding of an all-zero buffer (computed
//! once per stream), placed in front of the audio's own encoding. The transducer decodes the
//! chunk's frames from the state the previous chunk left (LSTM state, last label, a TDT
//! duration's overshoot) and the right context from a copy of that state that is then thrown
//! away; CTC decodes each buffer from scratch, one frame earlier. A silence-based endpointer
//! cuts the committed tokens into utterances. Every quirk of NeMo's pipelines that changes a
//! token or a time is copied, so that the tokens and their times are NeMo's, step by step.
//!
//! CTC's last request decodes to the buffer's end, over encoder frames past the audio that
//! NeMo's masked encoder computes from the padding (its subsampling output masked to zero, the
//! padding's attention rows and keys masked, its depthwise-conv inputs zeroed): their argmax
//! adds tokens to the last final, as in NeMo, and they are computed here the same way.
//!
//! Where the output is not NeMo's, on purpose:
//! - Times: none lies past the end of the audio heard. NeMo's pipelines stamp the padding's
//!   tokens (and, after `merge_timesteps` shifts a list that starts before the stream, any
//!   token) up to seconds after it; the text is NeMo's, the times are clamped to the audio.
//! - Punctuation (models whose vocabulary has it, e.g. parakeet-tdt-0.6b-v2 and v3): a mark's
//!   time moved onto the piece before it, texts without a space before a mark (finals with a
//!   run of marks cut to its last), segment and word times around marks, a lone `.`, `,` or
//!   `?` joined to the word before: as NeMo 3.0.0's pipeline, tested against its run of a tiny
//!   model with a punctuated vocabulary. The marks are NeMo 3.0.0's set (punctuation characters
//!   of pieces other than tags such as `[laughter]` or `<en>`), so a lone `[` or `]` piece
//!   counts; later NeMo tokenizers for vocabularies with event tags leave them out.
//! - Boosting and confidence follow NeMo's per-stream design (the tree state rides with the
//!   decoder state), checked against the offline decode of the same frames: NeMo 3.0.0's
//!   pipeline, which made the references, fuses no per-stream phrases.

mod words;

use super::{LiveTranscriber, StreamEvent, Utterance};
use crate::audio::mel::{SlidingMel, log_mel};
use crate::bail;
use crate::decoder::boosting::BoostingTree;
use crate::decoder::confidence::ConfidenceConfig;
use crate::decoder::ctc::argmax;
use crate::decoder::hypothesis::Hypothesis;
use crate::encoder::{AttentionChoice, EncoderState, FeatureImage, Outputs};
use crate::error::Result;
use crate::hparams::FrameGeometry;
use crate::session::{DecoderChoice, Session};
use crate::tokenizer::{Token, Tokenizer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use words::Grouping;

/// NeMo's default chunk, left and right context (seconds; `buffered_rnnt.yaml`).
pub const DEFAULT_CHUNK_SECS: f64 = 4.8;
pub const DEFAULT_LEFT_SECS: f64 = 1.6;
pub const DEFAULT_RIGHT_SECS: f64 = 1.6;

/// NeMo's endpointing defaults: silence that ends an utterance (ms), and the frames at the end
/// of the decoded window the endpointer ignores.
const STOP_HISTORY_EOU_MS: f64 = 800.0;
const RESIDUE_TOKENS_AT_END: usize = 2;
/// `detect_overlap`: tokens compared, and how close in frames a repeat must be to be dropped.
const OVERLAP_SEARCH: usize = 3;
const CLOSE_IN_TIME: f64 = 2.0;
/// The sentencepiece word mark.
const WORD_MARK: char = '\u{2581}';

/// How a [`BufferedStream`] runs.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferedConfig {
    /// New audio per step (seconds).
    pub chunk_secs: f64,
    /// Audio before the chunk encoded with it (seconds).
    pub left_secs: f64,
    /// Audio after the chunk encoded with it (seconds): the latency it adds.
    pub right_secs: f64,
    /// The head that decodes: the transducer (`Auto` / `Tdt`) or a hybrid's CTC.
    pub decoder: DecoderChoice,
    /// Keep a [`StepRecord`] of every step (tests and diagnostics).
    pub record_steps: bool,
}

impl Default for BufferedConfig {
    fn default() -> Self {
        BufferedConfig {
            chunk_secs: DEFAULT_CHUNK_SECS,
            left_secs: DEFAULT_LEFT_SECS,
            right_secs: DEFAULT_RIGHT_SECS,
            decoder: DecoderChoice::Auto,
            record_steps: false,
        }
    }
}

/// The sizes NeMo derives from the seconds, computed in the same floating point (so a chunk of
/// 1.2 s with right context 0.8 s and left 1.6 s gives a 57599-sample buffer, as in NeMo).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BufferSizes {
    /// New samples per step (`S_f`) and samples per buffer (`S_b`).
    pub chunk_samples: usize,
    pub buffer_samples: usize,
    /// Feature frames of a buffer (`expected_feature_buffer_len`).
    pub feature_frames: usize,
    /// Encoder frames of a buffer (`T`).
    pub buffer_frames: usize,
    /// Encoder frames of the chunk, left and right context (`C`, `L`, `R`).
    pub chunk_frames: usize,
    pub left_frames: usize,
    pub right_frames: usize,
    /// `C` before rounding (the per-step offsets accumulate it).
    pub chunk_frames_exact: f64,
    /// CTC: frames from the window's start to the buffer's end (`mid_delay`) and the offset
    /// of a buffer frame from the stream's (`initial_delay`, not always whole).
    pub mid_delay: usize,
    pub initial_delay: f64,
    /// Silence that ends an utterance, in encoder frames.
    pub stop_history_frames: usize,
    /// Feature frames per encoder frame, and samples per feature frame.
    pub subsampling: usize,
    pub hop: usize,
    /// Seconds per encoder frame.
    pub frame_seconds: f64,
}

impl BufferSizes {
    /// NeMo's sizes for `config` on a model of `geometry`; a size that is not a whole number of
    /// encoder frames, zero or negative is refused with what NeMo would make of it.
    pub fn new(config: &BufferedConfig, geometry: FrameGeometry) -> Result<BufferSizes> {
        let sr = geometry.sample_rate as f64;
        let window_stride = geometry.hop_length as f64 / sr;
        let stride = window_stride * geometry.subsampling_factor as f64;
        // NeMo counts frames as ceil(secs / stride) in floating point; a size is accepted
        // when that count is whole, which for some multiples of the stride it is not.
        let whole = |secs: f64| {
            let exact = secs / stride;
            exact.ceil() - exact <= 1e-6
        };
        let check = |name: &str, secs: f64, zero_ok: bool| -> Result<usize> {
            if !secs.is_finite() || secs < 0.0 || (secs == 0.0 && !zero_ok) {
                bail!(
                    Options,
                    "{name} {secs} s: must be {} seconds",
                    if zero_ok { "0 or more" } else { "more than 0" }
                );
            }
            if secs > MAX_SIZE_SECS {
                bail!(Options, "{name} {secs} s: at most {MAX_SIZE_SECS} s");
            }
            let exact = secs / stride;
            let frames = exact.ceil();
            if !whole(secs) {
                let near: Vec<String> = [exact.floor() - 1.0, exact.floor(), frames, frames + 1.0]
                    .iter()
                    .map(|f| round9(f * stride))
                    .filter(|&c| c > 0.0 && c != secs && whole(c))
                    .map(|c| format!("{c}"))
                    .collect();
                bail!(
                    Options,
                    "{name} {secs} s is not a whole number of {:.0} ms encoder frames as NeMo \
                     computes it ({secs} / {} = {exact} in floating point): NeMo would round it \
                     up to {frames} frames ({} s); sizes near it that NeMo takes whole: {} s",
                    stride * 1000.0,
                    round9(stride),
                    round9(frames * stride),
                    near.join(", ")
                );
            }
            Ok(frames as usize)
        };
        let chunk_frames = check("chunk (--chunk-secs)", config.chunk_secs, false)?;
        let left_frames = check("left context (--left-secs)", config.left_secs, true)?;
        let right_frames = check("right context (--right-secs)", config.right_secs, true)?;
        let buffer_secs = config.chunk_secs + config.left_secs + config.right_secs;
        let feature_frames = (buffer_secs / window_stride) as usize;
        let buffer_frames = geometry.encoded_len(feature_frames);
        if left_frames + chunk_frames > buffer_frames {
            bail!(
                Options,
                "a buffer of {buffer_secs} s holds {buffer_frames} encoder frames, fewer than \
                 the left context and chunk ({} frames)",
                left_frames + chunk_frames
            );
        }
        Ok(BufferSizes {
            chunk_samples: (config.chunk_secs * sr) as usize,
            buffer_samples: (buffer_secs * sr) as usize,
            feature_frames,
            buffer_frames,
            chunk_frames,
            left_frames,
            right_frames,
            chunk_frames_exact: config.chunk_secs / stride,
            mid_delay: ((config.chunk_secs + config.right_secs) / stride).ceil() as usize,
            initial_delay: (config.left_secs + config.right_secs) / stride,
            stop_history_frames: (STOP_HISTORY_EOU_MS / (stride * 1000.0)).ceil() as usize,
            subsampling: geometry.subsampling_factor,
            hop: geometry.hop_length,
            frame_seconds: stride,
        })
    }
}

/// The longest chunk or context accepted (the sizes stay far from overflowing a count).
const MAX_SIZE_SECS: f64 = 3600.0;

/// Where a step's buffer lies: the samples it holds are the stream's `start..start + len`, and
/// the ring's first `left_padding` samples stand for the time before the stream.
#[derive(Clone, Copy, Debug, PartialEq)]
struct BufferWindow {
    left_padding: usize,
    start: usize,
    len: usize,
}

impl BufferWindow {
    /// The buffer of step `k` whose chunk holds `valid` samples of audio (the last step's
    /// fewer, the rest padding that the buffer leaves out).
    fn of_step(s: &BufferSizes, k: usize, valid: usize) -> BufferWindow {
        let end = (k + 1) * s.chunk_samples;
        let left_padding = s.buffer_samples.saturating_sub(end);
        BufferWindow {
            left_padding,
            start: end.saturating_sub(s.buffer_samples),
            len: s.buffer_samples - left_padding - (s.chunk_samples - valid),
        }
    }
}

fn round9(x: f64) -> f64 {
    (x * 1e9).round() / 1e9
}

/// What one step did, when [`BufferedConfig::record_steps`] is set. Frames are buffer-local.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRecord {
    pub is_last: bool,
    /// Samples of the buffer that are audio (after the pre-stream zeros are rolled away).
    pub valid_samples: usize,
    /// Encoder frames holding the buffer (`encoded_len` after the roll).
    pub encoded_len: usize,
    /// Transducer: the chunk pass's and the right-context pass's tokens, `(id, frame)` with
    /// frames from the chunk's first frame (the right context's continue after the chunk).
    pub chunk_tokens: Vec<(usize, usize)>,
    pub right_tokens: Vec<(usize, usize)>,
    /// The chunk pass's token confidences (when asked for).
    pub chunk_confidences: Vec<f64>,
    /// CTC: the argmax label of every buffer frame held.
    pub labels: Vec<usize>,
    /// End of utterance, and the window `[start, end)` of committed frames.
    pub eou: bool,
    pub start_end: (i64, i64),
    /// Tokens that were the same as the last stored ones and close in time, dropped.
    pub overlap_skipped: usize,
    /// Tokens committed, their stream timestamps after NeMo's rewriting and their
    /// confidences (when asked for).
    pub committed: Vec<usize>,
    pub committed_timesteps: Vec<f64>,
    pub committed_confidences: Vec<f64>,
    /// The head's rows of the buffer after the roll, `[frames][width]` (transducer:
    /// `joint.enc` of the encoder output, `encoded_len` frames; CTC: the logits, the last
    /// buffer's to its end).
    pub rows: Vec<f32>,
    /// The finished utterance's text, when the step ended one, and the partial text, when
    /// the step reported one.
    pub final_text: Option<String>,
    pub partial_text: Option<String>,
    /// Tokens the stream keeps after the step (the utterance's unreported ones and the few
    /// the duplicate-token check compares).
    pub kept_tokens: usize,
}

/// Where a step's time went (for benchmarks): the buffer's features, its encoder pass, the
/// decoding.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTimes {
    pub features: Duration,
    pub encoder: Duration,
    pub decoder: Duration,
    /// Tokens the step's decoding produced (transducer: chunk and right-context passes; CTC:
    /// the whole buffer), the decoder's work.
    pub tokens: usize,
}

/// The decoding state NeMo keeps per stream (`StreamingState` and the decoder's).
#[derive(Clone, Debug, Default)]
struct Decoding {
    /// Transducer: the hypothesis after the last chunk pass.
    hyp: Option<Hypothesis>,
    /// The committed window of the previous step (`decoder_start_idx`, `decoder_end_idx`).
    start: i64,
    end: i64,
    /// Tokens, timestamps and token confidences (when asked for) since the last end of
    /// utterance.
    tokens: Vec<usize>,
    timesteps: Vec<f64>,
    confidences: Vec<f64>,
    /// Transducer with boosting: the phrase tree's state after the last chunk pass.
    boost_state: u32,
    eou_before: bool,
    /// CTC: the label at the end of the last window and its stream frame.
    last_token: Option<(usize, f64)>,
    /// Added to a committed local frame to make it a stream frame.
    global_offset: f64,
    /// Transducer: frames decoded by earlier chunk passes.
    timestamp_offset: f64,
}

/// The head's per-stream constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Head {
    Transducer,
    Ctc,
}

/// Buffered streaming transcription over a [`Session`] of an offline model.
pub struct BufferedStream {
    session: Session,
    config: BufferedConfig,
    sizes: BufferSizes,
    head: Head,
    outputs: Outputs,
    /// Values per encoder frame of the head's rows (`joint.enc` width or `V + 1`).
    width: usize,
    n_mels: usize,
    blank: usize,
    /// The head's rows of the all-zero buffer, `[T][width]` (shared by every stream of the
    /// model with these sizes).
    zero_rows: Arc<Vec<f32>>,
    /// Which pieces start a word or are punctuation, for words and times.
    grouping: Grouping,
    /// The buffers' log-mel frames, the overlap's taken from the previous buffer.
    mel: SlidingMel,
    /// The audio buffer (`S_b` samples, the newest last).
    ring: Vec<f32>,
    /// Samples received and not yet a whole chunk.
    pending: Vec<f32>,
    /// Samples accepted since the start of the stream, and how many of them the steps so far
    /// have decoded (through the last step's chunk): no time is reported past those, so that
    /// the times do not depend on how the audio was cut into pieces.
    received: usize,
    decoded: usize,
    /// Steps run since the start of the stream.
    steps: usize,
    decoding: Decoding,
    /// Tokens of `decoding.tokens` already reported in a cut-off final.
    reported: usize,
    /// An utterance this long without an end of utterance is cut at a word start.
    max_utterance_seconds: Option<f64>,
    /// Phrases the transducer prefers (the stream's own biasing), and the confidence to
    /// measure of each token.
    boost: Option<Arc<BoostingTree>>,
    confidence: Option<ConfidenceConfig>,
    records: Vec<StepRecord>,
    times: StepTimes,
}

/// The zero buffer's rows by model file, head and buffer size: computed once per process for
/// the sizes in use (a server whose clients ask for ever new sizes keeps the latest few).
type ZeroKey = (std::path::PathBuf, bool, usize, usize);
static ZERO_ROWS: Mutex<RecentRows> = Mutex::new(RecentRows::new());

/// How many zero buffers [`ZERO_ROWS`] keeps (a 0.6b transducer's is 256 KB at NeMo's sizes).
const ZERO_ROWS_KEPT: usize = 8;

/// The most recently used rows by key, at most [`ZERO_ROWS_KEPT`] of them.
struct RecentRows {
    /// Oldest use first.
    entries: Vec<(ZeroKey, Arc<Vec<f32>>)>,
}

impl RecentRows {
    const fn new() -> RecentRows {
        RecentRows {
            entries: Vec::new(),
        }
    }

    /// The rows of `key`, now the most recently used.
    fn get(&mut self, key: &ZeroKey) -> Option<Arc<Vec<f32>>> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let entry = self.entries.remove(i);
        let rows = entry.1.clone();
        self.entries.push(entry);
        Some(rows)
    }

    /// Keeps `rows` for `key`, forgetting the least recently used past the limit.
    fn insert(&mut self, key: ZeroKey, rows: Arc<Vec<f32>>) {
        self.entries.retain(|(k, _)| *k != key);
        self.entries.push((key, rows));
        let over = self.entries.len().saturating_sub(ZERO_ROWS_KEPT);
        self.entries.drain(..over);
    }
}

/// The models buffered streaming serves, for errors.
pub const OFFLINE_MODELS: &str = "offline (full-context) FastConformer CTC, RNN-T, TDT and \
     hybrid models, e.g. nvidia/parakeet-tdt-0.6b-v2, nvidia/parakeet-ctc-1.1b";

impl BufferedStream {
    /// A stream over `session`'s model with `config`. Fails with a clear error for sizes NeMo
    /// would round or cannot use, or a head the model lacks.
    pub fn new(session: Session, config: BufferedConfig) -> Result<BufferedStream> {
        let model = session.model().clone();
        let hp = model.hparams();
        let sizes = BufferSizes::new(&config, hp.geometry())?;
        if session.attention_for(sizes.feature_frames, AttentionChoice::Auto)
            != hp.encoder.attention
        {
            bail!(
                Options,
                "a buffer of {} s (--chunk-secs + --left-secs + --right-secs) is longer than \
                 this model's {} attention is run for ({} s); use a shorter buffer",
                config.chunk_secs + config.left_secs + config.right_secs,
                hp.encoder.attention,
                crate::encoder::AUTO_FULL_MAX_SECONDS
            );
        }
        let outputs = session.head(config.decoder)?;
        let head = match outputs {
            Outputs::CtcLogits => Head::Ctc,
            _ => Head::Transducer,
        };
        let grouping = Grouping::new(model.tokenizer(), sizes.frame_seconds);
        let mel = SlidingMel::new(model.window(), model.filterbank(), session.mel_config());
        let mut stream = BufferedStream {
            n_mels: hp.encoder.feat_in,
            blank: hp.blank_id(),
            session,
            config,
            sizes,
            head,
            outputs,
            width: 0,
            zero_rows: Arc::new(Vec::new()),
            grouping,
            mel,
            ring: Vec::new(),
            pending: Vec::new(),
            received: 0,
            decoded: 0,
            steps: 0,
            decoding: Decoding::default(),
            reported: 0,
            max_utterance_seconds: Some(super::DEFAULT_MAX_UTTERANCE_SECONDS),
            boost: None,
            confidence: None,
            records: Vec::new(),
            times: StepTimes::default(),
        };
        // The all-zero buffer, encoded once per model and size: it stands for the time before
        // the stream.
        let key = (
            model.path().to_path_buf(),
            head == Head::Ctc,
            sizes.buffer_samples,
            sizes.feature_frames,
        );
        let known = ZERO_ROWS.lock().ok().and_then(|mut cache| cache.get(&key));
        let zero_rows = match known {
            Some(rows) => rows,
            None => {
                let zeros = vec![0.0; sizes.buffer_samples];
                let rows = Arc::new(stream.encode_buffer(&zeros, None, None)?.0);
                if let Ok(mut cache) = ZERO_ROWS.lock() {
                    cache.insert(key, rows.clone());
                }
                rows
            }
        };
        stream.width = zero_rows.len() / sizes.buffer_frames;
        stream.zero_rows = zero_rows;
        stream.reset();
        Ok(stream)
    }

    /// The sizes in use.
    pub fn sizes(&self) -> &BufferSizes {
        &self.sizes
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Whether the transducer (true) or CTC decodes.
    pub fn is_transducer(&self) -> bool {
        self.head == Head::Transducer
    }

    /// Where the last step's time went.
    pub fn last_step_times(&self) -> StepTimes {
        self.times
    }

    /// The steps recorded since the last call ([`BufferedConfig::record_steps`]).
    pub fn take_records(&mut self) -> Vec<StepRecord> {
        std::mem::take(&mut self.records)
    }

    /// The head's rows `[frames][width]` of the audio `samples` (a buffer's audio, from its
    /// first sample, which is the stream's sample `start`; `None`: not the stream's), and
    /// how many of them are the audio's: NeMo's mel of the buffer, normalised per feature
    /// over its valid frames in float32 as torch sums, then the encoder over those frames.
    /// Frames after the valid ones are masked in NeMo's encoder and never reach a frame
    /// before them, so they are computed only when `padded_to` asks for that many frames in
    /// all (CTC's last buffer, whose window runs over them).
    fn encode_buffer(
        &mut self,
        samples: &[f32],
        start: Option<usize>,
        padded_to: Option<usize>,
    ) -> Result<(Vec<f32>, usize)> {
        let s = self.sizes;
        let t0 = Instant::now();
        let whole;
        let features = match start {
            // The stream's buffers overlap: the previous buffer's frames are reused.
            Some(start) => self.mel.window(samples, start),
            None => {
                let mut mel = self.session.mel_config().clone();
                mel.normalize_per_feature = false;
                let model = self.session.model();
                whole = log_mel(samples, model.window(), model.filterbank(), &mel);
                &whole
            }
        };
        let valid = features.n_frames.min(s.feature_frames);
        if valid == 0 {
            return Ok((Vec::new(), 0));
        }
        let m = self.n_mels;
        let mut data = vec![0f32; valid * m];
        let mut band = vec![0f32; s.feature_frames];
        for mel_bin in 0..m {
            band.fill(0.0);
            band[..valid].copy_from_slice(&features.band(mel_bin)[..valid]);
            normalize_like_torch(&mut band, valid);
            for (t, &v) in band[..valid].iter().enumerate() {
                data[t * m + mel_bin] = v;
            }
        }
        let chunk = FeatureImage::from_frames(data, m)?;
        let t1 = Instant::now();
        let attention = self.session.attention_for(valid, AttentionChoice::Auto);
        let mut state = match padded_to {
            Some(frames) => EncoderState::padded(frames),
            None => EncoderState::new(),
        };
        let audio_frames = self.session.model().hparams().geometry().encoded_len(valid);
        let enc = self
            .session
            .encode_chunk(&mut state, chunk, attention, self.outputs)?;
        self.times.features = t1 - t0;
        self.times.encoder = t1.elapsed();
        let rows = match self.head {
            Head::Transducer => enc.joint_enc,
            Head::Ctc => enc.ctc_logits,
        };
        let Some(rows) = rows else {
            bail!(
                Internal,
                "internal: the encoder pass lacks the decoder's head"
            );
        };
        Ok((rows, audio_frames))
    }

    /// Runs request `self.steps` over `chunk` (exactly `S_f` samples, of which `valid` are
    /// audio; the rest pads the last request).
    fn step(&mut self, chunk: &[f32], valid: usize, is_last: bool) -> Result<Vec<StreamEvent>> {
        let s = self.sizes;
        let k = self.steps;
        let is_first = k == 0;
        // The audio buffer moves on by a chunk; zeros stand for the time before the stream.
        self.ring.drain(..s.chunk_samples.min(s.buffer_samples));
        self.ring.extend_from_slice(chunk);
        let keep = self.ring.len() - s.buffer_samples;
        self.ring.drain(..keep);
        let window = BufferWindow::of_step(&s, k, valid);
        self.decoded = k * s.chunk_samples + valid;
        let (left_padding, audio) = (window.left_padding, window.len);
        let buffer: Vec<f32> = self.ring[left_padding..left_padding + audio].to_vec();
        let w = self.width;
        let lpad = ((left_padding / s.hop) / s.subsampling).min(self.zero_rows.len() / w);
        // CTC decodes the last buffer to its end, over the frames past the audio that NeMo's
        // masked encoder computes from the zero padding.
        let padded_to = (is_last && self.head == Head::Ctc).then(|| s.buffer_frames - lpad);
        let (own, audio_frames) = self.encode_buffer(&buffer, Some(window.start), padded_to)?;
        // NeMo's roll: the zero buffer's frames for the time before the stream, then the
        // audio's own encoding.
        let mut rows = Vec::with_capacity(lpad * w + own.len());
        rows.extend_from_slice(&self.zero_rows[..lpad * w]);
        rows.extend_from_slice(&own);
        let encoded_len = lpad + audio_frames;
        let t = Instant::now();
        let mut record = StepRecord {
            is_last,
            valid_samples: audio,
            encoded_len,
            ..StepRecord::default()
        };
        if self.config.record_steps {
            record.rows = rows.clone();
        }
        let (committed, eou) = match self.head {
            Head::Transducer => self.decode_transducer(&rows, is_first, is_last, &mut record)?,
            Head::Ctc => self.decode_ctc(&rows, is_first, is_last, &mut record),
        };
        self.steps += 1;
        self.times.decoder = t.elapsed();
        let mut events = Vec::new();
        if eou {
            if let Some(u) = self.utterance(true) {
                record.final_text = Some(u.text.clone());
                events.push(StreamEvent::Final(u));
            }
            self.decoding.tokens.clear();
            self.decoding.timesteps.clear();
            self.decoding.confidences.clear();
            self.reported = 0;
        } else if committed > 0 {
            if let Some(done) = self.cut_long_utterance() {
                events.push(StreamEvent::Final(done));
                self.forget_reported();
            }
            if let Some(u) = self.utterance(false) {
                record.partial_text = Some(u.text.clone());
                events.push(StreamEvent::Partial(u));
            }
        }
        if self.config.record_steps {
            record.kept_tokens = self.decoding.tokens.len();
            self.records.push(record);
        }
        Ok(events)
    }

    /// The transducer's step (`stateful_transcribe_step`, `decode_step`): the chunk pass from
    /// the saved state, the right-context pass from a copy, the clip and the endpointer.
    /// Returns the tokens committed and whether the utterance ended.
    fn decode_transducer(
        &mut self,
        rows: &[f32],
        is_first: bool,
        is_last: bool,
        record: &mut StepRecord,
    ) -> Result<(usize, bool)> {
        let s = self.sizes;
        let w = self.width;
        let encoded_len = rows.len() / w;
        let decodable = encoded_len.saturating_sub(s.left_frames);
        let n_c = if is_last {
            decodable
        } else {
            decodable.min(s.chunk_frames)
        };
        let from = s.left_frames.min(encoded_len);
        let chunk = &rows[from * w..(from + n_c) * w];
        let tree = self.boost.clone();
        let mut boost_state = self.decoding.boost_state;
        let (mut hyp, scores) = self.session.continue_greedy_with(
            self.decoding.hyp.take(),
            chunk,
            n_c,
            tree.as_deref().map(|t| (t, &mut boost_state)),
            self.confidence,
        )?;
        let chunk_tokens = hyp.take_tokens();
        let mut local: Vec<(usize, i64, f64)> = chunk_tokens
            .iter()
            .zip(scores.iter().chain(std::iter::repeat(&f64::NAN)))
            .map(|(t, &c)| (t.id, t.frame as i64, c))
            .collect();
        record.chunk_tokens = chunk_tokens.iter().map(|t| (t.id, t.frame)).collect();
        record.chunk_confidences = scores;
        self.times.tokens = local.len();
        if s.right_frames > 0 {
            let right = &rows[(from + n_c) * w..(from + decodable) * w];
            // The right context decodes from copies of the states, then they are dropped.
            let mut right_state = boost_state;
            let (copy, scores) = self.session.continue_greedy_with(
                Some(hyp.clone()),
                right,
                decodable - n_c,
                tree.as_deref().map(|t| (t, &mut right_state)),
                self.confidence,
            )?;
            let right_tokens = copy.into_tokens();
            local.extend(
                right_tokens
                    .iter()
                    .zip(scores.iter().chain(std::iter::repeat(&f64::NAN)))
                    .map(|(t, &c)| (t.id, (n_c + t.frame) as i64, c)),
            );
            record.right_tokens = right_tokens.iter().map(|t| (t.id, n_c + t.frame)).collect();
            self.times.tokens = local.len();
        }
        self.decoding.hyp = Some(hyp);
        self.decoding.boost_state = boost_state;
        // Punctuation and language tags take the time of the word before them; one that
        // opens the step takes the stream's frame 0, before any window but the first step's.
        let ids: Vec<usize> = local.iter().map(|l| l.0).collect();
        let mut times: Vec<i64> = local.iter().map(|l| l.1).collect();
        let stream_start = -(self.decoding.timestamp_offset.ceil() as i64);
        self.grouping
            .move_mark_times(&ids, &mut times, stream_start);
        for (l, t) in local.iter_mut().zip(times) {
            l.1 = t;
        }
        let c = s.chunk_frames as i64;
        let alignment = (s.right_frames + s.chunk_frames) as i64;
        let d = &mut self.decoding;
        let (mut start, mut end) = (d.start, d.end);
        if end > 0 {
            end -= c;
            start = end;
        }
        if is_first {
            (start, end) = (0, 0);
        } else if end <= 0 {
            (start, end) = (0, c);
        }
        let committed: Vec<(usize, f64, f64)>;
        let mut eou = is_last;
        if local.is_empty() {
            // Nothing decoded in chunk and right context: the utterance ends.
            eou = true;
            committed = Vec::new();
        } else {
            let mut eou_at = alignment;
            if !eou {
                let trimmed: Vec<i64> = local
                    .iter()
                    .filter(|(_, t, _)| *t >= start)
                    .map(|&(_, t, _)| t)
                    .collect();
                (eou, eou_at) = eou_from_timestamps(
                    &trimmed,
                    alignment,
                    s.stop_history_frames as i64,
                    RESIDUE_TOKENS_AT_END as i64,
                );
            }
            if eou && eou_at > end {
                end = eou_at.min(alignment);
            }
            if (0..c).contains(&end) {
                end = c;
                eou = false;
            }
            committed = local
                .iter()
                .filter(|(_, t, _)| (start..end).contains(t))
                .map(|&(id, t, c)| (id, t as f64 + d.timestamp_offset, c))
                .collect();
        }
        d.start = start;
        d.end = end;
        record.eou = eou;
        record.start_end = (start, end);
        let n = update_state(d, committed, eou, record);
        d.timestamp_offset += s.chunk_frames_exact;
        Ok((n, eou))
    }

    /// The CTC step (`BufferedCTCPipeline`): the whole buffer decoded from a blank, the
    /// window one frame before the transducer's, the endpointer on the frame labels.
    fn decode_ctc(
        &mut self,
        rows: &[f32],
        is_first: bool,
        is_last: bool,
        record: &mut StepRecord,
    ) -> (usize, bool) {
        let s = self.sizes;
        let w = self.width;
        let t_frames = s.buffer_frames as i64;
        let labels: Vec<usize> = rows.chunks_exact(w).map(argmax).collect();
        let mut tokens: Vec<(usize, i64)> = Vec::new();
        let mut previous = self.blank;
        for (i, &p) in labels.iter().enumerate() {
            if p != previous && p != self.blank {
                tokens.push((p, i as i64));
            }
            previous = p;
        }
        self.times.tokens = tokens.len();
        let c = s.chunk_frames as i64;
        let s0 = (t_frames - 1 - s.mid_delay as i64).max(0);
        let e0 = if is_last {
            t_frames
        } else {
            (s0 + c).min(t_frames)
        };
        let d = &mut self.decoding;
        let (mut start, mut end) = (d.start, d.end);
        if end > s0 {
            end -= c;
            start = end;
        }
        if is_first || end <= s0 {
            (start, end) = (s0, e0);
        }
        let mut eou = is_last;
        let mut eou_at = t_frames;
        if !eou {
            (eou, eou_at) = eou_from_emissions(
                &labels,
                self.blank,
                &self.grouping.word_start,
                start,
                s0,
                s.stop_history_frames as i64,
                RESIDUE_TOKENS_AT_END,
            );
        }
        if eou && eou_at > end {
            end = eou_at;
        }
        if (s0..e0).contains(&end) {
            end = e0;
            eou = false;
        }
        let confidence = self.confidence;
        let committed: Vec<(usize, f64, f64)> = tokens
            .iter()
            .filter(|(_, t)| (start..end).contains(t))
            .map(|&(id, t)| {
                // NeMo measures a CTC token on the frame it starts at.
                let c = confidence.map_or(f64::NAN, |c| {
                    c.of_logits(&rows[t as usize * w..][..w], w) as f64
                });
                (id, t as f64, c)
            })
            .collect();
        let last = (end >= 1 && ((end - 1) as usize) < labels.len())
            .then(|| (labels[(end - 1) as usize], (end - 1) as f64));
        record.eou = eou;
        record.start_end = (start, end);
        let n = update_state(d, committed, eou, record);
        d.last_token = last.map(|(id, i)| (id, i + d.global_offset));
        d.start = start;
        d.end = end;
        d.global_offset += s.chunk_frames_exact;
        record.labels = labels;
        (n, eou)
    }

    /// Cut utterances that run longer than `seconds` without an end of utterance (`None`:
    /// never; the default is [`DEFAULT_MAX_UTTERANCE_SECONDS`](super::DEFAULT_MAX_UTTERANCE_SECONDS)).
    /// Only the reported text is cut, at the start of its last word: the decoding state goes
    /// on as NeMo's, so the tokens are NeMo's whatever the limit.
    pub fn set_max_utterance_seconds(&mut self, seconds: Option<f64>) {
        self.max_utterance_seconds = seconds.filter(|s| *s > 0.0);
    }

    /// Phrases this stream's transducer prefers (`None`: none), from the next chunk on: the
    /// tree's state is carried from chunk to chunk with the decoder's and copied into the
    /// right context's pass, as NeMo's per-stream biasing does. NeMo's buffered CTC pipeline
    /// decodes by argmax alone, so the CTC head refuses phrases.
    pub fn set_boost(&mut self, tree: Option<Arc<BoostingTree>>) -> Result<()> {
        if let Some(t) = &tree {
            if self.head == Head::Ctc {
                bail!(
                    Options,
                    "phrase boosting in buffered streaming needs the transducer head: NeMo's \
                     buffered CTC pipeline decodes by argmax alone (drop --decoder ctc)"
                );
            }
            let vocab = self.session.model().hparams().vocab_size;
            if t.vocab_size() != vocab {
                bail!(
                    Options,
                    "the boosting phrases were tokenised for a {}-piece vocabulary; this model \
                     has {vocab}",
                    t.vocab_size()
                );
            }
            self.decoding.boost_state = t.start();
        }
        self.boost = tree;
        Ok(())
    }

    /// Measure each token's confidence by `cfg` (`None`: not), reported as word confidences;
    /// the transducer's from its emission step (blanks counted within a chunk's pass), CTC's
    /// from its first frame, as NeMo's pipelines do.
    pub fn set_confidence(&mut self, cfg: Option<ConfidenceConfig>) {
        self.confidence = cfg;
    }

    /// When the utterance spans more than the limit: its words before the last one, as a
    /// finished utterance (the whole of it once it spans twice the limit without a word
    /// start to cut at).
    fn cut_long_utterance(&mut self) -> Option<Utterance> {
        let limit = self.max_utterance_seconds?;
        let d = &self.decoding;
        let (first, last) = (d.timesteps.get(self.reported)?, d.timesteps.last()?);
        let span = (last - first + 1.0) * self.sizes.frame_seconds;
        if span <= limit {
            return None;
        }
        let starts_word = |id: &usize| self.grouping.starts_word(*id);
        let cut = match d.tokens[self.reported..].iter().rposition(starts_word) {
            Some(i) if i > 0 => self.reported + i,
            _ if span > 2.0 * limit => d.tokens.len(),
            _ => return None,
        };
        let done = self.utterance_of(self.reported, cut, true);
        self.reported = cut;
        done
    }

    /// Drops the reported tokens but the last few: past a cut only NeMo's duplicate-token
    /// check looks back, at the last [`OVERLAP_SEARCH`] stored tokens, so an utterance that
    /// never ends costs what its unreported part does, not what it has said so far. Dropping
    /// the head changes no timestamp: `merge_timesteps` shifts a stored list only when its
    /// first entry is negative, and a stored list is non-negative and increasing.
    fn forget_reported(&mut self) {
        let drop = self.reported.saturating_sub(OVERLAP_SEARCH);
        if drop == 0 {
            return;
        }
        let d = &mut self.decoding;
        d.tokens.drain(..drop);
        d.timesteps.drain(..drop);
        d.confidences.drain(..drop);
        self.reported -= drop;
    }

    /// The utterance since the last end of utterance (less what a cut reported), with NeMo's
    /// segment times and its text as NeMo prints a finished segment (`is_final`) or a partial
    /// transcript, or `None` when it has no token.
    fn utterance(&self, is_final: bool) -> Option<Utterance> {
        self.utterance_of(self.reported, self.decoding.tokens.len(), is_final)
    }

    fn utterance_of(&self, from: usize, to: usize, is_final: bool) -> Option<Utterance> {
        let d = &self.decoding;
        if from >= to {
            return None;
        }
        let (ids, times) = (&d.tokens[from..to], &d.timesteps[from..to]);
        let model = self.session.model();
        let fs = self.sizes.frame_seconds;
        let tokenizer = model.tokenizer();
        let text = ids_to_text(tokenizer, ids);
        let text = if is_final {
            self.grouping.tidy_final(&text)
        } else {
            self.grouping.tidy_partial(&text)
        };
        let (start, end) = self.grouping.refine(ids, times, None, None);
        let confidences = self
            .confidence
            .map(|c| (&d.confidences[from..to], c.aggregation));
        let mut words = self.grouping.words(tokenizer, ids, times, confidences);
        if is_final {
            // A final's text cuts each run of marks to its last, as NeMo prints a segment; its
            // words say the same (NeMo's own word offsets keep the whole run).
            for w in &mut words {
                w.text = self.grouping.tidy_final(&w.text);
            }
        }
        let tokens = ids
            .iter()
            .zip(times)
            .map(|(&id, &t)| Token {
                id,
                frame: t.max(0.0).round() as usize,
                duration: 0,
            })
            .collect();
        let utterance = Utterance {
            text,
            start: round9(start * fs),
            end: round9(end * fs),
            words,
            tokens,
        };
        Some(utterance.within(self.decoded as f64 / f64::from(self.sample_rate())))
    }

    /// Back to the start of a stream (time 0, empty buffer and state).
    fn reset(&mut self) {
        self.ring.clear();
        self.ring.resize(self.sizes.buffer_samples, 0.0);
        self.pending.clear();
        self.received = 0;
        self.decoded = 0;
        self.mel.reset();
        self.steps = 0;
        self.reported = 0;
        self.decoding = Decoding {
            global_offset: match self.head {
                Head::Transducer => -(self.sizes.right_frames as f64),
                Head::Ctc => -self.sizes.initial_delay,
            },
            boost_state: self.boost.as_ref().map_or(0, |t| t.start()),
            ..Decoding::default()
        };
    }
}

/// The text of `ids` as the streaming pipelines print it: SentencePiece's decoding, trimmed
/// (`ids_to_text(...).strip()`), without the offline transcript's removal of spaces before
/// punctuation.
fn ids_to_text(tokenizer: &Tokenizer, ids: &[usize]) -> String {
    let joined: String = ids
        .iter()
        .map(|&id| match tokenizer.piece(id) {
            Some("<unk>") | None => " \u{2047} ",
            Some(p) => p,
        })
        .collect();
    joined.replace(WORD_MARK, " ").trim().to_owned()
}

/// NeMo's `StreamingState.update_state`: the committed tokens (local frames already made
/// stream frames but for the offset) are appended, less those that repeat the last stored
/// ones close in time, their timestamps kept increasing and non-negative. Returns how many
/// were appended.
fn update_state(
    d: &mut Decoding,
    committed: Vec<(usize, f64, f64)>,
    eou: bool,
    record: &mut StepRecord,
) -> usize {
    if committed.is_empty() {
        d.last_token = None;
        return 0;
    }
    let tokens: Vec<usize> = committed.iter().map(|c| c.0).collect();
    let timesteps: Vec<f64> = committed.iter().map(|c| c.1 + d.global_offset).collect();
    let mut overlap = 0;
    if !d.eou_before {
        overlap = detect_overlap(&d.tokens, &d.timesteps, &tokens, &timesteps);
    }
    if d.eou_before
        && let Some((last, idx)) = d.last_token
        && last == tokens[0]
        && (idx - timesteps[0]).abs() <= CLOSE_IN_TIME
    {
        overlap = overlap.max(1);
    }
    d.tokens.extend_from_slice(&tokens[overlap..]);
    let confidences: Vec<f64> = committed[overlap..].iter().map(|c| c.2).collect();
    d.confidences.extend_from_slice(&confidences);
    record.committed_confidences = confidences;
    let before = d.timesteps.len();
    merge_timesteps(&mut d.timesteps, timesteps[overlap..].to_vec());
    d.eou_before = eou;
    record.overlap_skipped = overlap;
    record.committed = tokens[overlap..].to_vec();
    record.committed_timesteps = d.timesteps[before..].to_vec();
    tokens.len() - overlap
}

/// NeMo's `detect_overlap`: the longest k <= 3 with the last k stored tokens equal to the first
/// k new ones, when the k-th new one is at most 2 frames after the k-th last stored one.
fn detect_overlap(stored: &[usize], stored_ts: &[f64], new: &[usize], new_ts: &[f64]) -> usize {
    let limit = stored.len().min(new.len()).min(OVERLAP_SEARCH);
    let overlap = (1..=limit)
        .filter(|&k| stored[stored.len() - k..] == new[..k])
        .max()
        .unwrap_or(0);
    if overlap > 0 && new_ts[overlap - 1] - stored_ts[stored_ts.len() - overlap] <= CLOSE_IN_TIME {
        overlap
    } else {
        0
    }
}

/// NeMo's `merge_timesteps`: a list starting below 0 is shifted to start at 0; new timestamps
/// not after the last stored one are shifted to follow it.
fn merge_timesteps(stored: &mut Vec<f64>, mut new: Vec<f64>) {
    if let Some(&first) = stored.first()
        && first < 0.0
    {
        stored.iter_mut().for_each(|t| *t -= first);
    }
    if let Some(&first) = new.first()
        && first < 0.0
    {
        new.iter_mut().for_each(|t| *t -= first);
    }
    let Some(&last) = stored.last() else {
        *stored = new;
        return;
    };
    let Some(&first) = new.first() else {
        return;
    };
    let gap = first - last;
    if gap <= 0.0 {
        stored.extend(new.iter().map(|t| t + gap.abs() + 1.0));
    } else {
        stored.extend(new);
    }
}

/// NeMo's `detect_eou_given_timestamps`: silence of more than `stop` frames after the last
/// token (the window shortened by `residue`) or, failing that, the rightmost gap of more than
/// `stop` frames between tokens ends the utterance half the stop after the silence starts.
fn eou_from_timestamps(ts: &[i64], alignment: i64, stop: i64, residue: i64) -> (bool, i64) {
    let Some(&last) = ts.last() else {
        return (false, -1);
    };
    let alignment = (alignment - residue).max(0);
    if (alignment - last - 1).max(0) > stop {
        return (true, last + 1 + stop / 2);
    }
    match ts.windows(2).rposition(|p| p[1] - p[0] - 1 > stop) {
        Some(i) => (true, ts[i] + 1 + stop / 2),
        None => (false, -1),
    }
}

/// NeMo's `detect_eou_given_emissions` as coded: from the end of the labels (less `residue`)
/// back to `max(search_start, pivot - stop)`, a run of more than `stop` blanks whose next
/// token starts a word ends the utterance half the stop after the run's start. A run that
/// reaches the scan's start counts whatever follows it, and then ends it at `-1 + stop / 2`.
fn eou_from_emissions(
    labels: &[usize],
    blank: usize,
    word_start: &[bool],
    pivot: i64,
    search_start: i64,
    stop: i64,
    residue: usize,
) -> (bool, i64) {
    if stop <= 0 {
        return (false, -1);
    }
    let length = labels.len().saturating_sub(residue) as i64;
    let end_point = 0.max(search_start).max(pivot - stop);
    let mut position = (length - 1).max(0);
    let mut silent = 0i64;
    let mut silence_start = -1i64;
    let mut first_non_silent: Option<usize> = None;
    let mut detected = false;
    while position >= end_point {
        let Some(&label) = labels.get(position as usize) else {
            break;
        };
        if label == blank {
            silent += 1;
            let starts_word =
                first_non_silent.is_none_or(|t| word_start.get(t).copied().unwrap_or(false));
            detected = silent > stop && starts_word;
            if detected {
                silence_start = position;
            }
        } else {
            if detected {
                break;
            }
            silent = 0;
            silence_start = -1;
            first_non_silent = Some(label);
        }
        position -= 1;
    }
    if silent > stop {
        (true, silence_start + stop / 2)
    } else {
        (false, -1)
    }
}

/// torch's float32 `sum` over a contiguous row (`cascade_sum` with `lanes`-wide vectors: four
/// vector accumulators, multi-level partial sums, the tail in scalars). NeMo's normalisation
/// of a constant band leaves the rounding residual of this sum's mean, which
/// `(x - mean) / (std + 1e-5)` blows up to a constant the encoder sees (the zero buffer).
fn torch_sum(x: &[f32], lanes: usize) -> f32 {
    let n = x.len();
    let vectors = n / lanes;
    let vector = |i: usize| &x[i * lanes..(i + 1) * lanes];
    let add = |acc: &mut [f32], v: &[f32]| acc.iter_mut().zip(v).for_each(|(a, b)| *a += b);
    const ILP: usize = 4;
    const LEVELS: usize = 4;
    let size = vectors / ILP;
    let ceil_log2 = if size <= 1 {
        0
    } else {
        usize::BITS - (size - 1).leading_zeros()
    } as usize;
    let level_power = 4.max(ceil_log2 / LEVELS);
    let level_step = 1usize << level_power;
    let level_mask = level_step - 1;
    let mut acc = vec![vec![vec![0f32; lanes]; ILP]; LEVELS];
    let mut i = 0;
    while i + level_step <= size {
        for _ in 0..level_step {
            for (k, a) in acc[0].iter_mut().enumerate() {
                add(a, vector(i * ILP + k));
            }
            i += 1;
        }
        for j in 1..LEVELS {
            let (below, above) = acc.split_at_mut(j);
            for (lower, upper) in below[j - 1].iter_mut().zip(above[0].iter_mut()) {
                add(upper, lower);
                lower.fill(0.0);
            }
            if i & (level_mask << (j * level_power)) != 0 {
                break;
            }
        }
    }
    while i < size {
        for (k, a) in acc[0].iter_mut().enumerate() {
            add(a, vector(i * ILP + k));
        }
        i += 1;
    }
    let (first, rest) = acc.split_at_mut(1);
    for level in rest.iter() {
        for (low, high) in first[0].iter_mut().zip(level) {
            add(low, high);
        }
    }
    let mut partial = acc[0][0].clone();
    for v in size * ILP..vectors {
        add(&mut partial, vector(v));
    }
    for other in &acc[0][1..] {
        add(&mut partial, other);
    }
    let mut total = 0f32;
    for &v in &x[vectors * lanes..] {
        total += v;
    }
    for v in partial {
        total += v;
    }
    total
}

/// Vector width of torch's sum kernel the references ran (AVX2: 8 floats). 16 lanes would
/// leave no residual for a 320-frame buffer, where NeMo's is one ulp.
const TORCH_LANES: usize = 8;

/// NeMo's `normalize_batch(per_feature)` of one band as torch computes it in float32: `band`
/// holds the buffer's frames (zeros after the `valid` ones); mean and unbiased std over the
/// valid frames (the sums run over the whole band, the invalid frames masked to 0).
fn normalize_like_torch(band: &mut [f32], valid: usize) {
    let n = valid as f32;
    let mean = torch_sum(band, TORCH_LANES) / n;
    let squares: Vec<f32> = band
        .iter()
        .enumerate()
        .map(|(t, &x)| {
            if t < valid {
                (x - mean) * (x - mean)
            } else {
                0.0
            }
        })
        .collect();
    let var = torch_sum(&squares, TORCH_LANES) / (n - 1.0);
    let std = if var.is_nan() { 0.0 } else { var.sqrt() } + 1e-5;
    for x in band.iter_mut().take(valid) {
        *x = (*x - mean) / std;
    }
}

impl LiveTranscriber for BufferedStream {
    fn sample_rate(&self) -> u32 {
        self.session.sample_rate()
    }

    fn chunk_seconds(&self) -> f64 {
        self.config.chunk_secs
    }

    fn accept(&mut self, samples: &[f32]) -> Result<Vec<StreamEvent>> {
        let mut events = Vec::new();
        let size = self.sizes.chunk_samples;
        self.received += samples.len();
        let mut rest = samples;
        while !rest.is_empty() {
            // A full request waits for the next sample: only then is it known not to be the
            // last one, which NeMo decodes through its right context to the end.
            if self.pending.len() == size {
                let chunk = std::mem::take(&mut self.pending);
                events.extend(self.step(&chunk, size, false)?);
            }
            let take = (size - self.pending.len()).min(rest.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        Ok(events)
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>> {
        if self.received > 0
            && let Err(e) = self.session.check_long_enough(self.received)
        {
            self.reset();
            return Err(e);
        }
        let mut events = Vec::new();
        if !self.pending.is_empty() {
            // The last request: zero-padded to a whole chunk (a full one where the input ends
            // on a chunk's border), its valid length remembered.
            let valid = self.pending.len();
            let mut chunk = std::mem::take(&mut self.pending);
            chunk.resize(self.sizes.chunk_samples, 0.0);
            events.extend(self.step(&chunk, valid, true)?);
        } else if let Some(u) = self.utterance(true) {
            // No audio since the last request was decoded as the last one.
            events.push(StreamEvent::Final(u));
        }
        self.reset();
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> FrameGeometry {
        FrameGeometry {
            sample_rate: 16000,
            hop_length: 160,
            subsampling_factor: 8,
            causal_downsampling: false,
        }
    }

    fn sizes(chunk: f64, left: f64, right: f64) -> Result<BufferSizes> {
        let config = BufferedConfig {
            chunk_secs: chunk,
            left_secs: left,
            right_secs: right,
            ..BufferedConfig::default()
        };
        BufferSizes::new(&config, geometry())
    }

    #[test]
    fn sizes_are_nemos() {
        // The references' `effective` numbers.
        let s = sizes(4.8, 1.6, 1.6).unwrap();
        assert_eq!(
            (
                s.chunk_samples,
                s.buffer_samples,
                s.feature_frames,
                s.buffer_frames
            ),
            (76800, 128000, 800, 100)
        );
        assert_eq!(
            (s.chunk_frames, s.left_frames, s.right_frames),
            (60, 20, 20)
        );
        assert_eq!(
            (s.mid_delay, s.initial_delay, s.stop_history_frames),
            (80, 40.0, 10)
        );
        let s = sizes(0.8, 1.6, 0.8).unwrap();
        assert_eq!(
            (s.chunk_frames, s.left_frames, s.right_frames),
            (10, 20, 10)
        );
        assert_eq!(s.initial_delay, 30.000000000000004);
        assert_eq!(s.feature_frames, 320);
        // Float arithmetic as NeMo's: 1.2 + 1.6 + 0.8 s is 57599 samples, 359 frames; a
        // 1.6 s chunk with 0.8 s right context has a mid delay of 31.
        let s = sizes(1.2, 1.6, 0.8).unwrap();
        assert_eq!((s.buffer_samples, s.feature_frames), (57599, 359));
        assert_eq!(sizes(1.6, 1.6, 0.8).unwrap().mid_delay, 31);
    }

    #[test]
    fn bad_sizes_say_what_nemo_would_make_of_them() {
        let e = sizes(1.0, 1.6, 1.6).unwrap_err().to_string();
        assert!(e.contains("--chunk-secs") && e.contains("13 frames") && e.contains("1.04 s"));
        let e = sizes(4.8, 0.5, 1.6).unwrap_err().to_string();
        assert!(e.contains("--left-secs") && e.contains("7 frames"), "{e}");
        assert!(
            sizes(0.0, 1.6, 1.6)
                .unwrap_err()
                .to_string()
                .contains("more than 0")
        );
        assert!(
            sizes(4.8, -0.8, 1.6)
                .unwrap_err()
                .to_string()
                .contains("0 or more")
        );
        assert!(sizes(f64::NAN, 1.6, 1.6).is_err());
        assert!(sizes(4.8, 0.0, 0.0).is_ok());
        // 0.56 s is 7 strides, but 0.56 / 0.08 is 7.000000000000001 in floating point, which
        // NeMo rounds up to 8 frames: say so, and name sizes it takes whole.
        let e = sizes(0.56, 1.6, 1.6).unwrap_err().to_string();
        assert!(
            e.contains("7.000000000000001") && e.contains("8 frames"),
            "{e}"
        );
        assert!(e.contains("0.48, 0.64, 0.72 s"), "{e}");
        assert!(sizes(0.48, 1.6, 1.6).is_ok() && sizes(0.64, 1.6, 1.6).is_ok());
        // Sizes that would overflow a count are refused, not wrapped.
        for huge in [1e300, 3600.08] {
            let e = sizes(huge, 1.6, 1.6).unwrap_err().to_string();
            assert!(e.contains("at most 3600 s"), "{e}");
        }
    }

    /// The buffers' features with the overlap's frames reused equal the features of every
    /// buffer computed whole, bit for bit, over the stream's first steps (the buffer growing
    /// from the stream's start), the steady ones and a short last one, for sizes whose buffer
    /// is and is not a whole number of hops; and only the new audio's frames and a few at the
    /// buffer's edges are computed.
    #[test]
    fn reused_overlap_features_equal_whole_buffers() {
        use crate::audio::mel::MelConfig;
        let mut cfg = MelConfig::parakeet(16);
        cfg.normalize_per_feature = false;
        let window: Vec<f32> = (0..cfg.win_length)
            .map(|i| 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / 400.0).cos())
            .collect();
        let mut fb = vec![0f32; cfg.n_mels * cfg.n_bins()];
        for m in 0..cfg.n_mels {
            for b in 0..24 {
                fb[m * cfg.n_bins() + m * 15 + b] = 0.01 * (b + 1) as f32;
            }
        }
        let signal: Vec<f32> = (0..500_000u64)
            .map(|i| ((i * 7919 % 10007) as f32 / 5003.5 - 1.0) * 0.3 + (i as f32 * 0.01).sin())
            .collect();
        for (chunk, left, right) in [
            (4.8, 1.6, 1.6),
            (1.2, 1.6, 0.8),
            (1.2, 0.16, 0.0),
            (0.72, 0.0, 0.08),
            (0.64, 0.24, 0.08),
            (0.08, 0.08, 0.0),
            (0.08, 0.0, 0.0),
        ] {
            let s = sizes(chunk, left, right).unwrap();
            let mut sliding = SlidingMel::new(&window, &fb, &cfg);
            let total = 3 * s.buffer_samples + s.chunk_samples / 3 + 17;
            let steps = total.div_ceil(s.chunk_samples);
            for k in 0..steps {
                let valid = (total - k * s.chunk_samples).min(s.chunk_samples);
                let w = BufferWindow::of_step(&s, k, valid);
                let samples = &signal[w.start..w.start + w.len];
                let before = sliding.reused_frames();
                let got = sliding.window(samples, w.start).clone();
                let whole = log_mel(samples, &window, &fb, &cfg);
                assert_eq!(got.n_frames, whole.n_frames);
                let same = got
                    .data
                    .iter()
                    .zip(&whole.data)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{chunk},{left},{right} step {k}: frames differ");
                let computed = got.n_frames - (sliding.reused_frames() - before);
                let shift =
                    w.start - BufferWindow::of_step(&s, k.saturating_sub(1), s.chunk_samples).start;
                if k > 0 && shift.is_multiple_of(s.hop) {
                    // New audio's frames, the last frame's edge, two at a buffer's start.
                    let at_most = s.chunk_samples.min(w.len) / s.hop + 4;
                    assert!(
                        computed <= at_most,
                        "{chunk},{left},{right} step {k}: {computed} frames computed, \
                         more than {at_most}"
                    );
                }
            }
            // Without context the buffers do not overlap.
            let overlap = left + right > 0.0;
            assert_eq!(
                sliding.reused_frames() > 0,
                overlap,
                "{chunk},{left},{right}"
            );
        }
    }

    #[test]
    fn the_zero_buffer_normalises_to_the_recorded_residual() {
        // NeMo's `zero_buffer.normalized_feature_values` for 800, 480 and 320 frames.
        let raw = (2f32.powi(-24)).ln();
        for (frames, want) in [
            (800, -0.276_085_56_f32),
            (480, -0.160_155_71),
            (320, -0.160_142_3),
        ] {
            let mut band = vec![raw; frames];
            normalize_like_torch(&mut band, frames);
            assert!(
                (band[0] - want).abs() < 1e-6,
                "{frames} frames: {} against NeMo's {want}",
                band[0]
            );
        }
    }

    #[test]
    fn the_zero_buffers_kept_are_the_latest_few() {
        let key = |n: usize| (std::path::PathBuf::from("m.gguf"), false, n, n);
        let mut cache = RecentRows::new();
        for n in 0..ZERO_ROWS_KEPT + 3 {
            cache.insert(key(n), Arc::new(vec![n as f32]));
            // The first stays in use, so it is never the one forgotten.
            assert_eq!(cache.get(&key(0)).as_deref(), Some(&vec![0.0]));
        }
        assert_eq!(cache.entries.len(), ZERO_ROWS_KEPT);
        let last = ZERO_ROWS_KEPT + 2;
        assert_eq!(cache.get(&key(last)).as_deref(), Some(&vec![last as f32]));
        // The oldest unused ones went.
        assert!(cache.get(&key(1)).is_none() && cache.get(&key(3)).is_none());
        // A key inserted again replaces its rows, not adds a second entry.
        cache.insert(key(0), Arc::new(vec![9.0]));
        assert_eq!(cache.entries.len(), ZERO_ROWS_KEPT);
        assert_eq!(cache.get(&key(0)).as_deref(), Some(&vec![9.0]));
    }

    #[test]
    fn timestamps_merge_as_nemos() {
        let mut stored = vec![];
        merge_timesteps(&mut stored, vec![-20.0, -19.0, 2.0]);
        assert_eq!(stored, vec![0.0, 1.0, 22.0]);
        merge_timesteps(&mut stored, vec![20.0, 24.0]);
        assert_eq!(stored, vec![0.0, 1.0, 22.0, 23.0, 27.0]);
        merge_timesteps(&mut stored, vec![30.0]);
        assert_eq!(stored.last(), Some(&30.0));
    }

    #[test]
    fn overlap_needs_equal_tokens_close_in_time() {
        assert_eq!(
            detect_overlap(&[5, 38], &[0.0, 84.0], &[38, 23], &[83.0, 99.0]),
            1
        );
        assert_eq!(
            detect_overlap(&[5, 38], &[0.0, 84.0], &[38, 23], &[87.0, 99.0]),
            0
        );
        assert_eq!(
            detect_overlap(&[5, 7], &[0.0, 1.0], &[5, 7, 9], &[1.0, 2.0, 3.0]),
            2
        );
        assert_eq!(detect_overlap(&[], &[], &[5], &[1.0]), 0);
    }

    #[test]
    fn endpointing_on_timestamps() {
        // Trailing silence past the last token (window 40 less 2 residue).
        assert_eq!(eou_from_timestamps(&[3, 19], 40, 10, 2), (true, 25));
        // Gaps inside, no trailing silence: the rightmost counts.
        assert_eq!(eou_from_timestamps(&[1, 20, 37], 40, 10, 2), (true, 26));
        assert_eq!(eou_from_timestamps(&[1, 20, 27], 40, 10, 2), (true, 7));
        assert_eq!(
            eou_from_timestamps(&[1, 5, 14, 24, 34], 40, 10, 2),
            (false, -1)
        );
        assert_eq!(eou_from_timestamps(&[], 40, 10, 2), (false, -1));
    }

    #[test]
    fn endpointing_on_emissions() {
        let blank = 9;
        let starts = [true, false, false, false, false, false, false, false, false];
        let mut labels = vec![blank; 60];
        // A run of blanks before a word start: the end half the stop after the run's start
        // (the scan stops at the pivot, 19).
        labels[50] = 0;
        assert_eq!(
            eou_from_emissions(&labels, blank, &starts, 19, 19, 10, 2),
            (true, 24)
        );
        // Before a piece that does not start a word, the run still counts once it reaches the
        // scan's start, and the end is put at -1 + 5 (as coded in NeMo).
        labels[50] = 1;
        assert_eq!(
            eou_from_emissions(&labels, blank, &starts, 19, 19, 10, 2),
            (true, 4)
        );
        // A word start further back ends the run that reaches the scan's start properly.
        labels[30] = 0;
        assert_eq!(
            eou_from_emissions(&labels, blank, &starts, 19, 19, 10, 2),
            (true, 24)
        );
        labels[40] = 0;
        assert_eq!(
            eou_from_emissions(&labels, blank, &starts, 35, 19, 10, 2),
            (false, -1)
        );
    }
}
