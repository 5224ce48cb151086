//! The model loader: hyperparameters, vocabulary and weights of a parakeet GGUF, validated
//! once. Structs mirror NeMo's modules and every weight keeps NeMo's state_dict name, so any
//! stage can be diffed against the checkpoint by name. Shapes below are ggml order (the reverse
//! of PyTorch's).

use crate::backend::{DType, Device, HostWeights, Lowering, Weight};
use crate::bail;
use crate::error::{Context, Result};
use crate::gguf::GgufFile;
use crate::hparams::{EncoderParams, Hparams, TransducerParams, keys};
use crate::layout::{self, Elem, Layout, Role};
use crate::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

mod sortformer;
pub use sortformer::{SortformerWeights, TransformerLayer};

const F32: &[DType] = &[DType::F32];
/// Large matmul weights may be stored f16, q8_0 or q4_0.
const MATMUL: &[DType] = &[DType::F32, DType::F16, DType::Q8_0, DType::Q4_0];

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
    /// `depthwise_conv` with `batch_norm` folded in at load: [kernel, d] and [d] (with a
    /// LayerNorm `batch_norm`, the conv as it is, a missing bias as zeros).
    pub depthwise_conv_folded: Weight,
    pub depthwise_bias_folded: Weight,
    /// `batch_norm` when it is a LayerNorm over channels (`conv_norm_type: layer_norm`),
    /// applied after the depthwise conv; a BatchNorm is folded into it instead.
    pub batch_norm_layer_norm: Option<LayerNorm>,
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
}

/// `joint`: enc and pred projections, ReLU, `joint_net.2`.
#[derive(Clone, Debug)]
pub struct Joint {
    pub enc: Linear,
    pub pred: Linear,
    pub joint_net: Linear,
    /// The logits `joint_net` gives (vocabulary, blank, durations): its weight may have zero
    /// rows after them, padded at load for the int8 GEMM's 8-row panels.
    pub n_logits: usize,
}

/// A transducer's decoder: the prediction network and the joint.
#[derive(Clone, Debug)]
pub struct Transducer {
    pub prediction: PredictionNetwork,
    pub joint: Joint,
}

/// The decoder heads over the encoder a model has. A CTC head is `decoder.decoder_layers.0`
/// (or `ctc_decoder.decoder_layers.0` beside a transducer): a kernel-1 Conv1d.
#[derive(Clone, Debug)]
pub enum Heads {
    Transducer(Transducer),
    Ctc(Linear),
    /// A hybrid TDT/RNN-T + CTC model.
    Hybrid {
        transducer: Transducer,
        ctc: Linear,
    },
    /// A Sortformer diarization model: its Transformer and speaker head.
    Diarization(Box<SortformerWeights>),
}

impl Heads {
    pub fn transducer(&self) -> Option<&Transducer> {
        match self {
            Heads::Transducer(t) | Heads::Hybrid { transducer: t, .. } => Some(t),
            Heads::Ctc(_) | Heads::Diarization(_) => None,
        }
    }

    pub fn ctc(&self) -> Option<&Linear> {
        match self {
            Heads::Ctc(c) | Heads::Hybrid { ctc: c, .. } => Some(c),
            Heads::Transducer(_) | Heads::Diarization(_) => None,
        }
    }
}

/// How a model is loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The lowering its graphs will run: [`Lowering::Builtin`] realizes every weight the file
    /// stores in our packed layouts in ggml's own types at load (`GgufFile::unpack_layouts`)
    /// and packs nothing for our kernels; one GGUF file serves both.
    pub lowering: Lowering,
    /// The device whose memory holds the weights and whose backend its sessions compute on
    /// (none: the CPU). Any device but the CPU runs the built-in lowering.
    pub device: Option<Device>,
}

