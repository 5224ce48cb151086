//! `.nemo` -> GGUF conversion of the four tiny reference models, read back with the runtime's
//! GGUF loader and compared, tensor by tensor, with the checkpoint.

use std::path::{Path, PathBuf};

use parakeet::backend::DType;
use parakeet::convert::{
    self, NemoArchive, NemoModel, NemoTensor, OutType, ggml_shape, read_nemo, storage_layout,
    storage_type,
};
use parakeet::gguf::{GgufFile, MetaValue};
use parakeet::layout::{Layout, Q4_0X8_KEY, Q8_0X8_KEY};
use serde_yaml::Value;

const MODELS: [&str; 4] = ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"];
const TYPES: [OutType; 4] = [OutType::F32, OutType::F16, OutType::Q8_0, OutType::Q4_0];

fn fixture(model: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{model}.nemo"))
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn reads_checkpoint_tensors() {
    let m = read_nemo(&fixture("tiny_tdt")).unwrap();
    // 87 state-dict entries minus the two BatchNorm `num_batches_tracked` counters.
    assert_eq!(m.tensors.len(), 85);
    assert!(
        m.tensors
            .iter()
            .all(|t| !t.name.ends_with("num_batches_tracked"))
    );
    for t in &m.tensors {
        assert_eq!(
            t.data.len(),
            t.shape.iter().product::<usize>(),
            "{}",
            t.name
        );
    }
    // The window is a symmetric Hann of 400 samples.
    let w = m.tensor("preprocessor.featurizer.window").unwrap();
    assert_eq!(w.shape, [400]);
    for (n, &v) in w.data.iter().enumerate() {
        let hann = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / 399.0).cos();
        assert!(
            (v as f64 - hann).abs() < 1e-6,
            "window[{n}] = {v}, want {hann}"
        );
    }
    // Values from an independent reader (numpy over the same storage files).
    let q = m
        .tensor("encoder.layers.0.self_attn.linear_q.weight")
        .unwrap();
    assert_eq!(q.shape, [64, 64]);
    assert_eq!(q.data[..3], [-0.027466416, 0.13489509, -0.040364236]);
    let sum: f64 = q.data.iter().map(|&v| f64::from(v)).sum();
    assert!((sum - -0.498075845061976).abs() < 1e-5, "{sum}");
    assert_eq!(
        m.tensor("decoder.prediction.embed.weight").unwrap().shape,
        [49, 32]
    );
    assert!(m.tensor("nope").is_none());
}

#[test]
fn converts_every_model_in_every_type() {
    let dir = tmp();
    for model in MODELS {
        let nemo = read_nemo(&fixture(model)).unwrap();
        for ty in TYPES {
            let out = dir.path().join(format!("{model}-{ty:?}.gguf"));
            let report = convert::convert(&fixture(model), &out, ty)
                .unwrap_or_else(|e| panic!("{model} {ty:?}: {e:#}"));
            assert_eq!(report.tensors, nemo.tensors.len());
            assert_eq!(report.bytes, std::fs::metadata(&out).unwrap().len());
            let g = GgufFile::open(&out).unwrap();
            check_tensors(model, ty, &nemo, &g);
            check_metadata(model, ty, &nemo.config, &g);
            if ty != OutType::F32 {
                assert!(
                    report.f32_tensors < report.tensors,
                    "{model} {ty:?}: nothing converted"
                );
            }
            // q8_0 (q4_0) repacks the encoder graph's matrices (and lists them); nothing else
            // does.
            for (key, repacked, by) in [
                (Q8_0X8_KEY, report.repacked_tensors, OutType::Q8_0),
                (Q4_0X8_KEY, report.repacked_q4_tensors, OutType::Q4_0),
            ] {
                let listed = match g.get(key) {
                    Some(MetaValue::StrArray(v)) => v.len(),
                    None => 0,
                    Some(v) => panic!("{model} {ty:?}: {key} = {v:?}"),
                };
                assert_eq!(listed, repacked, "{model} {ty:?} {key}");
                assert_eq!(repacked > 0, ty == by, "{model} {ty:?} {key}");
            }
        }
    }
}

