//! The whole pipeline, one function per stage: samples -> features -> encoder -> decoder ->
//! text, run by a [`Session`]: a backend with its graph allocator over a shared, read-only
//! [`Model`] (whisper.cpp's state over its context, llama.cpp's context over its model).
//! A process holds one model and as many sessions as it runs utterances at once (the server,
//! one per worker).

use crate::audio::mel::{Features, MelConfig, log_mel};
use crate::backend::{Backend, Stats};
use crate::decoder::beam::{BeamHead, NBest, ctc_beam, transducer_beam};
use crate::decoder::boosting::BoostingTree;
use crate::decoder::confidence::{ConfidenceConfig, ctc_frames};
use crate::decoder::ctc::{ctc_greedy, ctc_greedy_boosted, log_softmax_rows};
use crate::decoder::greedy::{GreedyTransducer, Step};
use crate::decoder::hypothesis::Hypothesis;
use crate::decoder::nets::InputGates;
use crate::encoder::{
    AttentionChoice, Encoded, EncoderState, FeatureImage, Outputs, encode, encode_heads,
};
use crate::error::{Error, Result};
use crate::hparams::Attention;
use crate::model::Model;
use crate::tokenizer::{Token, TokenClock};
use crate::transcript::{Alternative, DecodingSummary, StageTimes, Transcript};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub mod options;
pub mod pipeline;
mod speech;

pub use options::{
    BeamPlan, BeamRequest, DecodeOptions, DecodeRequest, DecoderChoice, Device, DeviceArg,
    DeviceRequest, Head, MAX_BEAM_SIZE, MAX_MAES_BEAM_SIZE, Progress, SpeechPlan, SpeechRequest,
    Threads,
};

/// What decoding an encoder pass gives.
pub struct Decoded {
    pub tokens: Vec<Token>,
    /// NeMo's token confidence, when the session computes it.
    pub token_confidence: Option<Vec<f64>>,
    /// A beam search's N best, best first (`tokens` are the first's); empty for greedy.
    pub alternatives: Vec<NBest>,
    pub times: StageTimes,
}

/// One backend and its graph allocator running utterances of a shared model, one at a time.
///
/// Per utterance it starts a fresh [`EncoderState`] and a fresh decoder hypothesis: each file
/// is one chunk. How an utterance is decoded is the call's [`DecodeOptions`]: nothing of one
/// request stays in the session for the next.
pub struct Session {
    /// Read-only, so one model can serve several sessions (each with its own backend).
    model: Arc<Model>,
    backend: Backend,
    /// What decoding keeps per token (the transducer's first-layer input products): this
    /// session's, as its backend is, so that the shared model stays read-only.
    input_gates: InputGates,
    mel: MelConfig,
    /// Speech detection, made on first use (a backend of its own, as small as its model).
    vad: Option<crate::vad::Vad>,
}

/// Longest utterance [`Session::load_for`] readies the compute buffer for (a header may
/// declare anything; a longer file grows the buffer when it runs, as without preparing).
const PREPARE_MAX_SECONDS: f64 = 120.0;

/// The encoder graphs of an utterance of `seconds` (zero features), allocated, not computed.
fn prepare_encoder(backend: &mut Backend, model: &Model, seconds: f64) -> crate::error::Result<()> {
    let hp = model.hparams();
    if !seconds.is_finite() || seconds <= 0.0 {
        return Ok(());
    }
    let samples = (seconds * hp.preprocessor.sample_rate as f64) as usize;
    // As `MelConfig::n_frames`.
    let n_frames = samples / hp.preprocessor.hop_length.max(1);
    let features = Features {
        data: vec![0.0; n_frames * hp.encoder.feat_in],
        n_mels: hp.encoder.feat_in,
        n_frames,
    };
    let outputs = if model.transducer().is_some() {
        Outputs::JointEnc
    } else {
        Outputs::CtcLogits
    };
    let attention = AttentionChoice::Auto.resolve(
        hp.encoder.attention,
        hp.geometry().encoded_len(n_frames),
        hp.geometry().frame_seconds(),
    );
    let chunk = FeatureImage::from(&features);
    backend.prepare(|b| {
        encode(
            b,
            model,
            &mut EncoderState::new(),
            chunk,
            attention,
            outputs,
        )
        .map(|_| ())
    })
}

