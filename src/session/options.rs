//! A request's decoding choices as one value: [`DecodeRequest`] is what a front end was given
//! (command-line flags, form fields, Python keyword arguments), [`DecodeOptions::new`] the one
//! function that checks it against a model, and a [`DecodeOptions`] what a [`Session`] decodes
//! with, per call. Every range lives here, so the command line, the server and Python refuse
//! the same values with the same words; nothing a request can ask for reaches a graph unchecked.
//!
//! [`Session`]: super::Session

use crate::decoder::beam::{BeamConfig, BeamHead, BeamStrategy};
use crate::decoder::boosting::{BoostingConfig, BoostingTree, PhraseTrie};
use crate::decoder::confidence::{ConfidenceConfig, Measure};
use crate::encoder::{AttentionChoice, Outputs};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::vad::{SpeechParams, VadModel};
use std::num::NonZeroUsize;
use std::ops::RangeInclusive;
use std::sync::Arc;

pub use crate::backend::{Device, DeviceRequest};

/// `--device`, as every command that runs a model takes it.
#[derive(Clone, Copy, Debug, Default, clap::Args)]
pub struct DeviceArg {
    /// Device that computes: auto (the first GPU this build can use, else the CPU), cpu,
    /// vulkan[:N], cuda[:N] or metal (each GPU backend is a cargo feature of that name;
    /// `parakeet info --system` lists the devices this build sees).
    #[arg(long, value_name = "DEVICE", default_value = "auto")]
    pub device: DeviceRequest,
}

impl DeviceArg {
    /// The registry device asked for, or the user error saying why there is none.
    pub fn resolve(self) -> Result<Device> {
        self.device.resolve()
    }
}

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

pub use crate::backend::Threads;
pub use crate::decoder::beam::{MAX_BEAM_SIZE, MAX_MAES_BEAM_SIZE};

/// The finite ranges of the phrase-boosting weights. The boost is `alpha` times a bonus of
/// `context_score` (scaled by `depth_scaling` and the depth's log) per matched piece: at the
/// top of these ranges a phrase's pieces gain hundreds of log-probability units, which
/// already overrules any acoustic evidence; beyond them the scores lose their precision
/// (f32) and the searches their candidates.
pub const BOOST_ALPHA_RANGE: RangeInclusive<f32> = 0.0..=10.0;
pub const BOOST_CONTEXT_SCORE_RANGE: RangeInclusive<f32> = 0.0..=10.0;
pub const BOOST_DEPTH_SCALING_RANGE: RangeInclusive<f32> = 0.0..=10.0;
pub const BOOST_UNK_SCORE_RANGE: RangeInclusive<f32> = -10.0..=10.0;
pub const BOOST_SCORE_PER_PHRASE_RANGE: RangeInclusive<f32> = 0.0..=100.0;

/// A request for a beam search, as given.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamRequest {
    /// Hypotheses kept (`--beam`).
    pub size: usize,
    /// NeMo's strategy (`--beam-strategy`); `None`: NeMo's default for the head.
    pub strategy: Option<BeamStrategy>,
    /// Hypotheses kept as the transcript's alternatives (`--nbest`).
    pub nbest: usize,
    /// Rank by score per emitted token (NeMo's `score_norm`).
    pub score_norm: bool,
}

impl BeamRequest {
    /// A beam of `size` with NeMo's default strategy and settings, keeping the best only.
    pub fn new(size: usize) -> BeamRequest {
        BeamRequest {
            size,
            strategy: None,
            nbest: 1,
            score_norm: true,
        }
    }
}