impl LoadOptions {
    /// The default options, with the lowering `PARAKEET_KERNELS` asks for
    /// ([`Lowering::from_env`]) and the device `PARAKEET_DEVICE` names (a diagnostic, as
    /// `--device` takes it: the whole suite runs on a device so).
    ///
    /// # Panics
    /// When `PARAKEET_DEVICE` names no device of this build and machine: a run meant for a
    /// device must not pass on the CPU.
    pub fn from_env() -> LoadOptions {
        let device = std::env::var("PARAKEET_DEVICE").ok().map(|asked| {
            asked
                .parse::<crate::backend::DeviceRequest>()
                .and_then(|r| r.resolve())
                .unwrap_or_else(|e| panic!("PARAKEET_DEVICE={asked}: {e}"))
        });
        LoadOptions {
            lowering: Lowering::from_env(),
            device,
        }
    }

    /// The lowering a model loaded with these options runs: the built-in one on any device but
    /// the CPU (our kernels are CPU code).
    pub fn effective_lowering(&self) -> Lowering {
        match self.device {
            Some(d) if !d.is_cpu() => Lowering::Builtin,
            _ => self.lowering,
        }
    }
}

/// A loaded model, read-only once loaded (what decoding keeps per stream lives in the
/// session). Weights live in backend buffers (zero-copy over the file mapping).
pub struct Model {
    path: PathBuf,
    name: String,
    hparams: Hparams,
    tokenizer: Tokenizer,
    window: Vec<f32>,
    filterbank: Vec<f32>,
    encoder: EncoderWeights,
    heads: Heads,
    file: GgufFile,
    /// The lowering its weights were realized for.
    lowering: Lowering,
    /// The device whose memory holds its weights (its sessions compute there).
    device: Device,
}

/// BatchNorm epsilon used by NeMo's conformer conv module.
const BN_EPS: f64 = 1e-5;

impl Model {
    /// The GGUF file the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How errors name the model: what the user gave (a `.nemo` for a cached conversion).
    pub fn shown(&self) -> &str {
        self.file.shown()
    }

    /// The model's name (`general.name`, or the file's stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn hparams(&self) -> &Hparams {
        &self.hparams
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// `preprocessor.featurizer.window` [win_length], on the host.
    pub fn window(&self) -> &[f32] {
        &self.window
    }

    /// `preprocessor.featurizer.fb` [n_mels][n_fft/2+1], on the host.
    pub fn filterbank(&self) -> &[f32] {
        &self.filterbank
    }

    pub fn encoder(&self) -> &EncoderWeights {
        &self.encoder
    }

    pub fn heads(&self) -> &Heads {
        &self.heads
    }

    pub fn transducer(&self) -> Option<&Transducer> {
        self.heads.transducer()
    }

    pub fn ctc(&self) -> Option<&Linear> {
        self.heads.ctc()
    }

    /// A Sortformer's Transformer and speaker head (`None` for a speech recognition model).
    pub fn sortformer(&self) -> Option<&SortformerWeights> {
        match &self.heads {
            Heads::Diarization(w) => Some(w),
            _ => None,
        }
    }

    /// The mapped file (for modules read from it directly, and page-cache hints).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The lowering the model's weights were realized for: the one its sessions run.
    pub fn lowering(&self) -> Lowering {
        self.lowering
    }

    /// The device whose memory holds the weights: its sessions compute there.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Bytes of the file's weights in the device's memory (0 on the CPU: they are mapped).
    pub fn device_weight_bytes(&self) -> usize {
        if self.device.is_cpu() {
            return 0;
        }
        self.file.device_bytes(self.device)
    }

    pub fn load(path: &Path) -> Result<Model> {
        Model::load_as(path, &path.display().to_string())
    }

    /// [`Model::load`], naming the model `shown` in every error (what the user gave, e.g. the
    /// `.nemo` a cached GGUF was converted from).
    pub fn load_as(path: &Path, shown: &str) -> Result<Model> {
        Model::load_with(path, shown, &LoadOptions::from_env())
    }

