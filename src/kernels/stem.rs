//! The first two convolutions of NeMo's `dw_striding` subsampling as one custom op: conv.0
//! (1 -> C channels, 3 x 3, stride 2, pad 1) with its ReLU, then the depthwise conv.2 (3 x 3,
//! stride 2, pad 1) with its bias.
//!
//! Separately, conv.0's output is the largest tensor of the encoder (C x 40 x T/2 floats, 22 MB
//! for 11 s at C = 256), written once by an im2col product and read back by the depthwise
//! conv. Here each thread keeps only the three conv.0 rows (time steps) that one row of conv.2
//! reads, in cache, and slides them down its share of the output. The sums are the ones the
//! separate nodes form: conv.0 as the panel GEMM does (FMAs over the nine taps in torch's
//! order, zero for padding, then the bias and `max(v, 0)`), conv.2 as ggml's channels-last
//! depthwise kernel does (FMAs over the taps inside the image, rows then columns), then the
//! bias.

#[cfg(target_arch = "x86_64")]
use super::cpu::avx512;
use super::cpu::multiversioned;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor, Weight};
use crate::layout::{Layout, PANEL16_ROWS as PANEL};

/// Taps of a 3 x 3 kernel.
const TAPS: usize = 9;

/// conv.0 + ReLU + depthwise conv.2 + bias over the feature image `x` ([W, H]: mels by
/// frames) -> `[C, W2, H2]` (channels fastest), `W2 = out(out(W))` with
/// `out(n) = (n - 1) / 2 + 1`. `conv0` is panel-packed (`[9, C]` as a linear), `conv2` the
/// channels-fastest depthwise kernel (`[C, 1, 3, 3]` in ggml order).
pub fn conv_stem<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    (conv0, bias0): (&Weight, &Weight),
    (conv2, bias2): (&Weight, &Weight),
) -> Tensor<'g> {
    if conv0.layout() != Layout::Panel16 || g.lowering() == Lowering::Builtin {
        return stem_composed(g, x, (conv0, bias0), (conv2, bias2));
    }
    let [w, h, one, one2] = x.shape();
    let c = conv0.shape()[1];
    check(
        conv0.layout() == Layout::Panel16
            && conv0.dtype() == DType::F32
            && conv0.shape() == [TAPS, c, 1, 1]
            && c.is_multiple_of(PANEL)
            && conv2.shape() == [c, 1, 3, 3]
            && conv2.layout() == Layout::Plain
            && [bias0, bias2].iter().all(|b| {
                b.shape() == [c, 1, 1, 1] && b.dtype() == DType::F32 && b.layout() == Layout::Plain
            })
            && conv2.dtype() == DType::F32
            && one * one2 == 1
            && w > 0
            && h > 0
            && x.dtype() == Some(DType::F32),
        || {
            format!(
                "conv_stem: x {:?}, conv.0 {:?} ({:?}), conv.2 {:?}",
                x.shape(),
                conv0.shape(),
                conv0.layout(),
                conv2.shape()
            )
        },
    );
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let (w2, h2) = (half(half(w)), half(half(h)));
    let sources = [
        x,
        g.weight_source(conv0),
        g.weight_source(bias0),
        g.weight_source(conv2),
        g.weight_source(bias2),
    ];
    // SAFETY: a [C, W2, H2] f32 result over the contiguous f32 image and the four f32 weights
    // checked above, as ConvStem reads them; each thread writes its own rows of the result.
    unsafe {
        g.custom(
            Out::F32,
            [c, w2, h2, 1],
            &sources,
            ConvStem,
            "conv stem (conv.0 + conv.2)",
        )
    }
}

/// [`conv_stem`] as separate nodes over a plain conv.0 (`[3, 3, 1, C]`, torch's layout): its
/// im2col and product ([`super::linear::conv2d`]), the bias, the ReLU, then
/// [`conv_depthwise_stride2`]. ggml's built-in ops only under [`Lowering::Builtin`].
fn stem_composed<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    (conv0, bias0): (&Weight, &Weight),
    conv2: (&Weight, &Weight),
) -> Tensor<'g> {
    let k0 = g.weight(conv0);
    let y = super::linear::conv2d(g, k0, x, 2, 1);
    let b0 = g.weight(bias0);
    let y = g.add(y, b0);
    let y = g.relu(y); // [C, W1, H1]
    conv_depthwise_stride2(g, y, conv2, 1)
}

