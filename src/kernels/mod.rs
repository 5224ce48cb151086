//! Our fused CPU ops: each op's graph builder (shape checks, sources) and its kernel body
//! ([`crate::backend::custom::Body`]) together, built on the ggml runtime's custom-op hooks.
//!
//! Callers build them with [`FusedOps`] on a [`Graph`]: `use crate::kernels::FusedOps;`.
//! Which GEMM multiplies a weight is decided by its layout ([`crate::layout::choose`]) and
//! dispatched in [`linear`]; [`cpu`] is the one place that asks what this CPU can run.

mod attention;
#[cfg(test)]
mod builtin_tests;
mod columns;
pub mod cpu;
mod depthwise;
mod glu;
mod linear;
mod lstm;
mod lstm_sequence;
mod matvec;
mod norm;
mod pad;
pub mod panel;
pub mod qgemm;
pub mod sgemm;
mod stem;
pub mod vmath;

pub use attention::{Chunking, KeyWindow};

use crate::backend::{Graph, Tensor, Weight};
use linear::Fused;

/// The fused ops, as methods of the graph being built.
pub trait FusedOps<'g> {
    /// `w^T x` over `ne0`: `w` [k, m], `x` [k, n, ...] -> [m, n, ...]. With `w` a torch Linear
    /// weight ([out, in] in torch = ne [in, out]) this is `x @ W^T`; plain f32 products of a
    /// few columns run on our matrix-vector kernel, large ones on the `gemm` crate, the rest on
    /// ggml's `mul_mat`.
    fn matmul(&mut self, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g>;

    /// 2-D convolution in f32, torch semantics, channels-fastest output: `kernel`
    /// [KW, KH, Cin, Cout] (a torch Conv2d weight), `x` [W, H, Cin, N] -> [Cout, W', H', N].
    fn conv2d(
        &mut self,
        kernel: Tensor<'g>,
        x: Tensor<'g>,
        stride: usize,
        pad: usize,
    ) -> Tensor<'g>;

    /// A torch `Linear`: `x @ W^T + b` over `x` [in, n, ...], weight [in, out], on the GEMM
    /// its layout calls for.
    fn linear(&mut self, x: Tensor<'g>, w: &Weight, b: Option<&Weight>) -> Tensor<'g>;

    /// `relu(x @ W^T + b)`: with a panel-packed weight the bias and the ReLU are applied in
    /// the GEMM's store (the same values as a linear, then a ReLU node).
    fn linear_relu(&mut self, x: Tensor<'g>, w: &Weight, b: Option<&Weight>) -> Tensor<'g>;

    /// `residual + scale * (x @ W^T + b)`, a residual connection around a block that ends in a
    /// linear; with a packed weight done in the GEMM node, on each range of rows as soon as it
    /// is computed (the same values as `scale` and `add` nodes).
    fn linear_residual(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        residual: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g>;

    /// `silu(x) @ W^T + b`, plus `residual * scale` if given: with a packed weight the SiLU is
    /// applied where the input is packed or quantized for the GEMM (no pass of its own), within
    /// 3e-7 of f64 (`vmath`).
    fn silu_linear(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        residual: Option<(Tensor<'g>, f32)>,
    ) -> Tensor<'g>;

    /// A torch `LayerNorm` over `ne0`, one pass per row.
    fn layer_norm(&mut self, x: Tensor<'g>, w: &Weight, b: &Weight, eps: f32) -> Tensor<'g>;

    /// The pointwise part of one PyTorch LSTM cell step: `[h1 | c1]` ([H, 2]) from the gate
    /// products, their biases and the cell (see [`lstm::lstm_pointwise`]).
    fn lstm_pointwise(
        &mut self,
        gx: Tensor<'g>,
        gh: Tensor<'g>,
        biases: (&Weight, &Weight),
        c: Tensor<'g>,
    ) -> Tensor<'g>;

    /// The GEMM columns of a kernel-3, padding-1 Conv1d over N sequences: `x` [C, T, N] ->
    /// [3C, T', N] (see [`columns::conv1d_columns`]).
    fn conv1d_columns(&mut self, x: Tensor<'g>, stride: usize) -> Tensor<'g>;

    /// A PyTorch LSTM cell over a whole sequence of precomputed input products: `h` after
    /// every step, then the last `c` (see [`lstm_sequence::lstm_sequence`]).
    fn lstm_sequence(
        &mut self,
        gx: Tensor<'g>,
        w_hh_t: Tensor<'g>,
        state: Tensor<'g>,
    ) -> Tensor<'g>;

    /// Depthwise 1-D convolution over time ('same' padding, odd kernel) plus an optional
    /// per-channel bias: `x` [C, T], `kernel` [K, C], `bias` [C] -> [C, T].
    fn conv1d_depthwise_same(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g>;

    /// [`conv1d_depthwise_same`](Self::conv1d_depthwise_same) then SiLU on each step as it is
    /// computed.
    fn conv1d_depthwise_same_silu(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g>;

    /// Gated linear unit over `ne0`: `y` [2D, T] -> `y[..D] * sigmoid(y[D..])` [D, T].
    fn glu(&mut self, y: Tensor<'g>) -> Tensor<'g>;

    /// `x` with `pads[i] = (before, after)` zeros along axis `i` (ggml's pad, by whole rows).
    fn pad_zeros(&mut self, x: Tensor<'g>, pads: [(usize, usize); 4]) -> Tensor<'g>;

    /// The subsampling's conv.0 + ReLU + depthwise conv.2 + bias: one node over a panel-packed
    /// conv.0, separate nodes over a plain one (see [`stem::conv_stem`]).
    fn conv_stem(
        &mut self,
        x: Tensor<'g>,
        conv0: (&Weight, &Weight),
        conv2: (&Weight, &Weight),
    ) -> Tensor<'g>;

    /// A 3 x 3 stride-2 depthwise conv + bias (`conv` = kernel `[C, 1, 3, 3]`, bias) over a
    /// channels-fastest `[C, W, H]` padded by `pad`: our kernel where it takes the shape, ggml's
    /// otherwise (see [`stem::conv_depthwise_stride2`]).
    fn conv_depthwise_stride2(
        &mut self,
        x: Tensor<'g>,
        conv: (&Weight, &Weight),
        pad: usize,
    ) -> Tensor<'g>;

    /// Rel-pos multi-head attention over the keys `window` gives each query (see
    /// [`attention::rel_pos_attention_over`]); it runs after the nodes `after` (writes of the
    /// keys and values it reads in place).
    #[allow(clippy::too_many_arguments)]
    fn rel_pos_attention(
        &mut self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        p: Tensor<'g>,
        bias_u: Tensor<'g>,
        bias_v: Tensor<'g>,
        window: attention::KeyWindow,
        after: &[Tensor<'g>],
    ) -> Tensor<'g>;

    /// Multi-head attention without positions, every query over every key (see
    /// [`attention::dot_product_attention`]).
    fn dot_product_attention(&mut self, q: Tensor<'g>, k: Tensor<'g>, v: Tensor<'g>) -> Tensor<'g>;
}

impl<'g> FusedOps<'g> for Graph<'g> {
    fn matmul(&mut self, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
        linear::matmul(self, w, x)
    }

    fn conv2d(
        &mut self,
        kernel: Tensor<'g>,
        x: Tensor<'g>,
        stride: usize,
        pad: usize,
    ) -> Tensor<'g> {
        linear::conv2d(self, kernel, x, stride, pad)
    }

    fn linear(&mut self, x: Tensor<'g>, w: &Weight, b: Option<&Weight>) -> Tensor<'g> {
        linear::linear(self, x, w, b, Fused::default())
    }

    fn linear_relu(&mut self, x: Tensor<'g>, w: &Weight, b: Option<&Weight>) -> Tensor<'g> {
        linear::linear_relu(self, x, w, b)
    }

    fn linear_residual(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        residual: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        let fused = Fused {
            residual: Some((residual, scale)),
            ..Fused::default()
        };
        linear::linear(self, x, w, b, fused)
    }

    fn silu_linear(
        &mut self,
        x: Tensor<'g>,
        w: &Weight,
        b: Option<&Weight>,
        residual: Option<(Tensor<'g>, f32)>,
    ) -> Tensor<'g> {
        let fused = Fused {
            silu_input: true,
            residual,
            ..Fused::default()
        };
        linear::linear(self, x, w, b, fused)
    }

    fn layer_norm(&mut self, x: Tensor<'g>, w: &Weight, b: &Weight, eps: f32) -> Tensor<'g> {
        norm::layer_norm(self, x, w, b, eps)
    }

    fn lstm_pointwise(
        &mut self,
        gx: Tensor<'g>,
        gh: Tensor<'g>,
        biases: (&Weight, &Weight),
        c: Tensor<'g>,
    ) -> Tensor<'g> {
        lstm::lstm_pointwise(self, gx, gh, biases, c)
    }

    fn conv1d_columns(&mut self, x: Tensor<'g>, stride: usize) -> Tensor<'g> {
        columns::conv1d_columns(self, x, stride)
    }

    fn lstm_sequence(
        &mut self,
        gx: Tensor<'g>,
        w_hh_t: Tensor<'g>,
        state: Tensor<'g>,
    ) -> Tensor<'g> {
        lstm_sequence::lstm_sequence(self, gx, w_hh_t, state)
    }

    fn conv1d_depthwise_same(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        depthwise::conv1d_depthwise(self, x, kernel, bias, false)
    }

    fn conv1d_depthwise_same_silu(
        &mut self,
        x: Tensor<'g>,
        kernel: Tensor<'g>,
        bias: Option<Tensor<'g>>,
    ) -> Tensor<'g> {
        depthwise::conv1d_depthwise(self, x, kernel, bias, true)
    }

    fn glu(&mut self, y: Tensor<'g>) -> Tensor<'g> {
        glu::glu(self, y)
    }

    fn pad_zeros(&mut self, x: Tensor<'g>, pads: [(usize, usize); 4]) -> Tensor<'g> {
        pad::pad_zeros(self, x, pads)
    }

    fn conv_stem(
        &mut self,
        x: Tensor<'g>,
        conv0: (&Weight, &Weight),
        conv2: (&Weight, &Weight),
    ) -> Tensor<'g> {
        stem::conv_stem(self, x, conv0, conv2)
    }

    fn conv_depthwise_stride2(
        &mut self,
        x: Tensor<'g>,
        conv: (&Weight, &Weight),
        pad: usize,
    ) -> Tensor<'g> {
        stem::conv_depthwise_stride2(self, x, conv, pad)
    }

    fn rel_pos_attention(
        &mut self,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        p: Tensor<'g>,
        bias_u: Tensor<'g>,
        bias_v: Tensor<'g>,
        window: attention::KeyWindow,
        after: &[Tensor<'g>],
    ) -> Tensor<'g> {
        attention::rel_pos_attention_over(self, q, k, v, p, bias_u, bias_v, window, after)
    }

    fn dot_product_attention(&mut self, q: Tensor<'g>, k: Tensor<'g>, v: Tensor<'g>) -> Tensor<'g> {
        attention::dot_product_attention(self, q, k, v)
    }
}

/// Deterministic values in [-1, 1) for the op tests (a 64-bit LCG's high bits).
#[cfg(test)]
pub(crate) struct TestValues(u64);

#[cfg(test)]
impl TestValues {
    pub(crate) fn new(seed: u64) -> TestValues {
        TestValues(seed)
    }

    pub(crate) fn take(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }
}
