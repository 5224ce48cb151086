//! Depthwise 1-D convolution over time as one node (the conformer conv module).

use super::cpu::multiversioned;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor};

/// Depthwise 1-D convolution over time in f32 ('same' padding, odd kernel), plus an optional
/// per-channel bias, then SiLU on each step as it is computed with `silu` (the conformer conv
/// module's depthwise conv and activation, one pass). `x` [C, T] (channels fastest), `kernel`
/// [K, C], `bias` [C] -> [C, T]. Each thread slides the kernel over its own time steps, all
/// channels at once, with the padding implied (no padded or transposed copy of `x`); the taps
/// are summed in kernel order from zero, then the bias added, as ggml's `ssm_conv` followed by
/// an add would.
pub fn conv1d_depthwise<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    kernel: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    silu: bool,
) -> Tensor<'g> {
    let (k, c, t) = (kernel.ne(0), x.ne(0), x.ne(1));
    check(
        kernel.shape() == [k, c, 1, 1]
            && k % 2 == 1
            && x.shape() == [c, t, 1, 1]
            && bias.is_none_or(|b| b.shape() == [c, 1, 1, 1])
            && [Some(x), Some(kernel), bias]
                .iter()
                .flatten()
                .all(|t| t.dtype() == Some(DType::F32)),
        || {
            format!(
                "conv1d_dw: kernel {:?} for input {:?}",
                kernel.shape(),
                x.shape()
            )
        },
    );
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let kernel = if kernel.is_contiguous() {
        kernel
    } else {
        g.cont(kernel)
    };
    if g.lowering() == Lowering::Builtin {
        return depthwise_builtin(g, x, kernel, bias, silu);
    }
    let mut sources = vec![x, kernel];
    sources.extend(bias);
    let what = if silu {
        "conv1d_dw + silu"
    } else {
        "conv1d_dw"
    };
    // SAFETY: an f32 [C, T] result over the contiguous f32 sources checked above (the bias,
    // when given, a contiguous [C] weight or node), as DepthwiseConv reads them.
    unsafe {
        g.custom(
            Out::F32,
            [c, t, 1, 1],
            &sources,
            DepthwiseConv { silu },
            what,
        )
    }
}

/// [`conv1d_depthwise`] in ggml's built-in ops: `x` padded by half the kernel on each side,
/// then ggml's depthwise 2-D convolution on its channels-contiguous layout (a 1-row image of
/// `T + K - 1` columns, the kernel re-laid channels fastest), the bias and the SiLU as nodes.
fn depthwise_builtin<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    kernel: Tensor<'g>,
    bias: Option<Tensor<'g>>,
    silu: bool,
) -> Tensor<'g> {
    let (k, c, t) = (kernel.ne(0), x.ne(0), x.ne(1));
    let half = k / 2;
    let xp = g.pad(x, [(0, 0), (half, half), (0, 0), (0, 0)]); // [C, T + K - 1]
    let image = g.permute(xp, [2, 0, 1, 3]); // [T + K - 1, 1, C], channels contiguous
    let kt = g.transpose(kernel);
    let kt = g.cont(kt); // [C, K]
    let kt = g.reshape(kt, &[c, 1, k, 1]);
    let kt = g.permute(kt, [3, 2, 0, 1]); // [K, 1, 1, C], channels contiguous
    let y = g.conv2d_depthwise(kt, image, 1, 0); // [T, 1, C], channels contiguous
    let y = g.permute(y, [1, 2, 0, 3]); // [C, T]
    let y = if y.is_contiguous() { y } else { g.cont(y) };
    let y = g.reshape(y, &[c, t]);
    let y = match bias {
        Some(b) => g.add(y, b),
        None => y,
    };
    if silu { g.silu(y) } else { y }
}

/// The node of [`conv1d_depthwise`]: source 0 x (f32 [C, T]), source 1 the kernel (f32
/// [K, C]), an optional source 2 the bias (f32 [C]), the result f32 [C, T]; each thread
/// computes its own time steps.
struct DepthwiseConv {
    /// SiLU after the bias.
    silu: bool,
}

impl Body for DepthwiseConv {
    fn run(&self, op: &CustomOp<'_>) {
        let [c, t, ..] = op.shape();
        let k = op.src_shape(1)[0];
        let mine = op.share(t);
        let (x, kernel) = (op.src_f32(0), op.src_f32(1));
        let bias = op.has_src(2).then(|| op.src_f32(2));
        // SAFETY: this thread's time steps, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(mine.start * c..mine.end * c) };
        if mine.is_empty() {
            return;
        }
        // Tap-major kernel ([K][C]) so that the channel loop below runs over contiguous memory.
        let mut taps = vec![0f32; k * c];
        for (ch, w) in kernel.chunks_exact(k).enumerate() {
            for (j, &v) in w.iter().enumerate() {
                taps[j * c + ch] = v;
            }
        }
        convolve_steps(x, &taps, bias, self.silu, mine, out);
    }
}

multiversioned! {
    /// Output steps `steps` of `x` ([C, T]) into `out`, over the tap-major kernel `taps`
    /// ([K][C]).
    fn convolve_steps(
        x: &[f32],
        taps: &[f32],
        bias: Option<&[f32]>,
        silu: bool,
        steps: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let c = out.len() / steps.len();
        let (k, t) = (taps.len() / c, x.len() / c);
        let half = k / 2;
        for (ti, row) in steps.zip(out.chunks_exact_mut(c)) {
            row.fill(0.0);
            for (j, tap) in taps.chunks_exact(c).enumerate() {
                // Input step ti + j - half; outside the clip it is the zero padding.
                let Some(src) = (ti + j).checked_sub(half).filter(|&s| s < t) else {
                    continue;
                };
                for ((o, &xv), &w) in row.iter_mut().zip(&x[src * c..][..c]).zip(tap) {
                    *o += xv * w;
                }
            }
            if let Some(b) = bias {
                for (o, &bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
            if silu {
                super::vmath::silu_in_place(row);
            }
        }
    }
}