/// Compute buffer kept between utterances (a 0.6b encoder pass over 30 s needs about this).
const KEEP_COMPUTE_BUFFER_BYTES: usize = 256 << 20;

impl Session {
    /// A session over a model shared with others, with its own backend and allocator.
    pub fn new(model: Arc<Model>, threads: Threads) -> Result<Session> {
        if !model.hparams().model_type.is_asr() {
            return Err(Error::Model(format!(
                "{} is a Sortformer diarization model, not a speech recognition model (use \
                 `parakeet diarize`)",
                model.shown()
            )));
        }
        let mut backend = Backend::new(model.device(), threads.get())?;
        backend.set_lowering(model.lowering());
        backend.set_device_weight_bytes(model.device_weight_bytes());
        let mel = model.hparams().preprocessor.mel_config();
        Ok(Session {
            input_gates: InputGates::for_model(&model),
            model,
            backend,
            mel,
            vad: None,
        })
    }

    /// Loads the model at `path` and opens a session over it.
    pub fn load(path: &Path, threads: Threads) -> Result<Session> {
        Session::load_for(path, threads, None)
    }

    /// [`Session::load`], also readying the compute buffer for an utterance of
    /// `expect_seconds` ([`Session::prepare`]) while another thread maps the weights' pages.
    pub fn load_for(path: &Path, threads: Threads, expect_seconds: Option<f64>) -> Result<Session> {
        Session::ready(Model::load(path)?, threads, expect_seconds)
    }

    /// A session over a loaded `model`, its compute buffer readied as [`Session::load_for`]'s.
    pub fn ready(model: Model, threads: Threads, expect_seconds: Option<f64>) -> Result<Session> {
        let mut session = Session::new(Arc::new(model), threads)?;
        let Session { model, backend, .. } = &mut session;
        std::thread::scope(|s| {
            s.spawn(|| model.file().populate());
            if let Some(seconds) = expect_seconds {
                // A hint: an utterance the buffer cannot be readied for fails (or not) on its
                // own, with its own error, when it is transcribed.
                let _ = prepare_encoder(backend, model, seconds.min(PREPARE_MAX_SECONDS));
            }
        });
        Ok(session)
    }

    /// The transducer's first-layer input products this session's decoding has kept.
    pub fn input_gates(&self) -> &InputGates {
        &self.input_gates
    }

    /// The model this session runs (shared: clone the `Arc` to open another session on it).
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Grows the compute buffer to what an utterance of `seconds` needs and writes every page
    /// of it once, so that the first utterance does not pay for fresh memory (the graphs are
    /// built and allocated, not computed). Later utterances of up to that length reuse it.
    pub fn prepare(&mut self, seconds: f64) -> Result<()> {
        prepare_encoder(&mut self.backend, &self.model, seconds)
    }

    pub fn sample_rate(&self) -> u32 {
        self.model.hparams().preprocessor.sample_rate
    }

    /// NeMo's normalised log-mel features of 16 kHz mono samples.
    pub fn features(&self, samples: &[f32]) -> Features {
        log_mel(
            samples,
            self.model.window(),
            self.model.filterbank(),
            &self.mel,
        )
    }

    /// A whole file's encoder state (in layer time slices of `slice` frames, a test's).
    fn whole_file_state(slice: Option<usize>) -> EncoderState {
        let mut state = EncoderState::new();
        if let Some(frames) = slice {
            state.set_layer_slice(frames);
        }
        state
    }

    /// The backend's counters: graphs computed, compute buffer, node times.
    pub fn stats(&self) -> &Stats {
        self.backend.stats()
    }

    /// Bytes of the compute buffer as allocated now (0 before the first graph).
    pub fn compute_buffer_bytes(&self) -> usize {
        self.backend.compute_buffer_bytes()
    }

    /// Threads each compute runs on.
    pub fn threads(&self) -> usize {
        self.backend.threads()
    }

