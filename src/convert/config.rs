//! `model_config.yaml` -> the model's [`Hparams`] and vocabulary (docs/GGUF.md, "Metadata").
//!
//! Every value is cross-checked against the checkpoint's tensor shapes where a shape pins it
//! down, so a config that doesn't describe its weights is rejected here, not at inference time.
//! Setups the runtime doesn't implement are rejected with the config key that selects them.

use std::collections::HashMap;

use crate::error::{Context, Error, Fault, Result};
use crate::{bail, ensure, err};
use serde_yaml::Value;

use crate::hparams::{
    Attention, EncoderParams, Hparams, ModelType, PreprocessorParams, SortformerParams,
    SortformerStreaming, TransducerParams,
};
use crate::tokenizer::Tokenizer;

/// Tensor name -> shape (torch order).
pub type Shapes<'a> = HashMap<&'a str, &'a [usize]>;

/// What the converter takes from `model_config.yaml` and the archive's tokenizer files.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub hparams: Hparams,
    /// The vocabulary (the blank id is its length), with the SentencePiece model when the
    /// archive has one.
    pub tokenizer: Tokenizer,
}

impl ModelConfig {
    /// Reads and validates the config against the checkpoint's `shapes`. `tokenizer_vocab` (a
    /// SentencePiece `.vocab` file) is used only when the config lists no vocabulary;
    /// `tokenizer_model` (the `.model` file) must list the same pieces.
    pub fn from_yaml(
        config: &Value,
        shapes: &Shapes,
        tokenizer_vocab: Option<&str>,
        tokenizer_model: Option<&[u8]>,
    ) -> Result<Self> {
        let cfg = Cfg(config);
        let t = Tensors(shapes);
        if is_sortformer(&cfg, &t) {
            return sortformer(&cfg, &t);
        }
        let model_type = model_type(&cfg, &t)?;
        let preprocessor = preprocessor(&cfg, &t)?;
        let encoder = encoder(&cfg, &t, preprocessor.n_mels)?;
        let mut transducer = match model_type.has_transducer() {
            true => Some(transducer(&cfg, &t)?),
            false => None,
        };
        let vocab = vocabulary(&cfg, tokenizer_vocab)?;
        let durations = durations(&cfg)?;
        if let Some(tr) = transducer.as_mut().filter(|_| model_type.is_tdt()) {
            // Checked non-negative by `durations`.
            tr.durations = durations.iter().map(|&d| d as usize).collect();
        }
        check_heads(&cfg, &t, model_type, vocab.len(), &durations)?;
        let max_symbols = match cfg.get("decoding.greedy.max_symbols") {
            Some(_) => cfg.u32("decoding.greedy.max_symbols")?,
            None => cfg.u32_or("decoding.greedy.max_symbols_per_step", 10)?,
        };
        ensure!(
            max_symbols > 0,
            Model,
            "model_config.yaml: decoding.greedy.max_symbols must be positive"
        );
        let hparams = Hparams {
            model_type,
            preprocessor,
            encoder,
            vocab_size: vocab.len(),
            transducer,
            max_symbols: max_symbols as usize,
            sortformer: None,
        };
        let tokenizer = match tokenizer_model {
            None => Tokenizer::new(vocab),
            Some(model) => {
                let tokenizer = Tokenizer::with_sentencepiece(model)
                    .context("the archive's SentencePiece tokenizer.model")?;
                ensure!(
                    tokenizer.pieces() == vocab,
                    Model,
                    "the archive's tokenizer.model lists other pieces than the config's \
                     vocabulary ({} pieces vs {})",
                    tokenizer.len(),
                    vocab.len()
                );
                tokenizer
            }
        };
        Ok(Self { hparams, tokenizer })
    }
}

/// A Sortformer diarization checkpoint (`SortformerEncLabelModel`): named by the config's
/// `target`, or recognised by its speaker head.
fn is_sortformer(cfg: &Cfg, t: &Tensors) -> bool {
    let target = cfg
        .get("target")
        .and_then(Value::as_str)
        .unwrap_or_default();
    target.ends_with("SortformerEncLabelModel")
        || t.has("sortformer_modules.single_hidden_to_spks.weight")
}

