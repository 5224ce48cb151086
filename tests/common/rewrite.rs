//! Copies of a GGUF model with chosen metadata values and tensor values changed.

use parakeet::gguf::{GgufFile, GgufWriter, MetaValue};
use parakeet::layout::Layout;
use std::path::Path;

/// Writes `value` as metadata `key` (integers as u32, floats as f32, as the converter does).
pub fn set_meta(w: &mut GgufWriter, key: &str, value: &MetaValue) {
    match value {
        MetaValue::Str(s) => w.set_str(key, s),
        MetaValue::Int(i) => w.set_u32(key, *i as u32),
        MetaValue::Float(x) => w.set_f32(key, *x as f32),
        MetaValue::Bool(b) => w.set_bool(key, *b),
        MetaValue::IntArray(a) => {
            w.set_i32_array(key, &a.iter().map(|&x| x as i32).collect::<Vec<_>>())
        }
        MetaValue::StrArray(a) => w.set_str_array(key, a),
        MetaValue::Other(_) => Ok(()),
        MetaValue::FloatArray(a) => w.set_f32_array(key, a),
        MetaValue::Bytes(a) => w.set_bytes(key, a),
    }
    .unwrap();
}

/// A copy of the GGUF `src` at `dst`: each key's value is `meta(key)` where that gives one,
/// else the original; each tensor's values (f32, row-major) pass through `edit(name, values)`;
/// types, shapes and layouts are kept.
pub fn rewrite_gguf(
    src: &Path,
    dst: &Path,
    meta: impl Fn(&str) -> Option<MetaValue>,
    mut edit: impl FnMut(&str, &mut Vec<f32>),
) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    let mut keys: Vec<_> = f.metadata().iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    for (k, v) in keys {
        // The writer lists the tensors of each packed layout itself.
        let layout_key = Layout::ALL.iter().any(|l| l.key() == Some(k.as_str()));
        if k.starts_with("GGUF.") || layout_key {
            continue;
        }
        match meta(k) {
            Some(new) => set_meta(&mut w, k, &new),
            None => set_meta(&mut w, k, v),
        }
    }
    let mut data = Vec::new();
    for name in f.tensor_names() {
        let t = f.any_weight(name).unwrap();
        let shape = t.shape();
        let rank = shape.iter().rposition(|&v| v != 1).map_or(1, |i| i + 1);
        w.add_tensor_with_layout(name, &shape[..rank], t.dtype(), t.layout())
            .unwrap();
        let mut values = t.to_host_f32();
        edit(name, &mut values);
        data.push(values);
    }
    w.write(dst, |i| Ok(std::mem::take(&mut data[i]))).unwrap();
}