/// Every tensor: name and order, ggml shape, storage type, and values.
fn check_tensors(model: &str, ty: OutType, nemo: &NemoModel, g: &GgufFile) {
    let names: Vec<&str> = nemo.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(g.tensor_names(), names, "{model} {ty:?}");
    for t in &nemo.tensors {
        let ne = ggml_shape(&t.name, &t.shape).unwrap();
        let want_type = storage_type(&t.name, &ne, ty);
        let w = g
            .weight(&t.name, &ne, &[want_type])
            .unwrap_or_else(|e| panic!("{model} {ty:?}: {e:#}"));
        let layout = storage_layout(&t.name, &ne, want_type);
        assert_eq!(w.layout(), layout, "{model} {ty:?} {}", t.name);
        if matches!(layout, Layout::Q8_0x8 | Layout::Q4_0x8) {
            // The values of ggml's q8_0 (q4_0), reordered: the read-back undoes the order.
            assert!(
                t.name.starts_with("encoder.")
                    || t.name
                        .starts_with("decoder.prediction.dec_rnn.lstm.weight_")
                    || t.name == "joint.enc.weight"
                    || t.name == "joint.pred.weight",
                "{}",
                t.name
            );
        }
        let got = w.to_host_f32();
        assert_eq!(got.len(), t.data.len());
        let what = format!("{model} {ty:?} {}", t.name);
        match want_type {
            DType::F32 => assert!(got == t.data, "{what}: f32 must be exact"),
            DType::F16 => check_f16(&what, &got, t),
            DType::Q8_0 => check_q8_0(&what, &got, t, ne[0]),
            DType::Q4_0 => check_q4_0(&what, &got, t, ne[0]),
            other => panic!("{what}: unexpected type {other:?}"),
        }
    }
}

/// f16 storage is round-to-nearest-even: exactly what `half` computes.
fn check_f16(what: &str, got: &[f32], t: &NemoTensor) {
    for (i, (&g, &x)) in got.iter().zip(&t.data).enumerate() {
        let want = half::f16::from_f32(x).to_f32();
        assert!(g == want, "{what}[{i}]: {g} vs f16({x}) = {want}");
    }
}

/// q8_0 stores blocks of 32 as an f16 scale `max|x| / 127` and int8s: every value is within
/// one quantization step of the original.
fn check_q8_0(what: &str, got: &[f32], t: &NemoTensor, row: usize) {
    assert_eq!(row % 32, 0, "{what}");
    for (b, (gb, xb)) in got.chunks(32).zip(t.data.chunks(32)).enumerate() {
        let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        for (&g, &x) in gb.iter().zip(xb) {
            assert!(
                (g - x).abs() <= step * 1.01,
                "{what} block {b}: {g} vs {x} (step {step})"
            );
        }
    }
}

/// q4_0 stores blocks of 32 as an f16 scale `d = max / -8` (max: the value of largest
/// magnitude) and 4-bit `round(x / d) + 8` clamped to 0..15: within one step `max|x| / 8`.
fn check_q4_0(what: &str, got: &[f32], t: &NemoTensor, row: usize) {
    assert_eq!(row % 32, 0, "{what}");
    for (b, (gb, xb)) in got.chunks(32).zip(t.data.chunks(32)).enumerate() {
        let step = xb.iter().fold(0f32, |m, v| m.max(v.abs())) / 8.0;
        for (&g, &x) in gb.iter().zip(xb) {
            assert!(
                (g - x).abs() <= step * 1.01,
                "{what} block {b}: {g} vs {x} (step {step})"
            );
        }
    }
}

