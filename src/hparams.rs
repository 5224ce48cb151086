//! The GGUF schema of a parakeet model's hyperparameters: ONE type, its metadata keys, and its
//! reader and writer (docs/GGUF.md, "Metadata"). The converter fills [`Hparams`] from
//! `model_config.yaml` (`convert::config`) and writes it here; the loader reads it here. Both
//! sides share the key constants, so the file a converter writes is the file a loader reads.

use anyhow::{Result, anyhow, bail};

use crate::audio::TARGET_RATE;
use crate::gguf::GgufFile;
use crate::gguf::GgufWriter;

mod sortformer;
pub use sortformer::{SortformerParams, SortformerStreaming};

/// `general.architecture` of every parakeet GGUF.
pub const ARCHITECTURE: &str = "parakeet";

/// Every metadata key of a parakeet GGUF, as docs/GGUF.md lists them (the weight-layout keys
/// belong to the layouts that define them).
pub mod keys {
    pub const ARCHITECTURE: &str = "general.architecture";
    pub const NAME: &str = "general.name";
    pub const FILE_TYPE: &str = "general.file_type";

    pub const MODEL_TYPE: &str = "parakeet.model_type";
    pub const SAMPLE_RATE: &str = "parakeet.preprocessor.sample_rate";
    pub const N_MELS: &str = "parakeet.preprocessor.n_mels";
    pub const N_FFT: &str = "parakeet.preprocessor.n_fft";
    pub const WIN_LENGTH: &str = "parakeet.preprocessor.win_length";
    pub const HOP_LENGTH: &str = "parakeet.preprocessor.hop_length";
    pub const PREEMPH: &str = "parakeet.preprocessor.preemph";
    pub const LOG_ZERO_GUARD_VALUE: &str = "parakeet.preprocessor.log_zero_guard_value";
    pub const NORMALIZE: &str = "parakeet.preprocessor.normalize";
    pub const FEAT_IN: &str = "parakeet.encoder.feat_in";
    pub const N_LAYERS: &str = "parakeet.encoder.n_layers";
    pub const D_MODEL: &str = "parakeet.encoder.d_model";
    pub const N_HEADS: &str = "parakeet.encoder.n_heads";
    pub const FF_EXPANSION_FACTOR: &str = "parakeet.encoder.ff_expansion_factor";
    pub const SUBSAMPLING: &str = "parakeet.encoder.subsampling";
    pub const SUBSAMPLING_FACTOR: &str = "parakeet.encoder.subsampling_factor";
    pub const SUBSAMPLING_CONV_CHANNELS: &str = "parakeet.encoder.subsampling_conv_channels";
    pub const CONV_KERNEL_SIZE: &str = "parakeet.encoder.conv_kernel_size";
    pub const XSCALING: &str = "parakeet.encoder.xscaling";
    pub const USE_BIAS: &str = "parakeet.encoder.use_bias";
    pub const SELF_ATTENTION_MODEL: &str = "parakeet.encoder.self_attention_model";
    pub const ATT_CONTEXT_SIZE: &str = "parakeet.encoder.att_context_size";
    /// Cache-aware streaming models only (absent: NeMo's defaults, the offline encoder).
    pub const ATT_CONTEXT_STYLE: &str = "parakeet.encoder.att_context_style";
    pub const ATT_CONTEXT_SIZES: &str = "parakeet.encoder.att_context_sizes";
    pub const CAUSAL_DOWNSAMPLING: &str = "parakeet.encoder.causal_downsampling";
    pub const CONV_CONTEXT_SIZE: &str = "parakeet.encoder.conv_context_size";
    pub const CONV_NORM_TYPE: &str = "parakeet.encoder.conv_norm_type";
    pub const PRED_HIDDEN: &str = "parakeet.decoder.pred_hidden";
    pub const PRED_RNN_LAYERS: &str = "parakeet.decoder.pred_rnn_layers";
    pub const JOINT_HIDDEN: &str = "parakeet.joint.joint_hidden";
    pub const VOCAB_SIZE: &str = "parakeet.vocab_size";
    pub const TDT_DURATIONS: &str = "parakeet.tdt.durations";
    pub const MAX_SYMBOLS: &str = "parakeet.decoding.max_symbols";