/// The hyperparameters of a Sortformer: the FastConformer as for ASR, then `encoder_proj`, the
/// post-LN Transformer and the speaker head, checked against the checkpoint's shapes.
fn sortformer(cfg: &Cfg, t: &Tensors) -> Result<ModelConfig> {
    let preprocessor = preprocessor(cfg, t)?;
    let encoder = encoder(cfg, t, preprocessor.n_mels)?;
    let fc_d = encoder.d_model as u32;
    let n_spks = match cfg.get("sortformer_modules.num_spks") {
        Some(_) => cfg.u32("sortformer_modules.num_spks")?,
        None => cfg.u32("max_num_of_spks")?,
    };
    let max = cfg.u32_or("max_num_of_spks", n_spks)?;
    ensure!(
        max == n_spks,
        Model,
        "model_config.yaml: max_num_of_spks {max} differs from sortformer_modules.num_spks {n_spks}"
    );
    let tf_d = cfg.u32("transformer_encoder.hidden_size")?;
    let configured_tf_d = cfg.u32_or("model_defaults.tf_d_model", tf_d)?;
    ensure!(
        configured_tf_d == tf_d,
        Model,
        "model_config.yaml: model_defaults.tf_d_model {configured_tf_d} differs from \
         transformer_encoder.hidden_size {tf_d}"
    );
    let configured_fc_d = cfg.u32_or("model_defaults.fc_d_model", fc_d)?;
    ensure!(
        configured_fc_d == fc_d,
        Model,
        "model_config.yaml: model_defaults.fc_d_model {configured_fc_d} differs from \
         encoder.d_model {fc_d}"
    );
    let heads = cfg.u32("transformer_encoder.num_attention_heads")?;
    ensure!(
        heads > 0 && tf_d.is_multiple_of(heads),
        Model,
        "model_config.yaml: transformer_encoder.hidden_size {tf_d} is not divisible by \
         transformer_encoder.num_attention_heads {heads}"
    );
    let layers = cfg.u32("transformer_encoder.num_layers")?;
    let inner = cfg.u32("transformer_encoder.inner_size")?;
    require_setting(
        cfg,
        "transformer_encoder.pre_ln",
        &Value::Bool(false),
        "false",
    )?;
    require_setting(
        cfg,
        "transformer_encoder.hidden_act",
        &Value::from("relu"),
        "relu",
    )?;
    ensure!(
        cfg.u32_or("sortformer_modules.upsample_factor", 1)? == 1,
        Model,
        "model_config.yaml: sortformer_modules.upsample_factor other than 1 is not supported"
    );
    ensure!(
        !cfg.bool_or("sortformer_modules.use_learnable_sil_emb", false)?,
        Model,
        "model_config.yaml: sortformer_modules.use_learnable_sil_emb is not supported"
    );
    t.check_dim(
        "transformer_encoder.hidden_size",
        tf_d,
        "sortformer_modules.encoder_proj.weight",
        0,
    )?;
    t.check_dim(
        "encoder.d_model",
        fc_d,
        "sortformer_modules.encoder_proj.weight",
        1,
    )?;
    t.check_dim(
        "max_num_of_spks",
        n_spks,
        "sortformer_modules.single_hidden_to_spks.weight",
        0,
    )?;
    t.check_dim(
        "transformer_encoder.hidden_size",
        tf_d,
        "sortformer_modules.first_hidden_to_hidden.weight",
        0,
    )?;
    t.check_dim(
        "transformer_encoder.inner_size",
        inner,
        "transformer_encoder.layers.0.second_sub_layer.dense_in.weight",
        0,
    )?;
    let found = t.count_indexed("transformer_encoder.layers.");
    ensure!(
        found == layers as usize,
        Model,
        "model_config.yaml: transformer_encoder.num_layers is {layers} but the checkpoint has \
         {found} Transformer layers"
    );
    let d = SortformerStreaming::NEMO_DEFAULTS;
    let size = |key: &str, default: usize| -> Result<usize> {
        Ok(cfg.u32_or(&format!("sortformer_modules.{key}"), default as u32)? as usize)
    };
    let rate = |key: &str, default: f32| -> Result<f32> {
        Ok(cfg.f64_or(&format!("sortformer_modules.{key}"), default as f64)? as f32)
    };
    let streaming = SortformerStreaming {
        spkcache_len: size("spkcache_len", d.spkcache_len)?,
        fifo_len: size("fifo_len", d.fifo_len)?,
        chunk_len: size("chunk_len", d.chunk_len)?,
        spkcache_update_period: size("spkcache_update_period", d.spkcache_update_period)?,
        chunk_left_context: size("chunk_left_context", d.chunk_left_context)?,
        chunk_right_context: size("chunk_right_context", d.chunk_right_context)?,
        spkcache_sil_frames_per_spk: size(
            "spkcache_sil_frames_per_spk",
            d.spkcache_sil_frames_per_spk,
        )?,
        pred_score_threshold: rate("pred_score_threshold", d.pred_score_threshold)?,
        scores_boost_latest: rate("scores_boost_latest", d.scores_boost_latest)?,
        sil_threshold: rate("sil_threshold", d.sil_threshold)?,
        strong_boost_rate: rate("strong_boost_rate", d.strong_boost_rate)?,
        weak_boost_rate: rate("weak_boost_rate", d.weak_boost_rate)?,
        min_pos_scores_rate: rate("min_pos_scores_rate", d.min_pos_scores_rate)?,
    };
    let hparams = Hparams {
        model_type: ModelType::Sortformer,
        preprocessor,
        encoder,
        vocab_size: 0,
        transducer: None,
        max_symbols: 10,
        sortformer: Some(SortformerParams {
            n_spks: n_spks as usize,
            tf_d_model: tf_d as usize,
            tf_n_layers: layers as usize,
            tf_n_heads: heads as usize,
            tf_inner_size: inner as usize,
            streaming_mode: cfg.bool_or("streaming_mode", false)?,
            eps: cfg.f64_or("eps", 1e-3)? as f32,
            streaming,
        }),
    };
    Ok(ModelConfig {
        hparams,
        tokenizer: Tokenizer::new(Vec::new()),
    })
}

