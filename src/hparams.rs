//! The GGUF schema of a parakeet model's hyperparameters: ONE type, its metadata keys, and its
//! reader and writer (docs/GGUF.md, "Metadata"). The converter fills [`Hparams`] from
//! `model_config.yaml` (`convert::config`) and writes it here; the loader reads it here. Both
//! sides share the key constants, so the file a converter writes is the file a loader reads.

use std::ops::RangeInclusive;

use crate::error::{Context, Result};
use crate::{bail, ensure, err};

use crate::audio::TARGET_RATE;
use crate::audio::mel::MelConfig;
use crate::gguf::GgufFile;
use crate::gguf::GgufWriter;

mod sortformer;
pub use sortformer::{SortformerParams, SortformerStreaming};

/// `general.architecture` of every parakeet GGUF.
pub const ARCHITECTURE: &str = "parakeet";

/// Declares each metadata key once: its constant and its place in [`keys::ALL`].
macro_rules! metadata_keys {
    ($($(#[$doc:meta])* $name:ident = $key:literal,)*) => {
        $($(#[$doc])* pub const $name: &str = $key;)*
        /// Every key above, in the order the converter writes them.
        pub const ALL: &[&str] = &[$($name),*];
    };
}

/// Every metadata key of a parakeet GGUF, as docs/GGUF.md lists them (the weight-layout keys
/// belong to the layouts that define them).
pub mod keys {
    metadata_keys! {
        ARCHITECTURE = "general.architecture",
        NAME = "general.name",
        FILE_TYPE = "general.file_type",

        MODEL_TYPE = "parakeet.model_type",
        SAMPLE_RATE = "parakeet.preprocessor.sample_rate",
        N_MELS = "parakeet.preprocessor.n_mels",
        N_FFT = "parakeet.preprocessor.n_fft",
        WIN_LENGTH = "parakeet.preprocessor.win_length",
        HOP_LENGTH = "parakeet.preprocessor.hop_length",
        PREEMPH = "parakeet.preprocessor.preemph",
        LOG_ZERO_GUARD_VALUE = "parakeet.preprocessor.log_zero_guard_value",
        NORMALIZE = "parakeet.preprocessor.normalize",
        FEAT_IN = "parakeet.encoder.feat_in",
        N_LAYERS = "parakeet.encoder.n_layers",
        D_MODEL = "parakeet.encoder.d_model",
        N_HEADS = "parakeet.encoder.n_heads",
        FF_EXPANSION_FACTOR = "parakeet.encoder.ff_expansion_factor",
        SUBSAMPLING = "parakeet.encoder.subsampling",
        SUBSAMPLING_FACTOR = "parakeet.encoder.subsampling_factor",
        SUBSAMPLING_CONV_CHANNELS = "parakeet.encoder.subsampling_conv_channels",
        CONV_KERNEL_SIZE = "parakeet.encoder.conv_kernel_size",
        XSCALING = "parakeet.encoder.xscaling",
        USE_BIAS = "parakeet.encoder.use_bias",
        SELF_ATTENTION_MODEL = "parakeet.encoder.self_attention_model",
        ATT_CONTEXT_SIZE = "parakeet.encoder.att_context_size",
        /// Cache-aware streaming models only (absent: NeMo's defaults, the offline encoder).
        ATT_CONTEXT_STYLE = "parakeet.encoder.att_context_style",
        ATT_CONTEXT_SIZES = "parakeet.encoder.att_context_sizes",
        CAUSAL_DOWNSAMPLING = "parakeet.encoder.causal_downsampling",
        CONV_CONTEXT_SIZE = "parakeet.encoder.conv_context_size",
        CONV_NORM_TYPE = "parakeet.encoder.conv_norm_type",
        PRED_HIDDEN = "parakeet.decoder.pred_hidden",
        PRED_RNN_LAYERS = "parakeet.decoder.pred_rnn_layers",
        JOINT_HIDDEN = "parakeet.joint.joint_hidden",
        VOCAB_SIZE = "parakeet.vocab_size",
        TDT_DURATIONS = "parakeet.tdt.durations",
        MAX_SYMBOLS = "parakeet.decoding.max_symbols",

        /// Sortformer diarization models only (`SortformerParams`).
        SF_N_SPKS = "parakeet.sortformer.n_spks",
        SF_TF_D_MODEL = "parakeet.sortformer.tf_d_model",
        SF_TF_N_LAYERS = "parakeet.sortformer.tf_n_layers",
        SF_TF_N_HEADS = "parakeet.sortformer.tf_n_heads",
        SF_TF_INNER_SIZE = "parakeet.sortformer.tf_inner_size",
        SF_STREAMING_MODE = "parakeet.sortformer.streaming_mode",
        SF_EPS = "parakeet.sortformer.eps",
        SF_SPKCACHE_LEN = "parakeet.sortformer.spkcache_len",
        SF_FIFO_LEN = "parakeet.sortformer.fifo_len",
        SF_CHUNK_LEN = "parakeet.sortformer.chunk_len",
        SF_SPKCACHE_UPDATE_PERIOD = "parakeet.sortformer.spkcache_update_period",
        SF_CHUNK_LEFT_CONTEXT = "parakeet.sortformer.chunk_left_context",
        SF_CHUNK_RIGHT_CONTEXT = "parakeet.sortformer.chunk_right_context",
        SF_SPKCACHE_SIL_FRAMES_PER_SPK = "parakeet.sortformer.spkcache_sil_frames_per_spk",
        SF_PRED_SCORE_THRESHOLD = "parakeet.sortformer.pred_score_threshold",
        SF_SCORES_BOOST_LATEST = "parakeet.sortformer.scores_boost_latest",
        SF_SIL_THRESHOLD = "parakeet.sortformer.sil_threshold",
        SF_STRONG_BOOST_RATE = "parakeet.sortformer.strong_boost_rate",
        SF_WEAK_BOOST_RATE = "parakeet.sortformer.weak_boost_rate",
        SF_MIN_POS_SCORES_RATE = "parakeet.sortformer.min_pos_scores_rate",

        /// The tokenizer's keys: llama.cpp's names where llama.cpp has one, then SentencePiece's
        /// settings that llama.cpp has no key for (absent in files converted before the tokenizer
        /// was stored: those can detokenise but not tokenise).
        TOKENIZER_MODEL = "tokenizer.ggml.model",
        TOKENS = "tokenizer.ggml.tokens",
        SCORES = "tokenizer.ggml.scores",
        TOKEN_TYPE = "tokenizer.ggml.token_type",
        TOKENIZER_ALGORITHM = "parakeet.tokenizer.algorithm",
        NORMALIZER_NAME = "parakeet.tokenizer.normalizer.name",
        PRECOMPILED_CHARSMAP = "parakeet.tokenizer.normalizer.precompiled_charsmap",
        ADD_DUMMY_PREFIX = "parakeet.tokenizer.normalizer.add_dummy_prefix",
        REMOVE_EXTRA_WHITESPACES = "parakeet.tokenizer.normalizer.remove_extra_whitespaces",
        ESCAPE_WHITESPACES = "parakeet.tokenizer.normalizer.escape_whitespaces",
        BYTE_FALLBACK = "parakeet.tokenizer.byte_fallback",
    }
}

/// NeMo's `per_feature` normalisation, and its `NA` (none: raw log-mel, the cache-aware
/// streaming models, whose chunks cannot see the whole file's statistics).
const NORMALIZE_PER_FEATURE: &str = "per_feature";
const NORMALIZE_NONE: &str = "NA";
/// NeMo's `att_context_style`s: `regular` (a band, or full) and `chunked_limited`.
const ATT_CONTEXT_REGULAR: &str = "regular";
const ATT_CONTEXT_CHUNKED_LIMITED: &str = "chunked_limited";
/// NeMo's `conv_norm_type`s.
const CONV_NORM_BATCH_NORM: &str = "batch_norm";
const CONV_NORM_LAYER_NORM: &str = "layer_norm";
/// The one subsampling the runtime implements.
const SUBSAMPLING_DW_STRIDING: &str = "dw_striding";

/// Which heads the checkpoint has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    Tdt,
    Rnnt,
    Ctc,
    TdtCtc,
    RnntCtc,
    /// A Sortformer diarization model: speaker activity per frame, no vocabulary.
    Sortformer,
}

impl ModelType {
    /// Every type with its name in the GGUF (`parakeet.model_type`).
    const NAMED: [(&'static str, ModelType); 6] = [
        ("tdt", ModelType::Tdt),
        ("rnnt", ModelType::Rnnt),
        ("ctc", ModelType::Ctc),
        ("tdt_ctc", ModelType::TdtCtc),
        ("rnnt_ctc", ModelType::RnntCtc),
        ("sortformer", ModelType::Sortformer),
    ];

    /// The type named `name` in the GGUF (`parakeet.model_type`).
    pub fn from_name(name: &str) -> Option<ModelType> {
        let found = Self::NAMED.iter().find(|(n, _)| *n == name);
        found.map(|&(_, t)| t)
    }

    pub fn name(self) -> &'static str {
        let found = Self::NAMED.iter().find(|(_, t)| *t == self);
        found.map_or("?", |(n, _)| n)
    }

    pub fn has_transducer(self) -> bool {
        !matches!(self, ModelType::Ctc | ModelType::Sortformer)
    }

    /// A speech recognition model (not a diarization model).
    pub fn is_asr(self) -> bool {
        self != ModelType::Sortformer
    }

    pub fn has_ctc(self) -> bool {
        matches!(
            self,
            ModelType::Ctc | ModelType::TdtCtc | ModelType::RnntCtc
        )
    }

    pub fn is_tdt(self) -> bool {
        matches!(self, ModelType::Tdt | ModelType::TdtCtc)
    }
}

/// The encoder's self-attention for one utterance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attention {
    /// Every frame attends to every frame (NeMo's `rel_pos`).
    #[default]
    Full,
    /// NeMo's `rel_pos_local_attn` with `att_context_size` `[left, right]`: each frame attends
    /// to `left` frames before it and `right` after it.
    Local { left: usize, right: usize },
    /// NeMo's `rel_pos` with `att_context_style: chunked_limited` and `[left, right]` (the
    /// cache-aware streaming models): frames fall in chunks of `right + 1`, and a frame attends
    /// to its own chunk and the `left / (right + 1)` chunks before it.
    Chunked { left: usize, right: usize },
}

impl Attention {
    /// NeMo's recommended setting for long audio (`change_attention_model`).
    pub const LONG_FORM: Attention = Attention::Local {
        left: 128,
        right: 128,
    };

    /// The attention NeMo's `self_attention_model` and `att_context_size` describe, if the
    /// runtime implements it: `rel_pos` with `[-1, -1]`, or `rel_pos_local_attn` with a window.
    pub fn from_nemo(self_attention_model: &str, att_context_size: [i64; 2]) -> Option<Attention> {
        match (self_attention_model, att_context_size) {
            ("rel_pos", [l, r]) if l < 0 && r < 0 => Some(Attention::Full),
            ("rel_pos_local_attn", [l, r]) if l >= 0 && r >= 0 && l.max(r) > 0 => {
                Some(Attention::Local {
                    left: usize::try_from(l).ok()?,
                    right: usize::try_from(r).ok()?,
                })
            }
            _ => None,
        }
    }

    /// The attention three GGUF keys describe (`self_attention_model`, `att_context_size`,
    /// `att_context_style`), if the runtime implements it.
    fn from_keys(model: &str, context: [i64; 2], style: &str) -> Option<Attention> {
        match style {
            ATT_CONTEXT_REGULAR => Attention::from_nemo(model, context),
            ATT_CONTEXT_CHUNKED_LIMITED if model == "rel_pos" => Attention::chunked(context),
            _ => None,
        }
    }

    /// `chunked_limited` attention with `[left, right]` (`right + 1` frames a chunk), if it is
    /// one NeMo builds: both sides set, and `left` a whole number of chunks.
    pub fn chunked(att_context_size: [i64; 2]) -> Option<Attention> {
        let [l, r] = att_context_size;
        let (left, right) = (usize::try_from(l).ok()?, usize::try_from(r).ok()?);
        left.is_multiple_of(right + 1)
            .then_some(Attention::Chunked { left, right })
    }

    /// `(left, right)` key frames around each query for an utterance of `frames` frames (for
    /// chunked attention, the band that holds every query's chunks).
    pub fn window(self, frames: usize) -> (usize, usize) {
        match self {
            Attention::Full => (frames.max(1) - 1, frames.max(1) - 1),
            Attention::Local { left, right } => (left, right),
            Attention::Chunked { left, right } => (left + right, right),
        }
    }

    /// NeMo's `self_attention_model` name.
    pub fn nemo_name(self) -> &'static str {
        match self {
            Attention::Full | Attention::Chunked { .. } => "rel_pos",
            Attention::Local { .. } => "rel_pos_local_attn",
        }
    }

    /// NeMo's `att_context_style` name.
    pub fn style_name(self) -> &'static str {
        match self {
            Attention::Chunked { .. } => ATT_CONTEXT_CHUNKED_LIMITED,
            _ => ATT_CONTEXT_REGULAR,
        }
    }

    /// NeMo's `att_context_size` (`[-1, -1]` for full attention).
    pub fn context(self) -> [i64; 2] {
        match self {
            Attention::Full => [-1, -1],
            Attention::Local { left, right } | Attention::Chunked { left, right } => {
                [left as i64, right as i64]
            }
        }
    }
}

