//! The model loader: hyperparameters, vocabulary and weights of a parakeet GGUF, validated
//! once. Structs mirror NeMo's modules and every weight keeps NeMo's state_dict name, so any
//! stage can be diffed against the checkpoint by name. Shapes below are ggml order (the reverse
//! of PyTorch's).

use crate::audio::TARGET_RATE;
use crate::backend::{DType, HostWeights, Weight};
use crate::encoder::Attention;
use crate::gguf::GgufFile;
use crate::layout::{self, Elem, Layout, Role};
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const F32: &[DType] = &[DType::F32];
/// Large matmul weights may be stored f16, q8_0 or q4_0.
const MATMUL: &[DType] = &[DType::F32, DType::F16, DType::Q8_0, DType::Q4_0];

/// Which heads the checkpoint has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    Tdt,
    Rnnt,
    Ctc,
    TdtCtc,
    RnntCtc,
}

impl ModelType {
    fn parse(s: &str) -> Option<ModelType> {
        Some(match s {
            "tdt" => ModelType::Tdt,
            "rnnt" => ModelType::Rnnt,
            "ctc" => ModelType::Ctc,
            "tdt_ctc" => ModelType::TdtCtc,
            "rnnt_ctc" => ModelType::RnntCtc,
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
        }
    }

    pub fn has_transducer(self) -> bool {
        self != ModelType::Ctc
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

/// Front-end settings (NeMo's `preprocessor`).
#[derive(Clone, Debug)]
pub struct PreprocessorParams {
    pub sample_rate: u32,
    pub n_mels: usize,
    pub n_fft: usize,
    pub win_length: usize,
    pub hop_length: usize,
    pub preemph: f32,
    pub log_zero_guard: f32,
}

#[derive(Clone, Debug)]
pub struct EncoderParams {
    pub feat_in: usize,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub ff_dim: usize,
    pub subsampling_factor: usize,
    pub subsampling_channels: usize,
    pub conv_kernel: usize,
    pub xscaling: bool,
    /// The attention the checkpoint was configured with (`self_attention_model` and
    /// `att_context_size`).
    pub attention: Attention,
}

#[derive(Clone, Debug)]
pub struct Hparams {
    pub model_type: ModelType,
    pub preprocessor: PreprocessorParams,
    pub encoder: EncoderParams,
    /// SentencePiece pieces; the blank id is `vocab_size`.
    pub vocab_size: usize,
    pub pred_hidden: usize,
    pub pred_layers: usize,
    pub joint_hidden: usize,
    /// TDT durations (empty for RNN-T / CTC).
    pub durations: Vec<usize>,
    pub max_symbols: usize,
}

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
        }
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
            len = subsampled_len(len);
            factor /= 2;
        }
        len
    }
}

/// A torch `Linear`, or a kernel-1 `Conv1d` (stored squeezed to the same [in, out]).
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Weight>,
}

#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Weight,
    pub bias: Weight,
}

#[derive(Clone, Debug)]
pub struct FeedForward {
    pub linear1: Linear,
    pub linear2: Linear,
}

#[derive(Clone, Debug)]
pub struct RelPositionAttention {
    pub linear_q: Linear,
    pub linear_k: Linear,
    pub linear_v: Linear,
    pub linear_out: Linear,
    /// No bias, ever.
    pub linear_pos: Weight,
    /// [d_k, heads]
    pub pos_bias_u: Weight,
    pub pos_bias_v: Weight,
}

#[derive(Clone, Debug)]
pub struct ConvModule {
    pub pointwise_conv1: Linear,
    /// `depthwise_conv` with `batch_norm` folded in at load: [kernel, d] and [d].
    pub depthwise_conv_folded: Weight,
    pub depthwise_bias_folded: Weight,
    pub pointwise_conv2: Linear,
}

#[derive(Clone, Debug)]
pub struct ConformerLayer {
    pub norm_feed_forward1: LayerNorm,
    pub feed_forward1: FeedForward,
    pub norm_self_att: LayerNorm,
    pub self_attn: RelPositionAttention,
    pub norm_conv: LayerNorm,
    pub conv: ConvModule,
    pub norm_feed_forward2: LayerNorm,
    pub feed_forward2: FeedForward,
    pub norm_out: LayerNorm,
}

/// A torch `Conv2d` with its bias.
#[derive(Clone, Debug)]
pub struct Conv2d {
    pub weight: Weight,
    pub bias: Weight,
}

