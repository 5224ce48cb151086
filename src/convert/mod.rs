//! `.nemo` -> GGUF conversion (docs/GGUF.md is the contract).
//!
//! The checkpoint is streamed: tensor shapes come from the pickle, the GGUF header is laid out
//! from them, and each tensor is then read, converted and written before the next is loaded, so
//! peak memory is about one tensor, whatever the model size.

mod config;
mod nemo;
mod pickle;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Context, Error, Result};
use crate::{ensure, err};

use crate::backend::DType;
use crate::gguf::GgufWriter;
use crate::hparams::{ARCHITECTURE, ModelType, keys};
use crate::layout::{self, Layout, Role};

pub use config::ModelConfig;

pub use nemo::{NemoArchive, NemoModel, NemoTensor, TensorEntry, parse_config, read_nemo};

/// Entry points for the fuzz harness (`examples/fuzz.rs`): the `.nemo` reader's parsers on
/// in-memory bytes. Not a stable API.
#[doc(hidden)]
pub mod fuzz {
    use crate::error::{Error, Result};
    use std::io::Cursor;

    /// A torch checkpoint zip (`model_weights.ckpt`): its `data.pkl` index, then every tensor
    /// (storage lookup, size checks, decoding and view gathering). Returns the values read.
    pub fn checkpoint(zip_bytes: &[u8]) -> Result<usize> {
        let mut zip = zip::ZipArchive::new(Cursor::new(zip_bytes)).map_err(Error::model)?;
        let (prefix, tensors) = super::nemo::read_tensor_index(&mut zip)?;
        let mut values = 0;
        for t in &tensors {
            values += super::nemo::load_tensor(&mut zip, &prefix, &t.desc)?.len();
        }
        Ok(values)
    }

    /// A pickled state dict (`data.pkl`): returns the number of tensors it lists.
    pub fn pickle(pkl: &[u8]) -> Result<usize> {
        let root = super::pickle::load(pkl)?;
        Ok(super::pickle::state_dict_tensors(&root)?.len())
    }
}

/// Storage type for the large matmul weights (everything else stays f32).
///
/// What each costs (README, "Using a real model"; docs/BENCHMARKS.md): sizes and speeds of the
/// 0.6b on the AMD Zen 5 kind, 1 thread, process CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum OutType {
    /// Exact; 2357 MiB for the 0.6b, about 1.8x q8_0's time (our f32 panel GEMM).
    #[value(name = "f32")]
    F32,
    /// ggml's f16 (round to nearest); about half of f32's size, on ggml's f16 kernels.
    #[value(name = "f16")]
    F16,
    /// 8-bit blocks of 32 on our int8 GEMM (`q8_0x8`); 630 MiB for the 0.6b, the speed reference.
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks of 32 on our int8 GEMM (`q4_0x8`); 337 MiB for the 0.6b (0.53x q8_0),
    /// 0.92-0.97x q8_0's time, 16x q8_0's rounding step (lower token agreement with f32).
    #[value(name = "q4_0")]
    Q4_0,
}

impl OutType {
    /// `general.file_type` (llama.cpp's numbering: all f32, mostly f16, mostly q8_0, mostly
    /// q4_0).
    pub fn file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::Q4_0 => 2,
        }
    }

    fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
            Self::Q8_0 => DType::Q8_0,
            Self::Q4_0 => DType::Q4_0,
        }
    }
}

impl std::str::FromStr for OutType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        <Self as clap::ValueEnum>::from_str(s, true)
            .map_err(|_| err!(Options, "unknown output type {s:?} (f32, f16, q8_0, q4_0)"))
    }
}

/// What [`convert`] did.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub model_type: ModelType,
    pub tensors: usize,
    pub params: usize,
    /// Tensors stored as f32, f16, q8_0 and q4_0.
    pub f32_tensors: usize,
    pub f16_tensors: usize,
    pub q8_0_tensors: usize,
    /// f32 tensors stored panel-packed for the encoder's GEMM.
    pub panel16_tensors: usize,
    pub q4_0_tensors: usize,
    /// q8_0 tensors repacked into the `q8_0x8` layout.
    pub repacked_tensors: usize,
    /// q4_0 tensors repacked into the `q4_0x8` layout.
    pub repacked_q4_tensors: usize,
    /// Size of the written GGUF.
    pub bytes: u64,
    pub elapsed: Duration,
    /// What the converted model will lack and why (a front end prints each as a warning).
    pub warnings: Vec<String>,
}

/// Converts `nemo` to a GGUF at `out`.
pub fn convert(nemo: &Path, out: &Path, ty: OutType) -> Result<ConvertReport> {
    convert_with_progress(nemo, out, ty, |_, _| {})
}