/// Which heads the checkpoint carries decides the type; the config only says TDT vs RNN-T.
fn model_type(cfg: &Cfg, t: &Tensors) -> Result<ModelType> {
    let transducer = t.has("joint.joint_net.2.weight") || t.any_prefixed("decoder.prediction.");
    let hybrid_ctc = t.has("ctc_decoder.decoder_layers.0.weight");
    let pure_ctc = t.has("decoder.decoder_layers.0.weight");
    if !transducer {
        ensure!(
            pure_ctc,
            Model,
            "the checkpoint has no decoder: expected decoder.prediction.* and joint.* (transducer) \
             or decoder.decoder_layers.0.* (CTC)"
        );
        return Ok(ModelType::Ctc);
    }
    for key in [
        "decoder.prediction.embed.weight",
        "joint.joint_net.2.weight",
    ] {
        ensure!(
            t.has(key),
            Model,
            "transducer checkpoint without tensor {key}"
        );
    }
    let tdt = !durations(cfg)?.is_empty();
    if cfg.str_or("decoding.model_type", "")? == "tdt" {
        ensure!(
            tdt,
            Model,
            "model_config.yaml: decoding.model_type is tdt but no durations are given \
             (decoding.durations / model_defaults.tdt_durations)"
        );
    }
    Ok(match (tdt, hybrid_ctc) {
        (true, false) => ModelType::Tdt,
        (true, true) => ModelType::TdtCtc,
        (false, false) => ModelType::Rnnt,
        (false, true) => ModelType::RnntCtc,
    })
}

/// `decoding.durations` and `model_defaults.tdt_durations` (whichever is set; they must agree).
fn durations(cfg: &Cfg) -> Result<Vec<i32>> {
    let a = cfg.i32_list("decoding.durations")?.unwrap_or_default();
    let b = cfg
        .i32_list("model_defaults.tdt_durations")?
        .unwrap_or_default();
    ensure!(
        a.is_empty() || b.is_empty() || a == b,
        Model,
        "model_config.yaml: decoding.durations {a:?} and model_defaults.tdt_durations {b:?} differ"
    );
    let d = if a.is_empty() { b } else { a };
    ensure!(
        d.iter().all(|&x| x >= 0),
        Model,
        "model_config.yaml: negative TDT duration in {d:?}"
    );
    let big_blank = cfg
        .i32_list("decoding.big_blank_durations")?
        .unwrap_or_default();
    ensure!(
        big_blank.is_empty(),
        Model,
        "model_config.yaml: decoding.big_blank_durations (multi-blank transducers) is not supported"
    );
    Ok(d)
}

fn preprocessor(cfg: &Cfg, t: &Tensors) -> Result<PreprocessorParams> {
    let target = cfg.str_or("preprocessor._target_", "AudioToMelSpectrogramPreprocessor")?;
    ensure!(
        target.ends_with("AudioToMelSpectrogramPreprocessor"),
        Model,
        "model_config.yaml: preprocessor._target_ {target} is not supported (mel spectrogram only)"
    );
    let sample_rate = match cfg.get("preprocessor.sample_rate") {
        Some(_) => cfg.u32("preprocessor.sample_rate")?,
        None => cfg
            .u32("sample_rate")
            .map_err(|_| cfg.missing("preprocessor.sample_rate"))?,
    };
    // Every Parakeet model is 16 kHz, and the runtime resamples to that rate; anything else
    // would silently change the transcript (and 0 would break the window arithmetic below).
    ensure!(
        sample_rate == crate::audio::TARGET_RATE,
        Model,
        "model_config.yaml: preprocessor.sample_rate {sample_rate} is not supported ({} only)",
        crate::audio::TARGET_RATE
    );
    let n_mels = cfg.u32("preprocessor.features")?;
    // `n_window_size` / `n_window_stride` (samples) override the durations in seconds.
    let samples = |n_key: &str, s_key: &str| -> Result<u32> {
        if cfg.get(n_key).is_some() {
            return cfg.u32(n_key);
        }
        let seconds = cfg.f64(s_key)?;
        let n = (seconds * f64::from(sample_rate)).round();
        ensure!(
            n >= 1.0 && n <= f64::from(u32::MAX),
            Model,
            "model_config.yaml: {s_key} = {seconds} is out of range"
        );
        Ok(n as u32)
    };
    let win_length = samples("preprocessor.n_window_size", "preprocessor.window_size")?;
    let hop_length = samples("preprocessor.n_window_stride", "preprocessor.window_stride")?;
    // NeMo: n_fft defaults to the next power of two above the window.
    let n_fft = match cfg.get_raw("preprocessor.n_fft") {
        Some(Value::Null) | None => win_length.next_power_of_two(),
        Some(_) => cfg.u32("preprocessor.n_fft")?,
    };
    ensure!(
        win_length <= n_fft,
        Model,
        "model_config.yaml: window of {win_length} samples exceeds n_fft {n_fft}"
    );
    // An explicit null switches pre-emphasis off.
    let preemph = match cfg.get_raw("preprocessor.preemph") {
        Some(Value::Null) => 0.0,
        None => 0.97,
        Some(_) => cfg.f64("preprocessor.preemph")? as f32,
    };
    let normalize = cfg.str_or("preprocessor.normalize", "per_feature")?;
    ensure!(
        matches!(normalize, "per_feature" | "NA"),
        Model,
        "model_config.yaml: preprocessor.normalize {normalize} is not supported (per_feature or NA)"
    );
    require_setting(cfg, "preprocessor.log", &Value::Bool(true), "true")?;
    require_setting(cfg, "preprocessor.frame_splicing", &Value::from(1), "1")?;
    require_setting(cfg, "preprocessor.exact_pad", &Value::Bool(false), "false")?;
    require_setting(
        cfg,
        "preprocessor.log_zero_guard_type",
        &Value::from("add"),
        "add",
    )?;
    let mag_power = cfg.f64_or("preprocessor.mag_power", 2.0)?;
    ensure!(
        mag_power == 2.0,
        Model,
        "model_config.yaml: preprocessor.mag_power {mag_power} is not supported (2.0 only)"
    );
    t.check_dim(
        "preprocessor.features",
        n_mels,
        "preprocessor.featurizer.fb",
        1,
    )?;
    t.check_dim(
        "preprocessor.window_size",
        win_length,
        "preprocessor.featurizer.window",
        0,
    )?;
    t.check_dim(
        "preprocessor.n_fft",
        n_fft / 2 + 1,
        "preprocessor.featurizer.fb",
        2,
    )?;
    Ok(PreprocessorParams {
        sample_rate,
        n_mels: n_mels as usize,
        n_fft: n_fft as usize,
        win_length: win_length as usize,
        hop_length: hop_length as usize,
        preemph,
        log_zero_guard: log_zero_guard_value(cfg)?,
        normalize_per_feature: normalize == "per_feature",
    })
}