    /// The backend's device, as ggml names it.
    pub fn device_name(&self) -> String {
        self.backend.device_name()
    }

    /// How this session's graphs are lowered (its model's choice).
    pub fn lowering(&self) -> crate::backend::Lowering {
        self.backend.lowering()
    }

    /// The self-attention an utterance of `feature_frames` feature frames gets by `choice`.
    pub fn attention_for(&self, feature_frames: usize, choice: AttentionChoice) -> Attention {
        let geometry = self.model.hparams().geometry();
        choice.resolve(
            self.model.hparams().encoder.attention,
            geometry.encoded_len(feature_frames),
            geometry.frame_seconds(),
        )
    }

    /// The encoder graph over `features` as one chunk, with the model's own attention
    /// ([`AttentionChoice::Auto`]), the last layer's output and every head the model has;
    /// `capture_layers` adds every layer's output (and layer 0's sub-blocks) from the same
    /// graph.
    pub fn encode(&mut self, features: &Features, capture_layers: bool) -> Result<Encoded> {
        self.encode_with(features, capture_layers, AttentionChoice::Auto)
    }

    /// [`encode`](Self::encode) with the self-attention `choice` picks.
    pub fn encode_with(
        &mut self,
        features: &Features,
        capture_layers: bool,
        choice: AttentionChoice,
    ) -> Result<Encoded> {
        self.encode_sliced(features, capture_layers, choice, None)
    }

    /// Test hook: [`encode_with`](Self::encode_with) with whole-file layers under local
    /// attention in time slices of `slice` frames (a multiple of 32), as long files run.
    #[doc(hidden)]
    pub fn encode_sliced(
        &mut self,
        features: &Features,
        capture_layers: bool,
        choice: AttentionChoice,
        slice: Option<usize>,
    ) -> Result<Encoded> {
        let attention = self.attention_for(features.n_frames, choice);
        let outputs = Outputs::All {
            layers: capture_layers,
        };
        let mut state = Session::whole_file_state(slice);
        encode(
            &mut self.backend,
            &self.model,
            &mut state,
            features.into(),
            attention,
            outputs,
        )
    }

    /// The front end's settings (the model's `preprocessor`).
    /// The one "too short" rule, for a whole file and a stream alike: `samples` samples give
    /// no feature frame (fewer than a hop, 10 ms), so there is nothing to transcribe.
    pub fn check_long_enough(&self, samples: usize) -> Result<()> {
        if self.mel_config().n_frames(samples) == 0 {
            return Err(too_short(samples, self.sample_rate()));
        }
        Ok(())
    }

    pub fn mel_config(&self) -> &MelConfig {
        &self.mel
    }

    /// One chunk of a cache-aware stream (or a whole file from a fresh `state`) through the
    /// encoder with `attention`, returning `outputs`; `state` keeps the stream's caches.
    pub fn encode_chunk(
        &mut self,
        state: &mut EncoderState,
        chunk: FeatureImage,
        attention: Attention,
        outputs: Outputs,
    ) -> Result<Encoded> {
        encode(
            &mut self.backend,
            &self.model,
            state,
            chunk,
            attention,
            outputs,
        )
    }

    /// Greedy transducer decoding of a stream's next chunk (`joint_enc`, `[frames][joint
    /// hidden]`) from `hyp` (`None`: the stream's start). The new tokens are in the returned
    /// hypothesis, their frames counted from the chunk's start.
    pub fn continue_greedy(
        &mut self,
        hyp: Option<Hypothesis>,
        joint_enc: &[f32],
        frames: usize,
    ) -> Result<Hypothesis> {
        let (hyp, _) = self.continue_greedy_with(hyp, joint_enc, frames, None, None)?;
        Ok(hyp)
    }