/// A request's decoding choices, as given; [`DecodeOptions::new`] checks them.
#[derive(Clone, Debug, Default)]
pub struct DecodeRequest {
    /// Which head decodes (`--decoder`).
    pub decoder: DecoderChoice,
    /// The encoder's self-attention (`--att-context`).
    pub attention: AttentionChoice,
    /// Token and word confidence (`--confidence*`); `None`: none.
    pub confidence: Option<ConfidenceConfig>,
    /// Phrases to boost with their weights (`--boost*`); `None` or no phrases: none.
    pub boost: Option<BoostingConfig>,
    /// A beam search instead of greedy decoding (`--beam`, `--beam-strategy`, `--nbest`).
    pub beam: Option<BeamRequest>,
    /// Transcribe only the speech voice activity detection finds (`--vad`); `None`: all.
    pub speech: Option<SpeechRequest>,
}

/// A request to transcribe only speech, as given: the speech-segment parameters and the VAD
/// model (`None`: the built-in one).
#[derive(Clone, Default)]
pub struct SpeechRequest {
    pub params: SpeechParams,
    pub model: Option<Arc<VadModel>>,
}

impl std::fmt::Debug for SpeechRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpeechRequest")
            .field("params", &self.params)
            .field(
                "model",
                &self.model.as_ref().map_or("built-in", |_| "given"),
            )
            .finish()
    }
}

/// Speech detection, checked: the parameters in range and the model loaded.
#[derive(Clone)]
pub struct SpeechPlan {
    params: SpeechParams,
    model: Arc<VadModel>,
}

impl SpeechPlan {
    pub fn params(&self) -> &SpeechParams {
        &self.params
    }

    pub fn model(&self) -> &Arc<VadModel> {
        &self.model
    }
}

impl DecodeRequest {
    /// Greedy decoding by the head `decoder`, nothing else.
    pub fn with_decoder(decoder: DecoderChoice) -> DecodeRequest {
        DecodeRequest {
            decoder,
            ..DecodeRequest::default()
        }
    }
}

/// The head an encoder pass must give and the decoder runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    Tdt,
    Rnnt,
    Ctc,
}

impl Head {
    /// The encoder output this head reads.
    pub fn outputs(self) -> Outputs {
        match self {
            Head::Ctc => Outputs::CtcLogits,
            Head::Tdt | Head::Rnnt => Outputs::JointEnc,
        }
    }

    /// The name a transcript reports ("tdt", "rnnt", "ctc").
    pub fn name(self) -> &'static str {
        match self {
            Head::Tdt => "tdt",
            Head::Rnnt => "rnnt",
            Head::Ctc => "ctc",
        }
    }

    fn beam_head(self) -> BeamHead {
        match self {
            Head::Tdt => BeamHead::Tdt,
            Head::Rnnt => BeamHead::Rnnt,
            Head::Ctc => BeamHead::Ctc,
        }
    }

    /// The head `choice` picks on `model`, or why the model has none.
    pub fn of(model: &Model, choice: DecoderChoice) -> Result<Head> {
        let ty = model.hparams().model_type;
        let ctc = match choice {
            DecoderChoice::Ctc => true,
            DecoderChoice::Tdt => false,
            DecoderChoice::Auto => !ty.has_transducer(),
        };
        if ctc && model.ctc().is_none() {
            return Err(Error::Options(format!(
                "--decoder ctc: this model has no CTC head (it is {})",
                ty.name()
            )));
        }
        if !ctc && model.transducer().is_none() {
            return Err(Error::Options(format!(
                "--decoder tdt: this model has no transducer decoder (it is {}); use --decoder ctc",
                ty.name()
            )));
        }
        Ok(if ctc {
            Head::Ctc
        } else if ty.is_tdt() {
            Head::Tdt
        } else {
            Head::Rnnt
        })
    }
}

/// A checked beam search: its size within [`MAX_BEAM_SIZE`], a strategy the head runs, and
/// how many of its hypotheses a transcript keeps (1 to the beam size).
#[derive(Clone, Debug, PartialEq)]
pub struct BeamPlan {
    config: BeamConfig,
    nbest: NonZeroUsize,
}

impl BeamPlan {
    pub fn config(&self) -> &BeamConfig {
        &self.config
    }