/// A number, or NeMo's names for float32 limits.
fn log_zero_guard_value(cfg: &Cfg) -> Result<f32> {
    const KEY: &str = "preprocessor.log_zero_guard_value";
    Ok(match cfg.get_raw(KEY) {
        None | Some(Value::Null) => 2f32.powi(-24),
        Some(Value::String(s)) if s == "tiny" => f32::MIN_POSITIVE,
        Some(Value::String(s)) if s == "eps" => f32::EPSILON,
        Some(_) => cfg.f64(KEY)? as f32,
    })
}

fn encoder(cfg: &Cfg, t: &Tensors, n_mels: usize) -> Result<EncoderParams> {
    let target = cfg.str_or("encoder._target_", "ConformerEncoder")?;
    ensure!(
        target.contains("ConformerEncoder"),
        Model,
        "model_config.yaml: encoder._target_ {target} is not supported (FastConformer only)"
    );
    let feat_in = cfg.u32("encoder.feat_in")?;
    ensure!(
        feat_in as usize == n_mels,
        Model,
        "model_config.yaml: encoder.feat_in {feat_in} differs from preprocessor.features {n_mels}"
    );
    let d_model = cfg.u32("encoder.d_model")?;
    let n_layers = cfg.u32("encoder.n_layers")?;
    let n_heads = cfg.u32("encoder.n_heads")?;
    ensure!(
        n_heads > 0 && d_model.is_multiple_of(n_heads),
        Model,
        "model_config.yaml: encoder.d_model {d_model} is not divisible by encoder.n_heads {n_heads}"
    );
    let ff_expansion_factor = cfg.u32("encoder.ff_expansion_factor")?;
    let conv_kernel_size = cfg.u32("encoder.conv_kernel_size")?;
    ensure!(
        conv_kernel_size % 2 == 1,
        Model,
        "model_config.yaml: encoder.conv_kernel_size must be odd"
    );
    let subsampling = cfg.str("encoder.subsampling")?;
    ensure!(
        subsampling == "dw_striding",
        Model,
        "model_config.yaml: encoder.subsampling {subsampling} is not supported (dw_striding only)"
    );
    let subsampling_factor = cfg.u32("encoder.subsampling_factor")?;
    ensure!(
        subsampling_factor == 8,
        Model,
        "model_config.yaml: encoder.subsampling_factor {subsampling_factor} is not supported (8 only)"
    );
    // NeMo: -1 (the default) means d_model channels.
    let channels = cfg.i64_or("encoder.subsampling_conv_channels", -1)?;
    let subsampling_conv_channels = if channels == -1 {
        d_model
    } else {
        u32::try_from(channels).map_err(Error::model)?
    };
    let self_attention_model = cfg.str_or("encoder.self_attention_model", "rel_pos")?;
    ensure!(
        matches!(self_attention_model, "rel_pos" | "rel_pos_local_attn"),
        Model,
        "model_config.yaml: encoder.self_attention_model {self_attention_model} is not supported \
         (rel_pos, rel_pos_local_attn)"
    );
    let contexts = att_context_sizes(cfg)?;
    let [left, right] = contexts[0];
    let style = cfg.str_or("encoder.att_context_style", "regular")?;
    let attention = match style {
        "regular" if contexts.len() == 1 => {
            Attention::from_nemo(self_attention_model, [left.into(), right.into()])
        }
        "chunked_limited" if self_attention_model == "rel_pos" => {
            Attention::chunked([left.into(), right.into()])
        }
        _ => None,
    }
    .with_fault(Error::Model, || {
        format!(
            "model_config.yaml: encoder.self_attention_model {self_attention_model} with \
             encoder.att_context_style {style} and encoder.att_context_size {contexts:?} is not \
             supported (rel_pos with [-1, -1], rel_pos_local_attn with a window, or \
             chunked_limited rel_pos with [L, R] pairs, L a multiple of R + 1)"
        )
    })?;
    let mut att_context_sizes = Vec::new();
    if matches!(attention, Attention::Chunked { .. }) {
        for &[l, r] in &contexts {
            ensure!(
                Attention::chunked([l.into(), r.into()]).is_some(),
                Model,
                "model_config.yaml: encoder.att_context_size [{l}, {r}] is not supported with \
                 chunked_limited (L a multiple of R + 1, both >= 0)"
            );
            att_context_sizes.push([l as usize, r as usize]);
        }
    }
    let conv_context = conv_context_size(cfg, conv_kernel_size)?;
    let conv_layer_norm = match cfg.str_or("encoder.conv_norm_type", "batch_norm")? {
        "batch_norm" => false,
        "layer_norm" => true,
        other => bail!(
            Model,
            "model_config.yaml: encoder.conv_norm_type {other} is not supported (batch_norm or \
             layer_norm)"
        ),
    };
    reject_unsupported_setups(cfg)?;

    let use_bias = cfg.bool_or("encoder.use_bias", true)?;
    let has_bias = t.has("encoder.layers.0.self_attn.linear_q.bias");
    ensure!(
        use_bias == has_bias,
        Model,
        "model_config.yaml: encoder.use_bias is {use_bias} but the checkpoint {} biases \
         (encoder.layers.0.self_attn.linear_q.bias)",
        if has_bias { "has" } else { "has no" }
    );
    t.check_dim(
        "encoder.d_model",
        d_model,
        "encoder.pre_encode.out.weight",
        0,
    )?;
    t.check_dim(
        "encoder.n_heads",
        n_heads,
        "encoder.layers.0.self_attn.pos_bias_u",
        0,
    )?;
    t.check_dim(
        "encoder.ff_expansion_factor",
        ff_expansion_factor * d_model,
        "encoder.layers.0.feed_forward1.linear1.weight",
        0,
    )?;
    t.check_dim(
        "encoder.conv_kernel_size",
        conv_kernel_size,
        "encoder.layers.0.conv.depthwise_conv.weight",
        2,
    )?;
    t.check_dim(
        "encoder.subsampling_conv_channels",
        subsampling_conv_channels,
        "encoder.pre_encode.conv.0.weight",
        0,
    )?;
    let found = t.count_indexed("encoder.layers.");
    ensure!(
        found == n_layers as usize,
        Model,
        "model_config.yaml: encoder.n_layers is {n_layers} but the checkpoint has {found} encoder layers"
    );
    Ok(EncoderParams {
        feat_in: feat_in as usize,
        n_layers: n_layers as usize,
        d_model: d_model as usize,
        n_heads: n_heads as usize,
        ff_expansion_factor: ff_expansion_factor as usize,
        subsampling_factor: subsampling_factor as usize,
        subsampling_channels: subsampling_conv_channels as usize,
        conv_kernel: conv_kernel_size as usize,
        xscaling: cfg.bool_or("encoder.xscaling", true)?,
        use_bias,
        attention,
        att_context_sizes,
        causal_downsampling: cfg.bool_or("encoder.causal_downsampling", false)?,
        conv_context,
        conv_layer_norm,
    })
}

