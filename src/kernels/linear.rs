//! The one GEMM dispatch: which kernel multiplies a weight, by the layout
//! [`crate::layout::choose`] gave it, and what a linear fuses into its nodes.
//!
//! - [`Layout::Panel16`] (f32): our panel GEMM ([`super::sgemm`]), the input packed once for
//!   every linear reading it, the bias, a ReLU and a residual in its store.
//! - [`Layout::Q8_0x8`] (q8_0) and [`Layout::Q4_0x8`] (q4_0): our int8 GEMM
//!   ([`super::qgemm`]), the input quantized once for every linear reading it, the bias, a
//!   ReLU and a residual in its node.
//! - [`Layout::Plain`]: [`matmul`], our run-time dispatched f32 matrix-vector kernel
//!   ([`super::matvec`]) for a product of a few columns (the decoder's per-step products of an
//!   f32 model), the `gemm` crate's packed kernels for a large plain f32 product (about twice ggml's f32 tinyBLAS throughput, `examples/gemm_throughput.rs`), ggml's
//!   `mul_mat` for everything else (quantized weights, batched and small products).

use super::matvec;
use super::panel::GemmNode;
use super::qgemm::Format;
use super::qgemm::node::{Int8Gemm, Quantize, quantized_bytes};
use super::sgemm::{PackActivations, Panel16Gemm};
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::{check, check_mul_mat};
use crate::backend::{DType, Graph, Lowering, Tensor, Weight};
use crate::layout::Layout;

/// Below this many multiply-adds ggml's own kernel is as fast.
const PACKED_GEMM_MIN_MACS: usize = 1 << 20;

/// Whether a plain product goes to the `gemm` crate: f32, 2-D, large enough, and not switched
/// off with `PARAKEET_GGML_MATMUL` (for comparing against ggml's kernel).
fn use_packed_gemm(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    let (ws, xs) = (w.shape(), x.shape());
    w.dtype() == Some(DType::F32)
        && x.dtype() == Some(DType::F32)
        && w.is_contiguous()
        && x.is_contiguous()
        && ws[2] == 1
        && ws[3] == 1
        && xs[2] == 1
        && xs[3] == 1
        && ws[0] * ws[1] * xs[1] >= PACKED_GEMM_MIN_MACS
        && std::env::var_os("PARAKEET_GGML_MATMUL").is_none()
}

/// Whether a plain product is a few columns for [`matvec`] (unless `PARAKEET_GGML_MATMUL`
/// asks for ggml's kernel).
fn use_matvec(w: Tensor<'_>, x: Tensor<'_>) -> bool {
    matvec::fits(w, x) && std::env::var_os("PARAKEET_GGML_MATMUL").is_none()
}

/// The node `dst[m, n] = w[k, m]^T x[k, n]` (sources w and x, contiguous f32), rows of `dst`
/// split over the threads, each running the `gemm` crate's single-threaded kernel on its rows.
struct PackedGemmF32;