    /// [`continue_greedy`](Self::continue_greedy) with phrase boosting from a tree state
    /// (left where the chunk ended) and, with `confidence`, the confidence of each token the
    /// chunk added (blanks counted within the chunk only).
    pub fn continue_greedy_with(
        &mut self,
        hyp: Option<Hypothesis>,
        joint_enc: &[f32],
        frames: usize,
        boost: Option<(&BoostingTree, &mut u32)>,
        confidence: Option<ConfidenceConfig>,
    ) -> Result<(Hypothesis, Vec<f64>)> {
        let mut search = GreedyTransducer::new(&self.model, &mut self.input_gates)?;
        search.set_confidence(confidence);
        let mut hyp = match hyp {
            Some(h) => h,
            None => search.start(&mut self.backend)?,
        };
        let before = hyp.tokens().len();
        search.resume(&mut self.backend, joint_enc, frames, &mut hyp, boost)?;
        let scores = match confidence {
            Some(c) => {
                let hp = &self.model.hparams();
                let tdt = hp
                    .transducer
                    .as_ref()
                    .is_some_and(|t| !t.durations.is_empty());
                let steps = search.take_steps();
                c.transducer_tokens(&steps, &hyp.tokens()[before..], hp.blank_id(), frames, tdt)
            }
            None => Vec::new(),
        };
        Ok((hyp, scores))
    }

    /// The decoder-side heads over an encoder output computed elsewhere (e.g. NeMo's
    /// `encoder_out`, for teacher-forced decoder tests): `output` is `[frames][d_model]`.
    pub fn encode_heads(&mut self, output: &[f32], frames: usize) -> Result<Encoded> {
        encode_heads(&mut self.backend, &self.model, output, frames)
    }

    /// The encoder output the head `choice` decodes, or why this model has none.
    pub fn head(&self, choice: DecoderChoice) -> Result<Outputs> {
        Ok(Head::of(&self.model, choice)?.outputs())
    }

    /// What [`transcribe`](Self::transcribe) reports of its decoding by `opts`.
    fn summary(&self, opts: &DecodeOptions) -> DecodingSummary {
        let beam = opts.beam();
        let boosting = opts.boosting();
        DecodingSummary {
            head: opts.head().name(),
            strategy: beam.map_or("greedy_batch".into(), |b| b.config().strategy().to_string()),
            beam_size: beam.map_or(1, |b| b.config().beam_size()),
            boosted_phrases: boosting.map_or(0, |t| t.phrases()),
            boosting_alpha: boosting.map_or(0.0, |t| t.alpha()),
            confidence: opts
                .confidence()
                .map(|c| (c.measure.to_string(), c.alpha, c.aggregation.name())),
        }
    }

    /// Decoding of an encoder pass by `opts`: greedy, or its beam search.
    pub fn decode(&mut self, enc: &Encoded, opts: &DecodeOptions) -> Result<Decoded> {
        self.decode_with(enc, opts, None)
    }

    /// Greedy transducer decoding of an encoder pass, recording every step into `trace` (the
    /// fields of NeMo's `decode_trace.json`).
    pub fn decode_traced(&mut self, enc: &Encoded, trace: &mut Vec<Step>) -> Result<Vec<Token>> {
        let opts = DecodeOptions::new(
            &self.model,
            &DecodeRequest::with_decoder(DecoderChoice::Tdt),
        )?;
        self.decode_with(enc, &opts, Some(trace)).map(|d| d.tokens)
    }