/// Output length of a 3-tap, stride-2, pad-1 convolution.
fn half(n: usize) -> usize {
    (n - 1) / 2 + 1
}

/// The op's operands, as slices.
struct Stem<'a> {
    /// Feature image, `w` values per row, `h` rows.
    x: &'a [f32],
    w: usize,
    h: usize,
    c: usize,
    /// conv.0 panel-packed: panel `p`, tap `k`, channel `r` at `(p * 9 + k) * 16 + r`.
    k0: &'a [f32],
    b0: &'a [f32],
    /// conv.2 channels-fastest: tap `ky * 3 + kx`, channel `ch` at `(ky * 3 + kx) * c + ch`.
    k2: &'a [f32],
    b2: &'a [f32],
}

impl Stem<'_> {
    /// conv.0 + ReLU for output row `i` (time step of the first stage): `[w1][c]`.
    #[inline(always)]
    fn conv0_row(&self, i: usize, row: &mut [f32]) {
        let input: [Option<&[f32]>; 3] = std::array::from_fn(|ky| {
            let y = (2 * i + ky).wrapping_sub(1);
            (y < self.h).then(|| &self.x[y * self.w..][..self.w])
        });
        for (j, out) in row.chunks_exact_mut(self.c).enumerate() {
            // The nine input values of output (i, j), zero outside the image.
            let mut taps = [0f32; TAPS];
            for (ky, line) in input.iter().enumerate() {
                let Some(line) = line else { continue };
                for kx in 0..3 {
                    let x = (2 * j + kx).wrapping_sub(1);
                    if x < self.w {
                        taps[ky * 3 + kx] = line[x];
                    }
                }
            }
            conv0_point(&taps, self.k0, self.b0, out);
        }
    }

    /// Depthwise conv.2 + bias for output row `i2` from conv.0 rows `2 i2 - 1 ..= 2 i2 + 1`
    /// (`rows[ky]`, `None` outside the image): `[w2][c]`.
    #[inline(always)]
    fn conv2_row(&self, rows: [Option<&[f32]>; 3], out: &mut [f32]) {
        let kernel = Depthwise {
            c: self.c,
            k: self.k2,
            bias: self.b2,
        };
        kernel.row(rows, half(self.w), 1, out);
    }
}

/// A 3 x 3 stride-2 depthwise kernel with its bias, channels fastest: tap `ky * 3 + kx`,
/// channel `ch` at `(ky * 3 + kx) * c + ch`; `c` a multiple of 16.
struct Depthwise<'a> {
    c: usize,
    k: &'a [f32],
    bias: &'a [f32],
}