impl Body for PackedGemmF32 {
    fn run(&self, op: &CustomOp<'_>) {
        let ([k, m, ..], [_, n, ..]) = (op.src_shape(0), op.src_shape(1));
        // Whole 16-row register tiles per thread.
        let tiles = op.share(m.div_ceil(16));
        let (i0, i1) = (tiles.start * 16, (tiles.end * 16).min(m));
        if i0 >= i1 {
            return;
        }
        let (w, x) = (op.src_f32(0), op.src_f32(1));
        // SAFETY: rows i0..i1 of every column of the [m, n] result are this thread's; w holds
        // m rows of k, x n columns of k.
        unsafe {
            gemm::gemm(
                i1 - i0,
                n,
                k,
                op.dst_ptr::<f32>().add(i0),
                m as isize, // dst column stride (one time step)
                1,
                false,
                w.as_ptr().add(i0 * k),
                1, // lhs = w^T: [i, p] at i * k + p
                k as isize,
                x.as_ptr(),
                k as isize, // rhs = x: [p, j] at j * k + p
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

/// `w^T x` over `ne0`: `w` [k, m], `x` [k, n, ...] -> [m, n, ...]. With `w` a torch Linear
/// weight ([out, in] in torch = ne [in, out]) this is `x @ W^T`.
/// Built-in lowering: ggml's `mul_mat` for every product.
pub fn matmul<'g>(g: &mut Graph<'g>, w: Tensor<'g>, x: Tensor<'g>) -> Tensor<'g> {
    check_mul_mat(w, x);
    if g.lowering() == Lowering::Builtin {
        return g.mul_mat(w, x);
    }
    if use_matvec(w, x) {
        return matvec::matvec(g, w, x, None);
    }
    if !use_packed_gemm(w, x) {
        return g.mul_mat(w, x);
    }
    let (ws, xs) = (w.shape(), x.shape());
    // SAFETY: an [m, n] f32 result over the contiguous 2-D f32 w and x, as PackedGemmF32
    // reads them.
    unsafe {
        g.custom(
            Out::F32,
            [ws[1], xs[1], 1, 1],
            &[w, x],
            PackedGemmF32,
            "matmul (packed gemm)",
        )
    }
}

/// 2-D convolution in f32, torch semantics, channels-fastest output: im2col, then [`matmul`].
/// `kernel` [KW, KH, Cin, Cout] (a torch Conv2d weight), `x` [W, H, Cin, N] ->
/// [Cout, W', H', N].
pub fn conv2d<'g>(
    g: &mut Graph<'g>,
    kernel: Tensor<'g>,
    x: Tensor<'g>,
    stride: usize,
    pad: usize,
) -> Tensor<'g> {
    let cols = g.im2col(kernel, x, stride, pad);
    let [k, w, h, n] = cols.shape();
    let flat = g.reshape(cols, &[k, w * h * n]);
    let kern = g.reshape(kernel, &[k, kernel.ne(3)]);
    let y = matmul(g, kern, flat);
    g.reshape(y, &[kernel.ne(3), w, h, n])
}

/// What a linear does besides its product, in its own nodes where its weight is packed.
#[derive(Clone, Copy, Default)]
pub(super) struct Fused<'g> {
    /// SiLU on the input, where it is packed or quantized.
    pub silu_input: bool,
    /// ReLU on the product and bias, before the residual.
    pub relu: bool,
    /// `residual + scale * y` on the output.
    pub residual: Option<(Tensor<'g>, f32)>,
}

/// `relu(x @ W^T + b)`: with a panel-packed weight the bias and the ReLU are applied in the
/// GEMM's store (the same values as [`linear`] then a ReLU node).
pub fn linear_relu<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    w: &Weight,
    b: Option<&Weight>,
) -> Tensor<'g> {
    if g.lowering() == Lowering::Kernels
        && matches!(
            w.layout(),
            Layout::Panel16 | Layout::Q8_0x8 | Layout::Q4_0x8
        )
    {
        let relu = Fused {
            relu: true,
            ..Fused::default()
        };
        return linear(g, x, w, b, relu);
    }
    let y = linear(g, x, w, b, Fused::default());
    g.relu(y)
}

