//! NeMo's cache-aware streaming (`conformer_stream_step`) as a [`LiveTranscriber`].
//!
//! The schedule is the one of NeMo's `CacheAwareStreamingAudioBuffer` over raw log-mel frames
//! (`normalize: NA`): a first chunk of `1 + 8R` frames, then chunks of `8(R + 1)` new frames
//! with the previous 9 frames before them (zero frames while fewer exist), whose first 2
//! subsampled frames are dropped. The encoder keeps its attention and convolution caches in an
//! [`EncoderState`]; the transducer carries its hypothesis (LSTM state, last label, a TDT
//! duration's overshoot) from chunk to chunk, and CTC folds the per-frame labels across chunk
//! borders. At the end of the input NeMo's buffer holds one more, zeroed, frame, and a tail
//! shorter than a subsampling step is never encoded; both are copied.

use super::{LiveTranscriber, StreamEvent, Utterance};
use crate::audio::mel::StreamingMel;
use crate::bail;
use crate::decoder::ctc::{argmax, fold};
use crate::decoder::hypothesis::Hypothesis;
use crate::encoder::{EncoderState, FeatureImage, Outputs, StreamCaches};
use crate::error::Result;
use crate::hparams::{Attention, StreamingParams};
use crate::session::{DecoderChoice, Session};
use crate::tokenizer::{Token, TokenClock};

/// How a [`CacheAwareStream`] runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheAwareConfig {
    /// The lookahead `[left, right]`: one of the model's `att_context_size`s; `None`: NeMo's
    /// default, the first.
    pub att_context: Option<[i64; 2]>,
    /// The head that decodes: the transducer (`Auto` / `Tdt`) or a hybrid's CTC.
    pub decoder: DecoderChoice,
    /// Keep a [`ChunkRecord`] of every chunk (encoder output and caches; tests and
    /// diagnostics).
    pub record_chunks: bool,
}

/// What one chunk produced, when [`CacheAwareConfig::record_chunks`] is set.
#[derive(Clone, Debug)]
pub struct ChunkRecord {
    /// Encoder frames of the chunk and its output `[frames][d_model]`.
    pub frames: usize,
    pub encoder_out: Vec<f32>,
    /// The caches after the chunk (the next chunk's input).
    pub caches: StreamCaches,
    /// Tokens the chunk emitted.
    pub new_tokens: Vec<usize>,
}

/// The decoder's state across chunks.
enum HeadState {
    Transducer(Option<Hypothesis>),
    /// The previous frame's label (CTC folds repeats across chunk borders).
    Ctc {
        previous: usize,
    },
}

/// Cache-aware streaming transcription over a [`Session`] of a cache-aware model.
pub struct CacheAwareStream {
    session: Session,
    config: CacheAwareConfig,
    params: StreamingParams,
    attention: Attention,
    outputs: Outputs,
    n_mels: usize,
    mel: StreamingMel,
    /// Feature frames `[frames][n_mels]` from frame `features_base` on.
    features: Vec<f32>,
    features_base: usize,
    /// The first frame of the next chunk's new frames, and chunks run so far.
    next: usize,
    step: usize,
    encoder: EncoderState,
    head: HeadState,
    /// Encoder frames streamed so far (the stream's clock).
    frames_done: usize,
    /// Samples the features streamed so far needed, and of the whole input once it has ended
    /// (`finish`): no time is reported past them.
    used: usize,
    ended: Option<usize>,
    /// The utterance being spoken.
    tokens: Vec<Token>,
    /// The model's end-of-utterance and end-of-backchannel pieces (`<EOU>`, `<EOB>`).
    markers: Vec<usize>,
    /// An utterance this long without an end marker is cut at a word start
    /// ([`Self::set_max_utterance_seconds`]).
    max_utterance_seconds: Option<f64>,
    records: Vec<ChunkRecord>,
}

/// The longest utterance a stream reports before it cuts one at a word start, by default.
/// A model without an end-of-utterance token (nvidia/nemotron-speech-streaming-en-0.6b) would
/// otherwise make one utterance of a whole stream, and every partial of an hour-long stream
/// would carry the hour's text.
pub const DEFAULT_MAX_UTTERANCE_SECONDS: f64 = 30.0;

