//! The model loader: hyperparameters, vocabulary and weights of a parakeet GGUF, validated
//! once. Structs mirror NeMo's modules and every weight keeps NeMo's state_dict name, so any
//! stage can be diffed against the checkpoint by name. Shapes below are ggml order (the reverse
//! of PyTorch's).

use crate::backend::DType;
use crate::backend::gguf::{GgufFile, HostWeights, Weight};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

const F32: &[DType] = &[DType::F32];
/// Large matmul weights may be stored f16 or q8_0.
const MATMUL: &[DType] = &[DType::F32, DType::F16, DType::Q8_0];

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
    /// `[left, right]` frames of attention context; `[-1, -1]` is full attention.
    pub att_context: [i64; 2],
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

/// `encoder.pre_encode` (dw_striding): conv.0, then (depthwise conv.2 + pointwise conv.3) and
/// (conv.5 + conv.6), then `out`.
#[derive(Clone, Debug)]
pub struct PreEncode {
    pub conv0: (Weight, Weight),
    /// conv.2 and conv.5 kernels are re-laid channels-fastest at load ([C, 1, 3, 3] in ggml
    /// order) for ggml's channels-contiguous depthwise kernel; biases as in the checkpoint.
    pub conv2: (Weight, Weight),
    pub conv3: (Weight, Weight),
    pub conv5: (Weight, Weight),
    pub conv6: (Weight, Weight),
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

/// A depthwise conv with BatchNorm folded in, on the host: weight [d][k] and bias [d].
type FoldedConv = (Vec<f32>, Vec<f32>);

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