/// A torch `Linear`, `x @ W^T + b` over `x` [in, n, ...] and a weight [in, out], with `fused`
/// done in its nodes where the weight is packed and the residual (if any) is a contiguous f32
/// of the output's 2-D shape; as separate nodes otherwise.
pub(super) fn linear<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    w: &Weight,
    b: Option<&Weight>,
    fused: Fused<'g>,
) -> Tensor<'g> {
    if g.lowering() == Lowering::Builtin {
        return linear_builtin(g, x, w, b, fused);
    }
    let m = w.shape()[1];
    let fusable = fused.residual.is_none_or(|(r, _)| {
        let [_, n, c, d] = x.shape();
        r.shape() == [m, n, 1, 1]
            && c * d == 1
            && r.is_contiguous()
            && r.dtype() == Some(DType::F32)
    });
    match w.layout() {
        layout @ (Layout::Q8_0x8 | Layout::Q4_0x8) if fusable => {
            let format = Format::of(layout).expect("an int8 GEMM layout");
            return linear_int8(g, x, (w, format), b, fused);
        }
        Layout::Panel16 if fusable => return linear_panel16(g, x, w, b, fused),
        Layout::Q8_0x8 | Layout::Q4_0x8 | Layout::Panel16 => {
            // Separate nodes around the packed product.
            let x = if fused.silu_input { g.silu(x) } else { x };
            let y = linear(g, x, w, b, Fused::default());
            let y = if fused.relu { g.relu(y) } else { y };
            return add_scaled_residual(g, y, fused.residual);
        }
        Layout::Plain => {}
    }
    let x = if fused.silu_input { g.silu(x) } else { x };
    let w = g.weight(w);
    let bias_fits = b.is_none_or(|b| {
        b.layout() == Layout::Plain && b.dtype() == DType::F32 && b.shape() == [m, 1, 1, 1]
    });
    if use_matvec(w, x) && bias_fits {
        check_mul_mat(w, x);
        let b = b.map(|b| g.weight(b));
        let y = matvec::matvec(g, w, x, b);
        return add_scaled_residual(g, y, fused.residual);
    }
    let y = matmul(g, w, x);
    let y = add_bias(g, y, b);
    add_scaled_residual(g, y, fused.residual)
}

/// [`linear`] in ggml's built-in ops over a plain weight (what [`crate::backend::plain_weights`]
/// makes of a packed one): SiLU, `mul_mat`, the bias, ReLU, the scaled residual, each a node.
fn linear_builtin<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    w: &Weight,
    b: Option<&Weight>,
    fused: Fused<'g>,
) -> Tensor<'g> {
    let x = if fused.silu_input { g.silu(x) } else { x };
    let w = g.weight(w);
    let y = g.mul_mat(w, x);
    let y = add_bias(g, y, b);
    let y = if fused.relu { g.relu(y) } else { y };
    add_scaled_residual(g, y, fused.residual)
}

/// `y + b` as an `add` node (`y` alone without a bias).
fn add_bias<'g>(g: &mut Graph<'g>, y: Tensor<'g>, b: Option<&Weight>) -> Tensor<'g> {
    match b {
        Some(b) => {
            let b = g.weight(b);
            g.add(y, b)
        }
        None => y,
    }
}

/// `r + scale * y` as `scale` and `add` nodes (`y` alone without a residual).
fn add_scaled_residual<'g>(
    g: &mut Graph<'g>,
    y: Tensor<'g>,
    residual: Option<(Tensor<'g>, f32)>,
) -> Tensor<'g> {
    match residual {
        Some((r, scale)) => {
            let y = if scale == 1.0 { y } else { g.scale(y, scale) };
            g.add(r, y)
        }
        None => y,
    }
}

/// A GEMM node's sources: its two operands, then the bias and the residual where it has them
/// (the order its [`GemmNode`] reads them in).
fn gemm_sources<'g>(
    g: &mut Graph<'g>,
    (w, x): (&Weight, Tensor<'g>),
    bias: Option<&Weight>,
    residual: Option<Tensor<'g>>,
) -> Vec<Tensor<'g>> {
    let mut sources = vec![g.weight_source(w), x];
    sources.extend(bias.map(|b| g.weight_source(b)));
    sources.extend(residual);
    sources
}

/// The shape checks both custom GEMMs need before their nodes exist: an f32 input of `W`'s
/// row length and a plain f32 bias of its row count.
fn check_operands(x: Tensor<'_>, w: &Weight, b: Option<&Weight>) {
    let [k, m, ..] = w.shape();
    let xs = x.shape();
    check(xs[0] == k && x.dtype() == Some(DType::F32), || {
        format!("linear {}: input {xs:?} for weight [{k}, {m}]", w.name())
    });
    if let Some(b) = b {
        check(
            b.shape() == [m, 1, 1, 1] && b.dtype() == DType::F32 && b.layout() == Layout::Plain,
            || format!("linear {}: bias {:?}", w.name(), b.shape()),
        );
    }
}