impl Depthwise<'_> {
    /// One output row (`[w_out][c]`, `w_out = out.len() / c`) from the three input rows
    /// `rows[ky]` (`[w_in][c]`, `None` above or below the image), the columns padded by `pad`.
    #[inline(always)]
    fn row(&self, rows: [Option<&[f32]>; 3], w_in: usize, pad: usize, out: &mut [f32]) {
        let c = self.c;
        for (j, out) in out.chunks_exact_mut(c).enumerate() {
            // The taps inside the image, rows then columns (ggml's order), as offsets of
            // their channel vectors into an input row and into the kernel.
            let mut taps = [(0usize, 0usize, 0usize); TAPS];
            let mut n = 0;
            for (ky, row) in rows.iter().enumerate() {
                if row.is_none() {
                    continue;
                }
                for kx in 0..3 {
                    let x = (2 * j + kx).wrapping_sub(pad);
                    if x < w_in {
                        taps[n] = (ky, x * c, (ky * 3 + kx) * c);
                        n += 1;
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            if avx512() {
                // SAFETY: AVX-512F present; every tap's offsets leave a whole channel row
                // (`c` values) inside its input row and the kernel, and `out` is `c` long.
                unsafe { avx512::conv2_point(&rows, &taps[..n], self.k, self.bias, out) };
                continue;
            }
            for (ch, out) in out.chunks_exact_mut(PANEL).enumerate() {
                let out: &mut [f32; PANEL] = out.try_into().expect("lanes");
                let mut acc = [0f32; PANEL];
                for &(ky, at, k) in &taps[..n] {
                    let row = rows[ky].expect("tap inside the image");
                    let v: &[f32; PANEL] =
                        row[at + ch * PANEL..][..PANEL].try_into().expect("lanes");
                    let w: &[f32; PANEL] =
                        self.k[k + ch * PANEL..][..PANEL].try_into().expect("lanes");
                    for r in 0..PANEL {
                        acc[r] = v[r].mul_add(w[r], acc[r]);
                    }
                }
                let b: &[f32; PANEL] = self.bias[ch * PANEL..][..PANEL].try_into().expect("lanes");
                for r in 0..PANEL {
                    out[r] = acc[r] + b[r];
                }
            }
        }
    }
}

/// conv.0 at one position: `out[ch] = max(sum_t taps[t] * k0[ch][t] + b0[ch], 0)` over the
/// panel-packed kernel, sixteen channels at a time.
#[inline(always)]
fn conv0_point(taps: &[f32; TAPS], k0: &[f32], b0: &[f32], out: &mut [f32]) {
    assert!(k0.len() >= TAPS * out.len() && b0.len() >= out.len());
    assert!(out.len().is_multiple_of(PANEL));
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F present; extents asserted above.
        unsafe { avx512::conv0_point(taps, k0, b0, out) };
        return;
    }
    let panels = out
        .chunks_exact_mut(PANEL)
        .zip(k0.chunks_exact(TAPS * PANEL))
        .zip(b0.chunks_exact(PANEL));
    for ((out, panel), bias) in panels {
        let out: &mut [f32; PANEL] = out.try_into().expect("lanes");
        let bias: &[f32; PANEL] = bias.try_into().expect("lanes");
        let mut acc = [0f32; PANEL];
        for (t, &v) in taps.iter().enumerate() {
            let kw: &[f32; PANEL] = panel[t * PANEL..][..PANEL].try_into().expect("lanes");
            for r in 0..PANEL {
                acc[r] = v.mul_add(kw[r], acc[r]);
            }
        }
        for r in 0..PANEL {
            let v = acc[r] + bias[r];
            out[r] = if v > 0.0 { v } else { 0.0 };
        }
    }
}

/// The two inner loops in 512-bit registers (the compiler's own vectorisation of the portable
/// loops ran across channel panels with gathers, at a fifth of the speed): the same FMAs in
/// the same order, so the same bits.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{PANEL, TAPS};
    use std::arch::x86_64::*;

    /// Channel vectors computed together: independent FMA chains enough to cover the FMA
    /// latency on both ports (one chain per vector waited ~4 cycles per tap).
    const GROUP: usize = 8;

    /// # Safety
    /// AVX-512F; `out.len()` a multiple of 16, `k0` holds `9 * out.len()` values and `b0`
    /// `out.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn conv0_point(taps: &[f32; TAPS], k0: &[f32], b0: &[f32], out: &mut [f32]) {
        let v: [__m512; TAPS] = std::array::from_fn(|t| _mm512_set1_ps(taps[t]));
        let panels = out.len() / PANEL;
        let mut p = 0;
        while p < panels {
            let n = (panels - p).min(GROUP);
            // SAFETY: panels p..p + n are inside the slices (the contract).
            unsafe {
                match n {
                    GROUP => conv0_panels::<GROUP>(&v, k0, b0, out, p),
                    _ => {
                        for q in p..p + n {
                            conv0_panels::<1>(&v, k0, b0, out, q);
                        }
                    }
                }
            }
            p += n;
        }
    }

    /// conv.0 for the `N` panels from `p`.
    ///
    /// # Safety
    /// AVX-512F; panels `p..p + N` within the slices of [`conv0_point`].
    #[inline(always)]
    unsafe fn conv0_panels<const N: usize>(
        v: &[__m512; TAPS],
        k0: &[f32],
        b0: &[f32],
        out: &mut [f32],
        p: usize,
    ) {
        // SAFETY: per the contract.
        unsafe {
            let zero = _mm512_setzero_ps();
            let mut acc = [zero; N];
            for (t, &v) in v.iter().enumerate() {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = k0.as_ptr().add(((p + i) * TAPS + t) * PANEL);
                    *acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(w), *acc);
                }
            }
            for (i, &acc) in acc.iter().enumerate() {
                let at = (p + i) * PANEL;
                let y = _mm512_add_ps(acc, _mm512_loadu_ps(b0.as_ptr().add(at)));
                // max(y, +0) is `y > 0 ? y : +0` (-0 and NaN give the second operand).
                _mm512_storeu_ps(out.as_mut_ptr().add(at), _mm512_max_ps(y, zero));
            }
        }
    }

    /// # Safety
    /// AVX-512F; `out.len()` a multiple of 16; for each tap `(ky, at, k)`, `rows[ky]` is
    /// `Some` with `at + out.len()` values and `k2` holds `k + out.len()`; `b2` holds
    /// `out.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn conv2_point(
        rows: &[Option<&[f32]>; 3],
        taps: &[(usize, usize, usize)],
        k2: &[f32],
        b2: &[f32],
        out: &mut [f32],
    ) {
        let c = out.len();
        for &(ky, at, k) in taps {
            let row = rows[ky].expect("tap inside the image");
            assert!(row.len() >= at + c && k2.len() >= k + c);
        }
        assert!(b2.len() >= c && c.is_multiple_of(PANEL));
        let mut ch = 0;
        while ch < c {
            let n = ((c - ch) / PANEL).min(GROUP);
            // SAFETY: the extents asserted above.
            unsafe {
                match n {
                    GROUP => conv2_vectors::<GROUP>(rows, taps, k2, b2, out, ch),
                    _ => {
                        for i in 0..n {
                            conv2_vectors::<1>(rows, taps, k2, b2, out, ch + i * PANEL);
                        }
                    }
                }
            }
            ch += n * PANEL;
        }
    }

    /// conv.2 for the `N` channel vectors from channel `ch`.
    ///
    /// # Safety
    /// AVX-512F; the extents [`conv2_point`] asserts, channels `ch..ch + 16 N` within `out`.
    #[inline(always)]
    unsafe fn conv2_vectors<const N: usize>(
        rows: &[Option<&[f32]>; 3],
        taps: &[(usize, usize, usize)],
        k2: &[f32],
        b2: &[f32],
        out: &mut [f32],
        ch: usize,
    ) {
        // SAFETY: per the contract.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); N];
            for &(ky, at, k) in taps {
                let row = rows[ky]
                    .expect("tap inside the image")
                    .as_ptr()
                    .add(at + ch);
                let kernel = k2.as_ptr().add(k + ch);
                for (i, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(row.add(i * PANEL));
                    *acc = _mm512_fmadd_ps(x, _mm512_loadu_ps(kernel.add(i * PANEL)), *acc);
                }
            }
            for (i, &acc) in acc.iter().enumerate() {
                let at = ch + i * PANEL;
                let y = _mm512_add_ps(acc, _mm512_loadu_ps(b2.as_ptr().add(at)));
                _mm512_storeu_ps(out.as_mut_ptr().add(at), y);
            }
        }
    }
}

