//! Each fused op's built-in lowering (ggml's own ops only) against our kernel on the same
//! random inputs: the same graph built once per lowering, each with the weights in the layout
//! that lowering reads (packed for the kernels, plain for ggml's ops). Tolerances are relative
//! (‖builtin − kernel‖ / ‖kernel‖); both sides compute in f32, so only the order of the sums
//! differs, except the q8_0 product (both quantize the activations to q8_0 blocks).

use super::{Chunking, FusedOps, KeyWindow, TestValues};
use crate::backend::{
    Backend, Computed, DType, Graph, HostWeights, Lowering, Tensor, Weight, quantize_rows,
};
use crate::error::Result;

/// Runs `build` under both lowerings on one backend: (kernels, builtin).
fn both<F>(build: F) -> (Computed, Computed)
where
    F: for<'g> Fn(&mut Graph<'g>) -> Result<Tensor<'g>>,
{
    let mut b = Backend::cpu(2).unwrap();
    let kernels = b.compute(|g| build(g)).unwrap();
    b.set_lowering(Lowering::Builtin);
    let builtin = b.compute(|g| build(g)).unwrap();
    assert_eq!(kernels.shape, builtin.shape, "result shapes");
    (kernels, builtin)
}

/// ‖a − b‖ / ‖b‖ in f64.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        assert!(x.is_finite() && y.is_finite(), "a non-finite value");
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    assert!(den > 0.0, "an all-zero result proves nothing");
    (num / den).sqrt()
}

fn assert_close(what: &str, (kernels, builtin): (Computed, Computed), tol: f64) {
    let err = rel(&builtin.output, &kernels.output);
    assert!(
        err <= tol,
        "{what}: builtin vs kernels rel err {err:.3e} > {tol:.0e}"
    );
}

/// A torch Linear weight `[m][k]` twice: panel-packed (our f32 GEMM) and plain.
struct Pair {
    packed: Weight,
    plain: Weight,
}

impl Pair {
    fn get(&self, g: &Graph<'_>) -> &Weight {
        match g.lowering() {
            Lowering::Kernels => &self.packed,
            Lowering::Builtin => &self.plain,
        }
    }
}

fn f32_pair(m: usize, k: usize, seed: u64) -> (Pair, Weight) {
    let mut v = TestValues::new(seed);
    let w = v.take(m * k);
    let mut host = HostWeights::new();
    let packed = host.push_panel16("w.panel16", m, k, &w);
    let plain = host.push("w", &[k, m], w);
    let bias = host.push("b", &[m], v.take(m));
    let r = host.realize_slots().unwrap();
    (
        Pair {
            packed: r.get(packed),
            plain: r.get(plain),
        },
        r.get(bias),
    )
}

#[test]
fn linears_match_the_panel_gemm() {
    let (m, k, n) = (48, 40, 37);
    let (w, b) = f32_pair(m, k, 1);
    let x = TestValues::new(2).take(k * n);
    let r = TestValues::new(3).take(m * n);
    let (x, r) = (&x, &r);
    assert_close(
        "linear",
        both(|g| {
            let x = g.input_f32(x, &[k, n]);
            let w = w.get(g);
            Ok(g.linear(x, w, Some(&b)))
        }),
        1e-6,
    );
    assert_close(
        "linear_relu",
        both(|g| {
            let x = g.input_f32(x, &[k, n]);
            let w = w.get(g);
            Ok(g.linear_relu(x, w, Some(&b)))
        }),
        1e-6,
    );
    assert_close(
        "linear_residual",
        both(|g| {
            let x = g.input_f32(x, &[k, n]);
            let res = g.input_f32(r, &[m, n]);
            let w = w.get(g);
            Ok(g.linear_residual(x, w, Some(&b), res, 0.5))
        }),
        1e-6,
    );
    assert_close(
        "silu_linear",
        both(|g| {
            let x = g.input_f32(x, &[k, n]);
            let res = g.input_f32(r, &[m, n]);
            let w = w.get(g);
            Ok(g.silu_linear(x, w, Some(&b), Some((res, 1.0))))
        }),
        1e-6,
    );
}

#[test]
fn q8_0_linear_matches_the_int8_gemm() {
    let (m, k, n) = (40, 64, 9);
    let mut v = TestValues::new(4);
    let bytes = quantize_rows(&v.take(m * k), k, DType::Q8_0).unwrap();
    let mut host = HostWeights::new();
    let plain = host.push_blocks("w", &[k, m], DType::Q8_0, bytes);
    let plain = host.realize_slots().unwrap().get(plain);
    let mut host = HostWeights::new();
    let padded = host.push_int8_padded("w.int8", &plain, None).unwrap();
    let packed = host.realize_slots().unwrap().get(padded.weight);
    let x = v.take(k * n);
    let x = &x;
    // Both products quantize the input to q8_0 blocks and sum the int8 products; only the
    // rounding of the block scales' products differs.
    assert_close(
        "q8_0 linear",
        both(|g| {
            let x = g.input_f32(x, &[k, n]);
            let w = match g.lowering() {
                Lowering::Kernels => &packed,
                Lowering::Builtin => &plain,
            };
            Ok(g.linear(x, w, None))
        }),
        1e-5,
    );
}