    fn decode_with(
        &mut self,
        enc: &Encoded,
        opts: &DecodeOptions,
        trace: Option<&mut Vec<Step>>,
    ) -> Result<Decoded> {
        let mut times = StageTimes::default();
        let graphs_before = self.backend.stats().graphs_computed;
        if let Some(plan) = opts.beam() {
            let mut nbest = self.decode_beam(enc, opts)?;
            nbest.truncate(plan.nbest());
            times.decoder_graphs = self.backend.stats().graphs_computed - graphs_before;
            let tokens = nbest.first().map(|b| b.tokens.clone()).unwrap_or_default();
            return Ok(Decoded {
                tokens,
                token_confidence: None,
                alternatives: nbest,
                times,
            });
        }
        let missing = || Error::Internal("the encoder pass lacks the decoder's head".into());
        let vocab = self.model.hparams().vocab_size;
        let blank = self.model.hparams().blank_id();
        let boost = opts.boosting().map(|t| &**t);
        if let Some(tree) = boost
            && tree.vocab_size() != vocab
        {
            return Err(Error::Options(format!(
                "the boosting phrases were tokenised for a {}-piece vocabulary; this model has {vocab}",
                tree.vocab_size()
            )));
        }
        let confidence = opts.confidence().copied();
        let (tokens, token_confidence) = if opts.head() == Head::Ctc {
            let logits = enc.ctc_logits.as_ref().ok_or_else(missing)?;
            let classes = vocab + 1;
            let tokens = match boost {
                Some(tree) => ctc_greedy_boosted(logits, classes, tree),
                None => ctc_greedy(logits, classes),
            };
            let confidence = confidence.map(|c| {
                let (frame_confidence, frame_labels) = ctc_frames(&c, logits, classes);
                c.ctc_tokens(&frame_confidence, &frame_labels, &tokens, blank)
            });
            (tokens, confidence)
        } else {
            let joint_enc = enc.joint_enc.as_ref().ok_or_else(missing)?;
            let mut search = GreedyTransducer::new(&self.model, &mut self.input_gates)?;
            search.set_confidence(confidence);
            if let Some(p) = opts.progress().cloned() {
                search.set_progress(Some(Box::new(move |done| p("decoder", done))));
            }
            let tokens = search.decode(&mut self.backend, joint_enc, enc.frames, boost, trace)?;
            let counts = search.counts();
            times.decoder_steps = counts.joint_steps;
            times.predictor_steps = counts.predictor_steps;
            let tdt = opts.head() == Head::Tdt;
            let steps = search.take_steps();
            let confidence =
                confidence.map(|c| c.transducer_tokens(&steps, &tokens, blank, enc.frames, tdt));
            (tokens, confidence)
        };
        times.decoder_graphs = self.backend.stats().graphs_computed - graphs_before;
        Ok(Decoded {
            tokens,
            token_confidence,
            alternatives: Vec::new(),
            times,
        })
    }

    /// The beam search of `opts` over an encoder pass: NeMo's whole N-best list, best first
    /// (a transcript keeps `nbest` of it). Its phrases, if any, are boosted (the strategies
    /// that can boost were checked when the options were built).
    pub fn decode_beam(&mut self, enc: &Encoded, opts: &DecodeOptions) -> Result<Vec<NBest>> {
        let missing = || Error::Internal("the encoder pass lacks the decoder's head".into());
        let plan = opts
            .beam()
            .ok_or_else(|| Error::Internal("a beam search without a beam plan".into()))?;
        let cfg = plan.config();
        let model = &self.model;
        let boost = opts.boosting().map(|t| &**t);
        let nbest = match opts.head() {
            Head::Ctc => {
                let classes = model.hparams().vocab_size + 1;
                let logits = enc.ctc_logits.as_ref().ok_or_else(missing)?;
                ctc_beam(&log_softmax_rows(logits, classes), classes, cfg, boost)?
            }
            head => {
                let head = if head == Head::Tdt {
                    BeamHead::Tdt
                } else {
                    BeamHead::Rnnt
                };
                cfg.check(head)?;
                let joint_enc = enc.joint_enc.as_ref().ok_or_else(missing)?;
                transducer_beam(
                    &mut self.backend,
                    model,
                    &mut self.input_gates,
                    joint_enc,
                    enc.frames,
                    cfg,
                    boost,
                )?
            }
        };
        Ok(nbest)
    }

    /// Transcribe 16 kHz mono samples by `opts`: the whole file in one encoder pass and one
    /// decoder pass (local attention keeps long files linear in time and memory), or with
    /// speech detection each speech segment so. The samples are taken by value so that an
    /// hour of audio is freed once its features exist. The call's progress and node timing
    /// are `opts`' too.
    pub fn transcribe(&mut self, samples: Vec<f32>, opts: &DecodeOptions) -> Result<Transcript> {
        self.backend.set_op_timing(opts.op_timing());
        match opts.speech() {
            Some(speech) => self.transcribe_speech(samples, opts, speech),
            None => self.transcribe_whole(samples, opts),
        }
    }