/// [`convert`], calling `progress(done, total)` after each tensor is written.
pub fn convert_with_progress(
    nemo: &Path,
    out: &Path,
    ty: OutType,
    progress: impl FnMut(usize, usize),
) -> Result<ConvertReport> {
    convert_impl(nemo, out, ty, true, progress)
}

/// [`convert`] without the `q8_0x8` and `q4_0x8` layouts (quantized matrices in ggml's own
/// order; f32 ones are still panel-packed): the files written before those layouts existed,
/// which must keep loading and working.
pub fn convert_ggml_layout(nemo: &Path, out: &Path, ty: OutType) -> Result<ConvertReport> {
    convert_impl(nemo, out, ty, false, |_, _| {})
}

fn convert_impl(
    nemo: &Path,
    out: &Path,
    ty: OutType,
    repack: bool,
    mut progress: impl FnMut(usize, usize),
) -> Result<ConvertReport> {
    let start = Instant::now();
    ensure!(
        !same_file(nemo, out),
        Model,
        "refusing to overwrite the input {} with the output",
        nemo.display()
    );
    let archive = NemoArchive::open(nemo)?;
    let shapes: HashMap<&str, &[usize]> = archive
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.shape()))
        .collect();
    let config = ModelConfig::from_yaml(
        archive.config(),
        &shapes,
        archive.tokenizer_vocab(),
        archive.tokenizer_model(),
    )
    .with_context(|| format!("{}: unsupported or inconsistent model", nemo.display()))?;
    let hp = &config.hparams;

    let mut w = GgufWriter::new();
    let name = nemo
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    w.set_str(keys::ARCHITECTURE, ARCHITECTURE)?;
    w.set_str(keys::NAME, &name)?;
    w.set_u32(keys::FILE_TYPE, ty.file_type())?;
    hp.write(&mut w)?;
    // A diarization model has no vocabulary.
    if hp.model_type.is_asr() {
        config.tokenizer.write(&mut w)?;
    }

    let mut report = ConvertReport {
        model_type: hp.model_type,
        tensors: archive.tensors().len(),
        params: 0,
        f32_tensors: 0,
        f16_tensors: 0,
        q8_0_tensors: 0,
        panel16_tensors: 0,
        q4_0_tensors: 0,
        repacked_tensors: 0,
        repacked_q4_tensors: 0,
        bytes: 0,
        elapsed: Duration::ZERO,
        warnings: Vec::new(),
    };
    if hp.model_type.is_asr()
        && let Some(why) = archive.tokenizer_model_missing()
    {
        report.warnings.push(format!(
            "{}: {why}, so only the vocabulary is stored: phrase boosting (--boost, which \
             tokenises phrases with the SentencePiece model) will be unavailable with this model",
            nemo.display()
        ));
    }
    let allowed: &[Layout] = match repack {
        true => Layout::ALL,
        false => &[Layout::Plain, Layout::Panel16],
    };
    for t in archive.tensors() {
        let ne = ggml_shape(&t.name, t.shape())?;
        let dtype = storage_type(&t.name, &ne, ty);
        let layout = layout::choose(tensor_role(&t.name), dtype.elem(), &ne, allowed);
        // The writer packs the tensor and lists it under the layout's key.
        w.add_tensor_with_layout(&gguf_name(&t.name), &ne, dtype, layout)?;
        match layout {
            Layout::Panel16 => report.panel16_tensors += 1,
            Layout::Q8_0x8 => report.repacked_tensors += 1,
            Layout::Q4_0x8 => report.repacked_q4_tensors += 1,
            Layout::Plain => {}
        }
        report.params += ne.iter().product::<usize>();
        match dtype {
            DType::F16 => report.f16_tensors += 1,
            DType::Q8_0 => report.q8_0_tensors += 1,
            DType::Q4_0 => report.q4_0_tensors += 1,
            _ => report.f32_tensors += 1,
        }
    }
    let total = archive.tensors().len();
    report.bytes = w
        .write(out, |i| {
            let data = archive.load(&archive.tensors()[i]);
            progress(i + 1, total);
            data
        })
        .with_context(|| format!("writing {}", out.display()))?;
    report.elapsed = start.elapsed();
    Ok(report)
}