    /// Sortformer diarization models only (`SortformerParams`).
    pub const SF_N_SPKS: &str = "parakeet.sortformer.n_spks";
    pub const SF_TF_D_MODEL: &str = "parakeet.sortformer.tf_d_model";
    pub const SF_TF_N_LAYERS: &str = "parakeet.sortformer.tf_n_layers";
    pub const SF_TF_N_HEADS: &str = "parakeet.sortformer.tf_n_heads";
    pub const SF_TF_INNER_SIZE: &str = "parakeet.sortformer.tf_inner_size";
    pub const SF_STREAMING_MODE: &str = "parakeet.sortformer.streaming_mode";
    pub const SF_EPS: &str = "parakeet.sortformer.eps";
    pub const SF_SPKCACHE_LEN: &str = "parakeet.sortformer.spkcache_len";
    pub const SF_FIFO_LEN: &str = "parakeet.sortformer.fifo_len";
    pub const SF_CHUNK_LEN: &str = "parakeet.sortformer.chunk_len";
    pub const SF_SPKCACHE_UPDATE_PERIOD: &str = "parakeet.sortformer.spkcache_update_period";
    pub const SF_CHUNK_LEFT_CONTEXT: &str = "parakeet.sortformer.chunk_left_context";
    pub const SF_CHUNK_RIGHT_CONTEXT: &str = "parakeet.sortformer.chunk_right_context";
    pub const SF_SPKCACHE_SIL_FRAMES_PER_SPK: &str =
        "parakeet.sortformer.spkcache_sil_frames_per_spk";
    pub const SF_PRED_SCORE_THRESHOLD: &str = "parakeet.sortformer.pred_score_threshold";
    pub const SF_SCORES_BOOST_LATEST: &str = "parakeet.sortformer.scores_boost_latest";
    pub const SF_SIL_THRESHOLD: &str = "parakeet.sortformer.sil_threshold";
    pub const SF_STRONG_BOOST_RATE: &str = "parakeet.sortformer.strong_boost_rate";
    pub const SF_WEAK_BOOST_RATE: &str = "parakeet.sortformer.weak_boost_rate";
    pub const SF_MIN_POS_SCORES_RATE: &str = "parakeet.sortformer.min_pos_scores_rate";

    /// The tokenizer's keys: llama.cpp's names where llama.cpp has one, then SentencePiece's
    /// settings that llama.cpp has no key for (absent in files converted before the tokenizer
    /// was stored: those can detokenise but not tokenise).
    pub const TOKENIZER_MODEL: &str = "tokenizer.ggml.model";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const TOKENIZER_ALGORITHM: &str = "parakeet.tokenizer.algorithm";
    pub const NORMALIZER_NAME: &str = "parakeet.tokenizer.normalizer.name";
    pub const PRECOMPILED_CHARSMAP: &str = "parakeet.tokenizer.normalizer.precompiled_charsmap";
    pub const ADD_DUMMY_PREFIX: &str = "parakeet.tokenizer.normalizer.add_dummy_prefix";
    pub const REMOVE_EXTRA_WHITESPACES: &str =
        "parakeet.tokenizer.normalizer.remove_extra_whitespaces";
    pub const ESCAPE_WHITESPACES: &str = "parakeet.tokenizer.normalizer.escape_whitespaces";
    pub const BYTE_FALLBACK: &str = "parakeet.tokenizer.byte_fallback";