/// `encoder.pre_encode` (dw_striding): conv.0, then (depthwise conv.2 + pointwise conv.3) and
/// (conv.5 + conv.6), then `out`.
#[derive(Clone, Debug)]
pub struct PreEncode {
    pub conv0: Conv2d,
    /// conv.2 and conv.5 kernels are re-laid channels-fastest at load ([C, 1, 3, 3] in ggml
    /// order) for ggml's channels-contiguous depthwise kernel; biases as in the checkpoint.
    pub conv2: Conv2d,
    pub conv3: Conv2d,
    pub conv5: Conv2d,
    pub conv6: Conv2d,
    pub out: Linear,
}

#[derive(Clone, Debug)]
pub struct EncoderWeights {
    pub pre_encode: PreEncode,
    pub layers: Vec<ConformerLayer>,
}

#[derive(Clone, Debug)]
pub struct LstmLayer {
    pub weight_ih: Weight,
    pub weight_hh: Weight,
    pub bias_ih: Weight,
    pub bias_hh: Weight,
}

/// `decoder.prediction`: Embedding(V + 1, H) and a stacked LSTM.
#[derive(Clone, Debug)]
pub struct PredictionNetwork {
    pub embed: Weight,
    pub lstm: Vec<LstmLayer>,
    /// Layer 0's input gates `weight_ih_l0 · embed[token]`, a function of the token alone:
    /// kept per token after its first emission (see [`InputGates`]).
    pub input_gates: InputGates,
}

/// Per-token cache of the first LSTM layer's input product, shared by every decoder of the
/// model. Each emission otherwise streams `weight_ih_l0` (a quarter of the LSTM's weights,
/// 6.5 MB in f32 for the 0.6b) for a value that only depends on the token; the cached value is
/// the one the graph computed, so decoding is unchanged. At most `(V + 1) x 4H` floats (10.5
/// MB for the 0.6b), filled as tokens occur.
#[derive(Clone, Debug)]
pub struct InputGates(std::sync::Arc<[std::sync::OnceLock<Box<[f32]>>]>);

impl InputGates {
    pub fn new(tokens: usize) -> InputGates {
        InputGates((0..tokens).map(|_| std::sync::OnceLock::new()).collect())
    }

    pub fn get(&self, token: usize) -> Option<&[f32]> {
        self.0.get(token)?.get().map(|v| &v[..])
    }

    /// Keeps `gates` for `token` (a value already kept stays: every computation of it gives
    /// the same).
    pub fn keep(&self, token: usize, gates: Vec<f32>) {
        if let Some(slot) = self.0.get(token) {
            let _ = slot.set(gates.into_boxed_slice());
        }
    }
}

/// `joint`: enc and pred projections, ReLU, `joint_net.2`.
#[derive(Clone, Debug)]
pub struct Joint {
    pub enc: Linear,
    pub pred: Linear,
    pub joint_net: Linear,
}

/// A loaded model. Weights live in backend buffers (zero-copy over the file mapping).
pub struct Model {
    pub path: PathBuf,
    pub name: String,
    pub hparams: Hparams,
    pub vocab: Vec<String>,
    /// `preprocessor.featurizer.window` [win_length] and `.fb` [n_mels][n_fft/2+1], on the host.
    pub window: Vec<f32>,
    pub filterbank: Vec<f32>,
    pub encoder: EncoderWeights,
    pub prediction: Option<PredictionNetwork>,
    pub joint: Option<Joint>,
    /// CTC head (`decoder.decoder_layers.0` or `ctc_decoder.decoder_layers.0`): kernel-1 Conv1d.
    pub ctc: Option<Linear>,
    pub file: GgufFile,
}

/// BatchNorm epsilon used by NeMo's conformer conv module.
const BN_EPS: f64 = 1e-5;