    /// All of `samples` as one utterance.
    fn transcribe_whole(&mut self, samples: Vec<f32>, opts: &DecodeOptions) -> Result<Transcript> {
        let audio_seconds = samples.len() as f64 / self.sample_rate() as f64;
        let (decoded, attention) = self.run_stages(samples, opts)?;
        let Decoded {
            tokens,
            token_confidence,
            alternatives,
            times,
        } = decoded;
        let tokenizer = self.model.tokenizer();
        let clock = TokenClock {
            frame_seconds: self.model.hparams().geometry().frame_seconds(),
            tdt_durations: opts.head() == Head::Tdt,
            audio_seconds,
        };
        let mut words = tokenizer.words(&tokens, &clock);
        if let (Some(c), Some(tc)) = (opts.confidence(), &token_confidence) {
            let groups = tokenizer.word_groups(&tokens);
            for (word, conf) in words.iter_mut().zip(c.words(&groups, tc)) {
                word.confidence = Some(conf as f32);
            }
        }
        Ok(Transcript {
            text: tokenizer.detokenize(tokens.iter().map(|t| t.id)),
            pieces: tokens
                .iter()
                .map(|t| tokenizer.piece(t.id).unwrap_or_default().to_owned())
                .collect(),
            words,
            token_confidence: token_confidence.map(|tc| tc.into_iter().map(|c| c as f32).collect()),
            decoding: self.summary(opts),
            alternatives: alternatives
                .into_iter()
                .map(|b| Alternative {
                    text: tokenizer.detokenize(b.tokens.iter().map(|t| t.id)),
                    tokens: b.tokens,
                    score: b.score,
                })
                .collect(),
            tokens,
            audio_seconds,
            frame_seconds: clock.frame_seconds,
            tdt_durations: clock.tdt_durations,
            attention,
            times,
            speech: None,
        })
    }

    /// Features, encoder and decoder over one utterance. Each stage's input is dropped as soon
    /// as the next stage has what it needs, and the encoder returns only the head the decoder
    /// reads: for a long file these are each hundreds of MB.
    fn run_stages(
        &mut self,
        samples: Vec<f32>,
        opts: &DecodeOptions,
    ) -> Result<(Decoded, Attention)> {
        let outputs = opts.head().outputs();
        let t0 = Instant::now();
        report(opts, "features", 0.0);
        self.check_long_enough(samples.len())?;
        let features = self.features(&samples);
        drop(samples);
        let attention = self.attention_for(features.n_frames, opts.attention());
        let chunk = FeatureImage::from(&features);
        drop(features);
        let t1 = Instant::now();
        if let Some(p) = opts.progress().cloned() {
            self.backend
                .set_progress(Some(Box::new(move |done| p("encoder", done))));
        }
        let mut state = Session::whole_file_state(opts.layer_slice());
        let enc = encode(
            &mut self.backend,
            &self.model,
            &mut state,
            chunk,
            attention,
            outputs,
        );
        self.backend.set_progress(None);
        let enc = enc?;
        report(opts, "decoder", 0.0);
        // A long file grew the compute buffer to its encoder's size; the decoder's graphs and
        // the next (shorter) files need far less.
        self.backend
            .release_compute_buffer(KEEP_COMPUTE_BUFFER_BYTES)?;
        let t2 = Instant::now();
        let mut decoded = self.decode(&enc, opts)?;
        let times = &mut decoded.times;
        times.features = t1 - t0;
        times.encoder = t2 - t1;
        times.decoder = t2.elapsed();
        Ok((decoded, attention))
    }
}

/// Tells `opts`' progress, if any, how far `stage` is.
fn report(opts: &DecodeOptions, stage: &'static str, done: f64) {
    if let Some(p) = opts.progress() {
        p(stage, done);
    }
}

/// The one "too short" rule: audio shorter than one feature frame (a hop, 10 ms) has nothing
/// to transcribe.
fn too_short(samples: usize, rate: u32) -> Error {
    Error::Audio(format!(
        "audio too short ({:.3} s, {samples} samples at {rate} Hz): nothing to transcribe",
        samples as f64 / rate as f64
    ))
}