/// `x @ W^T (+ b)` with `W` panel-packed: the input packed by one node (shared by every linear
/// reading it), the panel GEMM as another, the bias added in its store.
fn linear_panel16<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    w: &Weight,
    b: Option<&Weight>,
    fused: Fused<'g>,
) -> Tensor<'g> {
    let [_, m, ..] = w.shape();
    check_operands(x, w, b);
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let xs = x.shape();
    let key = ("panel16 packing", x.raw() as usize, fused.silu_input);
    let xp = g.shared(key, |g| {
        let pack = PackActivations {
            silu: fused.silu_input,
        };
        // SAFETY: an f32 result of x's size over the contiguous f32 x.
        unsafe {
            g.custom(
                Out::F32,
                [xs[0] * xs[1] * xs[2] * xs[3], 1, 1, 1],
                &[x],
                pack,
                "pack activations (panel16 gemm)",
            )
        }
    });
    let node = GemmNode {
        relu: fused.relu,
        bias: b.is_some(),
        residual: fused.residual.map(|r| r.1),
        ..Default::default()
    };
    let sources = gemm_sources(g, (w, xp), b, fused.residual.map(|r| r.0));
    // SAFETY: an [m, n...] f32 result over W (packed [k, m]), the packed x, the optional bias
    // and residual (checked above and by the caller), as Panel16Gemm reads them.
    unsafe {
        g.custom(
            Out::F32,
            [m, xs[1], xs[2], xs[3]],
            &sources,
            Panel16Gemm { node },
            "linear (panel16 gemm)",
        )
    }
}

/// [`linear`] on a `q8_0x8` or `q4_0x8` weight: the input quantized by one node (shared by
/// every linear of the format reading it), then our int8 kernel as another, the bias added in
/// its store.
fn linear_int8<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    (w, format): (&Weight, Format),
    b: Option<&Weight>,
    fused: Fused<'g>,
) -> Tensor<'g> {
    let [k, m, ..] = w.shape();
    let xs = x.shape();
    check_operands(x, w, b);
    let n = xs[1] * xs[2] * xs[3];
    // Per format: on AMX CPUs the two formats' kernels read the activations laid out apart.
    let key = (format.name(), x.raw() as usize, fused.silu_input);
    let xq = g.shared(key, |g| {
        let xc = if x.is_contiguous() { x } else { g.cont(x) };
        let x2 = g.reshape(xc, &[k, n]);
        let quantize = Quantize {
            silu: fused.silu_input,
            format,
        };
        // SAFETY: x2 is a contiguous f32 [k, n], k % 32 == 0 (the weight's rows are whole
        // q8_0 blocks), as Quantize reads it.
        unsafe {
            g.custom(
                Out::Bytes,
                [quantized_bytes(k, n), 1, 1, 1],
                &[x2],
                quantize,
                "quantize (q8_0)",
            )
        }
    });
    let node = GemmNode {
        relu: fused.relu,
        bias: b.is_some(),
        residual: fused.residual.map(|r| r.1),
        ..Default::default()
    };
    let sources = gemm_sources(g, (w, xq), b, fused.residual.map(|r| r.0));
    let name = match format {
        Format::Q8_0x8 => "linear (q8_0x8)",
        Format::Q4_0x8 => "linear (q4_0x8)",
    };
    // SAFETY: a weight [k, m] in `format`, the quantized [k, n] input, the optional f32 bias
    // [m] and residual [m, n] (checked above or by the caller), as Int8Gemm reads them.
    let y = unsafe {
        g.custom(
            Out::F32,
            [m, n, 1, 1],
            &sources,
            Int8Gemm { node, format },
            name,
        )
    };
    if xs[2] * xs[3] == 1 {
        y
    } else {
        g.reshape(y, &[m, xs[1], xs[2], xs[3]])
    }
}
