//! The whole pipeline, one function per stage: samples -> features -> encoder -> decoder ->
//! text. One [`Transcriber`] holds the model and the persistent backend for a whole batch.

use crate::audio::mel::{Features, MelConfig, log_mel};
use crate::backend::Backend;
use crate::decoder::{Token, TransducerDecoder, Word, ctc_greedy, detokenize, words};
use crate::encoder::{Encoded, encode};
use crate::model::Model;
use anyhow::{Result, bail};
use std::path::Path;
use std::time::{Duration, Instant};

/// Which head decodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DecoderChoice {
    /// The model's transducer (TDT / RNN-T), or CTC for CTC-only models.
    #[default]
    Auto,
    /// TDT or RNN-T (whichever the model has).
    Tdt,
    /// The CTC head (CTC and hybrid models).
    Ctc,
}

/// Where the time went for one utterance.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    pub features: Duration,
    pub encoder: Duration,
    pub decoder: Duration,
    /// Joint evaluations and prediction-net updates (transducers), graphs computed.
    pub decoder_steps: u64,
    pub predictor_steps: u64,
    pub decoder_graphs: u64,
}

/// The result for one utterance.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    pub text: String,
    pub tokens: Vec<Token>,
    /// Token pieces, parallel to `tokens`.
    pub pieces: Vec<String>,
    pub words: Vec<Word>,
    /// Seconds of audio (16 kHz samples / 16000).
    pub audio_seconds: f64,
    pub times: StageTimes,
}

pub struct Transcriber {
    pub model: Model,
    pub backend: Backend,
    mel: MelConfig,
    max_chunk_seconds: f64,
}

impl StageTimes {
    /// Accumulate another utterance's (or piece's) times.
    pub fn add(&mut self, o: &StageTimes) {
        self.features += o.features;
        self.encoder += o.encoder;
        self.decoder += o.decoder;
        self.decoder_steps += o.decoder_steps;
        self.predictor_steps += o.predictor_steps;
        self.decoder_graphs += o.decoder_graphs;
    }
}

/// Default longest piece encoded at once: 5 minutes (about 2.3 GiB of attention scores for an
/// 8-head model).
pub const DEFAULT_MAX_CHUNK_SECONDS: f64 = 300.0;

impl Transcriber {
    pub fn new(model: Model, threads: usize) -> Result<Transcriber> {
        let backend = Backend::cpu(threads)?;
        let pp = &model.hparams.preprocessor;
        let mel = MelConfig {
            n_fft: pp.n_fft,
            win_length: pp.win_length,
            hop_length: pp.hop_length,
            n_mels: pp.n_mels,
            preemph: pp.preemph,
            log_zero_guard: pp.log_zero_guard,
        };
        Ok(Transcriber {
            model,
            backend,
            mel,
            max_chunk_seconds: DEFAULT_MAX_CHUNK_SECONDS,
        })
    }

    pub fn load(path: &Path, threads: usize) -> Result<Transcriber> {
        Transcriber::new(Model::load(path)?, threads)
    }

    pub fn sample_rate(&self) -> u32 {
        self.model.hparams.preprocessor.sample_rate
    }

    /// NeMo's normalised log-mel features of 16 kHz mono samples.
    pub fn features(&self, samples: &[f32]) -> Features {
        log_mel(
            samples,
            &self.model.window,
            &self.model.filterbank,
            &self.mel,
        )
    }

    /// The encoder graph over `features`.
    pub fn encode(&mut self, features: &Features, capture_layers: bool) -> Result<Encoded> {
        encode(&mut self.backend, &self.model, features, capture_layers)
    }

    /// Greedy decoding of an encoder pass.
    pub fn decode(
        &mut self,
        enc: &Encoded,
        choice: DecoderChoice,
    ) -> Result<(Vec<Token>, StageTimes)> {
        let mut times = StageTimes::default();
        let graphs_before = self.backend.stats().graphs_computed;
        let use_ctc = match choice {
            DecoderChoice::Ctc => true,
            DecoderChoice::Tdt => false,
            DecoderChoice::Auto => !self.model.hparams.model_type.has_transducer(),
        };
        let tokens = if use_ctc {
            let Some(logits) = &enc.ctc_logits else {
                bail!(
                    "{}: this model has no CTC head (it is {})",
                    self.model.path.display(),
                    self.model.hparams.model_type.name()
                );
            };
            ctc_greedy(logits, self.model.hparams.vocab_size + 1)
        } else {
            let Some(joint_enc) = &enc.joint_enc else {
                bail!(
                    "{}: this model has no transducer decoder (it is {}); use --decoder ctc",
                    self.model.path.display(),
                    self.model.hparams.model_type.name()
                );
            };
            let mut dec = TransducerDecoder::new(&self.model)?;
            let tokens = dec.decode(&mut self.backend, joint_enc, enc.frames, None)?;
            times.decoder_steps = dec.joint_steps;
            times.predictor_steps = dec.predictor_steps;
            tokens
        };
        times.decoder_graphs = self.backend.stats().graphs_computed - graphs_before;
        Ok((tokens, times))
    }