/// The GGUF name of a checkpoint tensor: NeMo's, except that a Sortformer's Transformer
/// layers drop the `.layers` segment (`transformer_encoder.N.first_sub_layer...`), as NeMo's
/// longest names there pass GGUF's 63 bytes.
pub fn gguf_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.strip_prefix("transformer_encoder.layers.") {
        Some(rest) => format!("transformer_encoder.{rest}").into(),
        None => name.into(),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// ggml order is torch's reversed (`[out, in]` -> `ne = [in, out]`), except that kernel-size-1
/// Conv1d weights (`[out, in, 1]`) drop the kernel axis and become plain `[in, out]` matrices:
/// they are matmuls, and q8_0 needs the row (`ne[0]`) to be the input axis.
pub fn ggml_shape(name: &str, torch: &[usize]) -> Result<Vec<usize>> {
    let mut ne: Vec<usize> = torch.iter().rev().copied().collect();
    if is_pointwise_conv1d(name) {
        ensure!(
            torch.len() == 3 && torch[2] == 1,
            Model,
            "tensor {name}: expected a kernel-size-1 Conv1d weight [out, in, 1], got {torch:?}"
        );
        ne.remove(0);
    }
    if ne.is_empty() {
        ne.push(1); // a 0-d tensor is one value
    }
    Ok(ne)
}

fn is_pointwise_conv1d(name: &str) -> bool {
    let (parent, leaf) = last_two(name.strip_suffix(".weight").unwrap_or_default());
    (parent == "conv" && matches!(leaf, "pointwise_conv1" | "pointwise_conv2"))
        || (parent == "decoder_layers" && leaf == "0")
}

/// The GGUF type of a tensor for `--type ty` (docs/GGUF.md, "Tensors").
pub fn storage_type(name: &str, ne: &[usize], ty: OutType) -> DType {
    if ty == OutType::F32 || !is_matmul_weight(name) {
        return DType::F32;
    }
    let want = ty.dtype();
    if ne[0].is_multiple_of(want.block_size()) {
        want
    } else {
        DType::F16
    }
}

/// What a tensor is multiplied by, for [`layout::choose`]: the matrices the encoder graph
/// multiplies by every frame (its linears, the subsampling's output projection, the joint's
/// encoder projection) are GEMMs; the decoder's LSTM and the joint's prediction projection,
/// multiplied by one step at a time, matrix-vector products; the rest (the joint's output
/// layer, vocabulary + durations rows, stays on ggml) other.
fn tensor_role(name: &str) -> Role {
    if !is_matmul_weight(name) {
        Role::Other
    } else if name.starts_with("encoder.") || name == "joint.enc.weight" || is_sortformer_gemm(name)
    {
        Role::Gemm
    } else if name.starts_with("decoder.prediction.dec_rnn.lstm.") || name == "joint.pred.weight" {
        Role::MatVec
    } else {
        Role::Other
    }
}

/// The layout a `--type` conversion stores a tensor in ([`layout::choose`] for its role).
pub fn storage_layout(name: &str, ne: &[usize], dtype: DType) -> Layout {
    layout::choose(tensor_role(name), dtype.elem(), ne, Layout::ALL)
}

/// A Sortformer's matrices after its FastConformer that multiply every frame: the
/// Transformer's linears and `encoder_proj`, `first_hidden_to_hidden` (the last layer, one row
/// per speaker, stays f32).
fn is_sortformer_gemm(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".weight") else {
        return false;
    };
    let (parent, leaf) = last_two(stem);
    match parent {
        "first_sub_layer" | "second_sub_layer" => {
            stem.starts_with("transformer_encoder.layers.")
                && matches!(
                    leaf,
                    "query_net"
                        | "key_net"
                        | "value_net"
                        | "out_projection"
                        | "dense_in"
                        | "dense_out"
                )
        }
        _ => matches!(
            stem,
            "sortformer_modules.encoder_proj" | "sortformer_modules.first_hidden_to_hidden"
        ),
    }
}

/// The large matmul weights that `--type f16|q8_0|q4_0` converts.
fn is_matmul_weight(name: &str) -> bool {
    if is_sortformer_gemm(name) {
        return true;
    }
    let leaf = name.rsplit('.').next().unwrap_or_default();
    if name.starts_with("decoder.prediction.dec_rnn.lstm.")
        && (leaf.starts_with("weight_ih_l") || leaf.starts_with("weight_hh_l"))
    {
        return true;
    }
    let Some(stem) = name.strip_suffix(".weight") else {
        return false;
    };
    let (parent, leaf) = last_two(stem);
    match parent {
        "feed_forward1" | "feed_forward2" => matches!(leaf, "linear1" | "linear2"),
        "self_attn" => matches!(
            leaf,
            "linear_q" | "linear_k" | "linear_v" | "linear_out" | "linear_pos"
        ),
        "conv" => matches!(leaf, "pointwise_conv1" | "pointwise_conv2"),
        _ => matches!(
            stem,
            "encoder.pre_encode.out" | "joint.enc" | "joint.pred" | "joint.joint_net.2"
        ),
    }
}