    /// Hypotheses a transcript keeps as its alternatives.
    pub fn nbest(&self) -> usize {
        self.nbest.get()
    }
}

/// How one utterance is decoded, checked against a model by [`DecodeOptions::new`]. Cheap to
/// clone (the boosting tree is shared). Options built for one model decode only that model's
/// sessions.
#[derive(Clone)]
pub struct DecodeOptions {
    head: Head,
    attention: AttentionChoice,
    confidence: Option<ConfidenceConfig>,
    boosting: Option<Arc<BoostingTree>>,
    beam: Option<BeamPlan>,
    speech: Option<SpeechPlan>,
    /// This call's choices that leave its result as it is (as whisper.cpp's per-call params
    /// carry its progress callback): how far it is, told to a terminal; node timing for
    /// `--profile`; a test's layer time slice.
    progress: Option<Progress>,
    op_timing: bool,
    layer_slice: Option<usize>,
}

/// Told the stage of the utterance being transcribed ("vad", "features", "encoder",
/// "decoder") and how far it is (0 to 1).
pub type Progress = Arc<dyn Fn(&'static str, f64) + Send + Sync>;

impl std::fmt::Debug for DecodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeOptions")
            .field("head", &self.head)
            .field("attention", &self.attention)
            .field("confidence", &self.confidence)
            .field(
                "boosted_phrases",
                &self.boosting.as_ref().map_or(0, |t| t.phrases()),
            )
            .field("beam", &self.beam)
            .field("speech", &self.speech.as_ref().map(|s| &s.params))
            .field("progress", &self.progress.is_some())
            .field("op_timing", &self.op_timing)
            .finish()
    }
}

impl DecodeOptions {
    /// Checks `request` against `model` and builds what it needs (the boosting tree). Every
    /// error is [`Error::Options`], naming the option as the command line spells it.
    pub fn new(model: &Model, request: &DecodeRequest) -> Result<DecodeOptions> {
        let head = Head::of(model, request.decoder)?;
        let beam = request
            .beam
            .as_ref()
            .map(|b| beam_plan(head, b, model.hparams().vocab_size))
            .transpose()?;
        if let Some(c) = &request.confidence {
            check_confidence(model, head, c, beam.is_some())?;
        }
        let boost = request.boost.as_ref().filter(|b| !b.phrases.is_empty());
        if let (Some(plan), Some(_)) = (&beam, boost) {
            plan.config.check_boosting(true).map_err(Error::options)?;
        }
        let boosting = match boost {
            Some(cfg) => Some(Arc::new(boosting_tree(model, cfg)?)),
            None => None,
        };
        let speech = request
            .speech
            .as_ref()
            .map(|r| speech_plan(r, beam.as_ref()))
            .transpose()?;
        Ok(DecodeOptions {
            head,
            attention: request.attention,
            confidence: request.confidence,
            boosting,
            beam,
            speech,
            progress: None,
            op_timing: false,
            layer_slice: None,
        })
    }

    /// Greedy decoding by the model's own head, nothing else.
    pub fn greedy(model: &Model) -> Result<DecodeOptions> {
        DecodeOptions::new(model, &DecodeRequest::default())
    }

    /// These options with `tree` for the boosting tree, built by the caller from phrases
    /// already checked (a server's phrases plus a request's: [`PhraseTrie`]). Its settings
    /// must be those these options were checked with.
    ///
    /// [`PhraseTrie`]: crate::decoder::boosting::PhraseTrie
    pub fn with_boosting(&self, tree: Arc<BoostingTree>) -> Result<DecodeOptions> {
        if let Some(plan) = &self.beam {
            plan.config.check_boosting(true).map_err(Error::options)?;
        }
        Ok(DecodeOptions {
            boosting: Some(tree),
            ..self.clone()
        })
    }