#[test]
fn matmul_matches_the_packed_gemm() {
    // Large enough for the `gemm` crate's kernel under our lowering.
    let (m, k, n) = (128, 96, 100);
    let mut v = TestValues::new(5);
    let (w, x) = (v.take(m * k), v.take(k * n));
    let (w, x) = (&w, &x);
    assert_close(
        "matmul",
        both(|g| {
            let w = g.input_f32(w, &[k, m]);
            let x = g.input_f32(x, &[k, n]);
            Ok(g.matmul(w, x))
        }),
        1e-6,
    );
}

#[test]
fn layer_norm_matches() {
    let (d, n) = (72, 11);
    let mut v = TestValues::new(6);
    let x = v.take(d * n);
    let mut host = HostWeights::new();
    let (w, b) = (
        host.push("w", &[d], v.take(d)),
        host.push("b", &[d], v.take(d)),
    );
    let r = host.realize_slots().unwrap();
    let (w, b) = (r.get(w), r.get(b));
    let x = &x;
    assert_close(
        "layer_norm",
        both(|g| {
            let x = g.input_f32(x, &[d, n]);
            Ok(g.layer_norm(x, &w, &b, 1e-5))
        }),
        1e-6,
    );
}

#[test]
fn lstm_ops_match() {
    let (h, n) = (16, 3);
    let mut v = TestValues::new(7);
    let (gx, gh, c) = (v.take(4 * h * n), v.take(4 * h * n), v.take(h * n));
    let mut host = HostWeights::new();
    let bi = host.push("b_ih", &[4 * h], v.take(4 * h));
    let bh = host.push("b_hh", &[4 * h], v.take(4 * h));
    let r = host.realize_slots().unwrap();
    let (bi, bh) = (r.get(bi), r.get(bh));
    let (gx, gh, c) = (&gx, &gh, &c);
    assert_close(
        "lstm_pointwise",
        both(|g| {
            let gx = g.input_f32(gx, &[4 * h, n]);
            let gh = g.input_f32(gh, &[4 * h, n]);
            let c = g.input_f32(c, &[h, n]);
            Ok(g.lstm_pointwise(gx, gh, (&bi, &bh), c))
        }),
        1e-6,
    );
    let steps = 13;
    let (gx, w, s) = (v.take(4 * h * steps), v.take(4 * h * h), v.take(2 * h));
    let (gx, w, s) = (&gx, &w, &s);
    assert_close(
        "lstm_sequence",
        both(|g| {
            let gx = g.input_f32(gx, &[4 * h, steps]);
            let w = g.input_f32(w, &[4 * h, h]);
            let s = g.input_f32(s, &[h, 2]);
            Ok(g.lstm_sequence(gx, w, s))
        }),
        1e-5,
    );
}

#[test]
fn columns_pad_and_glu_match() {
    let mut v = TestValues::new(8);
    let (c, t, n) = (5, 9, 3);
    let x = v.take(c * t * n);
    let x = &x;
    for stride in [1, 2] {
        let out = both(|g| {
            let x = g.input_f32(x, &[c, t, n]);
            Ok(g.conv1d_columns(x, stride))
        });
        assert_eq!(out.0.output, out.1.output, "conv1d_columns stride {stride}");
    }
    let out = both(|g| {
        let x = g.input_f32(x, &[c, t, n]);
        Ok(g.pad_zeros(x, [(1, 2), (2, 0), (0, 1), (0, 0)]))
    });
    assert_eq!(out.0.output, out.1.output, "pad_zeros");
    let y = v.take(2 * 24 * 7);
    let y = &y;
    assert_close(
        "glu",
        both(|g| {
            let y = g.input_f32(y, &[48, 7]);
            Ok(g.glu(y))
        }),
        1e-6,
    );
}