/// Encoder variants the runtime doesn't implement.
fn reject_unsupported_setups(cfg: &Cfg) -> Result<()> {
    require_setting(cfg, "encoder.untie_biases", &Value::Bool(true), "true")?;
    require_setting(cfg, "encoder.feat_out", &Value::from(-1), "-1")?;
    for key in ["encoder.reduction", "encoder.reduction_position"] {
        ensure!(
            cfg.get(key).is_none(),
            Model,
            "model_config.yaml: {key} (time reduction) is not supported"
        );
    }
    ensure!(
        cfg.i64_or("encoder.global_tokens", 0)? == 0,
        Model,
        "model_config.yaml: encoder.global_tokens (Longformer attention) is not supported"
    );
    Ok(())
}

/// `encoder.conv_context_size`: absent (symmetric), `causal`, or a `[left, right]` pair that is
/// one of those two.
fn conv_context_size(cfg: &Cfg, kernel: u32) -> Result<[usize; 2]> {
    const KEY: &str = "encoder.conv_context_size";
    let k = kernel as usize;
    let (half, causal) = ([k / 2; 2], [k - 1, 0]);
    if cfg.get(KEY).and_then(Value::as_str) == Some("causal") {
        return Ok(causal);
    }
    let Some(ctx) = cfg.i32_list(KEY)? else {
        return Ok(half);
    };
    let ctx: Vec<i64> = ctx.into_iter().map(i64::from).collect();
    let as_i64 = |c: [usize; 2]| c.map(|v| v as i64);
    if ctx == as_i64(half) {
        Ok(half)
    } else if ctx == as_i64(causal) {
        Ok(causal)
    } else {
        bail!(
            Model,
            "model_config.yaml: {KEY} {ctx:?} is not supported ({half:?} or causal {causal:?})"
        )
    }
}