/// The node of [`conv_stem`]: source 0 the contiguous f32 image [w, h], source 1 the packed
/// conv.0 [9, C], sources 2 and 4 f32 [C] biases, source 3 the f32 depthwise kernel
/// [C, 1, 3, 3]; the result f32 [C, w2, h2]; each thread computes its own output rows.
struct ConvStem;

impl Body for ConvStem {
    fn run(&self, op: &CustomOp<'_>) {
        let [w, h, ..] = op.src_shape(0);
        let [c, w2, h2, _] = op.shape();
        let stem = Stem {
            x: op.src_f32(0),
            w,
            h,
            c,
            k0: op.src_f32(1),
            b0: op.src_f32(2),
            k2: op.src_f32(3),
            b2: op.src_f32(4),
        };
        let mine = op.share(h2);
        if mine.is_empty() {
            return;
        }
        // SAFETY: this thread's output rows, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(mine.start * w2 * c..mine.end * w2 * c) };
        run(&stem, mine, out);
    }
}

multiversioned! {
    /// Output rows `rows` of conv.2 into `out` (`[rows][w2][c]`), sliding three conv.0 rows.
    fn run(stem: &Stem<'_>, rows: std::ops::Range<usize>, out: &mut [f32]) {
        let (h1, row_len) = (half(stem.h), half(stem.w) * stem.c);
        let mut ring = vec![0f32; 3 * row_len];
        // conv.0 row `i` lives in slot `i % 3`; `have` is one past the last row computed.
        let mut have = 0usize;
        let out_len = half(half(stem.w)) * stem.c;
        for (i2, out) in rows.zip(out.chunks_exact_mut(out_len)) {
            let first = (2 * i2).saturating_sub(1);
            let last = (2 * i2 + 1).min(h1 - 1);
            for i in first.max(have)..=last {
                stem.conv0_row(i, &mut ring[(i % 3) * row_len..][..row_len]);
            }
            have = last + 1;
            let rows: [Option<&[f32]>; 3] = std::array::from_fn(|ky| {
                let i = (2 * i2 + ky).wrapping_sub(1);
                (i < h1).then(|| &ring[(i % 3) * row_len..][..row_len])
            });
            stem.conv2_row(rows, out);
        }
    }
}

