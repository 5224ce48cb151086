//! The loader on good and malformed GGUFs: every bad file is one clear error naming the file
//! and the tensor or key, never a panic or a ggml abort.

use crate::common::rewrite::set_meta;
use crate::common::*;
use parakeet::backend::DType;
use parakeet::convert::OutType;
use parakeet::gguf::{GgufFile, GgufWriter};
use parakeet::hparams::ModelType;
use parakeet::layout::{Layout, pack_panels};
use parakeet::model::Model;
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Copy `src` to `dst`, dropping the key `drop_key` and giving tensor `reshape.0` the shape
/// `reshape.1` (zero-filled).
fn rewrite(src: &Path, dst: &Path, drop_key: Option<&str>, reshape: Option<(&str, &[usize])>) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    let mut keys: Vec<_> = f.metadata().iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    for (k, v) in keys {
        if Some(k.as_str()) == drop_key || k.starts_with("GGUF.") {
            continue;
        }
        set_meta(&mut w, k, v);
    }
    let mut data = Vec::new();
    for name in f.tensor_names() {
        let t = f.any_weight(name).unwrap();
        let shape: Vec<usize> = match reshape {
            Some((n, s)) if n == name => s.to_vec(),
            _ => {
                let s = t.shape();
                let rank = s.iter().rposition(|&v| v != 1).map_or(1, |i| i + 1);
                s[..rank].to_vec()
            }
        };
        let values = if shape.iter().product::<usize>() == t.elements() {
            // Stored bytes as they were: panel-packed tensors go back packed.
            match t.layout() {
                Layout::Panel16 => pack_panels(&t.to_host_f32(), shape[1], shape[0]),
                Layout::Plain | Layout::Q8_0x8 | Layout::Q4_0x8 => t.to_host_f32(),
            }
        } else {
            vec![0.0; shape.iter().product()]
        };
        w.add_tensor(name, &shape, DType::F32).unwrap();
        data.push(values);
    }
    w.write(dst, |i| Ok(std::mem::take(&mut data[i]))).unwrap();
}

fn load_err(path: &Path) -> String {
    match Model::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn loads_every_reference_model_with_its_hyperparameters() {
    let expect = [
        ("tiny_tdt", ModelType::Tdt, 128, 2, false, 5),
        ("tiny_tdt_ctc", ModelType::TdtCtc, 80, 1, false, 5),
        ("tiny_rnnt", ModelType::Rnnt, 80, 1, true, 0),
        ("tiny_ctc", ModelType::Ctc, 80, 0, true, 0),
    ];
    for (name, ty, mels, lstm, xscaling, durations) in expect {
        for out in [OutType::F32, OutType::F16, OutType::Q8_0] {
            let m = Model::load(&gguf(name, out)).unwrap();
            let hp = &m.hparams();
            assert_eq!(hp.model_type, ty, "{name}");
            assert_eq!(hp.preprocessor.n_mels, mels, "{name}");
            let pred_layers = hp.transducer.as_ref().map_or(0, |t| t.pred_layers);
            assert_eq!(pred_layers, lstm, "{name}");
            assert_eq!(hp.transducer.is_some(), ty.has_transducer(), "{name}");
            assert_eq!(hp.encoder.xscaling, xscaling, "{name}");
            assert_eq!(hp.durations().len(), durations, "{name}");
            assert_eq!(
                (hp.encoder.d_model, hp.encoder.n_layers, hp.vocab_size),
                (64, 2, 48)
            );
            assert_eq!(m.tokenizer().len(), 48);
            assert_eq!(m.window().len(), 400);
            assert_eq!(m.filterbank().len(), mels * 257);
        }
    }
}

#[test]
fn garbage_and_empty_files_are_not_models() {
    let garbage = scratch("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model at all, just some text").unwrap();
    let e = load_err(&garbage);
    assert!(
        e.contains("garbage.gguf") && e.contains("not a GGUF"),
        "{e}"
    );
    let empty = scratch("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = load_err(&empty);
    assert!(e.contains("empty.gguf") && e.contains("not a GGUF"), "{e}");
    let e = load_err(&scratch("does-not-exist.gguf"));
    assert!(e.contains("does-not-exist.gguf"), "{e}");
}

#[test]
fn truncated_gguf_is_reported() {
    let good = std::fs::read(gguf("tiny_tdt", OutType::F32)).unwrap();
    // (The last few bytes may be alignment padding: cut past it.)
    for cut in [good.len() / 2, good.len() - 40, 200, 30] {
        let path = scratch(&format!("truncated-{cut}.gguf"));
        std::fs::write(&path, &good[..cut]).unwrap();
        let e = load_err(&path);
        assert!(e.contains(&format!("truncated-{cut}.gguf")), "{e}");
        assert!(e.contains("truncated") || e.contains("malformed"), "{e}");
    }
}

#[test]
fn missing_key_is_named() {
    let path = scratch("no-d-model.gguf");
    rewrite(
        &gguf("tiny_tdt", OutType::F32),
        &path,
        Some("parakeet.encoder.d_model"),
        None,
    );
    let e = load_err(&path);
    assert!(
        e.contains("no-d-model.gguf") && e.contains("parakeet.encoder.d_model"),
        "{e}"
    );
}

#[test]
fn wrong_tensor_shape_is_named() {
    let path = scratch("bad-shape.gguf");
    let name = "encoder.layers.1.self_attn.linear_q.weight";
    rewrite(
        &gguf("tiny_tdt", OutType::F32),
        &path,
        None,
        Some((name, &[64, 63])),
    );
    let e = load_err(&path);
    assert!(
        e.contains("bad-shape.gguf") && e.contains(name) && e.contains("[64, 63]"),
        "{e}"
    );
}

#[test]
fn rewritten_model_is_identical_in_use() {
    // The rewrite helper itself must be faithful, or the two tests above prove little.
    let path = scratch("copy.gguf");
    rewrite(&gguf("tiny_ctc", OutType::F32), &path, None, None);
    let a = Model::load(&path).unwrap();
    let b = Model::load(&gguf("tiny_ctc", OutType::F32)).unwrap();
    assert_eq!(a.tokenizer().pieces(), b.tokenizer().pieces());
    assert_eq!(a.filterbank(), b.filterbank());
    assert_eq!(
        a.encoder().layers[1]
            .self_attn
            .linear_q
            .weight
            .to_host_f32(),
        b.encoder().layers[1]
            .self_attn
            .linear_q
            .weight
            .to_host_f32()
    );
}

#[test]
fn a_file_without_the_sentencepiece_model_loads_but_cannot_encode() {
    // Files converted before the tokenizer was stored have the pieces only.
    let path = scratch("no-sentencepiece.gguf");
    rewrite(
        &gguf("tiny_tdt", OutType::F32),
        &path,
        Some("parakeet.tokenizer.algorithm"),
        None,
    );
    let old = Model::load(&path).unwrap();
    let new = Model::load(&gguf("tiny_tdt", OutType::F32)).unwrap();
    assert_eq!(old.tokenizer().pieces(), new.tokenizer().pieces());
    assert_eq!(old.tokenizer().detokenize([6, 24]), "then");
    assert!(!old.tokenizer().can_encode());
    let e = old.tokenizer().encode("then").unwrap_err().to_string();
    assert!(e.contains("no SentencePiece model"), "{e}");
    assert_eq!(new.tokenizer().encode("then").unwrap(), [6, 24]);
}