impl Model {
    pub fn load(path: &Path) -> Result<Model> {
        let file = GgufFile::open(path)?;
        let shown = path.display().to_string();
        let arch = file.str("general.architecture")?;
        if arch != "parakeet" {
            bail!("{shown}: architecture '{arch}' is not a parakeet model");
        }
        let hparams = read_hparams(&file)?;
        let vocab = file.str_array("tokenizer.ggml.tokens")?;
        if vocab.len() != hparams.vocab_size {
            bail!(
                "{shown}: tokenizer.ggml.tokens has {} pieces, parakeet.vocab_size says {}",
                vocab.len(),
                hparams.vocab_size
            );
        }
        let name = file.str("general.name").unwrap_or_else(|_| {
            path.file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into()
        });

        let pp = &hparams.preprocessor;
        let window = file
            .weight("preprocessor.featurizer.window", &[pp.win_length], F32)?
            .to_host_f32();
        let filterbank = file
            .weight(
                "preprocessor.featurizer.fb",
                &[pp.n_fft / 2 + 1, pp.n_mels, 1],
                F32,
            )?
            .to_host_f32();

        let loader = Loader { file: &file };
        check_layer_count(&file, hparams.encoder.n_layers)?;
        // Weights computed on the host come first, in one buffer, so that every layer below is
        // built once and complete.
        let mut derived = loader.derived_weights(&hparams)?;
        let pre_encode = loader.pre_encode(&hparams, &mut derived)?;
        let layers = (0..hparams.encoder.n_layers)
            .map(|i| loader.conformer_layer(&hparams.encoder, i, &mut derived))
            .collect::<Result<Vec<_>>>()?;

        let (prediction, joint) = if hparams.model_type.has_transducer() {
            (
                Some(loader.prediction(&hparams)?),
                Some(loader.joint(&hparams)?),
            )
        } else {
            (None, None)
        };
        let ctc = if hparams.model_type.has_ctc() {
            Some(loader.ctc(&hparams)?)
        } else {
            None
        };
        Ok(Model {
            path: path.to_path_buf(),
            name,
            hparams,
            vocab,
            window,
            filterbank,
            encoder: EncoderWeights { pre_encode, layers },
            prediction,
            joint,
            ctc,
            file,
        })
    }
}

fn cwhn_name(conv: &str) -> String {
    format!("encoder.pre_encode.conv.{conv}.weight.cwhn")
}

/// A pre-encode pointwise conv's weight as a panel-packed linear (see `derived_weights`).
fn panel16_name(conv: &str) -> String {
    format!("encoder.pre_encode.conv.{conv}.weight.panel16")
}

/// `[c][k]` row-major -> `[k][c]` row-major.
fn channels_fastest(w: &[f32], c: usize, k: usize) -> Vec<f32> {
    (0..k)
        .flat_map(|j| (0..c).map(move |i| w[i * k + j]))
        .collect()
}

/// A realised derived weight, moved out of the map.
fn take(derived: &mut HashMap<String, Weight>, name: &str) -> Result<Weight> {
    derived
        .remove(name)
        .ok_or_else(|| anyhow::anyhow!("internal: derived weight {name} was not realised"))
}

/// The model's encoder layer count must match the layers the file has weights for: more would
/// fail on a missing tensor, fewer would silently drop layers.
fn check_layer_count(file: &GgufFile, n_layers: usize) -> Result<()> {
    let mut present = std::collections::BTreeSet::new();
    for name in file.tensor_names() {
        if let Some(rest) = name.strip_prefix("encoder.layers.")
            && let Some(Ok(i)) = rest.split('.').next().map(str::parse::<usize>)
        {
            present.insert(i);
        }
    }
    if present.len() != n_layers || present.iter().copied().ne(0..n_layers) {
        bail!(
            "{}: parakeet.encoder.n_layers = {n_layers}, but the file has weights for {} encoder \
             layers",
            file.path().display(),
            present.len()
        );
    }
    Ok(())
}