        let mut host = HostWeights::new();
        let loader = Loader { file: &file };
        let pre_encode = loader.pre_encode(&hparams)?;
        let mut layers = Vec::with_capacity(hparams.encoder.n_layers);
        let mut folded = Vec::new();
        for i in 0..hparams.encoder.n_layers {
            let (layer, fold) = loader.conformer_layer(&hparams.encoder, i)?;
            layers.push(layer);
            folded.push(fold);
        }
        for (i, (w, b)) in folded.iter().enumerate() {
            let (d, k) = (hparams.encoder.d_model, hparams.encoder.conv_kernel);
            host.push(&fold_name(i, "weight"), &[k, d], w.clone());
            host.push(&fold_name(i, "bias"), &[d], b.clone());
        }
        let c = hparams.encoder.subsampling_channels;
        for (name, (w, _)) in [("2", &pre_encode.conv2), ("5", &pre_encode.conv5)] {
            host.push(
                &cwhn_name(name),
                &[c, 1, 3, 3],
                channels_fastest(&w.to_host_f32(), c, 9),
            );
        }
        let mut derived = host.realize()?;
        let mut pre_encode = pre_encode;
        pre_encode.conv2.0 = derived.remove(&cwhn_name("2")).expect("queued above");
        pre_encode.conv5.0 = derived.remove(&cwhn_name("5")).expect("queued above");
        for (i, layer) in layers.iter_mut().enumerate() {
            layer.conv.depthwise_conv_folded = derived
                .remove(&fold_name(i, "weight"))
                .expect("queued above");
            layer.conv.depthwise_bias_folded =
                derived.remove(&fold_name(i, "bias")).expect("queued above");
        }

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

/// `[c][k]` row-major -> `[k][c]` row-major.
fn channels_fastest(w: &[f32], c: usize, k: usize) -> Vec<f32> {
    (0..k)
        .flat_map(|j| (0..c).map(move |i| w[i * k + j]))
        .collect()
}

fn fold_name(layer: usize, what: &str) -> String {
    format!("encoder.layers.{layer}.conv.depthwise_conv.folded_{what}")
}

fn read_hparams(f: &GgufFile) -> Result<Hparams> {
    let u = |k: &str| f.u32(&format!("parakeet.{k}")).map(|v| v as usize);
    let shown = f.path().display().to_string();
    let type_name = f.str("parakeet.model_type")?;
    let Some(model_type) = ModelType::parse(&type_name) else {
        bail!("{shown}: unknown parakeet.model_type '{type_name}'");
    };
    let preprocessor = PreprocessorParams {
        sample_rate: u("preprocessor.sample_rate")? as u32,
        n_mels: u("preprocessor.n_mels")?,
        n_fft: u("preprocessor.n_fft")?,
        win_length: u("preprocessor.win_length")?,
        hop_length: u("preprocessor.hop_length")?,
        preemph: f.f32("parakeet.preprocessor.preemph")?,
        log_zero_guard: f.f32("parakeet.preprocessor.log_zero_guard_value")?,
    };
    let sub = f.str("parakeet.encoder.subsampling")?;
    if sub != "dw_striding" {
        bail!("{shown}: subsampling '{sub}' is not supported (dw_striding only)");
    }
    let att = f.str("parakeet.encoder.self_attention_model")?;
    let att_context = f.int_array("parakeet.encoder.att_context_size")?;
    if att_context.len() != 2 {
        bail!("{shown}: parakeet.encoder.att_context_size must hold 2 values");
    }
    // Local attention (a band of att_context_size around each frame) is not implemented yet:
    // refuse it rather than silently attending to everything.
    let full_context = att_context.iter().all(|&c| c < 0);
    if att != "rel_pos" || !full_context {
        bail!(
            "{shown}: self_attention_model '{att}' with att_context_size {att_context:?} is not \
             supported yet (full rel_pos attention only)"
        );
    }
    let d_model = u("encoder.d_model")?;
    let encoder = EncoderParams {
        feat_in: u("encoder.feat_in")?,
        n_layers: u("encoder.n_layers")?,
        d_model,
        n_heads: u("encoder.n_heads")?,
        ff_dim: d_model * u("encoder.ff_expansion_factor")?,
        subsampling_factor: u("encoder.subsampling_factor")?,
        subsampling_channels: u("encoder.subsampling_conv_channels")?,
        conv_kernel: u("encoder.conv_kernel_size")?,
        xscaling: f.bool("parakeet.encoder.xscaling")?,
        att_context: [att_context[0], att_context[1]],
    };
    let sane = |ok: bool, what: &str| -> Result<()> {
        if ok {
            Ok(())
        } else {
            bail!("{shown}: invalid hyperparameter: {what}")
        }
    };
    sane(
        preprocessor.n_mels > 0 && preprocessor.n_mels == encoder.feat_in,
        "n_mels == feat_in",
    )?;
    sane(preprocessor.hop_length > 0, "hop_length > 0")?;
    sane(
        preprocessor.win_length > 0 && preprocessor.win_length <= preprocessor.n_fft,
        "0 < win_length <= n_fft",
    )?;
    sane(encoder.subsampling_factor == 8, "subsampling_factor == 8")?;
    sane(
        encoder.n_heads > 0 && d_model % encoder.n_heads == 0,
        "d_model divisible by n_heads",
    )?;
    sane(encoder.conv_kernel % 2 == 1, "odd conv_kernel_size")?;
    sane(
        encoder.n_layers > 0 && encoder.subsampling_channels > 0,
        "layers and channels",
    )?;
    let vocab_size = u("vocab_size")?;
    sane(vocab_size > 0, "vocab_size > 0")?;

    let (mut pred_hidden, mut pred_layers, mut joint_hidden) = (0, 0, 0);
    let mut durations = Vec::new();
    if model_type.has_transducer() {
        pred_hidden = u("decoder.pred_hidden")?;
        pred_layers = u("decoder.pred_rnn_layers")?;
        joint_hidden = u("joint.joint_hidden")?;
        sane(
            pred_hidden > 0 && pred_layers > 0 && joint_hidden > 0,
            "decoder sizes",
        )?;
    }
    if model_type.is_tdt() {
        let d = f.int_array("parakeet.tdt.durations")?;
        sane(!d.is_empty() && d.iter().all(|&v| v >= 0), "tdt.durations")?;
        durations = d.into_iter().map(|v| v as usize).collect();
    }
    let max_symbols = u("decoding.max_symbols").unwrap_or(10).max(1);
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

    fn conv_pair(&self, prefix: &str, shape: &[usize], c: usize) -> Result<(Weight, Weight)> {
        Ok((
            self.file.weight(&format!("{prefix}.weight"), shape, F32)?,
            self.w(&format!("{prefix}.bias"), &[c])?,
        ))
    }

    fn pre_encode(&self, hp: &Hparams) -> Result<PreEncode> {
        let c = hp.encoder.subsampling_channels;
        let p = "encoder.pre_encode";
        let f_out = subsampled_len(subsampled_len(subsampled_len(hp.encoder.feat_in)));
        Ok(PreEncode {
            conv0: self.conv_pair(&format!("{p}.conv.0"), &[3, 3, 1, c], c)?,
            conv2: self.conv_pair(&format!("{p}.conv.2"), &[3, 3, 1, c], c)?,
            conv3: self.conv_pair(&format!("{p}.conv.3"), &[1, 1, c, c], c)?,
            conv5: self.conv_pair(&format!("{p}.conv.5"), &[3, 3, 1, c], c)?,
            conv6: self.conv_pair(&format!("{p}.conv.6"), &[1, 1, c, c], c)?,
            out: self.linear(&format!("{p}.out"), c * f_out, hp.encoder.d_model)?,
        })
    }

    /// A conformer layer, plus its depthwise conv with BatchNorm folded in (host data).
    fn conformer_layer(
        &self,
        hp: &EncoderParams,
        i: usize,
    ) -> Result<(ConformerLayer, FoldedConv)> {
        let p = format!("encoder.layers.{i}");
        let (d, ff, k) = (hp.d_model, hp.ff_dim, hp.conv_kernel);
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
        let dw = self.w(&format!("{conv}.depthwise_conv.weight"), &[k, 1, d])?;
        let dw_bias = self.opt_bias(&format!("{conv}.depthwise_conv.bias"), d)?;
        let bn = |what: &str| self.w(&format!("{conv}.batch_norm.{what}"), &[d]);
        let fold = fold_batch_norm(
            &dw.to_host_f32(),
            dw_bias.map(|b| b.to_host_f32()).as_deref(),
            &bn("weight")?.to_host_f32(),
            &bn("bias")?.to_host_f32(),
            &bn("running_mean")?.to_host_f32(),
            &bn("running_var")?.to_host_f32(),
            k,
        );
        let layer = ConformerLayer {
            norm_feed_forward1: self.norm(&format!("{p}.norm_feed_forward1"), d)?,
            feed_forward1: ffn("feed_forward1")?,
            norm_self_att: self.norm(&format!("{p}.norm_self_att"), d)?,
            self_attn,
            norm_conv: self.norm(&format!("{p}.norm_conv"), d)?,
            conv: ConvModule {
                pointwise_conv1: self.conv1x1(&format!("{conv}.pointwise_conv1"), d, 2 * d)?,
                // Replaced by the realised folded tensors in Model::load.
                depthwise_conv_folded: dw.clone(),
                depthwise_bias_folded: dw,
                pointwise_conv2: self.conv1x1(&format!("{conv}.pointwise_conv2"), d, d)?,
            },
            norm_feed_forward2: self.norm(&format!("{p}.norm_feed_forward2"), d)?,
            feed_forward2: ffn("feed_forward2")?,
            norm_out: self.norm(&format!("{p}.norm_out"), d)?,
        };
        Ok((layer, fold))
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