/// `("b", "c")` for `"a.b.c"`.
fn last_two(path: &str) -> (&str, &str) {
    let mut parts = path.rsplit('.');
    let leaf = parts.next().unwrap_or_default();
    (parts.next().unwrap_or_default(), leaf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_weights_follow_the_contract() {
        for name in [
            "encoder.layers.3.feed_forward1.linear1.weight",
            "encoder.layers.3.feed_forward2.linear2.weight",
            "encoder.layers.0.self_attn.linear_pos.weight",
            "encoder.layers.0.self_attn.linear_out.weight",
            "encoder.layers.0.conv.pointwise_conv2.weight",
            "encoder.pre_encode.out.weight",
            "joint.enc.weight",
            "joint.pred.weight",
            "joint.joint_net.2.weight",
            "decoder.prediction.dec_rnn.lstm.weight_ih_l0",
            "decoder.prediction.dec_rnn.lstm.weight_hh_l1",
            "transformer_encoder.layers.17.first_sub_layer.query_net.weight",
            "transformer_encoder.layers.0.first_sub_layer.out_projection.weight",
            "transformer_encoder.layers.3.second_sub_layer.dense_in.weight",
            "transformer_encoder.layers.3.second_sub_layer.dense_out.weight",
            "sortformer_modules.encoder_proj.weight",
            "sortformer_modules.first_hidden_to_hidden.weight",
        ] {
            assert!(is_matmul_weight(name), "{name}");
        }
        for name in [
            "encoder.layers.3.feed_forward1.linear1.bias",
            "encoder.layers.0.self_attn.pos_bias_u",
            "encoder.layers.0.conv.depthwise_conv.weight",
            "encoder.layers.0.norm_out.weight",
            "encoder.pre_encode.conv.3.weight",
            "decoder.prediction.embed.weight",
            "decoder.prediction.dec_rnn.lstm.bias_ih_l0",
            "decoder.decoder_layers.0.weight",
            "preprocessor.featurizer.fb",
            "joint.enc.bias",
            "transformer_encoder.layers.0.first_sub_layer.query_net.bias",
            "transformer_encoder.layers.0.layer_norm_1.weight",
            "sortformer_modules.single_hidden_to_spks.weight",
        ] {
            assert!(!is_matmul_weight(name), "{name}");
        }
    }

    #[test]
    fn shapes_reverse_and_squeeze_pointwise_convs() {
        assert_eq!(
            ggml_shape("x.linear_q.weight", &[64, 32]).unwrap(),
            [32, 64]
        );
        assert_eq!(
            ggml_shape("preprocessor.featurizer.fb", &[1, 80, 257]).unwrap(),
            [257, 80, 1]
        );
        assert_eq!(
            ggml_shape("l.0.conv.pointwise_conv1.weight", &[128, 64, 1]).unwrap(),
            [64, 128]
        );
        assert_eq!(
            ggml_shape("ctc_decoder.decoder_layers.0.weight", &[49, 64, 1]).unwrap(),
            [64, 49]
        );
        assert_eq!(
            ggml_shape("ctc_decoder.decoder_layers.0.bias", &[49]).unwrap(),
            [49]
        );
        assert_eq!(
            ggml_shape("encoder.pre_encode.conv.3.weight", &[16, 16, 1, 1]).unwrap(),
            [1, 1, 16, 16]
        );
        assert!(ggml_shape("l.0.conv.pointwise_conv1.weight", &[128, 64, 3]).is_err());
        assert_eq!(ggml_shape("scalar", &[]).unwrap(), [1]);
    }

    #[test]
    fn q8_0_falls_back_to_f16_on_odd_rows() {
        let name = "joint.joint_net.2.weight";
        assert_eq!(storage_type(name, &[640, 1030], OutType::Q8_0), DType::Q8_0);
        assert_eq!(storage_type(name, &[40, 1030], OutType::Q8_0), DType::F16);
        assert_eq!(storage_type(name, &[40, 1030], OutType::F32), DType::F32);
        assert_eq!(
            storage_type("joint.enc.bias", &[640], OutType::Q8_0),
            DType::F32
        );
    }

    #[test]
    fn out_type_parses() {
        assert_eq!("q8_0".parse::<OutType>().unwrap(), OutType::Q8_0);
        assert_eq!("F16".parse::<OutType>().unwrap(), OutType::F16);
        assert_eq!("q4_0".parse::<OutType>().unwrap(), OutType::Q4_0);
        assert!("q4_k".parse::<OutType>().is_err());
    }
}
