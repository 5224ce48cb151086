//! Zero padding as one node that copies whole rows: ggml's pad computes an index and a branch
//! per element, which made it a tenth of a streaming chunk's time (the causal subsampling pads
//! every conv input).

use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor};

/// `x` (f32, up to 4-D) with `pads[i] = (before, after)` zeros along axis `i`.
pub fn pad_zeros<'g>(g: &mut Graph<'g>, x: Tensor<'g>, pads: [(usize, usize); 4]) -> Tensor<'g> {
    check(x.dtype() == Some(DType::F32), || {
        format!("pad: an f32 input, got {:?}", x.dtype())
    });
    if g.lowering() == Lowering::Builtin {
        return g.pad(x, pads);
    }
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let s = x.shape();
    let ne: [usize; 4] = std::array::from_fn(|i| s[i] + pads[i].0 + pads[i].1);
    // SAFETY: an f32 result of shape `ne` over one contiguous f32 source, as PadZeros reads
    // and writes them (each thread its own rows).
    unsafe { g.custom(Out::F32, ne, &[x], PadZeros { pads }, "pad") }
}

/// The node of [`pad_zeros`]: each thread fills its own rows (`ne0` runs) of the result.
struct PadZeros {
    pads: [(usize, usize); 4],
}

impl Body for PadZeros {
    fn run(&self, op: &CustomOp<'_>) {
        let ne = op.shape();
        let src = op.src_shape(0);
        let x = op.src_f32(0);
        let rows = ne[1] * ne[2] * ne[3];
        let mine = op.share(rows);
        // SAFETY: this thread's rows, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(mine.start * ne[0]..mine.end * ne[0]) };
        let [p0, p1, p2, p3] = self.pads;
        let source = |i: usize, p: (usize, usize), n: usize| i.checked_sub(p.0).filter(|&j| j < n);
        for (row, o) in mine.zip(out.chunks_exact_mut(ne[0])) {
            let (i1, i2, i3) = (row % ne[1], row / ne[1] % ne[2], row / (ne[1] * ne[2]));
            let from = source(i1, p1, src[1]).and_then(|j1| {
                let j2 = source(i2, p2, src[2])?;
                let j3 = source(i3, p3, src[3])?;
                Some(((j3 * src[2] + j2) * src[1] + j1) * src[0])
            });
            match from {
                Some(at) => {
                    o[..p0.0].fill(0.0);
                    o[p0.0..p0.0 + src[0]].copy_from_slice(&x[at..at + src[0]]);
                    o[p0.0 + src[0]..].fill(0.0);
                }
                None => o.fill(0.0),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::Backend;
    use crate::kernels::{FusedOps, TestValues};

    /// Equal to ggml's own pad on a 3-D tensor padded along every axis.
    #[test]
    fn pad_zeros_equals_ggml_pad() {
        let shape = [5, 4, 3];
        let data = TestValues::new(7).take(60);
        let data = &data;
        let pads = [(2, 1), (0, 2), (1, 1), (0, 0)];
        let mut b = Backend::cpu(2).unwrap();
        let ours = b
            .compute(|g| {
                let x = g.input_f32(data, &shape);
                Ok(g.pad_zeros(x, pads))
            })
            .unwrap();
        let ggml = b
            .compute(|g| {
                let x = g.input_f32(data, &shape);
                Ok(g.pad(x, pads))
            })
            .unwrap();
        assert_eq!(ours.shape, [8, 6, 5, 1]);
        assert_eq!(ours.shape, ggml.shape);
        assert_eq!(ours.output, ggml.output);
        assert!(ours.output.iter().any(|&v| v != 0.0));
    }
}