/// `encoder.att_context_size`: one `[left, right]` (absent: `[-1, -1]`) or, for a
/// multi-lookahead streaming model, a list of them (the first is NeMo's default).
fn att_context_sizes(cfg: &Cfg) -> Result<Vec<[i32; 2]>> {
    const KEY: &str = "encoder.att_context_size";
    let pair = |v: &[i32]| -> Result<[i32; 2]> {
        match *v {
            [left, right] if left >= -1 && right >= -1 => Ok([left, right]),
            _ => bail!(
                Model,
                "model_config.yaml: bad {KEY} entry {v:?} (two values >= -1)"
            ),
        }
    };
    if let Some(Value::Sequence(items)) = cfg.get(KEY)
        && items.iter().any(|v| v.is_sequence())
    {
        return items
            .iter()
            .map(|item| {
                let v: Option<Vec<i32>> = item.as_sequence().and_then(|xs| {
                    xs.iter()
                        .map(|x| x.as_i64().and_then(|n| i32::try_from(n).ok()))
                        .collect()
                });
                pair(&v.with_fault(Error::Model, || {
                    format!("model_config.yaml: bad {KEY} entry")
                })?)
            })
            .collect();
    }
    match cfg.i32_list(KEY)? {
        None => Ok(vec![[-1, -1]]),
        Some(v) => Ok(vec![pair(&v)?]),
    }
}

/// The prediction network and joint widths (durations: none yet, `durations` gives them).
fn transducer(cfg: &Cfg, t: &Tensors) -> Result<TransducerParams> {
    let target = cfg.str_or("decoder._target_", "RNNTDecoder")?;
    ensure!(
        target.ends_with("RNNTDecoder"),
        Model,
        "model_config.yaml: decoder._target_ {target} is not supported (LSTM RNNTDecoder only)"
    );
    require_setting(
        cfg,
        "decoder.prednet.rnn_type",
        &Value::from("lstm"),
        "lstm",
    )?;
    require_setting(cfg, "decoder.blank_as_pad", &Value::Bool(true), "true")?;
    ensure!(
        cfg.get("decoder.normalization_mode").is_none(),
        Model,
        "model_config.yaml: decoder.normalization_mode (normalised LSTM) is not supported"
    );
    require_setting(
        cfg,
        "joint.jointnet.activation",
        &Value::from("relu"),
        "relu",
    )?;
    let pred_hidden = cfg.u32("decoder.prednet.pred_hidden")?;
    let pred_rnn_layers = cfg.u32("decoder.prednet.pred_rnn_layers")?;
    let joint_hidden = cfg.u32("joint.jointnet.joint_hidden")?;
    t.check_dim(
        "decoder.prednet.pred_hidden",
        pred_hidden,
        "decoder.prediction.embed.weight",
        1,
    )?;
    t.check_dim(
        "joint.jointnet.joint_hidden",
        joint_hidden,
        "joint.enc.weight",
        0,
    )?;
    t.check_dim(
        "decoder.prednet.pred_hidden",
        4 * pred_hidden,
        "decoder.prediction.dec_rnn.lstm.weight_hh_l0",
        0,
    )?;
    let layers = (0..)
        .take_while(|l| t.has(&format!("decoder.prediction.dec_rnn.lstm.weight_ih_l{l}")))
        .count();
    ensure!(
        layers == pred_rnn_layers as usize,
        Model,
        "model_config.yaml: decoder.prednet.pred_rnn_layers is {pred_rnn_layers} but the checkpoint \
         has {layers} LSTM layers"
    );
    Ok(TransducerParams {
        pred_hidden: pred_hidden as usize,
        pred_layers: pred_rnn_layers as usize,
        joint_hidden: joint_hidden as usize,
        durations: Vec::new(),
    })
}

/// The SentencePiece pieces in id order.
fn vocabulary(cfg: &Cfg, tokenizer_vocab: Option<&str>) -> Result<Vec<String>> {
    for key in [
        "joint.vocabulary",
        "decoder.vocabulary",
        "aux_ctc.decoder.vocabulary",
        "labels",
    ] {
        if let Some(v) = cfg.str_list(key)?
            && !v.is_empty()
        {
            return Ok(v);
        }
    }
    let text = tokenizer_vocab.fault(Error::Model,
        "no vocabulary: model_config.yaml has none of joint.vocabulary, decoder.vocabulary, labels, \
         and the archive has no *tokenizer.vocab file",
    )?;
    // SentencePiece `.vocab`: `piece<TAB>score` per line, in id order.
    let pieces: Vec<String> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect();
    ensure!(
        !pieces.is_empty(),
        Model,
        "the tokenizer .vocab file is empty"
    );
    Ok(pieces)
}

