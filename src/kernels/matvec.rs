//! f32 matrix-vector products on plain (row-major) weights: the decoder's per-step products
//! (the LSTM's, the joint's prediction projection and output layer of an f32 model), one or a
//! beam's few columns at a time.
//!
//! ggml's `mul_mat` did these, compiled for the portable build's baseline (SSE): an f32 model's
//! decoder took 5.5 ms on jfk where the native build took 3.5 ms. Here the loop is compiled per
//! instruction set and picked at run time ([`super::cpu::multiversioned`]).

use super::cpu::multiversioned;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Tensor};

/// Up to this many columns a product runs here (a greedy step has one, a beam one per
/// hypothesis); wider ones are GEMMs.
pub(super) const MAX_COLUMNS: usize = 16;

/// Accumulator lanes: one 512-bit register, two 256-bit ones.
const LANES: usize = 16;
/// Independent accumulators, so that consecutive adds do not wait on each other.
const CHAINS: usize = 4;
/// Elements of a row each round of the dot product reads.
const STRIDE: usize = LANES * CHAINS;

/// Whether `w^T x` is a product for [`matvec`]: contiguous 2-D f32 operands and at most
/// [`MAX_COLUMNS`] columns.
pub(super) fn fits(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    let (ws, xs) = (w.shape(), x.shape());
    let plain_f32 = |t: Tensor<'_>| t.dtype() == Some(DType::F32) && t.is_contiguous();
    plain_f32(w) && plain_f32(x) && ws[2] * ws[3] == 1 && xs[2] * xs[3] == 1 && xs[1] <= MAX_COLUMNS
}

/// `w^T x (+ bias)`: `w` [k, m] (a torch Linear weight), `x` [k, n] -> [m, n], each row's dot
/// products with every column in one pass over the row, rows split over the threads. The
/// caller checked [`fits`] and `w`'s row length against `x`'s.
pub(super) fn matvec<'g>(
    g: &mut Graph<'g>,
    w: Tensor<'g>,
    x: Tensor<'g>,
    bias: Option<Tensor<'g>>,
) -> Tensor<'g> {
    let ([k, m, ..], [_, n, ..]) = (w.shape(), x.shape());
    check(fits(w, x) && x.ne(0) == k, || {
        format!("matvec: weight {:?}, input {:?}", w.shape(), x.shape())
    });
    if let Some(b) = bias {
        check(
            b.shape() == [m, 1, 1, 1] && b.dtype() == Some(DType::F32) && b.is_contiguous(),
            || format!("matvec: bias {:?} for {m} rows", b.shape()),
        );
    }
    let mut sources = vec![w, x];
    sources.extend(bias);
    // SAFETY: an [m, n] f32 result over the contiguous f32 w [k, m], x [k, n] and bias [m]
    // checked above, as MatVecF32 reads them.
    unsafe { g.custom(Out::F32, [m, n, 1, 1], &sources, MatVecF32, "matvec (f32)") }
}

/// The node of [`matvec`]: sources w [k, m], x [k, n] and an optional bias [m]; each thread
/// computes its own rows of every column.
struct MatVecF32;

impl Body for MatVecF32 {
    fn run(&self, op: &CustomOp<'_>) {
        let ([k, m, ..], [_, n, ..]) = (op.src_shape(0), op.src_shape(1));
        let rows = op.share(m);
        if rows.is_empty() {
            return;
        }
        let (w, x) = (op.src_f32(0), op.src_f32(1));
        let bias = op.has_src(2).then(|| &op.src_f32(2)[rows.clone()]);
        let w = &w[rows.start * k..rows.end * k];
        if n == 1 {
            // SAFETY: rows `rows` of the single column are this thread's alone.
            let out = unsafe { op.dst_mut::<f32>(rows.clone()) };
            dot_rows(w, x, k, out);
            add_bias(out, bias);
            return;
        }
        // Row by row (each row read once for every column), then scattered to the columns.
        let mut by_row = vec![0f32; rows.len() * n];
        dot_rows(w, x, k, &mut by_row);
        for j in 0..n {
            // SAFETY: rows `rows` of column j are this thread's alone.
            let out = unsafe { op.dst_mut::<f32>(j * m + rows.start..j * m + rows.end) };
            for (o, r) in out.iter_mut().zip(by_row.chunks_exact(n)) {
                *o = r[j];
            }
            add_bias(out, bias);
        }
    }
}

fn add_bias(out: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for (o, b) in out.iter_mut().zip(b) {
            *o += b;
        }
    }
}

multiversioned! {
    /// `out[r * n + j] = w[r] · x[j]` for every row `r` of `w` (rows of `k`) and column `j` of
    /// `x` (columns of `k`, `n = x.len() / k`).
    fn dot_rows(w: &[f32], x: &[f32], k: usize, out: &mut [f32]) {
        let n = x.len() / k;
        for (row, dots) in w.chunks_exact(k).zip(out.chunks_exact_mut(n)) {
            for (column, d) in x.chunks_exact(k).zip(dots.iter_mut()) {
                *d = dot(row, column);
            }
        }
    }
}

/// `a · b` in a fixed order (lane-wise partial sums, then a fixed tree), separate multiplies
/// and adds: the same bits from every instruction set's build of the loop.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [[0f32; LANES]; CHAINS];
    let whole = a.len() / STRIDE * STRIDE;
    for (ca, cb) in a[..whole]
        .chunks_exact(STRIDE)
        .zip(b[..whole].chunks_exact(STRIDE))
    {
        for (chain, (la, lb)) in acc
            .iter_mut()
            .zip(ca.chunks_exact(LANES).zip(cb.chunks_exact(LANES)))
        {
            for l in 0..LANES {
                chain[l] += la[l] * lb[l];
            }
        }
    }
    let mut tail = 0f32;
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        tail += x * y;
    }
    let mut lanes = [0f32; LANES];
    for l in 0..LANES {
        lanes[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0] + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn rows_times_columns_match_f64_for_every_length() {
        // Lengths below, at and off the 64-element stride, and the decoder's 640.
        for k in [1, 15, 63, 64, 65, 130, 640] {
            let (m, n) = (5, 3);
            let (w, x) = (values(m * k, k as u32), values(n * k, 7 + k as u32));
            let mut out = vec![0f32; m * n];
            dot_rows(&w, &x, k, &mut out);
            for r in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|i| w[r * k + i] as f64 * x[j * k + i] as f64)
                        .sum();
                    let bound = 1e-6 * (k as f64).sqrt() * 4.0 + 1e-7;
                    let got = out[r * n + j] as f64;
                    assert!(
                        (got - exact).abs() <= bound,
                        "k {k} row {r} column {j}: {got} vs {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let k = 640;
        let (w, x) = (values(8 * k, 1), values(2 * k, 2));
        let mut want = [0f32; 16];
        for (r, d) in w.chunks_exact(k).zip(want.chunks_exact_mut(2)) {
            for (c, d) in x.chunks_exact(k).zip(d) {
                *d = dot(r, c);
            }
        }
        let mut got = [0f32; 16];
        dot_rows(&w, &x, k, &mut got);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "the dispatched build ({}) and the baseline build differ",
            super::super::cpu::Isa::best().name()
        );
    }
}
