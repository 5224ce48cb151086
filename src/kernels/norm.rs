//! LayerNorm with its affine parameters as one node.

use super::cpu::multiversioned;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor, Weight};
use crate::layout::Layout;

/// A torch `LayerNorm` over `ne0`.
pub fn layer_norm<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    w: &Weight,
    b: &Weight,
    eps: f32,
) -> Tensor<'g> {
    let d = x.ne(0);
    check(
        x.dtype() == Some(DType::F32)
            && [w, b].iter().all(|p| {
                p.shape() == [d, 1, 1, 1] && p.dtype() == DType::F32 && p.layout() == Layout::Plain
            }),
        || {
            format!(
                "layer_norm: {:?} with {:?}, {:?}",
                x.shape(),
                w.shape(),
                b.shape()
            )
        },
    );
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let (w, b) = (g.weight(w), g.weight(b));
    if g.lowering() == Lowering::Builtin {
        // ggml's `norm`, `mul` and `add`: the operations the kernel does, in their order.
        let n = g.norm(x, eps);
        let n = g.mul(n, w);
        return g.add(n, b);
    }
    // SAFETY: an f32 result of x's shape over the contiguous f32 x and the [d] weight and
    // bias, as LayerNorm reads them.
    unsafe {
        g.custom(
            Out::F32,
            x.shape(),
            &[x, w, b],
            LayerNorm { eps },
            "layer_norm",
        )
    }
}

/// The node of [`layer_norm`]: source 0 x `[d, rows...]` (contiguous f32), sources 1 and 2 the
/// weight and the bias `[d]`, the result f32 of x's shape; each thread normalises its own rows.
struct LayerNorm {
    eps: f32,
}

impl Body for LayerNorm {
    fn run(&self, op: &CustomOp<'_>) {
        let [d, r1, r2, r3] = op.shape();
        let mine = op.share(r1 * r2 * r3);
        let rows = mine.start * d..mine.end * d;
        let (x, w, b) = (&op.src_f32(0)[rows.clone()], op.src_f32(1), op.src_f32(2));
        // SAFETY: this thread's rows, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(rows) };
        if d == 0 {
            return;
        }
        layer_norm_rows(x, w, b, self.eps, d, out);
    }
}

multiversioned! {
    /// Every row of `x` (`d` values each) into `out`.
    fn layer_norm_rows(x: &[f32], w: &[f32], b: &[f32], eps: f32, d: usize, out: &mut [f32]) {
        for (row, y) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            layer_norm_row(row, w, b, eps, y);
        }
    }
}

/// One row of a LayerNorm in one pass over memory (ggml's `norm`, `mul` and `add` made three):
/// mean and variance as ggml's `norm` forms them (the sums in f64, the mean and the variance
/// rounded to f32, `scale = 1 / sqrt(var + eps)`), then `((x - mean) * scale) * w + b` in f32,
/// the operations of the three nodes in their order. The sums keep eight partial sums (so that
/// they vectorise), which can move the variance by an ulp against ggml's.
#[inline(always)]
fn layer_norm_row(x: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32]) {
    let n = x.len();
    let sum = sum_f64(x, |v| v as f64);
    let mean = (sum as f32) / n as f32;
    let var = sum_f64(x, |v| {
        let d = v - mean;
        (d * d) as f64
    }) / n as f64;
    let scale = 1.0 / ((var as f32) + eps).sqrt();
    for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
        *y = ((x - mean) * scale) * w + b;
    }
}

/// `sum(f(x))` in eight partial sums (lane `i % 8` takes `x[i]`), so that it vectorises.
#[inline(always)]
fn sum_f64(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += f(v);
    }
    acc.iter().sum()
}