/// Whether [`conv_depthwise_stride2`] takes this conv: an f32 channels-fastest image
/// `[C, W, H]` with `C` a multiple of 16, an f32 kernel `[C, 1, 3, 3]` and bias, `pad` 0 or 1.
pub fn depthwise_stride2_fits(x: Tensor<'_>, kernel: &Weight, bias: &Weight, pad: usize) -> bool {
    let [c, w, h, n] = x.shape();
    c.is_multiple_of(PANEL)
        && c > 0
        && n == 1
        && pad <= 1
        && w + 2 * pad >= 3
        && h + 2 * pad >= 3
        && x.dtype() == Some(DType::F32)
        && kernel.shape() == [c, 1, 3, 3]
        && bias.shape() == [c, 1, 1, 1]
        && [kernel, bias]
            .iter()
            .all(|w| w.dtype() == DType::F32 && w.layout() == Layout::Plain)
}

/// A 3 x 3 stride-2 depthwise conv + bias over a channels-fastest image `x` (`[C, W, H]`) ->
/// `[C, W', H']`, `W' = (W + 2 pad - 3) / 2 + 1`: the subsampling's conv.5 (and conv.2 where
/// conv.0 is not fused into the stem). ggml's `conv2d_dw` loop is compiled for the build's
/// baseline (4-wide SSE in a portable build, five times slower here); this one is chosen at
/// run time. The sums are [`conv_stem`]'s conv.2 ones (ggml's order, then the bias).
pub fn conv_depthwise_stride2<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    (kernel, bias): (&Weight, &Weight),
    pad: usize,
) -> Tensor<'g> {
    if g.lowering() == Lowering::Builtin || !depthwise_stride2_fits(x, kernel, bias, pad) {
        return depthwise_stride2_ggml(g, x, (kernel, bias), pad);
    }
    let [c, w, h, _] = x.shape();
    check(depthwise_stride2_fits(x, kernel, bias, pad), || {
        format!(
            "conv_depthwise_stride2: x {:?}, kernel {:?} ({:?}), bias {:?}, pad {pad}",
            x.shape(),
            kernel.shape(),
            kernel.dtype(),
            bias.shape()
        )
    });
    let x = if x.is_contiguous() { x } else { g.cont(x) };
    let out = |n: usize| (n + 2 * pad - 3) / 2 + 1;
    let sources = [x, g.weight_source(kernel), g.weight_source(bias)];
    // SAFETY: a [C, W', H'] f32 result over the contiguous f32 image and the f32 kernel and
    // bias checked above, as DepthwiseStride2 reads them; each thread writes its own rows.
    unsafe {
        g.custom(
            Out::F32,
            [c, out(w), out(h), 1],
            &sources,
            DepthwiseStride2 { pad },
            "depthwise conv 3x3 stride 2",
        )
    }
}