    /// These options transcribing only the speech `r` finds, checked as [`DecodeOptions::new`]
    /// checks a request's.
    pub fn with_speech(&self, r: &SpeechRequest) -> Result<DecodeOptions> {
        Ok(DecodeOptions {
            speech: Some(speech_plan(r, self.beam.as_ref())?),
            ..self.clone()
        })
    }

    /// These options without confidence (always valid: confidence only restricts).
    pub fn without_confidence(&self) -> DecodeOptions {
        DecodeOptions {
            confidence: None,
            ..self.clone()
        }
    }

    /// These options telling `progress` how far each call is (`None`: nobody).
    pub fn with_progress(&self, progress: Option<Progress>) -> DecodeOptions {
        DecodeOptions {
            progress,
            ..self.clone()
        }
    }

    /// These options timing every graph node by kind (`--profile`; `Session::stats`).
    pub fn with_op_timing(&self, on: bool) -> DecodeOptions {
        DecodeOptions {
            op_timing: on,
            ..self.clone()
        }
    }

    /// Test hook: whole-file encoder layers under local attention run in time slices of
    /// `frames` frames (a multiple of 32) on inputs longer than that, as long files do.
    #[doc(hidden)]
    pub fn with_layer_slice(&self, frames: usize) -> DecodeOptions {
        DecodeOptions {
            layer_slice: Some(frames),
            ..self.clone()
        }
    }

    pub fn progress(&self) -> Option<&Progress> {
        self.progress.as_ref()
    }

    pub fn op_timing(&self) -> bool {
        self.op_timing
    }

    pub fn layer_slice(&self) -> Option<usize> {
        self.layer_slice
    }

    pub fn head(&self) -> Head {
        self.head
    }

    pub fn attention(&self) -> AttentionChoice {
        self.attention
    }

    pub fn confidence(&self) -> Option<&ConfidenceConfig> {
        self.confidence.as_ref()
    }

    pub fn boosting(&self) -> Option<&Arc<BoostingTree>> {
        self.boosting.as_ref()
    }

    pub fn beam(&self) -> Option<&BeamPlan> {
        self.beam.as_ref()
    }

    /// Speech detection, when only speech is transcribed.
    pub fn speech(&self) -> Option<&SpeechPlan> {
        self.speech.as_ref()
    }
}

/// Checks a speech request: the parameters' ranges, and no N-best list (each speech segment
/// has its own: the N best of the whole are not theirs joined).
fn speech_plan(r: &SpeechRequest, beam: Option<&BeamPlan>) -> Result<SpeechPlan> {
    r.params
        .validate()
        .map_err(|e| Error::Options(format!("speech detection: {e:#}")))?;
    if let Some(b) = beam.filter(|b| b.nbest() > 1) {
        return Err(Error::Options(format!(
            "--nbest {} with speech detection: each speech segment has its own N best, so only \
             the best is kept (--nbest 1)",
            b.nbest()
        )));
    }
    let model = match &r.model {
        Some(m) => m.clone(),
        None => builtin_vad()?,
    };
    Ok(SpeechPlan {
        params: r.params.clone(),
        model,
    })
}

/// The built-in VAD model, parsed once per process.
fn builtin_vad() -> Result<Arc<VadModel>> {
    static BUILTIN: std::sync::OnceLock<Arc<VadModel>> = std::sync::OnceLock::new();
    if let Some(m) = BUILTIN.get() {
        return Ok(m.clone());
    }
    let model = VadModel::builtin().map_err(Error::internal)?;
    Ok(BUILTIN.get_or_init(|| model).clone())
}