impl std::fmt::Display for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attention::Full => write!(f, "full"),
            Attention::Local { left, right } => write!(f, "local [{left}, {right}]"),
            Attention::Chunked { left, right } => write!(f, "chunked [{left}, {right}]"),
        }
    }
}

/// Front-end settings (NeMo's `preprocessor`).
#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessorParams {
    pub sample_rate: u32,
    pub n_mels: usize,
    pub n_fft: usize,
    pub win_length: usize,
    pub hop_length: usize,
    pub preemph: f32,
    pub log_zero_guard: f32,
    /// NeMo's `per_feature` normalisation (false: `NA`, raw log-mel).
    pub normalize_per_feature: bool,
}

impl PreprocessorParams {
    /// The log-mel front end these settings describe (every model family computes it alike).
    pub fn mel_config(&self) -> MelConfig {
        MelConfig {
            n_fft: self.n_fft,
            win_length: self.win_length,
            hop_length: self.hop_length,
            n_mels: self.n_mels,
            preemph: self.preemph,
            log_zero_guard: self.log_zero_guard,
            normalize_per_feature: self.normalize_per_feature,
        }
    }
}

/// FastConformer settings (NeMo's `encoder`).
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderParams {
    pub feat_in: usize,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub ff_expansion_factor: usize,
    pub subsampling_factor: usize,
    pub subsampling_channels: usize,
    pub conv_kernel: usize,
    pub xscaling: bool,
    /// Whether the linears and convs carry biases (the loader finds them by name; recorded for
    /// other readers of the file).
    pub use_bias: bool,
    /// The attention the checkpoint was configured with (`self_attention_model` and
    /// `att_context_size`; for a multi-lookahead model its first, NeMo's default).
    pub attention: Attention,
    /// Every `att_context_size` of a cache-aware streaming model, NeMo's default first (its
    /// lookaheads); empty for other models.
    pub att_context_sizes: Vec<[usize; 2]>,
    /// NeMo's `causal_downsampling`: the subsampling convs pad 2 frames before and 1 after (in
    /// time and frequency) instead of 1 on each side.
    pub causal_downsampling: bool,
    /// NeMo's `conv_context_size` `[left, right]` of the conformer's depthwise conv: `[k/2,
    /// k/2]`, or `[k - 1, 0]` (`causal`).
    pub conv_context: [usize; 2],
    /// `conv_norm_type: layer_norm` (the module is still `conv.batch_norm`): a LayerNorm over
    /// channels after the depthwise conv instead of a BatchNorm.
    pub conv_layer_norm: bool,
}