/// [`conv_depthwise_stride2`] in ggml's built-in ops: its depthwise 2-D convolution on the
/// channels-contiguous layout (the image and the kernel permuted as views), then the bias.
fn depthwise_stride2_ggml<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    (kernel, bias): (&Weight, &Weight),
    pad: usize,
) -> Tensor<'g> {
    let whcn = g.permute(x, [2, 0, 1, 3]); // logical [W, H, C], channels contiguous
    let k = g.weight(kernel); // [C, 1, KW, KH] in memory
    let k = g.permute(k, [3, 2, 0, 1]); // logical [KW, KH, 1, C], channels contiguous
    let y = g.conv2d_depthwise(k, whcn, 2, pad); // same channels-fastest layout
    let y = g.permute(y, [1, 2, 0, 3]); // back to [C, W', H'] (contiguous)
    let b = g.weight(bias);
    g.add(y, b)
}

/// The node of [`conv_depthwise_stride2`]: source 0 the contiguous f32 image `[C, W, H]`,
/// source 1 the kernel `[C, 1, 3, 3]`, source 2 the bias `[C]`; each thread computes its own
/// output rows.
struct DepthwiseStride2 {
    pad: usize,
}

impl Body for DepthwiseStride2 {
    fn run(&self, op: &CustomOp<'_>) {
        let [c, w, h, _] = op.src_shape(0);
        let [_, w_out, h_out, _] = op.shape();
        let mine = op.share(h_out);
        if mine.is_empty() {
            return;
        }
        let kernel = Depthwise {
            c,
            k: op.src_f32(1),
            bias: op.src_f32(2),
        };
        let image = Image {
            x: op.src_f32(0),
            w,
            h,
            pad: self.pad,
        };
        // SAFETY: this thread's output rows, written by no other thread.
        let out = unsafe { op.dst_mut::<f32>(mine.start * w_out * c..mine.end * w_out * c) };
        depthwise_rows(&kernel, &image, mine, out);
    }
}

/// A channels-fastest image, `w * c` values per row, `h` rows, padded by `pad` on each side.
struct Image<'a> {
    x: &'a [f32],
    w: usize,
    h: usize,
    pad: usize,
}