/// The pieces that end an utterance (nvidia/parakeet_realtime_eou_120m-v1).
const END_MARKERS: [&str; 2] = ["<EOU>", "<EOB>"];

/// The models that stream, for the error a non-streaming model gets.
pub const STREAMING_MODELS: &str = "NeMo's cache-aware FastConformers (att_context_style \
     chunked_limited, causal_downsampling, conv_context_size causal), e.g. \
     nvidia/nemotron-speech-streaming-en-0.6b, nvidia/parakeet_realtime_eou_120m-v1, \
     nvidia/stt_en_fastconformer_hybrid_large_streaming_multi";

impl CacheAwareStream {
    /// A stream over `session`'s model with `config`. Fails with a clear error for a model that
    /// is not cache-aware, a lookahead the model does not have, or a head it lacks.
    pub fn new(session: Session, config: CacheAwareConfig) -> Result<CacheAwareStream> {
        let model = session.model().clone();
        let hp = model.hparams();
        let e = &hp.encoder;
        let shown = model.shown();
        let default = e.att_context_sizes.first().copied();
        let Some(params) = default.and_then(|c| e.streaming(c)) else {
            bail!(
                Options,
                "{shown} cannot stream: not a cache-aware streaming model (attention {}); models \
                 that stream: \
                 {STREAMING_MODELS}",
                e.attention
            );
        };
        if hp.preprocessor.normalize_per_feature {
            bail!(
                Options,
                "{shown}: a streaming model with per_feature normalisation is not supported \
                 (NeMo's cache-aware models use normalize NA)"
            );
        }
        let context = match config.att_context {
            None => params.att_context,
            Some([l, r]) => {
                let found = e
                    .att_context_sizes
                    .iter()
                    .find(|c| [c[0] as i64, c[1] as i64] == [l, r]);
                let Some(&c) = found else {
                    let have: Vec<String> = e
                        .att_context_sizes
                        .iter()
                        .map(|c| format!("{},{}", c[0], c[1]))
                        .collect();
                    bail!(
                        Options,
                        "{shown}: att_context {l},{r} is not one of the model's lookaheads ({})",
                        have.join(" ")
                    );
                };
                c
            }
        };
        let params = e.streaming(context).expect("checked above");
        let Some(attention) = Attention::chunked([context[0] as i64, context[1] as i64]) else {
            bail!(
                Options,
                "{shown}: att_context {context:?} is not a chunked attention"
            );
        };
        let outputs = if config.record_chunks {
            Outputs::All { layers: false }
        } else {
            session.head(config.decoder)?
        };
        // The head must exist even when all outputs are asked for.
        let head = match session.head(config.decoder)? {
            Outputs::CtcLogits => HeadState::Ctc {
                previous: hp.blank_id(),
            },
            _ => HeadState::Transducer(None),
        };
        let mel = StreamingMel::new(model.window(), model.filterbank(), session.mel_config());
        let markers = model
            .tokenizer()
            .pieces()
            .iter()
            .enumerate()
            .filter(|(_, p)| END_MARKERS.contains(&p.as_str()))
            .map(|(id, _)| id)
            .collect();
        let mut encoder = EncoderState::streaming(params);
        if config.record_chunks {
            encoder.record_caches();
        }
        Ok(CacheAwareStream {
            encoder,
            n_mels: e.feat_in,
            session,
            config,
            params,
            attention,
            outputs,
            mel,
            features: Vec::new(),
            features_base: 0,
            next: 0,
            step: 0,
            head,
            frames_done: 0,
            used: 0,
            ended: None,
            tokens: Vec::new(),
            markers,
            max_utterance_seconds: Some(DEFAULT_MAX_UTTERANCE_SECONDS),
            records: Vec::new(),
        })
    }

    /// The schedule of the lookahead in use.
    pub fn params(&self) -> &StreamingParams {
        &self.params
    }