fn check_metadata(model: &str, ty: OutType, cfg: &Value, g: &GgufFile) {
    let u = |k: &str| g.u32(k).unwrap_or_else(|e| panic!("{model}: {e:#}"));
    let s = |k: &str| g.str(k).unwrap_or_else(|e| panic!("{model}: {e:#}"));
    let b = |k: &str| g.bool(k).unwrap_or_else(|e| panic!("{model}: {e:#}"));
    let c = |path: &str| path.split('.').fold(cfg, |v, p| &v[p]).clone();
    let cu = |path: &str| c(path).as_u64().unwrap() as u32;

    assert_eq!(s("general.architecture"), "parakeet");
    assert_eq!(s("general.name"), model);
    assert_eq!(u("general.file_type"), ty.file_type());

    // Values the reference README states, then the same keys against the config itself.
    let (ty_name, mels, bias, xscaling, lstm) = match model {
        "tiny_tdt" => ("tdt", 128, false, false, Some(2)),
        "tiny_tdt_ctc" => ("tdt_ctc", 80, true, false, Some(1)),
        "tiny_rnnt" => ("rnnt", 80, true, true, Some(1)),
        "tiny_ctc" => ("ctc", 80, true, true, None),
        _ => unreachable!(),
    };
    assert_eq!(s("parakeet.model_type"), ty_name);
    assert_eq!(u("parakeet.preprocessor.n_mels"), mels);
    assert_eq!(u("parakeet.encoder.feat_in"), mels);
    assert_eq!(b("parakeet.encoder.use_bias"), bias);
    assert_eq!(b("parakeet.encoder.xscaling"), xscaling);
    assert_eq!(u("parakeet.encoder.d_model"), 64);
    assert_eq!(u("parakeet.encoder.n_layers"), 2);
    assert_eq!(u("parakeet.encoder.n_heads"), 2);
    assert_eq!(u("parakeet.vocab_size"), 48);
    assert_eq!(
        u("parakeet.preprocessor.n_mels"),
        cu("preprocessor.features")
    );
    assert_eq!(u("parakeet.encoder.d_model"), cu("encoder.d_model"));
    assert_eq!(u("parakeet.encoder.n_layers"), cu("encoder.n_layers"));
    assert_eq!(u("parakeet.encoder.n_heads"), cu("encoder.n_heads"));
    assert_eq!(
        b("parakeet.encoder.xscaling"),
        c("encoder.xscaling").as_bool().unwrap()
    );
    assert_eq!(
        b("parakeet.encoder.use_bias"),
        c("encoder.use_bias").as_bool().unwrap()
    );
    assert_eq!(
        u("parakeet.encoder.subsampling_conv_channels"),
        cu("encoder.subsampling_conv_channels")
    );
    assert_eq!(
        u("parakeet.encoder.ff_expansion_factor"),
        cu("encoder.ff_expansion_factor")
    );
    assert_eq!(u("parakeet.encoder.conv_kernel_size"), 9);
    assert_eq!(s("parakeet.encoder.subsampling"), "dw_striding");
    assert_eq!(u("parakeet.encoder.subsampling_factor"), 8);
    assert_eq!(s("parakeet.encoder.self_attention_model"), "rel_pos");
    assert_eq!(
        g.int_array("parakeet.encoder.att_context_size").unwrap(),
        [-1, -1]
    );

    assert_eq!(u("parakeet.preprocessor.sample_rate"), 16000);
    assert_eq!(u("parakeet.preprocessor.n_fft"), 512);
    assert_eq!(u("parakeet.preprocessor.win_length"), 400);
    assert_eq!(u("parakeet.preprocessor.hop_length"), 160);
    assert_eq!(g.f32("parakeet.preprocessor.preemph").unwrap(), 0.97);
    assert_eq!(
        g.f32("parakeet.preprocessor.log_zero_guard_value").unwrap(),
        2f32.powi(-24)
    );
    assert_eq!(s("parakeet.preprocessor.normalize"), "per_feature");
    assert_eq!(u("parakeet.decoding.max_symbols"), 10);

    match lstm {
        Some(layers) => {
            assert_eq!(u("parakeet.decoder.pred_rnn_layers"), layers);
            assert_eq!(
                u("parakeet.decoder.pred_rnn_layers"),
                cu("decoder.prednet.pred_rnn_layers")
            );
            assert_eq!(u("parakeet.decoder.pred_hidden"), 32);
            assert_eq!(
                u("parakeet.joint.joint_hidden"),
                cu("joint.jointnet.joint_hidden")
            );
        }
        None => {
            for k in [
                "parakeet.decoder.pred_hidden",
                "parakeet.decoder.pred_rnn_layers",
                "parakeet.joint.joint_hidden",
            ] {
                assert!(g.get(k).is_none(), "{model}: {k} should be absent");
            }
        }
    }
    if ty_name.starts_with("tdt") {
        assert_eq!(
            g.int_array("parakeet.tdt.durations").unwrap(),
            [0, 1, 2, 3, 4]
        );
    } else {
        assert!(
            g.get("parakeet.tdt.durations").is_none(),
            "{model}: durations should be absent"
        );
    }

    assert_eq!(s("tokenizer.ggml.model"), "sentencepiece");
    let vocab_key = ["joint.vocabulary", "decoder.vocabulary"]
        .into_iter()
        .find(|k| !c(k).is_null());
    let labels: Vec<String> = serde_yaml::from_value(c(vocab_key.unwrap())).unwrap();
    assert_eq!(labels.len(), 48);
    assert_eq!(
        g.get("tokenizer.ggml.tokens"),
        Some(&MetaValue::StrArray(labels.clone()))
    );
    // YAML 1.1 quoting survives: 'on', 'n', 'y' and a lone quote are pieces, not booleans.
    for piece in ["on", "n", "y", "'", "▁the", "<unk>"] {
        assert!(
            labels.iter().any(|l| l == piece),
            "{model}: piece {piece:?} missing"
        );
    }
}