    /// Longest stretch of audio encoded in one piece (seconds). Full attention is quadratic
    /// in length, so longer audio is cut at quiet points into pieces of at most this length,
    /// each transcribed on its own (NeMo would attend over the whole file; results near a cut
    /// can differ). Audio up to this length is processed exactly as NeMo does.
    pub fn set_max_chunk_seconds(&mut self, seconds: f64) {
        self.max_chunk_seconds = seconds.max(1.0);
    }

    /// Transcribe 16 kHz mono samples.
    pub fn transcribe(&mut self, samples: &[f32], choice: DecoderChoice) -> Result<Transcript> {
        let audio_seconds = samples.len() as f64 / self.sample_rate() as f64;
        let max_len = (self.max_chunk_seconds * self.sample_rate() as f64) as usize;
        let mut tokens = Vec::new();
        let mut times = StageTimes::default();
        for piece in chunk_bounds(samples, max_len) {
            // Pieces start on an encoder-frame boundary, so frames just add up.
            let frame0 = piece.start / SAMPLES_PER_FRAME;
            let (piece_tokens, t) = self.transcribe_piece(&samples[piece], choice)?;
            tokens.extend(piece_tokens.into_iter().map(|mut tok| {
                tok.frame += frame0;
                tok
            }));
            times.add(&t);
        }
        let vocab = &self.model.vocab;
        Ok(Transcript {
            text: detokenize(vocab, tokens.iter().map(|t| t.id)),
            pieces: tokens
                .iter()
                .map(|t| vocab.get(t.id).cloned().unwrap_or_default())
                .collect(),
            words: words(vocab, &tokens),
            tokens,
            audio_seconds,
            times,
        })
    }

    /// Features, encoder and decoder over one piece of audio.
    fn transcribe_piece(
        &mut self,
        samples: &[f32],
        choice: DecoderChoice,
    ) -> Result<(Vec<Token>, StageTimes)> {
        let t0 = Instant::now();
        let features = self.features(samples);
        if features.n_frames == 0 {
            bail!(
                "audio too short ({:.3} s): nothing to transcribe",
                samples.len() as f64 / self.sample_rate() as f64
            );
        }
        let t1 = Instant::now();
        let enc = self.encode(&features, false)?;
        let t2 = Instant::now();
        let (tokens, mut times) = self.decode(&enc, choice)?;
        times.features = t1 - t0;
        times.encoder = t2 - t1;
        times.decoder = t2.elapsed();
        Ok((tokens, times))
    }
}

/// Samples per encoder frame: 8 hops of 160.
const SAMPLES_PER_FRAME: usize = 1280;

/// Where long audio is cut: pieces of at most `max_len` samples, each ending (except the last)
/// in the quietest encoder frame of its final fifth (at most 10 s), on a frame boundary.
pub fn chunk_bounds(samples: &[f32], max_len: usize) -> Vec<std::ops::Range<usize>> {
    let max_len = (max_len / SAMPLES_PER_FRAME).max(1) * SAMPLES_PER_FRAME;
    let search = (max_len / 5).min(160_000) / SAMPLES_PER_FRAME;
    let mut out = Vec::new();
    let mut start = 0;
    while samples.len() - start > max_len {
        let last = start + max_len; // a frame boundary
        let energy = |f: usize| -> f64 {
            let a = last - (f + 1) * SAMPLES_PER_FRAME;
            samples[a..a + SAMPLES_PER_FRAME]
                .iter()
                .map(|&x| (x as f64) * (x as f64))
                .sum()
        };
        // The quietest frame among the last `search` frames; the cut goes after it.
        let quietest = (0..search.max(1))
            .min_by(|&a, &b| energy(a).total_cmp(&energy(b)))
            .unwrap_or(0);
        let end = last - quietest * SAMPLES_PER_FRAME;
        out.push(start..end);
        start = end;
    }
    out.push(start..samples.len());
    out
}