    /// Encoder frames streamed so far (since the start or the last `finish`).
    pub fn frames_done(&self) -> usize {
        self.frames_done
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The chunks recorded since the last call ([`CacheAwareConfig::record_chunks`]).
    pub fn take_records(&mut self) -> Vec<ChunkRecord> {
        std::mem::take(&mut self.records)
    }

    /// Feature frames a chunk of step `step` takes (NeMo's `chunk_size`), and the frames the
    /// stream then moves on (`shift_size`).
    fn sizes(&self) -> (usize, usize) {
        let i = usize::from(self.step > 0);
        (self.params.chunk_size[i], self.params.shift_size[i])
    }

    /// Feature frames held so far (from frame 0).
    fn frames_held(&self) -> usize {
        self.features_base + self.features.len() / self.n_mels
    }

    /// Runs the chunk of `new` frames from `self.next`, with its pre-encode cache, then moves
    /// on.
    fn run_chunk(&mut self, new: usize, events: &mut Vec<StreamEvent>) -> Result<()> {
        let m = self.n_mels;
        let (_, shift) = self.sizes();
        let prefix = if self.step == 0 {
            0
        } else {
            self.params.pre_encode_cache_size
        };
        // Fewer frames before the chunk than the cache holds: zero frames make up the rest.
        let real = prefix.min(self.next);
        let mut data = vec![0f32; (prefix - real) * m];
        let from = (self.next - real - self.features_base) * m;
        let to = (self.next + new - self.features_base) * m;
        data.extend_from_slice(&self.features[from..to]);
        let chunk = FeatureImage::from_frames(data, m)?;
        let enc =
            self.session
                .encode_chunk(&mut self.encoder, chunk, self.attention, self.outputs)?;
        let frames = enc.frames;
        let new_tokens = match &mut self.head {
            HeadState::Transducer(hyp) => {
                let Some(joint_enc) = enc.joint_enc.as_deref() else {
                    bail!(Internal, "internal: a transducer chunk without joint.enc");
                };
                let mut h = self
                    .session
                    .continue_greedy(hyp.take(), joint_enc, frames)?;
                let mut tokens = h.take_tokens();
                *hyp = Some(h);
                for t in &mut tokens {
                    t.frame += self.frames_done;
                }
                tokens
            }
            HeadState::Ctc { previous } => {
                let Some(logits) = enc.ctc_logits.as_deref() else {
                    bail!(Internal, "internal: a CTC chunk without logits");
                };
                let classes = logits.len() / frames.max(1);
                let blank = classes - 1;
                // The previous chunk's last label leads, so that a repeat across the border
                // folds as in NeMo's re-decoding of the concatenated labels.
                let labels: Vec<usize> = std::iter::once(*previous)
                    .chain(logits.chunks_exact(classes).map(argmax))
                    .collect();
                *previous = *labels.last().expect("one label at least");
                // Frame 0 of the fold is the previous chunk's last frame: its token, if any,
                // was emitted then.
                let mut tokens: Vec<Token> = fold(labels.into_iter(), blank)
                    .into_iter()
                    .filter(|t| t.frame > 0)
                    .collect();
                for t in &mut tokens {
                    t.frame = t.frame + self.frames_done - 1;
                }
                tokens
            }
        };
        if self.config.record_chunks {
            self.records.push(ChunkRecord {
                frames,
                encoder_out: enc.output,
                caches: self.encoder.caches().expect("a streaming state").clone(),
                new_tokens: new_tokens.iter().map(|t| t.id).collect(),
            });
        }
        self.frames_done += frames;
        self.used = self.used.max(self.mel.samples_needed(self.next + new));
        self.next += shift;
        self.step += 1;
        self.emit(new_tokens, events);
        // Only the pre-encode cache's frames before the next chunk are read again.
        let keep_from = self
            .next
            .saturating_sub(self.params.pre_encode_cache_size)
            .min(self.frames_held());
        if keep_from > self.features_base {
            self.features.drain(..(keep_from - self.features_base) * m);
            self.features_base = keep_from;
        }
        Ok(())
    }

    /// Adds a chunk's tokens to the utterance: a `Partial` when it gained any (after a `Final`
    /// of its first words when it grew too long); a `Final` when they hold an end marker,
    /// after which the encoder's caches and the decoder start afresh (as NeMo's voice agent
    /// resets its streaming state on `<EOU>` / `<EOB>`).
    fn emit(&mut self, tokens: Vec<Token>, events: &mut Vec<StreamEvent>) {
        let (kept, ended) = end_of_utterance(tokens, &self.markers);
        let grew = !kept.is_empty();
        self.tokens.extend(kept);
        if !ended {
            if grew {
                if let Some(done) = self.cut_long_utterance() {
                    events.push(StreamEvent::Final(done));
                }
                if !self.tokens.is_empty() {
                    events.push(StreamEvent::Partial(self.utterance()));
                }
            }
            return;
        }
        if !self.tokens.is_empty() {
            events.push(StreamEvent::Final(self.utterance()));
        }
        self.tokens.clear();
        self.restart_model_state();
    }

    /// The encoder's caches and the decoder's state as at the start of a stream.
    fn restart_model_state(&mut self) {
        let model = self.session.model().clone();
        self.encoder.restart();
        self.head = match self.head {
            HeadState::Transducer(_) => HeadState::Transducer(None),
            HeadState::Ctc { .. } => HeadState::Ctc {
                previous: model.hparams().blank_id(),
            },
        };
    }

    /// Cut utterances that run longer than `seconds` without an end marker (`None`: never;
    /// the default is [`DEFAULT_MAX_UTTERANCE_SECONDS`]). Only the reported text is cut, at
    /// the start of the utterance's last word: the encoder and decoder carry on, so the finals'
    /// texts joined with spaces are the uncut stream's text.
    pub fn set_max_utterance_seconds(&mut self, seconds: Option<f64>) {
        self.max_utterance_seconds = seconds.filter(|s| *s > 0.0);
    }

    /// When the utterance spans more than the limit: its words before the last one, as a
    /// finished utterance; the last word stays as the start of the next. An utterance without
    /// a word start to cut at ends whole once it spans twice the limit.
    fn cut_long_utterance(&mut self) -> Option<Utterance> {
        let limit = self.max_utterance_seconds?;
        let (first, last) = (self.tokens.first()?, self.tokens.last()?);
        let clock = self.clock();
        let span = clock.span(last).1 - clock.span(first).0;
        if span <= limit {
            return None;
        }
        // A piece with the word mark starts a word; the text cut before it loses only the
        // space the mark stands for.
        let tokenizer = &self.session.model().tokenizer();
        let starts_word = |t: &Token| {
            tokenizer
                .piece(t.id)
                .is_some_and(|p| p.starts_with('\u{2581}'))
        };
        let cut = match self.tokens.iter().rposition(starts_word) {
            Some(i) if i > 0 => i,
            _ if span > 2.0 * limit => self.tokens.len(),
            _ => return None,
        };
        let rest = self.tokens.split_off(cut);
        let done = self.utterance();
        self.tokens = rest;
        Some(done)
    }

    /// Test hook: room for only `chunks` chunks in the encoder's cache rings, so that their
    /// live rows move to the front that often (call before the first chunk).
    #[doc(hidden)]
    pub fn set_cache_room(&mut self, chunks: usize) {
        self.encoder.set_cache_room(chunks);
    }

    /// Test hook: treat `ids` as end-of-utterance pieces (the tiny reference models have none).
    #[doc(hidden)]
    pub fn set_end_markers(&mut self, ids: Vec<usize>) {
        self.markers = ids;
    }

    /// The stream's token times: up to the frames streamed so far, and never past the audio
    /// their features needed (the input's end once it has ended: the last chunk's frames run
    /// past it); the bound does not depend on how the audio was cut into pieces.
    fn clock(&self) -> TokenClock {
        let model = self.session.model();
        let frame_seconds = model.hparams().geometry().frame_seconds();
        let streamed = self.frames_done as f64 * frame_seconds;
        let audio = self.ended.unwrap_or(self.used) as f64 / f64::from(self.session.sample_rate());
        TokenClock {
            frame_seconds,
            tdt_durations: matches!(self.head, HeadState::Transducer(_))
                && model.hparams().model_type.is_tdt(),
            audio_seconds: streamed.min(audio),
        }
    }

    /// The utterance so far.
    fn utterance(&self) -> Utterance {
        let model = self.session.model();
        let clock = self.clock();
        let ids = self.tokens.iter().map(|t| t.id);
        let (start, end) = match (self.tokens.first(), self.tokens.last()) {
            (Some(a), Some(b)) => (clock.span(a).0, clock.span(b).1),
            _ => (0.0, 0.0),
        };
        Utterance {
            text: model.tokenizer().detokenize(ids),
            start,
            end,
            words: model.tokenizer().words(&self.tokens, &clock),
            tokens: self.tokens.clone(),
        }
    }

    /// Back to the start of a stream (time 0, empty caches).
    fn reset(&mut self) {
        let model = self.session.model().clone();
        self.mel = StreamingMel::new(
            model.window(),
            model.filterbank(),
            self.session.mel_config(),
        );
        self.features.clear();
        self.features_base = 0;
        self.next = 0;
        self.step = 0;
        self.restart_model_state();
        self.frames_done = 0;
        self.used = 0;
        self.ended = None;
        self.tokens.clear();
    }
}

/// A chunk's tokens without the end markers among them, and whether there was one (the
/// utterance then ends with this chunk).
fn end_of_utterance(tokens: Vec<Token>, markers: &[usize]) -> (Vec<Token>, bool) {
    let before = tokens.len();
    let kept: Vec<Token> = tokens
        .into_iter()
        .filter(|t| !markers.contains(&t.id))
        .collect();
    let ended = kept.len() < before;
    (kept, ended)
}

impl LiveTranscriber for CacheAwareStream {
    fn sample_rate(&self) -> u32 {
        self.session.sample_rate()
    }