impl EncoderParams {
    /// Width of the feed-forward modules' hidden layer.
    pub fn ff_dim(&self) -> usize {
        self.d_model * self.ff_expansion_factor
    }

    /// Whether the depthwise conv sees no future frames (`conv_context_size: causal`).
    pub fn causal_conv(&self) -> bool {
        self.conv_context == [self.conv_kernel - 1, 0]
    }

    /// NeMo's cache-aware streaming schedule for `att_context_size` `[left, right]`, if this
    /// encoder streams (chunked attention, causal subsampling and convolution).
    pub fn streaming(&self, [left, right]: [usize; 2]) -> Option<StreamingParams> {
        if !(self.causal_downsampling
            && self.causal_conv()
            && matches!(self.attention, Attention::Chunked { .. }))
        {
            return None;
        }
        let factor = self.subsampling_factor;
        // NeMo's `setup_streaming_params` for `chunked_limited` and dw_striding's sampling
        // frames [1, factor] and streaming cache [0, factor + 1].
        let pre_encode_cache = factor + 1;
        Some(StreamingParams {
            att_context: [left, right],
            chunk_size: [1 + factor * right, factor * (right + 1)],
            shift_size: [1 + factor * right, factor * (right + 1)],
            valid_out_len: right + 1,
            last_channel_cache_size: left,
            last_time_cache_size: self.conv_kernel - 1,
            pre_encode_cache_size: pre_encode_cache,
            drop_extra_pre_encoded: 1 + (pre_encode_cache - 1) / factor,
        })
    }
}

/// NeMo's `CacheAwareStreamingConfig` for one lookahead (sizes in feature frames unless said
/// otherwise; pairs are `[first chunk, later chunks]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamingParams {
    pub att_context: [usize; 2],
    /// Feature frames of audio a chunk consumes.
    pub chunk_size: [usize; 2],
    /// Feature frames the stream advances per chunk.
    pub shift_size: [usize; 2],
    /// Encoder frames a chunk yields.
    pub valid_out_len: usize,
    /// Encoder frames of each layer's attention cache (`cache_last_channel`).
    pub last_channel_cache_size: usize,
    /// Frames of each layer's depthwise-conv cache (`cache_last_time`).
    pub last_time_cache_size: usize,
    /// Feature frames of the previous chunk prefixed to a later chunk.
    pub pre_encode_cache_size: usize,
    /// Subsampled frames dropped from a later chunk (they belong to the prefix).
    pub drop_extra_pre_encoded: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    /// Which heads the checkpoint has: the one source of "is TDT", "has CTC", "has a transducer".
    pub model_type: ModelType,
    pub preprocessor: PreprocessorParams,
    pub encoder: EncoderParams,
    /// SentencePiece pieces; the blank id is `vocab_size`.
    pub vocab_size: usize,
    /// The prediction network and joint: present exactly when `model_type` has a transducer.
    pub transducer: Option<TransducerParams>,
    pub max_symbols: usize,
    /// A Sortformer diarization model's Transformer and head: present exactly when
    /// `model_type` is sortformer (which has no vocabulary: `vocab_size` 0).
    pub sortformer: Option<SortformerParams>,
}

