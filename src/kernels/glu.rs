//! The gated linear unit as one node (the conformer conv module).

use super::vmath;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor};

/// Gated linear unit over `ne0`: `y` [2D, T] -> `y[..D] * sigmoid(y[D..])` [D, T], as one pass,
/// the sigmoid from our vectorised `e^x` (within 3e-7 of f64; libm's `expf` kept the loop
/// scalar).
pub fn glu<'g>(g: &mut Graph<'g>, y: Tensor<'g>) -> Tensor<'g> {
    let (d2, t) = (y.ne(0), y.ne(1));
    check(
        d2 % 2 == 0 && y.shape() == [d2, t, 1, 1] && y.dtype() == Some(DType::F32),
        || format!("glu: input {:?}", y.shape()),
    );
    let y = if y.is_contiguous() { y } else { g.cont(y) };
    if g.lowering() == Lowering::Builtin {
        // The two halves as views, `a * sigmoid(gate)`.
        let a = g.cols(y, 0, d2 / 2);
        let gate = g.cols(y, d2 / 2, d2 / 2);
        let gate = g.sigmoid(gate);
        return g.mul(a, gate);
    }
    // SAFETY: an f32 [D, T] result over a contiguous f32 [2D, T], as Glu reads it.
    unsafe { g.custom(Out::F32, [d2 / 2, t, 1, 1], &[y], Glu, "glu") }
}

/// The node of [`glu`]: source 0 f32 [2D, T], the result f32 [D, T]; each thread computes its
/// own time steps.
struct Glu;

impl Body for Glu {
    fn run(&self, op: &CustomOp<'_>) {
        let [dd, t, ..] = op.shape();
        let mine = op.share(t);
        let y = &op.src_f32(0)[mine.start * 2 * dd..mine.end * 2 * dd];
        // SAFETY: this thread's time steps, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(mine.start * dd..mine.end * dd) };
        if dd == 0 {
            return;
        }
        for (row, o) in y.chunks_exact(2 * dd).zip(out.chunks_exact_mut(dd)) {
            let (a, gate) = row.split_at(dd);
            vmath::glu(a, gate, o);
        }
    }
}