impl BeamRequest {
    /// The bounds that need no model: the size within 1 to [`MAX_BEAM_SIZE`] and `nbest`
    /// within 1 to the size (a front end checks them before it loads a model;
    /// [`DecodeOptions::new`] checks them again with the rest).
    pub fn check(&self) -> Result<NonZeroUsize> {
        let size = self.size;
        if size == 0 {
            return Err(Error::Options(
                "--beam 0: a beam search keeps at least one hypothesis".into(),
            ));
        }
        if size > MAX_BEAM_SIZE {
            return Err(Error::Options(format!(
                "--beam {size}: at most {MAX_BEAM_SIZE} hypotheses (NeMo's configurations use 2 to 16)"
            )));
        }
        NonZeroUsize::new(self.nbest)
            .filter(|n| n.get() <= size)
            .ok_or_else(|| {
                Error::Options(format!(
                    "--nbest {} must be between 1 and the beam size ({size})",
                    self.nbest
                ))
            })
    }
}

fn beam_plan(head: Head, b: &BeamRequest, vocab: usize) -> Result<BeamPlan> {
    let size = b.size;
    let nbest = b.check()?;
    let strategy = b
        .strategy
        .unwrap_or_else(|| BeamStrategy::default_for(head.beam_head()));
    let config = BeamConfig::new(strategy, size)
        .map_err(Error::options)?
        .with_score_norm(b.score_norm);
    config.check(head.beam_head()).map_err(Error::options)?;
    config.check_vocabulary(vocab).map_err(Error::options)?;
    Ok(BeamPlan { config, nbest })
}

fn check_confidence(model: &Model, head: Head, c: &ConfidenceConfig, beam: bool) -> Result<()> {
    if beam {
        return Err(Error::Options(
            "confidence is computed by greedy decoding only (as NeMo does), not with a beam search"
                .into(),
        ));
    }
    let classes = model.hparams().vocab_size + 1;
    let range = c.measure.alpha_range(classes);
    if !range.contains(&c.alpha) {
        let why = match c.measure {
            Measure::Entropy(crate::decoder::confidence::EntropyKind::Gibbs, _) => {
                "NeMo's bound for the Gibbs entropy over this model's vocabulary"
            }
            _ => "beyond it the measure leaves [0, 1] in floating point",
        };
        return Err(Error::Options(format!(
            "--confidence-alpha {}: {} takes {:.4} to {:.4} ({why})",
            c.alpha,
            c.measure,
            range.start(),
            range.end()
        )));
    }
    if c.tdt_include_duration && head != Head::Tdt {
        return Err(Error::Options(format!(
            "--confidence-with-durations: the {} decoder has no durations (TDT only)",
            head.name()
        )));
    }
    Ok(())
}

fn boosting_tree(model: &Model, cfg: &BoostingConfig) -> Result<BoostingTree> {
    Ok(boosting_trie(model, cfg)?.into_tree())
}

/// `cfg`'s settings checked against their ranges and its phrases tokenised with `model`'s
/// tokenizer, kept as a trie more phrases can be added to; errors as [`DecodeOptions::new`]'s.
pub fn boosting_trie(model: &Model, cfg: &BoostingConfig) -> Result<PhraseTrie> {
    for (flag, value, range) in [
        ("--boost-alpha", cfg.alpha, BOOST_ALPHA_RANGE),
        (
            "--boost-context-score",
            cfg.context_score,
            BOOST_CONTEXT_SCORE_RANGE,
        ),
        (
            "--boost-depth-scaling",
            cfg.depth_scaling,
            BOOST_DEPTH_SCALING_RANGE,
        ),
        ("boost unk_score", cfg.unk_score, BOOST_UNK_SCORE_RANGE),
        (
            "boost score_per_phrase",
            cfg.score_per_phrase,
            BOOST_SCORE_PER_PHRASE_RANGE,
        ),
    ] {
        if !range.contains(&value) {
            return Err(Error::Options(format!(
                "{flag} {value}: takes {} to {}",
                range.start(),
                range.end()
            )));
        }
    }
    PhraseTrie::new(model.tokenizer(), cfg).map_err(boosting_error)
}

/// A boosting failure (a phrase the tokenizer cannot spell: the user's options) saying it is
/// one.
pub fn boosting_error(e: Error) -> Error {
    e.context("phrase boosting")
}