/// The transducer head's widths (NeMo's `decoder.prednet` and `joint.jointnet`).
#[derive(Clone, Debug, PartialEq)]
pub struct TransducerParams {
    pub pred_hidden: usize,
    pub pred_layers: usize,
    pub joint_hidden: usize,
    /// TDT durations in encoder frames: non-empty exactly when the model type is TDT (the joint
    /// then emits `durations.len()` more outputs).
    pub durations: Vec<usize>,
}

/// Bounds on the sizes a GGUF may declare. Real Parakeet models sit far inside them (the
/// largest, 1.1b, has 42 layers of d_model 1024); they exist so that a corrupt or hostile file
/// is refused with its key and value before anything is sized from it.
mod limits {
    pub const N_MELS: usize = 512;
    pub const N_FFT: usize = 1 << 16;
    pub const N_LAYERS: usize = 512;
    pub const D_MODEL: usize = 16_384;
    pub const FF_EXPANSION: usize = 16;
    pub const CHANNELS: usize = 16_384;
    pub const CONV_KERNEL: usize = 1023;
    pub const VOCAB: usize = 1 << 20;
    pub const PRED_LAYERS: usize = 16;
    pub const DURATIONS: usize = 64;
    pub const DURATION: i64 = 1_000;
    pub const MAX_SYMBOLS: usize = 1_000;
}

/// `parakeet.decoding.max_symbols` of files written before the key existed.
const DEFAULT_MAX_SYMBOLS: usize = 10;

impl Hparams {
    pub fn blank_id(&self) -> usize {
        self.vocab_size
    }

    /// TDT durations (empty for RNN-T and CTC models).
    pub fn durations(&self) -> &[usize] {
        self.transducer.as_ref().map_or(&[], |t| &t.durations)
    }

    /// The time grid of the features and the encoder, derived from these hyperparameters.
    pub fn geometry(&self) -> FrameGeometry {
        FrameGeometry {
            sample_rate: self.preprocessor.sample_rate as usize,
            hop_length: self.preprocessor.hop_length,
            subsampling_factor: self.encoder.subsampling_factor,
            causal_downsampling: self.encoder.causal_downsampling,
        }
    }

    /// Reads and range-checks the hyperparameters of a parakeet GGUF. Every error names the
    /// file, the key, the value and what is supported.
    pub fn read(f: &GgufFile) -> Result<Hparams> {
        let shown = f.shown().to_string();
        let arch = f.str(keys::ARCHITECTURE)?;
        if arch != ARCHITECTURE {
            bail!(
                Model,
                "{shown}: architecture '{arch}' is not a parakeet model"
            );
        }
        let mut hp = Hparams::unread();
        schema(&mut Io::Read { f, shown }, &mut hp)?;
        Ok(hp)
    }

    /// Writes every `parakeet.*` hyperparameter key (the `general.*` keys name the file, not
    /// the model, and are the converter's).
    pub fn write(&self, w: &mut GgufWriter) -> Result<()> {
        let t = self.transducer.as_ref();
        ensure!(
            t.is_some() == self.model_type.has_transducer()
                && t.is_none_or(|t| t.durations.is_empty() != self.model_type.is_tdt()),
            Internal,
            "internal: {} hyperparameters with transducer {t:?}",
            self.model_type.name()
        );
        schema(&mut Io::Write(w), &mut self.clone())
    }

    /// What `read` fills in: every field is set by the schema before it is returned.
    fn unread() -> Hparams {
        Hparams {
            model_type: ModelType::Ctc,
            preprocessor: PreprocessorParams {
                sample_rate: 0,
                n_mels: 0,
                n_fft: 0,
                win_length: 0,
                hop_length: 0,
                preemph: 0.0,
                log_zero_guard: 0.0,
                normalize_per_feature: false,
            },
            encoder: EncoderParams {
                feat_in: 0,
                n_layers: 0,
                d_model: 0,
                n_heads: 0,
                ff_expansion_factor: 0,
                subsampling_factor: 0,
                subsampling_channels: 0,
                conv_kernel: 0,
                xscaling: false,
                use_bias: false,
                attention: Attention::Full,
                att_context_sizes: Vec::new(),
                causal_downsampling: false,
                conv_context: [0, 0],
                conv_layer_norm: false,
            },
            vocab_size: 0,
            transducer: None,
            max_symbols: 0,
            sortformer: None,
        }
    }
}