    /// [`Model::load_as`] with `options`.
    pub fn load_with(path: &Path, shown: &str, options: &LoadOptions) -> Result<Model> {
        let mut file = GgufFile::open_as(path, shown)?;
        let lowering = options.effective_lowering();
        if lowering == Lowering::Builtin {
            file.unpack_layouts()?;
        }
        let device = match options.device {
            Some(d) => d,
            None => Device::cpu()?,
        };
        // One pass: every file weight copied into the device's memory, before anything reads it.
        file.place_on(device)?;
        let shown = shown.to_string();
        let hparams = Hparams::read(&file)?;
        // A diarization model has no vocabulary.
        let tokenizer = match hparams.model_type.is_asr() {
            true => Tokenizer::read(&file)?,
            false => Tokenizer::new(Vec::new()),
        };
        if tokenizer.len() != hparams.vocab_size {
            bail!(
                Model,
                "{shown}: {} has {} pieces, {} says {}",
                keys::TOKENS,
                tokenizer.len(),
                keys::VOCAB_SIZE,
                hparams.vocab_size
            );
        }
        let name = file.str(keys::NAME).unwrap_or_else(|_| {
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

        let loader = Loader {
            file: &file,
            lowering,
            device,
        };
        check_layer_count(&file, hparams.encoder.n_layers)?;
        // Weights computed on the host come first, in one buffer, so that every layer below is
        // built once and complete.
        let derived = loader.derived_weights(&hparams)?;
        let pre_encode = loader.pre_encode(&hparams, &derived)?;
        let layers = (0..hparams.encoder.n_layers)
            .map(|i| loader.conformer_layer(&hparams.encoder, i, &derived))
            .collect::<Result<Vec<_>>>()?;

        let transducer = match &hparams.transducer {
            Some(t) => Some(Transducer {
                prediction: loader.prediction(&hparams, t)?,
                joint: loader.joint(&hparams, t)?,
            }),
            None => None,
        };
        let ctc = if hparams.model_type.has_ctc() {
            Some(loader.ctc(&hparams)?)
        } else {
            None
        };
        let heads = match (transducer, ctc) {
            (Some(transducer), Some(ctc)) => Heads::Hybrid { transducer, ctc },
            (Some(t), None) => Heads::Transducer(t),
            (None, Some(c)) => Heads::Ctc(c),
            (None, None) if let Some(p) = &hparams.sortformer => Heads::Diarization(Box::new(
                SortformerWeights::load(&file, hparams.encoder.d_model, p)?,
            )),
            (None, None) => bail!(
                Model,
                "{shown}: a {} model without a decoder head",
                hparams.model_type.name()
            ),
        };
        Ok(Model {
            path: path.to_path_buf(),
            name,
            hparams,
            tokenizer,
            window,
            filterbank,
            encoder: EncoderWeights { pre_encode, layers },
            heads,
            file,
            lowering,
            device,
        })
    }
}

/// The weights computed on the host at load ([`Loader::derived_weights`]), each where it
/// belongs.
struct Derived {
    /// Per encoder layer: the depthwise conv's weight [k, d] and bias [d], BatchNorm folded in.
    folded: Vec<(Weight, Weight)>,
    /// Pre-encode conv.2 and conv.5, channels-fastest.
    depthwise: [Weight; 2],
    /// Pre-encode conv.0, conv.3 and conv.6 panel-packed, where the f32 GEMM takes them so.
    pointwise: [Option<Weight>; 3],
}

/// `[c][k]` row-major -> `[k][c]` row-major.
fn channels_fastest(w: &[f32], c: usize, k: usize) -> Vec<f32> {
    (0..k)
        .flat_map(|j| (0..c).map(move |i| w[i * k + j]))
        .collect()
}

/// `linear` (named `name`) on our int8 GEMM, padded to whole 8-row panels
/// ([`HostWeights::push_int8_padded`]), when the file keeps it on ggml's q8_0 / q4_0 layout
/// for its row count; as it is otherwise.
fn on_int8_gemm(name: &str, linear: Linear) -> Result<Linear> {
    let mut host = HostWeights::new();
    let weight = format!("{name}.weight.int8");
    let Some(slots) = host.push_int8_padded(&weight, &linear.weight, linear.bias.as_ref()) else {
        return Ok(linear);
    };
    let realised = host.realize_slots()?;
    Ok(Linear {
        weight: realised.get(slots.weight),
        bias: slots.bias.map(|b| realised.get(b)),
    })
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
            Model,
            "{}: parakeet.encoder.n_layers = {n_layers}, but the file has weights for {} encoder \
             layers",
            file.shown(),
            present.len()
        );
    }
    Ok(())
}