/// Vocabulary size and head output widths must agree with the config and the weights.
fn check_heads(cfg: &Cfg, t: &Tensors, ty: ModelType, v: usize, durations: &[i32]) -> Result<()> {
    let v = v as u32;
    for key in [
        "decoder.vocab_size",
        "joint.num_classes",
        "decoder.num_classes",
        "aux_ctc.decoder.num_classes",
    ] {
        if cfg.get(key).is_some() {
            let n = cfg.u32(key)?;
            ensure!(
                n == v,
                Model,
                "model_config.yaml: {key} is {n} but the vocabulary has {v} pieces"
            );
        }
    }
    let blank = v + 1;
    match ty {
        ModelType::Ctc => t.check_dim(
            "vocabulary size + blank",
            blank,
            "decoder.decoder_layers.0.weight",
            0,
        )?,
        ModelType::TdtCtc | ModelType::RnntCtc => t.check_dim(
            "vocabulary size + blank",
            blank,
            "ctc_decoder.decoder_layers.0.weight",
            0,
        )?,
        ModelType::Tdt | ModelType::Rnnt | ModelType::Sortformer => {}
    }
    if ty.has_transducer() {
        t.check_dim(
            "vocabulary size + blank",
            blank,
            "decoder.prediction.embed.weight",
            0,
        )?;
        let extra = if ty.is_tdt() {
            durations.len() as u32
        } else {
            0
        };
        let configured = cfg.u32_or("joint.num_extra_outputs", extra)?;
        ensure!(
            configured == extra,
            Model,
            "model_config.yaml: joint.num_extra_outputs is {configured} but there are {extra} TDT durations"
        );
        t.check_dim(
            "vocabulary + blank + durations",
            blank + extra,
            "joint.joint_net.2.weight",
            0,
        )?;
    }
    Ok(())
}

/// A config setting that, when present, must have the one value the runtime implements.
fn require_setting(cfg: &Cfg, key: &str, want: &Value, shown: &str) -> Result<()> {
    match cfg.get(key) {
        None => Ok(()),
        Some(v) if v == want || yaml_num_eq(v, want) => Ok(()),
        Some(v) => bail!(
            Model,
            "model_config.yaml: {key} = {} is not supported ({shown} only)",
            show(v)
        ),
    }
}

fn yaml_num_eq(a: &Value, b: &Value) -> bool {
    matches!((a.as_f64(), b.as_f64()), (Some(x), Some(y)) if x == y)
}

fn show(v: &Value) -> String {
    serde_yaml::to_string(v)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| format!("{v:?}"))
}

/// Dotted-path access to the config with typed, key-naming errors. A `null` value reads as
/// absent, except through [`Cfg::get_raw`] (where NeMo gives null a meaning of its own).
struct Cfg<'a>(&'a Value);