multiversioned! {
    /// Output rows `rows` of a stride-2 depthwise conv into `out` (`[rows][w_out][c]`).
    fn depthwise_rows(
        kernel: &Depthwise<'_>,
        image: &Image<'_>,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        let row_len = image.w * kernel.c;
        let out_len = ((image.w + 2 * image.pad - 3) / 2 + 1) * kernel.c;
        for (i, out) in rows.zip(out.chunks_exact_mut(out_len)) {
            let input: [Option<&[f32]>; 3] = std::array::from_fn(|ky| {
                let y = (2 * i + ky).wrapping_sub(image.pad);
                (y < image.h).then(|| &image.x[y * row_len..][..row_len])
            });
            kernel.row(input, image.w, image.pad, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// conv.0 + ReLU + conv.2 + bias by the definition, in f64.
    fn naive(s: &Stem<'_>) -> Vec<f64> {
        let (w1, h1) = (half(s.w), half(s.h));
        let (w2, h2) = (half(w1), half(h1));
        let mut first = vec![0f64; h1 * w1 * s.c];
        for i in 0..h1 {
            for j in 0..w1 {
                for ch in 0..s.c {
                    let (p, r) = (ch / PANEL, ch % PANEL);
                    let mut v = s.b0[ch] as f64;
                    for k in 0..TAPS {
                        let (y, x) = ((2 * i + k / 3) as i64 - 1, (2 * j + k % 3) as i64 - 1);
                        if (0..s.h as i64).contains(&y) && (0..s.w as i64).contains(&x) {
                            let kw = s.k0[(p * TAPS + k) * PANEL + r] as f64;
                            v += kw * s.x[y as usize * s.w + x as usize] as f64;
                        }
                    }
                    first[(i * w1 + j) * s.c + ch] = v.max(0.0);
                }
            }
        }
        let mut out = vec![0f64; h2 * w2 * s.c];
        for i in 0..h2 {
            for j in 0..w2 {
                for ch in 0..s.c {
                    let mut v = s.b2[ch] as f64;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (y, x) = ((2 * i + ky) as i64 - 1, (2 * j + kx) as i64 - 1);
                            if (0..h1 as i64).contains(&y) && (0..w1 as i64).contains(&x) {
                                let at = (y as usize * w1 + x as usize) * s.c + ch;
                                v += s.k2[(ky * 3 + kx) * s.c + ch] as f64 * first[at];
                            }
                        }
                    }
                    out[(i * w2 + j) * s.c + ch] = v;
                }
            }
        }
        out
    }

    #[test]
    fn sliding_rows_match_the_definition_in_any_split() {
        let mut rng = crate::kernels::TestValues::new(7);
        let mut rnd = |n: usize| rng.take(n);
        // Odd and even sizes, a single row, a single column; channel counts that fill the
        // SIMD kernels' groups of eight vectors, and leave some over.
        for &(w, h, c) in &[
            (80, 37, 256),
            (7, 8, 16),
            (1, 5, 16),
            (9, 1, 144),
            (2, 2, 48),
        ] {
            let (x, k0, b0, k2, b2) = (rnd(w * h), rnd(TAPS * c), rnd(c), rnd(TAPS * c), rnd(c));
            let s = Stem {
                x: &x,
                w,
                h,
                c,
                k0: &k0,
                b0: &b0,
                k2: &k2,
                b2: &b2,
            };
            let want = naive(&s);
            let (w2, h2) = (half(half(w)), half(half(h)));
            let row = w2 * c;
            let mut whole = vec![0f32; h2 * row];
            run(&s, 0..h2, &mut whole);
            let worst = whole
                .iter()
                .zip(&want)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0f64, f64::max);
            assert!(worst < 1e-5, "{w}x{h}x{c}: worst {worst:e}");
            // Split among 2 and 3 threads: the same bits.
            for parts in [2, 3] {
                let mut split = vec![0f32; h2 * row];
                for part in 0..parts {
                    let rows = crate::backend::custom::thread_share(h2, part, parts);
                    let out = &mut split[rows.start * row..rows.end * row];
                    run(&s, rows, out);
                }
                assert!(split == whole, "{w}x{h}x{c} in {parts} parts");
            }
        }
    }

    /// The stride-2 depthwise conv against its definition in f64, for both paddings, odd and
    /// even sizes, and split among threads (the same bits).
    #[test]
    fn depthwise_stride2_matches_the_definition_in_any_split() {
        let mut rng = crate::kernels::TestValues::new(11);
        for &(w, h, c, pad) in &[
            (20, 37, 256, 1),
            (21, 36, 256, 0),
            (3, 3, 16, 0),
            (1, 2, 48, 1),
            (7, 9, 144, 1),
        ] {
            let (x, k, b) = (rng.take(w * h * c), rng.take(TAPS * c), rng.take(c));
            let out = |n: usize| (n + 2 * pad - 3) / 2 + 1;
            let (w_out, h_out) = (out(w), out(h));
            let mut want = vec![0f64; h_out * w_out * c];
            for i in 0..h_out {
                for j in 0..w_out {
                    for ch in 0..c {
                        let mut v = b[ch] as f64;
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let (y, xx) = (2 * i + ky, 2 * j + kx);
                                let (Some(y), Some(xx)) = (y.checked_sub(pad), xx.checked_sub(pad))
                                else {
                                    continue;
                                };
                                if y < h && xx < w {
                                    v += k[(ky * 3 + kx) * c + ch] as f64
                                        * x[(y * w + xx) * c + ch] as f64;
                                }
                            }
                        }
                        want[(i * w_out + j) * c + ch] = v;
                    }
                }
            }
            let kernel = Depthwise { c, k: &k, bias: &b };
            let image = Image { x: &x, w, h, pad };
            let row = w_out * c;
            let mut whole = vec![0f32; h_out * row];
            depthwise_rows(&kernel, &image, 0..h_out, &mut whole);
            let worst = whole
                .iter()
                .zip(&want)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0f64, f64::max);
            assert!(worst < 1e-5, "{w}x{h}x{c} pad {pad}: worst {worst:e}");
            for parts in [2, 3] {
                let mut split = vec![0f32; h_out * row];
                for part in 0..parts {
                    let rows = crate::backend::custom::thread_share(h_out, part, parts);
                    let out = &mut split[rows.start * row..rows.end * row];
                    depthwise_rows(&kernel, &image, rows, out);
                }
                assert!(split == whole, "{w}x{h}x{c} pad {pad} in {parts} parts");
            }
        }
    }
}