/// Typed weight lookups with NeMo's names.
struct Loader<'a> {
    file: &'a GgufFile,
    /// What the weights are realized for: nothing is packed for our kernels under
    /// [`Lowering::Builtin`].
    lowering: Lowering,
    /// Where the weights computed at load are realised.
    device: Device,
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
    fn derived_weights(&self, hp: &Hparams) -> Result<Derived> {
        let mut host = HostWeights::on(self.device);
        let (d, k) = (hp.encoder.d_model, hp.encoder.conv_kernel);
        let fold_name =
            |i: usize, what: &str| format!("encoder.layers.{i}.conv.depthwise_conv.folded_{what}");
        let mut folded = Vec::with_capacity(hp.encoder.n_layers);
        for i in 0..hp.encoder.n_layers {
            let conv = format!("encoder.layers.{i}.conv");
            let dw = self.w(&format!("{conv}.depthwise_conv.weight"), &[k, 1, d])?;
            let dw_bias = self.opt_bias(&format!("{conv}.depthwise_conv.bias"), d)?;
            if hp.encoder.conv_layer_norm {
                // Nothing to fold: the LayerNorm's statistics are the frame's own.
                let bias = dw_bias.map_or_else(|| vec![0.0; d], |b| b.to_host_f32());
                folded.push((
                    host.push(&fold_name(i, "weight"), &[k, d], dw.to_host_f32()),
                    host.push(&fold_name(i, "bias"), &[d], bias),
                ));
                continue;
            }
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
            folded.push((
                host.push(&fold_name(i, "weight"), &[k, d], w),
                host.push(&fold_name(i, "bias"), &[d], b),
            ));
        }
        let c = hp.encoder.subsampling_channels;
        let depthwise = ["2", "5"].map(|conv| -> Result<_> {
            let name = format!("encoder.pre_encode.conv.{conv}.weight");
            let w = self.file.weight(&name, &[3, 3, 1, c], F32)?;
            Ok(host.push(
                &format!("{name}.cwhn"),
                &[c, 1, 3, 3],
                channels_fastest(&w.to_host_f32(), c, 9),
            ))
        });
        let [d2, d5] = depthwise;
        let depthwise = [d2?, d5?];
        // conv.0 (1 -> C, 3 x 3) runs in the stem op (`FusedOps::conv_stem`), which reads its
        // [9, C] panels sixteen channels at a time; conv.3 and conv.6 as [C, C] products;
        // torch's [out, in, kh, kw] is the row-major [m][k] of a Linear.
        // The stem op pads 1 frame on each side: causal subsampling takes the plain convs.
        let stem = !hp.encoder.causal_downsampling;
        let mut pointwise = [None; 3];
        for (slot, (conv, side, cin)) in [("0", 3, 1), ("3", 1, c), ("6", 1, c)]
            .into_iter()
            .enumerate()
        {
            if conv == "0" && !stem {
                continue;
            }
            let name = format!("encoder.pre_encode.conv.{conv}.weight");
            let w = self.file.weight(&name, &[side, side, cin, c], F32)?;
            let k = side * side * cin;
            if self.lowering == Lowering::Kernels
                && layout::choose(Role::Gemm, Elem::F32, &[k, c], Layout::ALL) == Layout::Panel16
            {
                pointwise[slot] =
                    Some(host.push_panel16(&format!("{name}.panel16"), c, k, &w.to_host_f32()));
            }
        }
        let realised = host.realize_slots()?;
        Ok(Derived {
            folded: folded
                .into_iter()
                .map(|(w, b)| (realised.get(w), realised.get(b)))
                .collect(),
            depthwise: depthwise.map(|s| realised.get(s)),
            pointwise: pointwise.map(|s| s.map(|s| realised.get(s))),
        })
    }

    fn pre_encode(&self, hp: &Hparams, derived: &Derived) -> Result<PreEncode> {
        let c = hp.encoder.subsampling_channels;
        let p = "encoder.pre_encode";
        // The convs shrink the mel axis as they shrink time.
        let f_out = hp.geometry().encoded_len(hp.encoder.feat_in);
        let bias = |conv: &str| self.w(&format!("{p}.conv.{conv}.bias"), &[c]);
        let [d2, d5] = &derived.depthwise;
        // The panel-packed kernel made at load, or the file's own (when C is not a multiple
        // of 16).
        let packed_or_plain = |packed: &Option<Weight>, conv: &str, shape: &[usize]| match packed {
            Some(weight) => Ok(Conv2d {
                weight: weight.clone(),
                bias: bias(conv)?,
            }),
            None => self.conv2d(&format!("{p}.conv.{conv}"), shape, c),
        };
        let [p0, p3, p6] = &derived.pointwise;
        Ok(PreEncode {
            conv0: packed_or_plain(p0, "0", &[3, 3, 1, c])?,
            conv2: Conv2d {
                weight: d2.clone(),
                bias: bias("2")?,
            },
            conv3: packed_or_plain(p3, "3", &[1, 1, c, c])?,
            conv5: Conv2d {
                weight: d5.clone(),
                bias: bias("5")?,
            },
            conv6: packed_or_plain(p6, "6", &[1, 1, c, c])?,
            out: self.linear(&format!("{p}.out"), c * f_out, hp.encoder.d_model)?,
        })
    }

    /// A conformer layer, its depthwise conv taken from the folded `derived` weights.
    fn conformer_layer(
        &self,
        hp: &EncoderParams,
        i: usize,
        derived: &Derived,
    ) -> Result<ConformerLayer> {
        let p = format!("encoder.layers.{i}");
        let (d, ff) = (hp.d_model, hp.ff_dim());
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
                depthwise_conv_folded: derived.folded[i].0.clone(),
                depthwise_bias_folded: derived.folded[i].1.clone(),
                batch_norm_layer_norm: if hp.conv_layer_norm {
                    Some(self.norm(&format!("{conv}.batch_norm"), d)?)
                } else {
                    None
                },
                pointwise_conv2: self.conv1x1(&format!("{conv}.pointwise_conv2"), d, d)?,
            },
            norm_feed_forward2: self.norm(&format!("{p}.norm_feed_forward2"), d)?,
            feed_forward2: ffn("feed_forward2")?,
            norm_out: self.norm(&format!("{p}.norm_out"), d)?,
        })
    }

    fn prediction(&self, hp: &Hparams, t: &TransducerParams) -> Result<PredictionNetwork> {
        let h = t.pred_hidden;
        let p = "decoder.prediction";
        let lstm = (0..t.pred_layers)
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

    fn joint(&self, hp: &Hparams, t: &TransducerParams) -> Result<Joint> {
        let j = t.joint_hidden;
        let out = hp.vocab_size + 1 + t.durations.len();
        Ok(Joint {
            enc: self.linear("joint.enc", hp.encoder.d_model, j)?,
            pred: self.linear("joint.pred", t.pred_hidden, j)?,
            joint_net: match self.lowering {
                Lowering::Kernels => on_int8_gemm(
                    "joint.joint_net.2",
                    self.linear("joint.joint_net.2", j, out)?,
                )?,
                Lowering::Builtin => self.linear("joint.joint_net.2", j, out)?,
            },
            n_logits: out,
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