impl Cfg<'_> {
    /// The value at `key`, including an explicit null (`None` only when absent).
    fn get_raw(&self, key: &str) -> Option<&Value> {
        key.split('.').try_fold(self.0, |v, part| v.get(part))
    }

    /// The value at `key`; an explicit null counts as absent.
    fn get(&self, key: &str) -> Option<&Value> {
        self.get_raw(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> Error {
        err!(Model, "model_config.yaml: missing key {key}")
    }

    fn wrong(&self, key: &str, want: &str) -> Error {
        let got = self.get_raw(key).map(show).unwrap_or_default();
        err!(
            Model,
            "model_config.yaml: {key} should be {want}, found {got}"
        )
    }

    fn required(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| self.missing(key))
    }

    fn u32(&self, key: &str) -> Result<u32> {
        let v = self.required(key)?;
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.wrong(key, "a non-negative integer"))
    }

    fn u32_or(&self, key: &str, default: u32) -> Result<u32> {
        if self.get(key).is_some() {
            self.u32(key)
        } else {
            Ok(default)
        }
    }

    fn i64_or(&self, key: &str, default: i64) -> Result<i64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_i64().ok_or_else(|| self.wrong(key, "an integer")),
        }
    }

    fn f64(&self, key: &str) -> Result<f64> {
        self.required(key)?
            .as_f64()
            .ok_or_else(|| self.wrong(key, "a number"))
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        if self.get(key).is_some() {
            self.f64(key)
        } else {
            Ok(default)
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.wrong(key, "true or false")),
        }
    }

    fn str(&self, key: &str) -> Result<&str> {
        self.required(key)?
            .as_str()
            .ok_or_else(|| self.wrong(key, "a string"))
    }

    fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str> {
        if self.get(key).is_some() {
            self.str(key)
        } else {
            Ok(default)
        }
    }

    fn i32_list(&self, key: &str) -> Result<Option<Vec<i32>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_sequence()
            .ok_or_else(|| self.wrong(key, "a list of integers"))?;
        items
            .iter()
            .map(|x| x.as_i64().and_then(|n| i32::try_from(n).ok()))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| self.wrong(key, "a list of integers"))
    }

    fn str_list(&self, key: &str) -> Result<Option<Vec<String>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_sequence()
            .ok_or_else(|| self.wrong(key, "a list of strings"))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(str::to_owned).ok_or_else(|| {
                    err!(
                        Model,
                        "model_config.yaml: {key}[{i}] is not a string: {}",
                        show(x)
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// Shape queries on the checkpoint.
struct Tensors<'a, 'b>(&'a Shapes<'b>);

impl Tensors<'_, '_> {
    fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn any_prefixed(&self, prefix: &str) -> bool {
        self.0.keys().any(|k| k.starts_with(prefix))
    }

    /// Distinct `N` in `<prefix>N.*`.
    fn count_indexed(&self, prefix: &str) -> usize {
        let mut seen: Vec<&str> = self
            .0
            .keys()
            .filter_map(|k| k.strip_prefix(prefix)?.split('.').next())
            .filter(|n| n.parse::<usize>().is_ok())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }

    /// `what` (from the config) must equal `tensor`'s size along `axis` (torch order).
    fn check_dim(&self, what: &str, expected: u32, tensor: &str, axis: usize) -> Result<()> {
        let shape = self.0.get(tensor).with_fault(Error::Model, || {
            format!("the checkpoint has no tensor {tensor}")
        })?;
        let got = shape.get(axis).copied();
        ensure!(
            got == Some(expected as usize),
            Model,
            "model_config.yaml: {what} = {expected} disagrees with the checkpoint: {tensor} has shape {shape:?}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> Value {
        serde_yaml::from_str(s).unwrap()
    }

    #[test]
    fn cfg_reads_typed_values_and_names_keys() {
        let v = yaml("a:\n  b: 3\n  f: 0.5\n  s: x\n  n: null\n  l: ['on', 'n', '''']\n");
        let c = Cfg(&v);
        assert_eq!(c.u32("a.b").unwrap(), 3);
        assert_eq!(c.f64("a.f").unwrap(), 0.5);
        assert_eq!(c.str("a.s").unwrap(), "x");
        assert_eq!(c.str_list("a.l").unwrap().unwrap(), ["on", "n", "'"]);
        assert_eq!(c.u32_or("a.n", 7).unwrap(), 7, "null reads as absent");
        let e = c.u32("a.missing").unwrap_err().to_string();
        assert!(e.contains("missing key a.missing"), "{e}");
        let e = c.u32("a.f").unwrap_err().to_string();
        assert!(e.contains("a.f should be a non-negative integer"), "{e}");
    }

    #[test]
    fn att_context_size_forms() {
        let full = yaml("encoder: {}");
        assert_eq!(att_context_sizes(&Cfg(&full)).unwrap(), [[-1, -1]]);
        let local = yaml("encoder: {att_context_size: [128, 128]}");
        assert_eq!(att_context_sizes(&Cfg(&local)).unwrap(), [[128, 128]]);
        let multi = yaml("encoder: {att_context_size: [[70, 13], [70, 6]]}");
        assert_eq!(
            att_context_sizes(&Cfg(&multi)).unwrap(),
            [[70, 13], [70, 6]]
        );
        let bad = yaml("encoder: {att_context_size: [[70, 13], [70]]}");
        assert!(att_context_sizes(&Cfg(&bad)).is_err());
    }

    #[test]
    fn conv_context_size_forms() {
        let c = |s: &str| conv_context_size(&Cfg(&yaml(s)), 9);
        assert_eq!(c("encoder: {}").unwrap(), [4, 4]);
        assert_eq!(c("encoder: {conv_context_size: causal}").unwrap(), [8, 0]);
        assert_eq!(c("encoder: {conv_context_size: [8, 0]}").unwrap(), [8, 0]);
        assert_eq!(c("encoder: {conv_context_size: [4, 4]}").unwrap(), [4, 4]);
        assert!(c("encoder: {conv_context_size: [6, 2]}").is_err());
    }

    #[test]
    fn durations_must_agree() {
        let v = yaml("decoding: {durations: [0, 1, 2]}\nmodel_defaults: {tdt_durations: [0, 1]}");
        assert!(durations(&Cfg(&v)).is_err());
        let v = yaml("decoding: {durations: []}\nmodel_defaults: {tdt_durations: [0, 1]}");
        assert_eq!(durations(&Cfg(&v)).unwrap(), [0, 1]);
    }

    #[test]
    fn vocabulary_falls_back_to_the_tokenizer_file() {
        let v = yaml("joint: {}");
        let got = vocabulary(&Cfg(&v), Some("<unk>\t0\n▁t\t-0\n")).unwrap();
        assert_eq!(got, ["<unk>", "▁t"]);
        assert!(vocabulary(&Cfg(&v), None).is_err());
    }
}
