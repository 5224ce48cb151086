//! The columns of a kernel-3 Conv1d's GEMM (im2col), zero padding included, in one node: for
//! small convolutions over many short sequences (Silero VAD's four frames a window), where
//! ggml's pad and concatenations cost as much as the product.

use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor};

/// `x` [C, T, N] (N sequences of T steps) -> [3C, T', N] with `T' = (T - 1) / stride + 1`:
/// column `t` of sequence `n` holds steps `stride * t - 1`, `stride * t` and `stride * t + 1`
/// of that sequence side by side (tap-major), zeros where a step falls outside it (padding 1).
pub fn conv1d_columns<'g>(g: &mut Graph<'g>, x: Tensor<'g>, stride: usize) -> Tensor<'g> {
    let [c, t, n, d] = x.shape();
    check(
        x.dtype() == Some(DType::F32) && d == 1 && c > 0 && t > 0 && stride > 0,
        || format!("conv1d_columns: input {:?} stride {stride}", x.shape()),
    );
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let t_out = (t - 1) / stride + 1;
    if g.lowering() == Lowering::Builtin {
        // Padded by a zero step on each side, tap k of output step s is step `stride s + k`:
        // three strided views, side by side along ne0.
        let xp = g.pad(x, [(0, 0), (1, 1), (0, 0), (0, 0)]);
        let row = c * 4;
        let taps: Vec<Tensor<'g>> = (0..3)
            .map(|k| g.view(xp, &[c, t_out, n], &[stride * row, (t + 2) * row], k * row))
            .collect();
        let two = g.concat(taps[0], taps[1], 0);
        return g.concat(two, taps[2], 0);
    }
    // SAFETY: an f32 [3C, T', N] result over one contiguous f32 [C, T, N] source, as Columns
    // reads and writes them (each thread its own columns).
    unsafe {
        g.custom(
            Out::F32,
            [3 * c, t_out, n, 1],
            &[x],
            Columns { stride },
            "conv1d columns",
        )
    }
}

/// The node of [`conv1d_columns`].
struct Columns {
    stride: usize,
}

impl Body for Columns {
    fn run(&self, op: &CustomOp<'_>) {
        let [c3, t_out, n, _] = op.shape();
        let [c, t, ..] = op.src_shape(0);
        let x = op.src_f32(0);
        let mine = op.share(t_out * n);
        // SAFETY: this thread's columns, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(mine.start * c3..mine.end * c3) };
        for (col, o) in mine.zip(out.chunks_exact_mut(c3)) {
            let (seq, step) = (col / t_out, col % t_out);
            for (k, tap) in o.chunks_exact_mut(c).enumerate() {
                match (self.stride * step + k).checked_sub(1).filter(|&s| s < t) {
                    Some(s) => tap.copy_from_slice(&x[(seq * t + s) * c..(seq * t + s + 1) * c]),
                    None => tap.fill(0.0),
                }
            }
        }
    }
}