fn err_text<T>(r: parakeet::error::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

/// Errors name the file and say what is wrong; no output file is left behind.
fn assert_rejected(path: &Path, dir: &Path, problem: &str) {
    let read = err_text(read_nemo(path));
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        read.contains(name) && read.contains(problem),
        "read_nemo: {read}"
    );
    let out = dir.join("out.gguf");
    let conv = err_text(convert::convert(path, &out, OutType::F16));
    assert!(
        conv.contains(name) && conv.contains(problem),
        "convert: {conv}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("gguf"))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

#[test]
fn truncated_archive_is_an_error() {
    let dir = tmp();
    let bytes = std::fs::read(fixture("tiny_tdt")).unwrap();
    let path = dir.path().join("half.nemo");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_rejected(&path, dir.path(), "truncated");
}

#[test]
fn every_cut_through_the_archive_is_an_error() {
    let dir = tmp();
    let bytes = std::fs::read(fixture("tiny_ctc")).unwrap();
    let path = dir.path().join("cut.nemo");
    // Past the last member only tar's end-of-archive padding is lost, which is harmless.
    let mut tar = tar::Archive::new(bytes.as_slice());
    let last_member_end = tar
        .entries()
        .unwrap()
        .map(|e| e.map(|e| e.raw_file_position() + e.size()).unwrap())
        .max()
        .unwrap() as usize;
    for cut in (0..last_member_end).step_by(4099) {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        assert!(read_nemo(&path).is_err(), "cut at {cut}");
    }
}

#[test]
fn archive_without_weights_is_an_error() {
    let dir = tmp();
    let path = dir.path().join("noweights.nemo");
    let mut tar = tar::Builder::new(std::fs::File::create(&path).unwrap());
    let config = b"encoder: {d_model: 64}\n";
    let mut header = tar::Header::new_gnu();
    header.set_size(config.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "./model_config.yaml", &config[..])
        .unwrap();
    tar.finish().unwrap();
    drop(tar);
    assert_rejected(&path, dir.path(), "no model_weights.ckpt");
}

#[test]
fn non_tar_file_is_an_error() {
    let dir = tmp();
    let path = dir.path().join("notes.nemo");
    std::fs::write(&path, "this is a text file, not a tar archive\n".repeat(40)).unwrap();
    assert_rejected(&path, dir.path(), "not a .nemo (tar) archive");
    let gz = dir.path().join("model.nemo");
    std::fs::write(&gz, [0x1f, 0x8b, 8, 0, 0, 0, 0, 0]).unwrap();
    assert_rejected(&gz, dir.path(), "gzip");
    let missing = dir.path().join("missing.nemo");
    assert!(err_text(read_nemo(&missing)).contains("missing.nemo"));
}

#[test]
fn refuses_to_overwrite_its_input() {
    let dir = tmp();
    let path = dir.path().join("m.nemo");
    std::fs::copy(fixture("tiny_ctc"), &path).unwrap();
    assert!(err_text(convert::convert(&path, &path, OutType::F32)).contains("refusing"));
    assert!(read_nemo(&path).is_ok(), "input intact");
}

/// Full-size check, for models too big to ship as fixtures:
/// `PARAKEET_NEMO=model.nemo [PARAKEET_TYPES=f32,q8_0] cargo test --test pipeline convert:: -- --ignored`.
/// `PARAKEET_VERIFY=0` only converts (to measure the converter's time and memory alone).
#[test]
#[ignore]
fn converts_the_model_in_parakeet_nemo() {
    let Some(nemo) = std::env::var_os("PARAKEET_NEMO").map(PathBuf::from) else {
        eprintln!("PARAKEET_NEMO not set; nothing to do");
        return;
    };
    let types = std::env::var("PARAKEET_TYPES").unwrap_or_else(|_| "f32".into());
    let archive = NemoArchive::open(&nemo).unwrap();
    let dir = tempfile::tempdir_in(nemo.parent().unwrap()).unwrap();
    for ty in types.split(',') {
        let ty: OutType = ty.parse().unwrap();
        let out = dir.path().join("model.gguf");
        let report = convert::convert(&nemo, &out, ty).unwrap();
        eprintln!("{ty:?}: {report:?}");
        if std::env::var("PARAKEET_VERIFY").is_ok_and(|v| v == "0") {
            continue;
        }
        let g = GgufFile::open(&out).unwrap();
        for entry in archive.tensors() {
            let t = NemoTensor {
                name: entry.name.clone(),
                shape: entry.shape().to_vec(),
                data: archive.load(entry).unwrap(),
            };
            let ne = ggml_shape(&t.name, &t.shape).unwrap();
            let want_type = storage_type(&t.name, &ne, ty);
            let got = g.weight(&t.name, &ne, &[want_type]).unwrap().to_host_f32();
            let what = format!("{ty:?} {}", t.name);
            match want_type {
                DType::F32 => assert!(got == t.data, "{what}: f32 must be exact"),
                DType::F16 => check_f16(&what, &got, &t),
                _ => check_q8_0(&what, &got, &t, ne[0]),
            }
        }
        eprintln!("{ty:?}: all {} tensors match", archive.tensors().len());
    }
}

/// A copy of fixture `model` whose `model_config.yaml` has `from` replaced by `to`.
fn with_config_edit(model: &str, dir: &Path, from: &str, to: &str) -> PathBuf {
    let path = dir.join(format!("{model}-edited.nemo"));
    let mut src = tar::Archive::new(std::fs::File::open(fixture(model)).unwrap());
    let mut dst = tar::Builder::new(std::fs::File::create(&path).unwrap());
    for entry in src.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut header = entry.header().clone();
        let name = entry.path().unwrap().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        if name.ends_with("model_config.yaml") {
            let text = String::from_utf8(data).unwrap();
            assert!(text.contains(from), "{from:?} not in the config");
            data = text.replacen(from, to, 1).into_bytes();
            header.set_size(data.len() as u64);
            header.set_cksum();
        }
        dst.append_data(&mut header, &name, data.as_slice())
            .unwrap();
    }
    dst.finish().unwrap();
    path
}

#[test]
fn unsupported_or_inconsistent_configs_are_rejected_naming_the_key() {
    let dir = tmp();
    let out = dir.path().join("out.gguf");
    let cases = [
        (
            "subsampling: dw_striding",
            "subsampling: striding",
            "encoder.subsampling striding is not supported",
        ),
        (
            "  d_model: 64",
            "  d_model: 96",
            "encoder.d_model = 96 disagrees",
        ),
        ("  n_heads: 2\n", "", "missing key encoder.n_heads"),
        (
            "  use_bias: false",
            "  use_bias: true",
            "encoder.use_bias is true",
        ),
        (
            "    pred_rnn_layers: 2",
            "    pred_rnn_layers: 1",
            "pred_rnn_layers is 1",
        ),
        (
            "  num_extra_outputs: 5",
            "  num_extra_outputs: 4",
            "joint.num_extra_outputs is 4",
        ),
        (
            "  normalize: per_feature",
            "  normalize: all_features",
            "preprocessor.normalize",
        ),
        (
            "  att_context_style: regular",
            "  att_context_style: chunked_limited",
            "att_context_style",
        ),
    ];
    for (from, to, problem) in cases {
        let path = with_config_edit("tiny_tdt", dir.path(), from, to);
        let e = err_text(convert::convert(&path, &out, OutType::F32));
        assert!(
            e.contains("tiny_tdt-edited.nemo") && e.contains(problem),
            "{to:?}: {e}"
        );
        assert!(!out.exists());
    }
    // An unedited copy converts: the edits above are what's rejected.
    let path = with_config_edit("tiny_tdt", dir.path(), "xscaling: false", "xscaling: false");
    convert::convert(&path, &out, OutType::F32).unwrap();
}

/// docs/GGUF.md's metadata table is the schema's key list (`hparams::keys::ALL`, and the
/// layouts' own keys), in the order the converter writes them: neither can gain, lose or
/// rename a key without the other.
#[test]
fn the_gguf_doc_lists_every_metadata_key_and_no_other() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/GGUF.md"))
        .unwrap();
    let table = doc.split("## Metadata").nth(1).expect("a Metadata section");
    let documented: Vec<&str> = table
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(key, _)| key))
        .collect();
    let mut schema: Vec<&str> = parakeet::hparams::keys::ALL.to_vec();
    // The layouts' keys sit after the file type, where the table lists them.
    let at = schema
        .iter()
        .position(|k| *k == parakeet::hparams::keys::FILE_TYPE)
        .unwrap();
    schema.splice(at + 1..at + 1, [Q8_0X8_KEY, Q4_0X8_KEY]);
    assert_eq!(documented, schema, "docs/GGUF.md's metadata table");
    // The panel16 layout's key has a section of its own.
    assert!(doc.contains(&format!("`{}`", parakeet::layout::PANEL16_KEY)));
}