fn fold_name(layer: usize, what: &str) -> String {
    format!("encoder.layers.{layer}.conv.depthwise_conv.folded_{what}")
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

fn read_hparams(f: &GgufFile) -> Result<Hparams> {
    let shown = f.path().display().to_string();
    // Every error names the key, the value and what is supported.
    let refuse = |key: &str, value: &dyn std::fmt::Display, supported: &str| {
        anyhow::anyhow!("{shown}: parakeet.{key} = {value} is not supported ({supported})")
    };
    let u = |key: &str, lo: usize, hi: usize| -> Result<usize> {
        let v = f.u32(&format!("parakeet.{key}"))? as usize;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(refuse(key, &v, &format!("{lo}..={hi}")))
        }
    };
    let type_name = f.str("parakeet.model_type")?;
    let Some(model_type) = ModelType::parse(&type_name) else {
        return Err(refuse(
            "model_type",
            &type_name,
            "tdt, rnnt, ctc, tdt_ctc, rnnt_ctc",
        ));
    };

    let sample_rate = u("preprocessor.sample_rate", 0, usize::MAX)? as u32;
    if sample_rate != TARGET_RATE {
        return Err(refuse(
            "preprocessor.sample_rate",
            &sample_rate,
            &format!("{TARGET_RATE} only"),
        ));
    }
    let n_mels = u("preprocessor.n_mels", 1, limits::N_MELS)?;
    let n_fft = u("preprocessor.n_fft", 2, limits::N_FFT)?;
    let win_length = u("preprocessor.win_length", 1, n_fft)?;
    // A hop longer than the window would skip audio between frames.
    let hop_length = u("preprocessor.hop_length", 1, win_length)?;
    let preemph = f.f32("parakeet.preprocessor.preemph")?;
    if !(0.0..1.0).contains(&preemph) {
        return Err(refuse("preprocessor.preemph", &preemph, "0 <= preemph < 1"));
    }
    let log_zero_guard = f.f32("parakeet.preprocessor.log_zero_guard_value")?;
    if !(log_zero_guard.is_finite() && log_zero_guard > 0.0) {
        return Err(refuse(
            "preprocessor.log_zero_guard_value",
            &log_zero_guard,
            "a finite value > 0",
        ));
    }
    if f.get("parakeet.preprocessor.normalize").is_some() {
        let normalize = f.str("parakeet.preprocessor.normalize")?;
        if normalize != "per_feature" {
            return Err(refuse(
                "preprocessor.normalize",
                &normalize,
                "per_feature only",
            ));
        }
    }
    let preprocessor = PreprocessorParams {
        sample_rate,
        n_mels,
        n_fft,
        win_length,
        hop_length,
        preemph,
        log_zero_guard,
    };

    let sub = f.str("parakeet.encoder.subsampling")?;
    if sub != "dw_striding" {
        return Err(refuse("encoder.subsampling", &sub, "dw_striding only"));
    }
    let att = f.str("parakeet.encoder.self_attention_model")?;
    let att_context = f.int_array("parakeet.encoder.att_context_size")?;
    if att_context.len() != 2 {
        return Err(refuse(
            "encoder.att_context_size",
            &format!("{att_context:?}"),
            "2 values",
        ));
    }
    let attention = match (att.as_str(), att_context[0], att_context[1]) {
        ("rel_pos", l, r) if l < 0 && r < 0 => Attention::Full,
        ("rel_pos_local_attn", l, r) if l >= 0 && r >= 0 && l.max(r) > 0 => Attention::Local {
            left: l as usize,
            right: r as usize,
        },
        _ => bail!(
            "{shown}: self_attention_model '{att}' with att_context_size {att_context:?} is not \
             supported (rel_pos with [-1, -1], or rel_pos_local_attn with a window)"
        ),
    };
    let feat_in = u("encoder.feat_in", 1, limits::N_MELS)?;
    if feat_in != n_mels {
        return Err(refuse(
            "encoder.feat_in",
            &feat_in,
            &format!("equal to preprocessor.n_mels {n_mels}"),
        ));
    }
    let d_model = u("encoder.d_model", 1, limits::D_MODEL)?;
    let n_heads = u("encoder.n_heads", 1, d_model)?;
    if !d_model.is_multiple_of(n_heads) {
        return Err(refuse(
            "encoder.n_heads",
            &n_heads,
            &format!("a divisor of d_model {d_model}"),
        ));
    }
    let conv_kernel = u("encoder.conv_kernel_size", 1, limits::CONV_KERNEL)?;
    if conv_kernel % 2 == 0 {
        return Err(refuse(
            "encoder.conv_kernel_size",
            &conv_kernel,
            "odd sizes",
        ));
    }
    let encoder = EncoderParams {
        feat_in,
        n_layers: u("encoder.n_layers", 1, limits::N_LAYERS)?,
        d_model,
        n_heads,
        ff_dim: d_model * u("encoder.ff_expansion_factor", 1, limits::FF_EXPANSION)?,
        subsampling_factor: u("encoder.subsampling_factor", 8, 8)?,
        subsampling_channels: u("encoder.subsampling_conv_channels", 1, limits::CHANNELS)?,
        conv_kernel,
        xscaling: f.bool("parakeet.encoder.xscaling")?,
        attention,
    };
    let vocab_size = u("vocab_size", 1, limits::VOCAB)?;

    let (mut pred_hidden, mut pred_layers, mut joint_hidden) = (0, 0, 0);
    let mut durations = Vec::new();
    if model_type.has_transducer() {
        pred_hidden = u("decoder.pred_hidden", 1, limits::D_MODEL)?;
        pred_layers = u("decoder.pred_rnn_layers", 1, limits::PRED_LAYERS)?;
        joint_hidden = u("joint.joint_hidden", 1, limits::D_MODEL)?;
    }
    if model_type.is_tdt() {
        let d = f.int_array("parakeet.tdt.durations")?;
        let ok = (1..=limits::DURATIONS).contains(&d.len())
            && d.iter().all(|v| (0..=limits::DURATION).contains(v));
        if !ok {
            return Err(refuse(
                "tdt.durations",
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
    let max_symbols = match f.get("parakeet.decoding.max_symbols") {
        Some(_) => u("decoding.max_symbols", 1, limits::MAX_SYMBOLS)?,
        None => 10,
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
    })
}

/// Typed weight lookups with NeMo's names.
struct Loader<'a> {
    file: &'a GgufFile,
}

impl Loader<'_> {
    fn w(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        self.file.weight(name, shape, F32)
    }

    fn opt_bias(&self, name: &str, n: usize) -> Result<Option<Weight>> {
        if self.file.has_tensor(name) {
            Ok(Some(self.w(name, &[n])?))
        } else {
            Ok(None)
        }
    }

    /// `prefix.weight` [in, out] (+ optional `prefix.bias` [out]).
    fn linear(&self, prefix: &str, n_in: usize, n_out: usize) -> Result<Linear> {
        Ok(Linear {
            weight: self
                .file
                .weight(&format!("{prefix}.weight"), &[n_in, n_out], MATMUL)?,
            bias: self.opt_bias(&format!("{prefix}.bias"), n_out)?,
        })
    }

    /// A kernel-1 Conv1d: the converter stores it as the [in, out] matrix it is.
    fn conv1x1(&self, prefix: &str, n_in: usize, n_out: usize) -> Result<Linear> {
        self.linear(prefix, n_in, n_out)
    }

    fn norm(&self, prefix: &str, d: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.w(&format!("{prefix}.weight"), &[d])?,
            bias: self.w(&format!("{prefix}.bias"), &[d])?,
        })
    }

    fn conv2d(&self, prefix: &str, shape: &[usize], c: usize) -> Result<Conv2d> {
        Ok(Conv2d {
            weight: self.file.weight(&format!("{prefix}.weight"), shape, F32)?,
            bias: self.w(&format!("{prefix}.bias"), &[c])?,
        })
    }

    /// The weights computed on the host at load, realised into one backend buffer: each
    /// layer's depthwise conv with BatchNorm folded in, the pre-encode depthwise kernels
    /// re-laid channels-fastest, and the pre-encode pointwise convs (f32, C x C) panel-packed
    /// for the f32 GEMM (they are matrix products over every (frequency, time) position; the
    /// converter leaves conv weights in torch's layout).
    fn derived_weights(&self, hp: &Hparams) -> Result<HashMap<String, Weight>> {
        let mut host = HostWeights::new();
        let (d, k) = (hp.encoder.d_model, hp.encoder.conv_kernel);
        for i in 0..hp.encoder.n_layers {
            let conv = format!("encoder.layers.{i}.conv");
            let dw = self.w(&format!("{conv}.depthwise_conv.weight"), &[k, 1, d])?;
            let dw_bias = self.opt_bias(&format!("{conv}.depthwise_conv.bias"), d)?;
            let bn = |what: &str| -> Result<Vec<f32>> {
                Ok(self
                    .w(&format!("{conv}.batch_norm.{what}"), &[d])?
                    .to_host_f32())
            };
            let (w, b) = fold_batch_norm(
                &dw.to_host_f32(),
                dw_bias.map(|b| b.to_host_f32()).as_deref(),
                &bn("weight")?,
                &bn("bias")?,
                &bn("running_mean")?,
                &bn("running_var")?,
                k,
            );
            host.push(&fold_name(i, "weight"), &[k, d], w);
            host.push(&fold_name(i, "bias"), &[d], b);
        }
        let c = hp.encoder.subsampling_channels;
        for conv in ["2", "5"] {
            let name = format!("encoder.pre_encode.conv.{conv}.weight");
            let w = self.file.weight(&name, &[3, 3, 1, c], F32)?;
            host.push(
                &cwhn_name(conv),
                &[c, 1, 3, 3],
                channels_fastest(&w.to_host_f32(), c, 9),
            );
        }
        // conv.0 (1 -> C, 3 x 3) runs in the stem op (`Graph::conv_stem`), which reads its
        // [9, C] panels sixteen channels at a time; conv.3 and conv.6 as [C, C] products;
        // torch's [out, in, kh, kw] is the row-major [m][k] of a Linear.
        for (conv, side, cin) in [("0", 3, 1), ("3", 1, c), ("6", 1, c)] {
            let name = format!("encoder.pre_encode.conv.{conv}.weight");
            let w = self.file.weight(&name, &[side, side, cin, c], F32)?;
            let k = side * side * cin;
            if layout::choose(Role::Gemm, Elem::F32, &[k, c], Layout::ALL) == Layout::Panel16 {
                host.push_panel16(&panel16_name(conv), c, k, &w.to_host_f32());
            }
        }
        host.realize()
    }

    fn pre_encode(&self, hp: &Hparams, derived: &mut HashMap<String, Weight>) -> Result<PreEncode> {
        let c = hp.encoder.subsampling_channels;
        let p = "encoder.pre_encode";
        let f_out = subsampled_len(subsampled_len(subsampled_len(hp.encoder.feat_in)));
        let depthwise = |derived: &mut HashMap<String, Weight>, conv: &str| -> Result<Conv2d> {
            Ok(Conv2d {
                weight: take(derived, &cwhn_name(conv))?,
                bias: self.w(&format!("{p}.conv.{conv}.bias"), &[c])?,
            })
        };
        // The panel-packed kernel made at load, or the file's own (when C is not a multiple
        // of 16).
        let packed_or_plain = |derived: &mut HashMap<String, Weight>,
                               conv: &str,
                               shape: &[usize]|
         -> Result<Conv2d> {
            let prefix = format!("{p}.conv.{conv}");
            match derived.remove(&panel16_name(conv)) {
                Some(weight) => Ok(Conv2d {
                    weight,
                    bias: self.w(&format!("{prefix}.bias"), &[c])?,
                }),
                None => self.conv2d(&prefix, shape, c),
            }
        };
        Ok(PreEncode {
            conv0: packed_or_plain(derived, "0", &[3, 3, 1, c])?,
            conv2: depthwise(derived, "2")?,
            conv3: packed_or_plain(derived, "3", &[1, 1, c, c])?,
            conv5: depthwise(derived, "5")?,
            conv6: packed_or_plain(derived, "6", &[1, 1, c, c])?,
            out: self.linear(&format!("{p}.out"), c * f_out, hp.encoder.d_model)?,
        })
    }

    /// A conformer layer, its depthwise conv taken from the folded `derived` weights.
    fn conformer_layer(
        &self,
        hp: &EncoderParams,
        i: usize,
        derived: &mut HashMap<String, Weight>,
    ) -> Result<ConformerLayer> {
        let p = format!("encoder.layers.{i}");
        let (d, ff) = (hp.d_model, hp.ff_dim);
        let dk = d / hp.n_heads;
        let ffn = |name: &str| -> Result<FeedForward> {
            Ok(FeedForward {
                linear1: self.linear(&format!("{p}.{name}.linear1"), d, ff)?,
                linear2: self.linear(&format!("{p}.{name}.linear2"), ff, d)?,
            })
        };
        let att = format!("{p}.self_attn");
        let self_attn = RelPositionAttention {
            linear_q: self.linear(&format!("{att}.linear_q"), d, d)?,
            linear_k: self.linear(&format!("{att}.linear_k"), d, d)?,
            linear_v: self.linear(&format!("{att}.linear_v"), d, d)?,
            linear_out: self.linear(&format!("{att}.linear_out"), d, d)?,
            linear_pos: self
                .file
                .weight(&format!("{att}.linear_pos.weight"), &[d, d], MATMUL)?,
            pos_bias_u: self.w(&format!("{att}.pos_bias_u"), &[dk, hp.n_heads])?,
            pos_bias_v: self.w(&format!("{att}.pos_bias_v"), &[dk, hp.n_heads])?,
        };
        let conv = format!("{p}.conv");
        Ok(ConformerLayer {
            norm_feed_forward1: self.norm(&format!("{p}.norm_feed_forward1"), d)?,
            feed_forward1: ffn("feed_forward1")?,
            norm_self_att: self.norm(&format!("{p}.norm_self_att"), d)?,
            self_attn,
            norm_conv: self.norm(&format!("{p}.norm_conv"), d)?,
            conv: ConvModule {
                pointwise_conv1: self.conv1x1(&format!("{conv}.pointwise_conv1"), d, 2 * d)?,
                depthwise_conv_folded: take(derived, &fold_name(i, "weight"))?,
                depthwise_bias_folded: take(derived, &fold_name(i, "bias"))?,
                pointwise_conv2: self.conv1x1(&format!("{conv}.pointwise_conv2"), d, d)?,
            },
            norm_feed_forward2: self.norm(&format!("{p}.norm_feed_forward2"), d)?,
            feed_forward2: ffn("feed_forward2")?,
            norm_out: self.norm(&format!("{p}.norm_out"), d)?,
        })
    }

    fn prediction(&self, hp: &Hparams) -> Result<PredictionNetwork> {
        let h = hp.pred_hidden;
        let p = "decoder.prediction";
        let lstm = (0..hp.pred_layers)
            .map(|l| {
                let r = format!("{p}.dec_rnn.lstm");
                Ok(LstmLayer {
                    weight_ih: self.file.weight(
                        &format!("{r}.weight_ih_l{l}"),
                        &[h, 4 * h],
                        MATMUL,
                    )?,
                    weight_hh: self.file.weight(
                        &format!("{r}.weight_hh_l{l}"),
                        &[h, 4 * h],
                        MATMUL,
                    )?,
                    bias_ih: self.w(&format!("{r}.bias_ih_l{l}"), &[4 * h])?,
                    bias_hh: self.w(&format!("{r}.bias_hh_l{l}"), &[4 * h])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PredictionNetwork {
            embed: self.w(&format!("{p}.embed.weight"), &[h, hp.vocab_size + 1])?,
            lstm,
            input_gates: InputGates::new(hp.vocab_size + 1),
        })
    }

    fn joint(&self, hp: &Hparams) -> Result<Joint> {
        let j = hp.joint_hidden;
        let out = hp.vocab_size + 1 + hp.durations.len();
        Ok(Joint {
            enc: self.linear("joint.enc", hp.encoder.d_model, j)?,
            pred: self.linear("joint.pred", hp.pred_hidden, j)?,
            joint_net: self.linear("joint.joint_net.2", j, out)?,
        })
    }

    fn ctc(&self, hp: &Hparams) -> Result<Linear> {
        let prefix = if self.file.has_tensor("ctc_decoder.decoder_layers.0.weight") {
            "ctc_decoder.decoder_layers.0"
        } else {
            "decoder.decoder_layers.0"
        };
        self.conv1x1(prefix, hp.encoder.d_model, hp.vocab_size + 1)
            .with_context(|| "CTC head")
    }
}

/// NeMo's subsampled length for one stride-2, kernel-3, pad-1 conv: `floor((L - 1) / 2) + 1`.
pub fn subsampled_len(len: usize) -> usize {
    if len == 0 { 0 } else { (len - 1) / 2 + 1 }
}

/// Fold inference-mode BatchNorm into the preceding depthwise conv: returns the weight
/// ([d][k] row-major = ggml [k, d]) and bias [d]. Computed in f64, stored f32.
pub fn fold_batch_norm(
    weight: &[f32],
    bias: Option<&[f32]>,
    gamma: &[f32],
    beta: &[f32],
    mean: &[f32],
    var: &[f32],
    kernel: usize,
) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    let mut w = vec![0f32; d * kernel];
    let mut b = vec![0f32; d];
    for c in 0..d {
        let s = gamma[c] as f64 / (var[c] as f64 + BN_EPS).sqrt();
        for k in 0..kernel {
            w[c * kernel + k] = (weight[c * kernel + k] as f64 * s) as f32;
        }
        let b0 = bias.map_or(0.0, |b| b[c] as f64);
        b[c] = ((b0 - mean[c] as f64) * s + beta[c] as f64) as f32;
    }
    (w, b)
}