/// The schema: every `parakeet.*` hyperparameter key once, in the order the converter writes
/// them, with its field, its bounds and what its absence means. `Hparams::read` and
/// `Hparams::write` are this one walk in its two directions, so they cannot drift apart. A key
/// checked against another (`win_length <= n_fft`) comes after it.
fn schema(io: &mut Io, hp: &mut Hparams) -> Result<()> {
    use Absent::{Default, Means, Refused};
    io.name(
        keys::MODEL_TYPE,
        &mut hp.model_type,
        &ModelType::NAMED,
        Refused,
    )?;

    let p = &mut hp.preprocessor;
    io.field(
        keys::SAMPLE_RATE,
        &mut p.sample_rate,
        Refused,
        |&v| Ok(v),
        |&v| {
            (v == TARGET_RATE)
                .then_some(v)
                .ok_or(format!("{TARGET_RATE} only"))
        },
    )?;
    io.size(keys::N_MELS, &mut p.n_mels, 1..=limits::N_MELS)?;
    io.size(keys::N_FFT, &mut p.n_fft, 2..=limits::N_FFT)?;
    io.size(keys::WIN_LENGTH, &mut p.win_length, 1..=p.n_fft)?;
    // A hop longer than the window would skip audio between frames.
    io.size(keys::HOP_LENGTH, &mut p.hop_length, 1..=p.win_length)?;
    io.real(keys::PREEMPH, &mut p.preemph, "0 <= preemph < 1", |v| {
        (0.0..1.0).contains(&v)
    })?;
    io.real(
        keys::LOG_ZERO_GUARD_VALUE,
        &mut p.log_zero_guard,
        "a finite value > 0",
        |v| v.is_finite() && v > 0.0,
    )?;
    let normalize = [(NORMALIZE_PER_FEATURE, true), (NORMALIZE_NONE, false)];
    io.name(
        keys::NORMALIZE,
        &mut p.normalize_per_feature,
        &normalize,
        Means(true),
    )?;
    let n_mels = p.n_mels;

    let e = &mut hp.encoder;
    io.field(keys::FEAT_IN, &mut e.feat_in, Refused, to_u32, |&v| {
        let v = within(v, 1..=limits::N_MELS)?;
        (v == n_mels)
            .then_some(v)
            .ok_or(format!("equal to preprocessor.n_mels {n_mels}"))
    })?;
    io.size(keys::N_LAYERS, &mut e.n_layers, 1..=limits::N_LAYERS)?;
    io.size(keys::D_MODEL, &mut e.d_model, 1..=limits::D_MODEL)?;
    let d_model = e.d_model;
    io.field(keys::N_HEADS, &mut e.n_heads, Refused, to_u32, |&v| {
        let v = within(v, 1..=d_model)?;
        d_model
            .is_multiple_of(v)
            .then_some(v)
            .ok_or(format!("a divisor of d_model {d_model}"))
    })?;
    io.size(
        keys::FF_EXPANSION_FACTOR,
        &mut e.ff_expansion_factor,
        1..=limits::FF_EXPANSION,
    )?;
    io.name(
        keys::SUBSAMPLING,
        &mut (),
        &[(SUBSAMPLING_DW_STRIDING, ())],
        Refused,
    )?;
    io.size(keys::SUBSAMPLING_FACTOR, &mut e.subsampling_factor, 8..=8)?;
    io.size(
        keys::SUBSAMPLING_CONV_CHANNELS,
        &mut e.subsampling_channels,
        1..=limits::CHANNELS,
    )?;
    io.field(
        keys::CONV_KERNEL_SIZE,
        &mut e.conv_kernel,
        Refused,
        to_u32,
        |&v| {
            let v = within(v, 1..=limits::CONV_KERNEL)?;
            (v % 2 == 1).then_some(v).ok_or("odd sizes".into())
        },
    )?;
    io.flag(keys::XSCALING, &mut e.xscaling, Refused)?;
    io.flag(keys::USE_BIAS, &mut e.use_bias, Refused)?;
    // The attention is three NeMo keys; the last only where it differs from NeMo's default.
    let mut model = e.attention.nemo_name().to_owned();
    let mut context = e.attention.context().to_vec();
    let mut style = e.attention.style_name().to_owned();
    io.field(
        keys::SELF_ATTENTION_MODEL,
        &mut model,
        Refused,
        |v| Ok(v.clone()),
        |v| Ok(v.clone()),
    )?;
    io.field(
        keys::ATT_CONTEXT_SIZE,
        &mut context,
        Refused,
        |v| Ok(v.clone()),
        |v| (v.len() == 2).then(|| v.clone()).ok_or("2 values".into()),
    )?;
    let regular = ATT_CONTEXT_REGULAR.to_owned();
    io.field(
        keys::ATT_CONTEXT_STYLE,
        &mut style,
        Default(regular),
        |v| Ok(v.clone()),
        |v| Ok(v.clone()),
    )?;
    if let Io::Read { shown, .. } = io {
        e.attention =
            Attention::from_keys(&model, [context[0], context[1]], &style).ok_or_else(|| {
                err!(
                    Model,
                    "{shown}: self_attention_model '{model}' with att_context_size {context:?} and \
                     att_context_style '{style}' is not supported (rel_pos with [-1, -1], \
                     rel_pos_local_attn with a window, or chunked_limited rel_pos with [L, R], L a \
                     multiple of R + 1)"
                )
            })?;
    }
    let attention = e.attention;
    let to_ints = |pairs: &Vec<[usize; 2]>| Ok(pairs.iter().flatten().map(|&v| v as i64).collect());
    io.field(
        keys::ATT_CONTEXT_SIZES,
        &mut e.att_context_sizes,
        Default(Vec::new()),
        to_ints,
        |all: &Vec<i64>| {
            let pairs: Vec<[i64; 2]> = all.chunks(2).map(|p| [p[0], p[p.len() - 1]]).collect();
            let ok = all.len().is_multiple_of(2)
                && !pairs.is_empty()
                && pairs[0] == attention.context()
                && pairs.iter().all(|&p| Attention::chunked(p).is_some())
                && matches!(attention, Attention::Chunked { .. });
            ok.then(|| {
                pairs
                    .iter()
                    .map(|p| [p[0] as usize, p[1] as usize])
                    .collect()
            })
            .ok_or(
                "[L, R] pairs of chunked_limited attention, the first equal to att_context_size"
                    .into(),
            )
        },
    )?;
    io.flag(
        keys::CAUSAL_DOWNSAMPLING,
        &mut e.causal_downsampling,
        Default(false),
    )?;
    let k = e.conv_kernel;
    let (half, causal) = ([k / 2; 2], [k - 1, 0]);
    let to_pair = |v: &[usize; 2]| Ok(vec![v[0] as i64, v[1] as i64]);
    io.field(
        keys::CONV_CONTEXT_SIZE,
        &mut e.conv_context,
        Default(half),
        to_pair,
        |c: &Vec<i64>| {
            [half, causal]
                .into_iter()
                .find(|p| *c == [p[0] as i64, p[1] as i64])
                .ok_or(format!("[{}, {}] or [{}, 0]", half[0], half[1], causal[0]))
        },
    )?;
    let norms = [(CONV_NORM_BATCH_NORM, false), (CONV_NORM_LAYER_NORM, true)];
    io.name(
        keys::CONV_NORM_TYPE,
        &mut e.conv_layer_norm,
        &norms,
        Default(false),
    )?;

    // Transducer widths only where a transducer exists; TDT durations only for TDT.
    let (transducer, tdt) = (hp.model_type.has_transducer(), hp.model_type.is_tdt());
    if !transducer {
        hp.transducer = None;
    }
    if transducer {
        let t = hp.transducer.get_or_insert_with(|| TransducerParams {
            pred_hidden: 0,
            pred_layers: 0,
            joint_hidden: 0,
            durations: Vec::new(),
        });
        io.size(keys::PRED_HIDDEN, &mut t.pred_hidden, 1..=limits::D_MODEL)?;
        io.size(
            keys::PRED_RNN_LAYERS,
            &mut t.pred_layers,
            1..=limits::PRED_LAYERS,
        )?;
        io.size(keys::JOINT_HIDDEN, &mut t.joint_hidden, 1..=limits::D_MODEL)?;
    }
    if hp.model_type.is_asr() {
        io.size(keys::VOCAB_SIZE, &mut hp.vocab_size, 1..=limits::VOCAB)?;
    }
    if let Some(t) = hp.transducer.as_mut().filter(|_| tdt) {
        let to_ints = |d: &Vec<usize>| Ok(d.iter().map(|&v| v as i64).collect());
        io.field(
            keys::TDT_DURATIONS,
            &mut t.durations,
            Refused,
            to_ints,
            |d: &Vec<i64>| {
                let ok = (1..=limits::DURATIONS).contains(&d.len())
                    && d.iter().all(|v| (0..=limits::DURATION).contains(v));
                ok.then(|| d.iter().map(|&v| v as usize).collect())
                    .ok_or(format!(
                        "1 to {} durations of 0..={} frames",
                        limits::DURATIONS,
                        limits::DURATION
                    ))
            },
        )?;
    }
    io.field(
        keys::MAX_SYMBOLS,
        &mut hp.max_symbols,
        Means(DEFAULT_MAX_SYMBOLS),
        to_u32,
        |&v| within(v, 1..=limits::MAX_SYMBOLS),
    )?;
    // A Sortformer's Transformer, head and streaming settings (its own module's keys).
    match (io, hp.model_type) {
        (Io::Read { f, .. }, ModelType::Sortformer) => {
            hp.sortformer = Some(SortformerParams::read(f)?);
            hp.vocab_size = 0;
        }
        (Io::Write(w), ModelType::Sortformer) => match &hp.sortformer {
            Some(s) => s.write(w)?,
            None => bail!(
                Internal,
                "internal: sortformer hyperparameters without their parameters"
            ),
        },
        _ => hp.sortformer = None,
    }
    Ok(())
}