    fn chunk_seconds(&self) -> f64 {
        let pp = &self.session.model().hparams().preprocessor;
        (self.params.shift_size[1] * pp.hop_length) as f64 / pp.sample_rate as f64
    }

    fn accept(&mut self, samples: &[f32]) -> Result<Vec<StreamEvent>> {
        let frames = self.mel.push(samples);
        self.features.extend(frames);
        let mut events = Vec::new();
        loop {
            let (size, _) = self.sizes();
            if self.frames_held() < self.next + size {
                break;
            }
            self.run_chunk(size, &mut events)?;
        }
        Ok(events)
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>> {
        let received = self.mel.received();
        if received > 0
            && let Err(e) = self.session.check_long_enough(received)
        {
            self.reset();
            return Err(e);
        }
        self.ended = Some(received);
        let mut events = Vec::new();
        if received > 0 {
            let rest = self.mel.finish();
            self.features.extend(rest);
            // NeMo's buffer holds the preprocessor's output including its frame past the
            // valid ones, which the preprocessor zeroes.
            self.features.extend(std::iter::repeat_n(0.0, self.n_mels));
            let end = self.frames_held();
            while self.next < end {
                let (size, _) = self.sizes();
                let new = size.min(end - self.next);
                // A tail shorter than one subsampling step is never encoded.
                let least = if self.step == 0 {
                    1
                } else {
                    self.session.model().hparams().encoder.subsampling_factor
                };
                if new < least {
                    break;
                }
                self.run_chunk(new, &mut events)?;
            }
        }
        if !self.tokens.is_empty() {
            events.push(StreamEvent::Final(self.utterance()));
        }
        self.reset();
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(ids: &[usize]) -> Vec<Token> {
        ids.iter()
            .enumerate()
            .map(|(frame, &id)| Token {
                id,
                frame,
                duration: 0,
            })
            .collect()
    }

    #[test]
    fn an_end_marker_ends_the_utterance_and_is_not_part_of_it() {
        let ids = |t: &[Token]| t.iter().map(|t| t.id).collect::<Vec<_>>();
        let (kept, ended) = end_of_utterance(tokens(&[5, 7, 9]), &[99, 100]);
        assert_eq!((ids(&kept), ended), (vec![5, 7, 9], false));
        let (kept, ended) = end_of_utterance(tokens(&[5, 99, 7]), &[99, 100]);
        assert_eq!((ids(&kept), ended), (vec![5, 7], true));
        assert_eq!(kept[1].frame, 2, "tokens keep their frames");
        let (kept, ended) = end_of_utterance(tokens(&[100]), &[99, 100]);
        assert_eq!((ids(&kept), ended), (vec![], true));
        let (kept, ended) = end_of_utterance(tokens(&[]), &[]);
        assert_eq!((ids(&kept), ended), (vec![], false));
    }
}