#[test]
fn depthwise_convs_match() {
    let (c, t, k) = (24, 17, 9);
    let mut v = TestValues::new(9);
    let (x, kern, b) = (v.take(c * t), v.take(k * c), v.take(c));
    let (x, kern, b) = (&x, &kern, &b);
    for silu in [false, true] {
        assert_close(
            "conv1d_depthwise_same",
            both(|g| {
                let x = g.input_f32(x, &[c, t]);
                let kern = g.input_f32(kern, &[k, c]);
                let b = g.input_f32(b, &[c]);
                Ok(match silu {
                    true => g.conv1d_depthwise_same_silu(x, kern, Some(b)),
                    false => g.conv1d_depthwise_same(x, kern, Some(b)),
                })
            }),
            1e-6,
        );
    }
    // The subsampling's stride-2 depthwise conv, and the stem (conv.0 packed for the kernel,
    // plain for ggml's im2col).
    let (c, w, h) = (32, 13, 11);
    let mut host = HostWeights::new();
    let k2 = host.push("conv2", &[c, 1, 3, 3], v.take(9 * c));
    let b2 = host.push("b2", &[c], v.take(c));
    let w0 = v.take(9 * c);
    let k0_packed = host.push_panel16("conv0.panel16", c, 9, &w0);
    let k0_plain = host.push("conv0", &[3, 3, 1, c], w0);
    let b0 = host.push("b0", &[c], v.take(c));
    let r = host.realize_slots().unwrap();
    let (k2, b2, b0) = (r.get(k2), r.get(b2), r.get(b0));
    let (k0_packed, k0_plain) = (r.get(k0_packed), r.get(k0_plain));
    let img = v.take(c * w * h);
    let img = &img;
    for pad in [0, 1] {
        assert_close(
            "conv_depthwise_stride2",
            both(|g| {
                let x = g.input_f32(img, &[c, w, h]);
                Ok(g.conv_depthwise_stride2(x, (&k2, &b2), pad))
            }),
            1e-6,
        );
    }
    let feats = v.take(w * h);
    let feats = &feats;
    assert_close(
        "conv_stem",
        both(|g| {
            let x = g.input_f32(feats, &[w, h]);
            let k0 = match g.lowering() {
                Lowering::Kernels => &k0_packed,
                Lowering::Builtin => &k0_plain,
            };
            Ok(g.conv_stem(x, (k0, &b0), (&k2, &b2)))
        }),
        1e-6,
    );
}

/// Rel-pos attention with `queries` queries over the keys `window` gives them (`past` cache
/// keys before them and `later` keys after), `h` heads of `dk`.
fn attention_case(dk: usize, h: usize, queries: usize, later: usize, window: KeyWindow) {
    let keys = window.past + queries + later;
    let rows = window.left + window.right + 1;
    let mut v = TestValues::new((queries * 31 + keys) as u64);
    let (q, k, vv) = (
        v.take(dk * h * queries),
        v.take(dk * h * keys),
        v.take(dk * h * keys),
    );
    let (p, u, bv) = (v.take(dk * h * rows), v.take(dk * h), v.take(dk * h));
    let (q, k, vv, p, u, bv) = (&q, &k, &vv, &p, &u, &bv);
    assert_close(
        &format!("rel_pos_attention {queries} queries, {keys} keys, {window:?}"),
        both(|g| {
            let q = g.input_f32(q, &[dk, h, queries]);
            let k = g.input_f32(k, &[dk, h, keys]);
            let vv = g.input_f32(vv, &[dk, h, keys]);
            let p = g.input_f32(p, &[dk, h, rows]);
            let u = g.input_f32(u, &[dk, h]);
            let bv = g.input_f32(bv, &[dk, h]);
            Ok(g.rel_pos_attention(q, k, vv, p, u, bv, window, &[]))
        }),
        2e-6,
    );
}

#[test]
fn rel_pos_attention_matches_for_every_window() {
    // Full attention (one block, and several blocks of the built-in lowering).
    for t in [7, 300] {
        attention_case(8, 2, t, 0, KeyWindow::band(t - 1, t - 1));
    }
    // Local attention, symmetric and not, shorter and longer than a block.
    attention_case(8, 3, 40, 0, KeyWindow::band(5, 3));
    attention_case(16, 2, 600, 0, KeyWindow::band(64, 64));
    // A time slice: keys before and after its queries.
    let slice = KeyWindow {
        past: 12,
        ..KeyWindow::band(12, 12)
    };
    attention_case(8, 2, 50, 12, slice);
    // A stream's chunk over a cache, partly filled, with a chunked mask.
    let stream = KeyWindow {
        left: 30,
        right: 6,
        past: 30,
        first_valid: 9,
        chunk: Some(Chunking {
            size: 7,
            left_chunks: 4,
        }),
    };
    attention_case(8, 2, 14, 0, stream);
}

#[test]
fn dot_product_attention_matches() {
    let (dk, h, t) = (8, 4, 70);
    let mut v = TestValues::new(10);
    let (q, k, vv) = (v.take(dk * h * t), v.take(dk * h * t), v.take(dk * h * t));
    let (q, k, vv) = (&q, &k, &vv);
    assert_close(
        "dot_product_attention",
        both(|g| {
            let q = g.input_f32(q, &[dk, h, t]);
            let k = g.input_f32(k, &[dk, h, t]);
            let vv = g.input_f32(vv, &[dk, h, t]);
            Ok(g.dot_product_attention(q, k, vv))
        }),
        2e-6,
    );
}