/// One direction through [`schema`]: a file's keys into `Hparams`, or `Hparams` into a writer.
enum Io<'a> {
    Read { f: &'a GgufFile, shown: String },
    Write(&'a mut GgufWriter),
}

/// What a key's absence from a file means.
enum Absent<T> {
    /// Every file has the key.
    Refused,
    /// Files written before the key existed lack it and mean this value; always written.
    Means(T),
    /// NeMo's default: written only where the value differs, so the files of models that keep
    /// the default carry no key for it.
    Default(T),
}

/// The GGUF value types the schema stores.
trait Stored: Sized {
    fn get(f: &GgufFile, key: &str) -> Result<Self>;
    fn set(&self, w: &mut GgufWriter, key: &str) -> Result<()>;
    /// The value as an error message shows it.
    fn shown(&self) -> String;
}

impl Stored for u32 {
    fn get(f: &GgufFile, key: &str) -> Result<Self> {
        f.u32(key)
    }
    fn set(&self, w: &mut GgufWriter, key: &str) -> Result<()> {
        w.set_u32(key, *self)
    }
    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Stored for f32 {
    fn get(f: &GgufFile, key: &str) -> Result<Self> {
        f.f32(key)
    }
    fn set(&self, w: &mut GgufWriter, key: &str) -> Result<()> {
        w.set_f32(key, *self)
    }
    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Stored for bool {
    fn get(f: &GgufFile, key: &str) -> Result<Self> {
        f.bool(key)
    }
    fn set(&self, w: &mut GgufWriter, key: &str) -> Result<()> {
        w.set_bool(key, *self)
    }
    fn shown(&self) -> String {
        self.to_string()
    }
}

impl Stored for String {
    fn get(f: &GgufFile, key: &str) -> Result<Self> {
        f.str(key)
    }
    fn set(&self, w: &mut GgufWriter, key: &str) -> Result<()> {
        w.set_str(key, self)
    }
    fn shown(&self) -> String {
        self.clone()
    }
}

/// Integer arrays, stored as i32.
impl Stored for Vec<i64> {
    fn get(f: &GgufFile, key: &str) -> Result<Self> {
        f.int_array(key)
    }
    fn set(&self, w: &mut GgufWriter, key: &str) -> Result<()> {
        let values = self
            .iter()
            .map(|&v| {
                i32::try_from(v).map_err(|_| err!(Model, "{key}: {v} does not fit a GGUF i32"))
            })
            .collect::<Result<Vec<_>>>()?;
        w.set_i32_array(key, &values)
    }
    fn shown(&self) -> String {
        format!("{self:?}")
    }
}

impl Io<'_> {
    /// One key and its field `v`: `to` gives the stored value of a field (writing), `from` checks
    /// a stored value and gives the field, or says what is supported (reading).
    fn field<T: PartialEq, S: Stored>(
        &mut self,
        key: &str,
        v: &mut T,
        absent: Absent<T>,
        to: impl FnOnce(&T) -> Result<S>,
        from: impl FnOnce(&S) -> Result<T, String>,
    ) -> Result<()> {
        match self {
            Io::Read { f, shown } => {
                match absent {
                    Absent::Means(d) | Absent::Default(d) if f.get(key).is_none() => *v = d,
                    _ => {
                        let stored = S::get(f, key)?;
                        *v = from(&stored).map_err(|supported| {
                            err!(
                                Model,
                                "{shown}: {key} = {} is not supported ({supported})",
                                stored.shown()
                            )
                        })?;
                    }
                }
                Ok(())
            }
            Io::Write(w) => match absent {
                Absent::Default(d) if *v == d => Ok(()),
                _ => to(v).context(key)?.set(w, key),
            },
        }
    }

    /// A required size stored as u32, within `range`.
    fn size(&mut self, key: &str, v: &mut usize, range: RangeInclusive<usize>) -> Result<()> {
        self.field(key, v, Absent::Refused, to_u32, |&s| within(s, range))
    }

    /// A required f32 that `ok` accepts (`supported` says which).
    fn real(&mut self, key: &str, v: &mut f32, supported: &str, ok: fn(f32) -> bool) -> Result<()> {
        self.field(
            key,
            v,
            Absent::Refused,
            |&v| Ok(v),
            |&s| ok(s).then_some(s).ok_or(supported.to_owned()),
        )
    }

    fn flag(&mut self, key: &str, v: &mut bool, absent: Absent<bool>) -> Result<()> {
        self.field(key, v, absent, |&v| Ok(v), |&s| Ok(s))
    }

    /// A string naming one of `named`'s values.
    fn name<T: Copy + PartialEq>(
        &mut self,
        key: &str,
        v: &mut T,
        named: &[(&str, T)],
        absent: Absent<T>,
    ) -> Result<()> {
        let to = |v: &T| {
            let found = named.iter().find(|(_, t)| t == v);
            found
                .map(|(n, _)| n.to_string())
                .ok_or_else(|| err!(Internal, "internal: {key} has no name for its value"))
        };
        let from = |s: &String| {
            let found = named.iter().find(|(n, _)| n == s);
            found
                .map(|&(_, t)| t)
                .ok_or_else(|| one_of(named.iter().map(|(n, _)| *n)))
        };
        self.field(key, v, absent, to, from)
    }
}

/// "a, b or c" (or "a only").
fn one_of<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    match names.split_last() {
        Some((only, [])) => format!("{only} only"),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

fn to_u32(v: &usize) -> Result<u32> {
    u32::try_from(*v).map_err(|_| err!(Model, "{v} does not fit a GGUF u32"))
}

fn within(v: u32, range: RangeInclusive<usize>) -> Result<usize, String> {
    let v = v as usize;
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(format!("{}..={}", range.start(), range.end()))
    }
}

/// Where feature and encoder frames fall in time: one feature frame per `hop_length` samples,
/// one encoder frame per `subsampling_factor` feature frames (1280 samples, 0.08 s, for every
/// Parakeet model). The one place these numbers are derived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameGeometry {
    pub sample_rate: usize,
    pub hop_length: usize,
    pub subsampling_factor: usize,
    /// Causal subsampling convs (padding 2 + 1 instead of 1 + 1) yield one frame more on an
    /// even length.
    pub causal_downsampling: bool,
}

impl FrameGeometry {
    /// Samples per encoder frame.
    pub fn samples_per_frame(&self) -> usize {
        self.hop_length * self.subsampling_factor
    }

    /// Seconds per encoder frame.
    pub fn frame_seconds(&self) -> f64 {
        self.samples_per_frame() as f64 / self.sample_rate as f64
    }

    /// Encoder frames for `feature_frames` feature frames: one stride-2 conv per factor of 2.
    pub fn encoded_len(&self, feature_frames: usize) -> usize {
        let mut len = feature_frames;
        let mut factor = self.subsampling_factor;
        while factor > 1 {
            len = if self.causal_downsampling {
                causal_subsampled_len(len)
            } else {
                subsampled_len(len)
            };
            factor /= 2;
        }
        len
    }
}

/// NeMo's subsampled length for one stride-2, kernel-3, pad-1 conv: `floor((L - 1) / 2) + 1`.
pub fn subsampled_len(len: usize) -> usize {
    if len == 0 { 0 } else { (len - 1) / 2 + 1 }
}

/// The same for NeMo's `CausalConv2D` (pads 2 before, 1 after): `floor(L / 2) + 1`.
pub fn causal_subsampled_len(len: usize) -> usize {
    if len == 0 { 0 } else { len / 2 + 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_round_trips_through_nemo_names() {
        for a in [
            Attention::Full,
            Attention::LONG_FORM,
            Attention::Local { left: 0, right: 3 },
        ] {
            assert_eq!(Attention::from_nemo(a.nemo_name(), a.context()), Some(a));
        }
        assert_eq!(Attention::from_nemo("rel_pos", [128, 128]), None);
        assert_eq!(Attention::from_nemo("rel_pos_local_attn", [-1, -1]), None);
        assert_eq!(Attention::from_nemo("rel_pos_local_attn", [0, 0]), None);
        assert_eq!(Attention::from_nemo("abs_pos", [-1, -1]), None);
    }

    #[test]
    fn model_types_round_trip_through_names() {
        for t in [
            ModelType::Tdt,
            ModelType::Rnnt,
            ModelType::Ctc,
            ModelType::TdtCtc,
            ModelType::RnntCtc,
            ModelType::Sortformer,
        ] {
            assert_eq!(ModelType::from_name(t.name()), Some(t));
        }
        assert_eq!(ModelType::from_name("tdt_rnnt"), None);
    }

    /// Every schema key set away from its default: a TDT + CTC streaming model.
    fn everything() -> Hparams {
        Hparams {
            model_type: ModelType::TdtCtc,
            preprocessor: PreprocessorParams {
                sample_rate: TARGET_RATE,
                n_mels: 80,
                n_fft: 512,
                win_length: 400,
                hop_length: 160,
                preemph: 0.97,
                log_zero_guard: 5.960_464_5e-8,
                normalize_per_feature: false,
            },
            encoder: EncoderParams {
                feat_in: 80,
                n_layers: 17,
                d_model: 512,
                n_heads: 8,
                ff_expansion_factor: 4,
                subsampling_factor: 8,
                subsampling_channels: 256,
                conv_kernel: 9,
                xscaling: false,
                use_bias: true,
                attention: Attention::Chunked {
                    left: 70,
                    right: 13,
                },
                att_context_sizes: vec![[70, 13], [70, 6], [70, 1], [70, 0]],
                causal_downsampling: true,
                conv_context: [8, 0],
                conv_layer_norm: true,
            },
            vocab_size: 1024,
            transducer: Some(TransducerParams {
                pred_hidden: 640,
                pred_layers: 1,
                joint_hidden: 640,
                durations: vec![0, 1, 2, 3, 4],
            }),
            max_symbols: 7,
            sortformer: None,
        }
    }

    /// Writes `hp` (and the architecture) to a GGUF with one tensor, and opens it.
    fn written(hp: &Hparams, tag: &str) -> GgufFile {
        let dir =
            std::env::temp_dir().join(format!("parakeet-hparams-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.gguf");
        let mut w = GgufWriter::new();
        w.set_str(keys::ARCHITECTURE, ARCHITECTURE).unwrap();
        hp.write(&mut w).unwrap();
        w.add_tensor("t", &[1], crate::backend::DType::F32).unwrap();
        w.write(&path, |_| Ok(vec![0.0])).unwrap();
        let f = GgufFile::open(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        f
    }

    /// `read` gives back what `write` wrote, for a model that sets every key and for the
    /// defaults of each head (where the optional keys are left out).
    #[test]
    fn read_mirrors_write() {
        let full = everything();
        let mut plain = everything();
        plain.preprocessor.normalize_per_feature = true;
        plain.encoder.attention = Attention::Full;
        plain.encoder.att_context_sizes.clear();
        plain.encoder.causal_downsampling = false;
        plain.encoder.conv_context = [4, 4];
        plain.encoder.conv_layer_norm = false;
        for (tag, ty) in [
            ("tdt", ModelType::Tdt),
            ("rnnt", ModelType::Rnnt),
            ("ctc", ModelType::Ctc),
            ("rnnt_ctc", ModelType::RnntCtc),
        ] {
            let mut hp = plain.clone();
            hp.model_type = ty;
            if !ty.has_transducer() {
                hp.transducer = None;
            } else if !ty.is_tdt() {
                hp.transducer.as_mut().unwrap().durations.clear();
            }
            assert_eq!(Hparams::read(&written(&hp, tag)).unwrap(), hp, "{tag}");
        }
        assert_eq!(Hparams::read(&written(&full, "full")).unwrap(), full);
        let mut sortformer = plain.clone();
        sortformer.model_type = ModelType::Sortformer;
        sortformer.transducer = None;
        sortformer.vocab_size = 0;
        sortformer.sortformer = Some(SortformerParams {
            n_spks: 4,
            tf_d_model: 192,
            tf_n_layers: 18,
            tf_n_heads: 8,
            tf_inner_size: 768,
            streaming_mode: true,
            eps: 1e-3,
            streaming: SortformerStreaming::NEMO_DEFAULTS.inference_defaults(),
        });
        let f = written(&sortformer, "sortformer");
        assert!(f.get(keys::VOCAB_SIZE).is_none());
        assert_eq!(Hparams::read(&f).unwrap(), sortformer);
    }

    /// Each `parakeet.*` key the schema knows is written by a model that sets everything, and
    /// nothing else is; the optional keys of a model at NeMo's defaults are left out, and a CTC
    /// model carries no transducer key.
    #[test]
    fn write_covers_every_key_once() {
        let tokenizer = [
            keys::TOKENIZER_ALGORITHM,
            keys::NORMALIZER_NAME,
            keys::PRECOMPILED_CHARSMAP,
            keys::ADD_DUMMY_PREFIX,
            keys::REMOVE_EXTRA_WHITESPACES,
            keys::ESCAPE_WHITESPACES,
            keys::BYTE_FALLBACK,
        ];
        let schema: Vec<&str> = keys::ALL
            .iter()
            .copied()
            .filter(|k| k.starts_with("parakeet.") && !tokenizer.contains(k))
            .filter(|k| !k.starts_with("parakeet.sortformer."))
            .collect();
        let written_keys = |hp: &Hparams, tag| {
            let f = written(hp, tag);
            let mut ks: Vec<String> = f
                .metadata()
                .keys()
                .filter(|k| k.starts_with("parakeet."))
                .cloned()
                .collect();
            ks.sort();
            ks
        };
        let mut want: Vec<String> = schema.iter().map(|k| k.to_string()).collect();
        want.sort();
        assert_eq!(written_keys(&everything(), "all"), want);

        let mut ctc = everything();
        ctc.model_type = ModelType::Ctc;
        ctc.transducer = None;
        ctc.encoder.attention = Attention::Full;
        ctc.encoder.att_context_sizes.clear();
        ctc.encoder.causal_downsampling = false;
        ctc.encoder.conv_context = [4, 4];
        ctc.encoder.conv_layer_norm = false;
        let optional_or_transducer = [
            keys::ATT_CONTEXT_STYLE,
            keys::ATT_CONTEXT_SIZES,
            keys::CAUSAL_DOWNSAMPLING,
            keys::CONV_CONTEXT_SIZE,
            keys::CONV_NORM_TYPE,
            keys::PRED_HIDDEN,
            keys::PRED_RNN_LAYERS,
            keys::JOINT_HIDDEN,
            keys::TDT_DURATIONS,
        ];
        want.retain(|k| !optional_or_transducer.contains(&k.as_str()));
        assert_eq!(written_keys(&ctc, "ctc-keys"), want);
    }

    /// The model type and the transducer's parameters must agree before anything is written.
    #[test]
    fn write_refuses_heads_that_disagree_with_the_type() {
        let mut w = GgufWriter::new();
        let mut hp = everything();
        hp.model_type = ModelType::Ctc;
        assert!(hp.write(&mut w).is_err(), "CTC with a transducer");
        let mut hp = everything();
        hp.transducer = None;
        assert!(hp.write(&mut w).is_err(), "TDT without a transducer");
        let mut hp = everything();
        hp.model_type = ModelType::RnntCtc;
        assert!(hp.write(&mut w).is_err(), "RNN-T with durations");
        let mut hp = everything();
        hp.transducer.as_mut().unwrap().durations.clear();
        assert!(hp.write(&mut w).is_err(), "TDT without durations");
    }

    /// docs/GGUF.md's metadata table lists exactly the keys of this schema (plus the
    /// weight-layout keys, which their layouts define).
    #[test]
    fn the_documented_keys_are_the_schema() {
        let doc = include_str!("../docs/GGUF.md");
        let table = doc
            .split("## Metadata")
            .nth(1)
            .expect("docs/GGUF.md has a Metadata section");
        let mut documented: Vec<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .filter(|k| !k.starts_with("parakeet.layout."))
            .collect();
        let mut ours: Vec<&str> = keys::ALL.to_vec();
        documented.sort_unstable();
        ours.sort_unstable();
        assert_eq!(documented, ours);
    }
}