    /// Every key above, in the order the converter writes them.
    pub const ALL: &[&str] = &[
        ARCHITECTURE,
        NAME,
        FILE_TYPE,
        MODEL_TYPE,
        SAMPLE_RATE,
        N_MELS,
        N_FFT,
        WIN_LENGTH,
        HOP_LENGTH,
        PREEMPH,
        LOG_ZERO_GUARD_VALUE,
        NORMALIZE,
        FEAT_IN,
        N_LAYERS,
        D_MODEL,
        N_HEADS,
        FF_EXPANSION_FACTOR,
        SUBSAMPLING,
        SUBSAMPLING_FACTOR,
        SUBSAMPLING_CONV_CHANNELS,
        CONV_KERNEL_SIZE,
        XSCALING,
        USE_BIAS,
        SELF_ATTENTION_MODEL,
        ATT_CONTEXT_SIZE,
        ATT_CONTEXT_STYLE,
        ATT_CONTEXT_SIZES,
        CAUSAL_DOWNSAMPLING,
        CONV_CONTEXT_SIZE,
        CONV_NORM_TYPE,
        PRED_HIDDEN,
        PRED_RNN_LAYERS,
        JOINT_HIDDEN,
        VOCAB_SIZE,
        TDT_DURATIONS,
        MAX_SYMBOLS,
        SF_N_SPKS,
        SF_TF_D_MODEL,
        SF_TF_N_LAYERS,
        SF_TF_N_HEADS,
        SF_TF_INNER_SIZE,
        SF_STREAMING_MODE,
        SF_EPS,
        SF_SPKCACHE_LEN,
        SF_FIFO_LEN,
        SF_CHUNK_LEN,
        SF_SPKCACHE_UPDATE_PERIOD,
        SF_CHUNK_LEFT_CONTEXT,
        SF_CHUNK_RIGHT_CONTEXT,
        SF_SPKCACHE_SIL_FRAMES_PER_SPK,
        SF_PRED_SCORE_THRESHOLD,
        SF_SCORES_BOOST_LATEST,
        SF_SIL_THRESHOLD,
        SF_STRONG_BOOST_RATE,
        SF_WEAK_BOOST_RATE,
        SF_MIN_POS_SCORES_RATE,
        TOKENIZER_MODEL,
        TOKENS,
        SCORES,
        TOKEN_TYPE,
        TOKENIZER_ALGORITHM,
        NORMALIZER_NAME,
        PRECOMPILED_CHARSMAP,
        ADD_DUMMY_PREFIX,
        REMOVE_EXTRA_WHITESPACES,
        ESCAPE_WHITESPACES,
        BYTE_FALLBACK,
    ];
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
    /// The type named `name` in the GGUF (`parakeet.model_type`).
    pub fn from_name(name: &str) -> Option<ModelType> {
        Some(match name {
            "tdt" => ModelType::Tdt,
            "rnnt" => ModelType::Rnnt,
            "ctc" => ModelType::Ctc,
            "tdt_ctc" => ModelType::TdtCtc,
            "rnnt_ctc" => ModelType::RnntCtc,
            "sortformer" => ModelType::Sortformer,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ModelType::Tdt => "tdt",
            ModelType::Rnnt => "rnnt",
            ModelType::Ctc => "ctc",
            ModelType::TdtCtc => "tdt_ctc",
            ModelType::RnntCtc => "rnnt_ctc",
            ModelType::Sortformer => "sortformer",
        }
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
    pub model_type: ModelType,
    pub preprocessor: PreprocessorParams,
    pub encoder: EncoderParams,
    /// SentencePiece pieces; the blank id is `vocab_size`.
    pub vocab_size: usize,
    /// Prediction network and joint widths (0 for CTC).
    pub pred_hidden: usize,
    pub pred_layers: usize,
    pub joint_hidden: usize,
    /// TDT durations (empty for RNN-T / CTC).
    pub durations: Vec<usize>,
    pub max_symbols: usize,
    /// A Sortformer diarization model's Transformer and head (`model_type` sortformer).
    pub sortformer: Option<SortformerParams>,
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
        let shown = f.path().display().to_string();
        let arch = f.str(keys::ARCHITECTURE)?;
        if arch != ARCHITECTURE {
            bail!("{shown}: architecture '{arch}' is not a parakeet model");
        }
        let refuse = |key: &str, value: &dyn std::fmt::Display, supported: &str| {
            anyhow!("{shown}: {key} = {value} is not supported ({supported})")
        };
        let u = |key: &str, lo: usize, hi: usize| -> Result<usize> {
            let v = f.u32(key)? as usize;
            if (lo..=hi).contains(&v) {
                Ok(v)
            } else {
                Err(refuse(key, &v, &format!("{lo}..={hi}")))
            }
        };
        let type_name = f.str(keys::MODEL_TYPE)?;
        let Some(model_type) = ModelType::from_name(&type_name) else {
            return Err(refuse(
                keys::MODEL_TYPE,
                &type_name,
                "tdt, rnnt, ctc, tdt_ctc, rnnt_ctc, sortformer",
            ));
        };

        let sample_rate = u(keys::SAMPLE_RATE, 0, usize::MAX)? as u32;
        if sample_rate != TARGET_RATE {
            return Err(refuse(
                keys::SAMPLE_RATE,
                &sample_rate,
                &format!("{TARGET_RATE} only"),
            ));
        }
        let n_mels = u(keys::N_MELS, 1, limits::N_MELS)?;
        let n_fft = u(keys::N_FFT, 2, limits::N_FFT)?;
        let win_length = u(keys::WIN_LENGTH, 1, n_fft)?;
        // A hop longer than the window would skip audio between frames.
        let hop_length = u(keys::HOP_LENGTH, 1, win_length)?;
        let preemph = f.f32(keys::PREEMPH)?;
        if !(0.0..1.0).contains(&preemph) {
            return Err(refuse(keys::PREEMPH, &preemph, "0 <= preemph < 1"));
        }
        let log_zero_guard = f.f32(keys::LOG_ZERO_GUARD_VALUE)?;
        if !(log_zero_guard.is_finite() && log_zero_guard > 0.0) {
            return Err(refuse(
                keys::LOG_ZERO_GUARD_VALUE,
                &log_zero_guard,
                "a finite value > 0",
            ));
        }
        let mut normalize_per_feature = true;
        if f.get(keys::NORMALIZE).is_some() {
            let normalize = f.str(keys::NORMALIZE)?;
            normalize_per_feature = match normalize.as_str() {
                NORMALIZE_PER_FEATURE => true,
                NORMALIZE_NONE => false,
                _ => {
                    return Err(refuse(
                        keys::NORMALIZE,
                        &normalize,
                        &format!("{NORMALIZE_PER_FEATURE} or {NORMALIZE_NONE}"),
                    ));
                }
            };
        }
        let preprocessor = PreprocessorParams {
            sample_rate,
            n_mels,
            n_fft,
            win_length,
            hop_length,
            preemph,
            log_zero_guard,
            normalize_per_feature,
        };

        let sub = f.str(keys::SUBSAMPLING)?;
        if sub != SUBSAMPLING_DW_STRIDING {
            return Err(refuse(
                keys::SUBSAMPLING,
                &sub,
                &format!("{SUBSAMPLING_DW_STRIDING} only"),
            ));
        }
        let att = f.str(keys::SELF_ATTENTION_MODEL)?;
        let att_context = f.int_array(keys::ATT_CONTEXT_SIZE)?;
        if att_context.len() != 2 {
            return Err(refuse(
                keys::ATT_CONTEXT_SIZE,
                &format!("{att_context:?}"),
                "2 values",
            ));
        }
        let style = match f.get(keys::ATT_CONTEXT_STYLE) {
            Some(_) => f.str(keys::ATT_CONTEXT_STYLE)?,
            None => ATT_CONTEXT_REGULAR.to_owned(),
        };
        let context = [att_context[0], att_context[1]];
        let attention = match style.as_str() {
            ATT_CONTEXT_REGULAR => Attention::from_nemo(&att, context),
            ATT_CONTEXT_CHUNKED_LIMITED if att == "rel_pos" => Attention::chunked(context),
            _ => None,
        };
        let Some(attention) = attention else {
            bail!(
                "{shown}: self_attention_model '{att}' with att_context_size {att_context:?} and \
                 att_context_style '{style}' is not supported (rel_pos with [-1, -1], \
                 rel_pos_local_attn with a window, or chunked_limited rel_pos with [L, R], L a \
                 multiple of R + 1)"
            );
        };
        let mut att_context_sizes = Vec::new();
        if f.get(keys::ATT_CONTEXT_SIZES).is_some() {
            let all = f.int_array(keys::ATT_CONTEXT_SIZES)?;
            let pairs: Vec<[i64; 2]> = all.chunks(2).map(|p| [p[0], p[p.len() - 1]]).collect();
            let ok = all.len().is_multiple_of(2)
                && !pairs.is_empty()
                && pairs[0] == context
                && pairs.iter().all(|&p| Attention::chunked(p).is_some());
            if !ok || !matches!(attention, Attention::Chunked { .. }) {
                return Err(refuse(
                    keys::ATT_CONTEXT_SIZES,
                    &format!("{all:?}"),
                    "[L, R] pairs of chunked_limited attention, the first equal to \
                     att_context_size",
                ));
            }
            att_context_sizes = pairs
                .iter()
                .map(|p| [p[0] as usize, p[1] as usize])
                .collect();
        }
        let feat_in = u(keys::FEAT_IN, 1, limits::N_MELS)?;
        if feat_in != n_mels {
            return Err(refuse(
                keys::FEAT_IN,
                &feat_in,
                &format!("equal to preprocessor.n_mels {n_mels}"),
            ));
        }
        let d_model = u(keys::D_MODEL, 1, limits::D_MODEL)?;
        let n_heads = u(keys::N_HEADS, 1, d_model)?;
        if !d_model.is_multiple_of(n_heads) {
            return Err(refuse(
                keys::N_HEADS,
                &n_heads,
                &format!("a divisor of d_model {d_model}"),
            ));
        }
        let conv_kernel = u(keys::CONV_KERNEL_SIZE, 1, limits::CONV_KERNEL)?;
        if conv_kernel % 2 == 0 {
            return Err(refuse(keys::CONV_KERNEL_SIZE, &conv_kernel, "odd sizes"));
        }
        let conv_context = match f.get(keys::CONV_CONTEXT_SIZE) {
            None => [conv_kernel / 2; 2],
            Some(_) => {
                let c = f.int_array(keys::CONV_CONTEXT_SIZE)?;
                let half = (conv_kernel / 2) as i64;
                let causal = conv_kernel as i64 - 1;
                if c != [half, half] && c != [causal, 0] {
                    return Err(refuse(
                        keys::CONV_CONTEXT_SIZE,
                        &format!("{c:?}"),
                        &format!("[{half}, {half}] or [{causal}, 0]"),
                    ));
                }
                [c[0] as usize, c[1] as usize]
            }
        };
        let conv_layer_norm = match f.get(keys::CONV_NORM_TYPE) {
            None => false,
            Some(_) => match f.str(keys::CONV_NORM_TYPE)?.as_str() {
                CONV_NORM_BATCH_NORM => false,
                CONV_NORM_LAYER_NORM => true,
                other => {
                    return Err(refuse(
                        keys::CONV_NORM_TYPE,
                        &other,
                        "batch_norm or layer_norm",
                    ));
                }
            },
        };
        let causal_downsampling = match f.get(keys::CAUSAL_DOWNSAMPLING) {
            None => false,
            Some(_) => f.bool(keys::CAUSAL_DOWNSAMPLING)?,
        };
        let encoder = EncoderParams {
            feat_in,
            n_layers: u(keys::N_LAYERS, 1, limits::N_LAYERS)?,
            d_model,
            n_heads,
            ff_expansion_factor: u(keys::FF_EXPANSION_FACTOR, 1, limits::FF_EXPANSION)?,
            subsampling_factor: u(keys::SUBSAMPLING_FACTOR, 8, 8)?,
            subsampling_channels: u(keys::SUBSAMPLING_CONV_CHANNELS, 1, limits::CHANNELS)?,
            conv_kernel,
            xscaling: f.bool(keys::XSCALING)?,
            use_bias: f.bool(keys::USE_BIAS)?,
            attention,
            att_context_sizes,
            causal_downsampling,
            conv_context,
            conv_layer_norm,
        };
        let (vocab_size, sortformer) = match model_type {
            ModelType::Sortformer => (0, Some(SortformerParams::read(f)?)),
            _ => (u(keys::VOCAB_SIZE, 1, limits::VOCAB)?, None),
        };

        let (mut pred_hidden, mut pred_layers, mut joint_hidden) = (0, 0, 0);
        let mut durations = Vec::new();
        if model_type.has_transducer() {
            pred_hidden = u(keys::PRED_HIDDEN, 1, limits::D_MODEL)?;
            pred_layers = u(keys::PRED_RNN_LAYERS, 1, limits::PRED_LAYERS)?;
            joint_hidden = u(keys::JOINT_HIDDEN, 1, limits::D_MODEL)?;
        }
        if model_type.is_tdt() {
            let d = f.int_array(keys::TDT_DURATIONS)?;
            let ok = (1..=limits::DURATIONS).contains(&d.len())
                && d.iter().all(|v| (0..=limits::DURATION).contains(v));
            if !ok {
                return Err(refuse(
                    keys::TDT_DURATIONS,
                    &format!("{d:?}"),
                    &format!(
                        "1 to {} durations of 0..={} frames",
                        limits::DURATIONS,
                        limits::DURATION
                    ),
                ));
            }
            durations = d.into_iter().map(|v| v as usize).collect();
        }
        let max_symbols = match f.get(keys::MAX_SYMBOLS) {
            Some(_) => u(keys::MAX_SYMBOLS, 1, limits::MAX_SYMBOLS)?,
            None => DEFAULT_MAX_SYMBOLS,
        };
        Ok(Hparams {
            model_type,
            preprocessor,
            encoder,
            vocab_size,
            pred_hidden,
            pred_layers,
            joint_hidden,
            durations,
            max_symbols,
            sortformer,
        })
    }

    /// Writes every `parakeet.*` hyperparameter key (the `general.*` keys name the file, not
    /// the model, and are the converter's).
    pub fn write(&self, w: &mut GgufWriter) -> Result<()> {
        let (p, e) = (&self.preprocessor, &self.encoder);
        let set_u32 = set_usize_as_u32;
        w.set_str(keys::MODEL_TYPE, self.model_type.name())?;
        w.set_u32(keys::SAMPLE_RATE, p.sample_rate)?;
        set_u32(w, keys::N_MELS, p.n_mels)?;
        set_u32(w, keys::N_FFT, p.n_fft)?;
        set_u32(w, keys::WIN_LENGTH, p.win_length)?;
        set_u32(w, keys::HOP_LENGTH, p.hop_length)?;
        w.set_f32(keys::PREEMPH, p.preemph)?;
        w.set_f32(keys::LOG_ZERO_GUARD_VALUE, p.log_zero_guard)?;
        w.set_str(
            keys::NORMALIZE,
            if p.normalize_per_feature {
                NORMALIZE_PER_FEATURE
            } else {
                NORMALIZE_NONE
            },
        )?;
        set_u32(w, keys::FEAT_IN, e.feat_in)?;
        set_u32(w, keys::N_LAYERS, e.n_layers)?;
        set_u32(w, keys::D_MODEL, e.d_model)?;
        set_u32(w, keys::N_HEADS, e.n_heads)?;
        set_u32(w, keys::FF_EXPANSION_FACTOR, e.ff_expansion_factor)?;
        w.set_str(keys::SUBSAMPLING, SUBSAMPLING_DW_STRIDING)?;
        set_u32(w, keys::SUBSAMPLING_FACTOR, e.subsampling_factor)?;
        set_u32(w, keys::SUBSAMPLING_CONV_CHANNELS, e.subsampling_channels)?;
        set_u32(w, keys::CONV_KERNEL_SIZE, e.conv_kernel)?;
        w.set_bool(keys::XSCALING, e.xscaling)?;
        w.set_bool(keys::USE_BIAS, e.use_bias)?;
        w.set_str(keys::SELF_ATTENTION_MODEL, e.attention.nemo_name())?;
        let [left, right] = e.attention.context();
        w.set_i32_array(
            keys::ATT_CONTEXT_SIZE,
            &[
                i32_of(keys::ATT_CONTEXT_SIZE, left)?,
                i32_of(keys::ATT_CONTEXT_SIZE, right)?,
            ],
        )?;
        // The streaming keys only where they differ from NeMo's defaults: every other model's
        // file stays as it was.
        if e.attention.style_name() != ATT_CONTEXT_REGULAR {
            w.set_str(keys::ATT_CONTEXT_STYLE, e.attention.style_name())?;
        }
        if !e.att_context_sizes.is_empty() {
            let all = e
                .att_context_sizes
                .iter()
                .flatten()
                .map(|&v| i32_of(keys::ATT_CONTEXT_SIZES, v as i64))
                .collect::<Result<Vec<_>>>()?;
            w.set_i32_array(keys::ATT_CONTEXT_SIZES, &all)?;
        }
        if e.causal_downsampling {
            w.set_bool(keys::CAUSAL_DOWNSAMPLING, true)?;
        }
        if e.conv_context != [e.conv_kernel / 2; 2] {
            let [l, r] = e.conv_context;
            w.set_i32_array(
                keys::CONV_CONTEXT_SIZE,
                &[
                    i32_of(keys::CONV_CONTEXT_SIZE, l as i64)?,
                    i32_of(keys::CONV_CONTEXT_SIZE, r as i64)?,
                ],
            )?;
        }
        if e.conv_layer_norm {
            w.set_str(keys::CONV_NORM_TYPE, CONV_NORM_LAYER_NORM)?;
        }
        if self.model_type.has_transducer() {
            set_u32(w, keys::PRED_HIDDEN, self.pred_hidden)?;
            set_u32(w, keys::PRED_RNN_LAYERS, self.pred_layers)?;
            set_u32(w, keys::JOINT_HIDDEN, self.joint_hidden)?;
        }
        match &self.sortformer {
            Some(s) => s.write(w)?,
            None => set_u32(w, keys::VOCAB_SIZE, self.vocab_size)?,
        }
        if self.model_type.is_tdt() {
            let durations = self
                .durations
                .iter()
                .map(|&d| i32_of(keys::TDT_DURATIONS, d as i64))
                .collect::<Result<Vec<_>>>()?;
            w.set_i32_array(keys::TDT_DURATIONS, &durations)?;
        }
        set_u32(w, keys::MAX_SYMBOLS, self.max_symbols)?;
        Ok(())
    }
}

/// A size written as the GGUF's u32.
fn set_usize_as_u32(w: &mut GgufWriter, key: &str, v: usize) -> Result<()> {
    let v = u32::try_from(v).map_err(|_| anyhow!("{key} = {v} does not fit a GGUF u32"))?;
    w.set_u32(key, v)
}

fn i32_of(key: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{key}: {v} does not fit a GGUF i32"))
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
