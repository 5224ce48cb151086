//! Int8 GEMM over q8_0 weights stored in the `q8_0x8` panel layout, and over q4_0 ones in the
//! `q4_0x8` layout (`crate::layout`, docs/GGUF.md).
//!
//! The quantization is ggml's q8_0 (blocks of 32 along a row, an f16 scale and 32 int8s), so a
//! `q8_0x8` tensor holds exactly the values of a plain q8_0 one, only reordered into panels of
//! 8 output rows. One 256-bit load then feeds 8 rows at once, and the integer dot products land
//! in one register lane per row, so the per-block scaling is a plain vector multiply.
//!
//! Activations are quantized per time step on the fly, in blocks of 32 exactly like ggml's q8_0
//! (scale `max|x| / 127` as f16, quants rounded to nearest), by a graph node of their own
//! (`quantize`, `node`): the threads split the steps, and the linears that read the same input
//! share the result.
//!
//! The AVX2 kernel (`avx2`) multiplies with `vpmaddubsw` on |w| and sign(w) * x (both within
//! 127 in magnitude, so the pairwise i16 sums cannot saturate), widens with `vpmaddwd`, sums a
//! block in i32 and scales it once per block. With AVX-512 VNNI, one `vpdpbusd` does all three
//! for 64 bytes (`vnni`); with AMX, one `tdpbssd` does a block for 16 steps x 8 rows (`amx`).
//! Other CPUs run a portable loop.
//!
//! `q4_0x8` ([`Format::Q4_0x8`]) holds ggml's q4_0 values (4-bit quants offset by 8, an f16
//! scale per block of 32) in the same panels, a byte holding the quants `q8_0x8` has at the same
//! place in its first and second half: one load, masked and shifted, minus 8, gives two of the
//! registers a `q8_0x8` load gives, and every kernel is the same after its loads (const
//! generic `Q4`). Half the weight bytes to read, a few more instructions per load. AMX would need
//! the nibbles unpacked into tiles through memory; q4_0x8 runs on VNNI on AMX CPUs instead.

use super::cpu::Kernel;
use crate::layout::{
    Layout, Q4_0_BLOCK_BYTES, Q4_0X8_BLOCK_BYTES, Q8_0_BLOCK as QK, Q8_0_BLOCK_BYTES,
    Q8_0X8_BLOCK_BYTES, Q8_0X8_ROWS as PANEL, can_repack,
};
use llama_cpp_sys_2 as sys;
use quantize::QuantizedCols;

/// Quantized activations are padded with zero steps to a multiple of this, so that the AMX
/// kernel's 16-step tiles never read past them.
const STEP_PAD: usize = 16;
/// Fewest steps for which the AMX kernel beats VNNI.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AMX_MIN_STEPS: usize = 4;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub(crate) mod node;
mod quantize;
#[cfg(target_arch = "x86_64")]
mod vnni;

/// The weight layouts the int8 GEMM multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Q8_0x8,
    Q4_0x8,
}

impl Format {
    /// The format of a weight stored in `layout` (none for the layouts other GEMMs read).
    pub fn of(layout: Layout) -> Option<Format> {
        match layout {
            Layout::Q8_0x8 => Some(Format::Q8_0x8),
            Layout::Q4_0x8 => Some(Format::Q4_0x8),
            Layout::Plain | Layout::Panel16 => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Q8_0x8 => "q8_0x8",
            Format::Q4_0x8 => "q4_0x8",
        }
    }

    /// Bytes of a block of 32 weights of one row.
    pub fn row_block_bytes(self) -> usize {
        match self {
            Format::Q8_0x8 => Q8_0_BLOCK_BYTES,
            Format::Q4_0x8 => Q4_0_BLOCK_BYTES,
        }
    }

    /// Bytes of a panel's block of 32 weights of 8 rows.
    fn panel_block_bytes(self) -> usize {
        match self {
            Format::Q8_0x8 => Q8_0X8_BLOCK_BYTES,
            Format::Q4_0x8 => Q4_0X8_BLOCK_BYTES,
        }
    }

    /// The kernel multiplying this format over `n` steps (and quantizing its activations):
    /// [`Kernel::for_steps`], except that `q4_0x8` has no AMX kernel and takes VNNI there.
    pub fn kernel(self, n: usize) -> Kernel {
        match (self, Kernel::for_steps(n)) {
            #[cfg(target_arch = "x86_64")]
            (Format::Q4_0x8, Kernel::Amx) => Kernel::Avx512Vnni,
            (_, kernel) => kernel,
        }
    }
}

/// Bytes of a panel's block of 32 weights of 8 rows, for the const-generic kernels.
const fn panel_block<const Q4: bool>() -> usize {
    if Q4 {
        Q4_0X8_BLOCK_BYTES
    } else {
        Q8_0X8_BLOCK_BYTES
    }
}

impl Kernel {
    /// The kernel for a product over `n` steps: the best one, except that AMX gives way to VNNI
    /// below [`AMX_MIN_STEPS`] (a 16-step tile holding a few would waste its work).
    pub fn for_steps(n: usize) -> Kernel {
        match Kernel::best() {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx if n < AMX_MIN_STEPS => Kernel::Avx512Vnni,
            best => best,
        }
    }
}

/// Activations of `n` time steps quantized per block of 32, as `kernel` reads them: the quants
/// of step `c`, block `b` at [`quants_at`] (int8 bits; +128 as unsigned bytes for the VNNI
/// kernel, whose `vpdpbusd` multiplies unsigned by signed) and their scale at
/// `d[quants_at(..) / 32]`. Both hold [`STEP_PAD`]-padded steps, the padding zero.
#[derive(Clone, Copy)]
pub(super) struct Cols<'a> {
    pub(super) q: &'a [u8],
    pub(super) d: &'a [f32],
}

/// What a GEMM node does after the product and bias, where the kernel does it in its last
/// pass's stores (the VNNI kernel; the others leave it to passes over the output): a ReLU
/// (ggml's `v > 0 ? v : 0`), then the residual `residual + scale * v` (`v + residual` at
/// scale 1) from the residual tensor (the output's layout, `[n][m]`). The same operations in
/// the same order as the passes, so the same bits.
#[derive(Clone, Copy, Default)]
pub(super) struct Epilogue {
    pub(super) relu: bool,
    pub(super) residual: Option<(*const f32, f32)>,
}

/// `out[c * m + r] = sum_i w[r, i] x[c, i] (+ bias[r])` for the rows of panels `p0..p1`, all
/// `n` steps. `w` is the whole matrix ([k, m]) in `format`. A non-empty `epilogue` only for the
/// VNNI kernel.
///
/// # Safety
/// `out` points to `n * m` writable f32s; no other thread writes the rows of these panels.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_panels(
    kernel: Kernel,
    format: Format,
    w: &[u8],
    k: usize,
    m: usize,
    (p0, p1): (usize, usize),
    x: Cols,
    n: usize,
    (bias, epilogue): (Option<&[f32]>, Epilogue),
    out: *mut f32,
) {
    let nb = k / QK;
    let size = nb * format.panel_block_bytes();
    let plain = !epilogue.relu && epilogue.residual.is_none();
    let q4 = format == Format::Q4_0x8;
    // The extents every kernel relies on (the SIMD ones read the activations' padding too).
    let padded = n.next_multiple_of(STEP_PAD);
    assert!(w.len() >= p1 * size && p1 * PANEL <= m);
    assert!(x.q.len() >= padded * k && x.d.len() >= padded * nb);
    assert!(bias.is_none_or(|b| b.len() >= m));
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Amx {
        assert!(!q4, "q4_0x8 has no AMX kernel (Format::kernel)");
        assert!(
            plain,
            "only the VNNI kernel finishes its output in its stores"
        );
        // SAFETY: chosen only where the CPU runs it (`cpu::Kernel::available`); the
        // activations are signed and padded.
        return unsafe { amx::panels(w, k, m, (p0, p1), x, n, bias, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx512Vnni {
        // SAFETY: chosen only on CPUs with AVX-512 F/BW/VNNI; out per the contract.
        return unsafe {
            let ops = (bias, epilogue);
            match q4 {
                true => vnni::panels::<true>(w, k, m, (p0, p1), x, n, ops, out),
                false => vnni::panels::<false>(w, k, m, (p0, p1), x, n, ops, out),
            }
        };
    }
    assert!(
        plain,
        "only the VNNI kernel finishes its output in its stores"
    );
    for p in p0..p1 {
        let panel = &w[p * size..][..size];
        let bias = bias.map(|b| &b[p * PANEL..][..PANEL]);
        // SAFETY: rows p*8..p*8+8 of every step are inside out and ours (the contract).
        let out = unsafe { out.add(p * PANEL) };
        match kernel {
            // SAFETY: as above.
            Kernel::Portable if q4 => unsafe {
                portable_panel::<true>(panel, k, x, n, bias, out, m)
            },
            // SAFETY: as above.
            Kernel::Portable => unsafe { portable_panel::<false>(panel, k, x, n, bias, out, m) },
            // SAFETY: chosen only on CPUs with AVX2/FMA/F16C; as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 if q4 => unsafe { avx2::panel::<true>(panel, k, x, n, bias, out, m) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::panel::<false>(panel, k, x, n, bias, out, m) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni | Kernel::Amx => unreachable!("runs all its panels above"),
        }
    }
}

/// Quant `i` of group `g` (the block's quants `4g..4g + 4`) of row `r` of a panel block
/// (scales included), `q4_0x8` with `Q4`, else `q8_0x8`.
#[inline(always)]
fn panel_quant<const Q4: bool>(blk: &[u8], (g, r, i): (usize, usize, usize)) -> i32 {
    if Q4 {
        // Groups 0-3 in the low nibbles, 4-7 in the high ones, stored +8.
        let byte = blk[2 * PANEL + (g % 4) * 4 * PANEL + r * 4 + i];
        i32::from((byte >> (4 * (g / 4))) & 0xF) - 8
    } else {
        i32::from(blk[2 * PANEL + g * 4 * PANEL + r * 4 + i] as i8)
    }
}

/// # Safety
/// `out` holds 8 rows of `n` steps with step stride `m`.
unsafe fn portable_panel<const Q4: bool>(
    panel: &[u8],
    k: usize,
    x: Cols,
    n: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
    m: usize,
) {
    let nb = k / QK;
    for c in 0..n {
        let xq = &x.q[c * k..][..k];
        let xd = &x.d[c * nb..][..nb];
        let mut acc = [0f32; PANEL];
        for (b, blk) in panel.chunks_exact(panel_block::<Q4>()).enumerate() {
            let xb = &xq[b * QK..][..QK];
            let mut sums = [0i32; PANEL];
            for g in 0..QK / 4 {
                for (r, s) in sums.iter_mut().enumerate() {
                    for i in 0..4 {
                        *s += panel_quant::<Q4>(blk, (g, r, i)) * i32::from(xb[g * 4 + i] as i8);
                    }
                }
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let dw = f16_to_f32(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]));
                *a += sums[r] as f32 * (dw * xd[b]);
            }
        }
        for (r, &a) in acc.iter().enumerate() {
            let v = a + bias.map_or(0.0, |b| b[r]);
            // SAFETY: per the contract.
            unsafe { *out.add(c * m + r) = v };
        }
    }
}

fn f16_to_f32(h: u16) -> f32 {
    // SAFETY: pure conversion.
    unsafe { sys::ggml_fp16_to_fp32(h) }
}

/// `w^T x (+ bias)` for a weight `w` ([k, m]) in `format` and f32 `x` ([k, n]) -> [m, n], on
/// `threads` threads split exactly as inside a ggml graph. For tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn gemm_int8(
    kernel: Kernel,
    format: Format,
    w: &[u8],
    k: usize,
    m: usize,
    x: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    threads: usize,
) -> Vec<f32> {
    assert!(can_repack(&[k, m]) && w.len() == m * k / QK * format.row_block_bytes());
    assert!(x.len() == k * n && bias.is_none_or(|b| b.len() == m));
    assert!(Kernel::available().contains(&kernel));
    #[cfg(target_arch = "x86_64")]
    assert!(
        format == Format::Q8_0x8 || kernel != Kernel::Amx,
        "q4_0x8 has no AMX kernel"
    );
    let mut xq = QuantizedCols::default();
    xq.quantize(kernel, x, k, n);
    let cols = xq.cols();
    let mut out = vec![0f32; m * n];
    struct Out(*mut f32);
    // SAFETY: threads write disjoint rows (their own panels).
    unsafe impl Sync for Out {}
    let dst = Out(out.as_mut_ptr());
    let nth = threads.max(1);
    std::thread::scope(|s| {
        for ith in 0..nth {
            let dst = &dst;
            let mine = crate::backend::custom::thread_share(m / PANEL, ith, nth);
            // SAFETY: out has n * m values; each thread writes only the rows of its panels.
            s.spawn(move || unsafe {
                gemm_panels(
                    kernel,
                    format,
                    w,
                    k,
                    m,
                    (mine.start, mine.end),
                    cols,
                    n,
                    (bias, Epilogue::default()),
                    dst.0,
                )
            });
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::node::{Int8Gemm, Quantize, quantized_bytes};
    use super::quantize::quantize_block;
    use super::*;
    use crate::backend::custom::{self, Out};
    use crate::backend::{DType, quantize_rows};
    use crate::kernels::panel::GemmNode;
    use crate::layout::{repack_q4_0x8, repack_q8_0x8, unpack_q4_0x8, unpack_q8_0x8};

    /// Each format with the ggml type whose values it holds.
    const FORMATS: [(Format, DType); 2] =
        [(Format::Q8_0x8, DType::Q8_0), (Format::Q4_0x8, DType::Q4_0)];

    fn repack(format: Format, plain: &[u8], k: usize, m: usize) -> Vec<u8> {
        match format {
            Format::Q8_0x8 => repack_q8_0x8(plain, k, m),
            Format::Q4_0x8 => repack_q4_0x8(plain, k, m),
        }
    }

    /// Every kernel this CPU runs for `format` (q4_0x8 has no AMX kernel).
    fn kernels_for(format: Format) -> Vec<Kernel> {
        let all = Kernel::available();
        #[cfg(target_arch = "x86_64")]
        return all
            .into_iter()
            .filter(|&k| format == Format::Q8_0x8 || k != Kernel::Amx)
            .collect();
        #[cfg(not(target_arch = "x86_64"))]
        all
    }

    /// A [`Quantize`] node over the f32 `[k, n]` `x` (the body outlives the graph's compute).
    unsafe fn quantize_node(
        ctx: *mut sys::ggml_context,
        x: *mut sys::ggml_tensor,
        body: &Quantize,
    ) -> *mut sys::ggml_tensor {
        // SAFETY: x is a contiguous f32 [k, n] of ctx.
        unsafe {
            let (k, n) = ((*x).ne[0] as usize, (*x).ne[1] as usize);
            custom::node(
                ctx,
                Out::Bytes,
                [quantized_bytes(k, n), 1, 1, 1],
                &[x],
                body,
            )
        }
    }

    /// An [`Int8Gemm`] node over `args` (weight, quantized input, then what its node lists).
    unsafe fn linear_node(
        ctx: *mut sys::ggml_context,
        args: &[*mut sys::ggml_tensor],
        n: usize,
        body: &Int8Gemm,
    ) -> *mut sys::ggml_tensor {
        // SAFETY: per Int8Gemm's sources.
        unsafe {
            let m = (*args[0]).ne[1] as usize;
            custom::node(ctx, Out::F32, [m, n, 1, 1], args, body)
        }
    }

    /// Deterministic values in [-1, 1) with a few outliers, so blocks have different scales.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                if i % 97 == 5 { v * 8.0 } else { v }
            })
            .collect()
    }

    /// Plain q8_0 or q4_0 rows as f64 values, written from ggml's block formats (not with its
    /// dequantizers): q4_0 byte `l` holds quant `l` low and `l + 16` high, both +8.
    fn dequant_plain(format: Format, plain: &[u8], k: usize, m: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(k * m);
        for blk in plain.chunks_exact(format.row_block_bytes()) {
            let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]])) as f64;
            match format {
                Format::Q8_0x8 => out.extend(blk[2..].iter().map(|&q| d * (q as i8) as f64)),
                Format::Q4_0x8 => {
                    let low = blk[2..].iter().map(|&q| d * ((q & 0xF) as f64 - 8.0));
                    let high = blk[2..].iter().map(|&q| d * ((q >> 4) as f64 - 8.0));
                    out.extend(low.chain(high));
                }
            }
        }
        assert_eq!(out.len(), k * m);
        out
    }

    #[test]
    fn repack_round_trips() {
        let (k, m) = (96, 24);
        let plain = quantize_rows(&values(k * m, 1), k, DType::Q8_0).unwrap();
        let packed = repack_q8_0x8(&plain, k, m);
        assert_ne!(packed, plain);
        assert_eq!(unpack_q8_0x8(&packed, k, m), plain);
        let plain = quantize_rows(&values(k * m, 1), k, DType::Q4_0).unwrap();
        let packed = repack_q4_0x8(&plain, k, m);
        assert_ne!(packed, plain);
        assert_eq!(unpack_q4_0x8(&packed, k, m), plain);
        // The nibbles are ggml's: the portable kernel's view of the packed block matches the
        // plain one (row 3, block 1, every quant).
        let nb = k / QK;
        let blk = &packed[Q4_0X8_BLOCK_BYTES..][..Q4_0X8_BLOCK_BYTES];
        let row = &plain[(3 * nb + 1) * Q4_0_BLOCK_BYTES..][..Q4_0_BLOCK_BYTES];
        for j in 0..QK {
            let byte = row[2 + j % 16];
            let want = i32::from(if j < 16 { byte & 0xF } else { byte >> 4 }) - 8;
            assert_eq!(
                panel_quant::<true>(blk, (j / 4, 3, j % 4)),
                want,
                "quant {j}"
            );
        }
        assert!(can_repack(&[32, 8]) && !can_repack(&[32, 12]) && !can_repack(&[40, 8]));
    }

    #[test]
    fn quantizers_agree() {
        // 19 steps of 3 blocks: more than one 16-step tile, for the AMX layout.
        let (k, n) = (96, 19);
        let x = values(k * n, 2);
        for kernel in Kernel::available() {
            let mut q = QuantizedCols::default();
            q.quantize(kernel, &x, k, n);
            // The VNNI kernel reads its quants +128 as unsigned bytes.
            #[cfg(target_arch = "x86_64")]
            let bias = if kernel == Kernel::Avx512Vnni {
                0x80
            } else {
                0
            };
            #[cfg(not(target_arch = "x86_64"))]
            let bias = 0;
            for (j, xb) in x.chunks_exact(32).enumerate() {
                let mut want = [0u8; 32];
                let d = quantize_block(xb, &mut want);
                let (c, b) = (j / (k / 32), j % (k / 32));
                let (quants, scale) = q.block(kernel, k, c, b);
                let got: Vec<u8> = quants.iter().map(|v| v ^ bias).collect();
                assert_eq!(got, want, "{kernel:?} step {c} block {b}");
                assert_eq!(scale, d);
                // Every value within half a step of its quantized value, plus the f16 rounding
                // of the scale (2^-11 relative, times at most 127 steps).
                for (v, qv) in xb.iter().zip(want.map(|q| q as i8)) {
                    let bound = d * (0.5 + 127.0 / 2048.0) * 1.0001;
                    assert!((v - d * qv as f32).abs() <= bound, "{v} vs {qv} * {d}");
                }
            }
        }
    }

    /// Odd shapes (m, n, k not multiples of any tile beyond the layout's own 8 x 32), n = 1,
    /// 1-3 threads: the kernels against an f64 product of the same quantized operands, which
    /// they must match to f32 rounding; and against the unquantized f64 product within the
    /// quantization bound.
    #[test]
    fn kernels_match_an_f64_reference() {
        for &(k, m, n) in &[
            (32, 8, 1),
            (96, 24, 5),
            (160, 40, 7),
            (64, 16, 13),
            (320, 56, 3),
            // More than one pass over the blocks (VNNI: 32 per pass), tiles of 16, 8 and 3.
            (1088, 24, 27),
        ] {
            for (format, dtype) in FORMATS {
                let w = values(k * m, k as u64);
                let x = values(k * n, n as u64 + 7);
                let bias = values(m, 3);
                let plain = quantize_rows(&w, k, dtype).unwrap();
                let wq = dequant_plain(format, &plain, k, m);
                let packed = repack(format, &plain, k, m);
                let mut xq = QuantizedCols::default();
                xq.quantize(Kernel::Portable, &x, k, n);
                for kernel in kernels_for(format) {
                    for threads in 1..=3 {
                        let got =
                            gemm_int8(kernel, format, &packed, k, m, &x, n, Some(&bias), threads);
                        for c in 0..n {
                            for r in 0..m {
                                let (mut exact, mut quant, mut bound) = (0f64, 0f64, 0f64);
                                for i in 0..k {
                                    let xd = xq.d[(c * k + i) / 32] as f64;
                                    let wv = wq[r * k + i];
                                    quant += wv * xd * (xq.q[c * k + i] as i8) as f64;
                                    exact += wv * x[c * k + i] as f64;
                                    bound += wv.abs() * xd * 0.5;
                                }
                                let g = got[c * m + r] as f64 - bias[r] as f64;
                                let what = format!(
                                    "{format:?} {kernel:?} k{k} m{m} n{n} t{threads} [{r},{c}]"
                                );
                                assert!(
                                    (g - quant).abs() <= 1e-5 * (1.0 + quant.abs()),
                                    "{what}: {g} vs quantized {quant}"
                                );
                                assert!(
                                    (g - exact).abs() <= bound + 1e-5,
                                    "{what}: {g} vs exact {exact} (bound {bound})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The custom op inside a real ggml graph (ggml's threads, 1-3 of them) against ggml's own
    /// q8_0 (q4_0) `ggml_mul_mat` on the same weights, plain, for q8_0x8 (q4_0x8); ggml
    /// multiplies q4_0 by q8_0 activations too. Both quantize the activations the same way and
    /// sum the same integer products, in another order and ggml partly in f16 (its AVX2 q8_0
    /// dot product keeps the products of scales as f32 of f16s): stated bound per output
    /// `1e-4 * sum_i |w_i| * d_x(i) + 1e-5`, about 1/10000 of one activation step summed over
    /// the row, i.e. f32 rounding of the sums.
    #[test]
    fn custom_op_matches_ggml_mul_mat() {
        let (k, m, n) = (256, 40, 11);
        let w = values(k * m, 11);
        let x = values(k * n, 12);
        let residual = values(m * n, 13);
        for (format, dtype) in FORMATS {
            let plain = quantize_rows(&w, k, dtype).unwrap();
            let packed = repack(format, &plain, k, m);
            let wq = dequant_plain(format, &plain, k, m);
            let mut xq = QuantizedCols::default();
            xq.quantize(Kernel::Portable, &x, k, n);
            for threads in 1..=3 {
                // SAFETY: a self-contained ggml context with allocated tensors, sized generously;
                // every tensor is written before the compute and read after it.
                let (ours, theirs) = unsafe {
                    let ctx = sys::ggml_init(sys::ggml_init_params {
                        mem_size: 16 << 20,
                        mem_buffer: std::ptr::null_mut(),
                        no_alloc: false,
                    });
                    assert!(!ctx.is_null());
                    let wt = |data: &[u8]| {
                        let t = sys::ggml_new_tensor_2d(ctx, dtype.to_ggml(), k as i64, m as i64);
                        std::ptr::copy_nonoverlapping(
                            data.as_ptr(),
                            (*t).data as *mut u8,
                            data.len(),
                        );
                        t
                    };
                    let (w_plain, w_packed) = (wt(&plain), wt(&packed));
                    let xt = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, k as i64, n as i64);
                    std::ptr::copy_nonoverlapping(x.as_ptr(), (*xt).data as *mut f32, x.len());
                    let theirs = sys::ggml_mul_mat(ctx, w_plain, xt);
                    let plain_q = Quantize {
                        silu: false,
                        format,
                    };
                    let silu_q = Quantize { silu: true, format };
                    let xq = quantize_node(ctx, xt, &plain_q);
                    // The node with SiLU first: the quantization of silu(x).
                    let xq_silu = quantize_node(ctx, xt, &silu_q);
                    let queue = Int8Gemm {
                        node: GemmNode::default(),
                        format,
                    };
                    let ours = linear_node(ctx, &[w_packed, xq], n, &queue);
                    // The same product with a residual added in the node: `r + 0.5 * ours`.
                    let rt = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, m as i64, n as i64);
                    std::ptr::copy_nonoverlapping(residual.as_ptr(), (*rt).data as *mut f32, m * n);
                    let with_residual = Int8Gemm {
                        node: GemmNode {
                            residual: Some(0.5),
                            ..Default::default()
                        },
                        format,
                    };
                    let finished = linear_node(ctx, &[w_packed, xq, rt], n, &with_residual);
                    let gf = sys::ggml_new_graph(ctx);
                    sys::ggml_build_forward_expand(gf, theirs);
                    sys::ggml_build_forward_expand(gf, ours);
                    sys::ggml_build_forward_expand(gf, finished);
                    sys::ggml_build_forward_expand(gf, xq_silu);
                    let st = sys::ggml_graph_compute_with_ctx(ctx, gf, threads);
                    assert_eq!(st, sys::GGML_STATUS_SUCCESS);
                    let read = |t: *mut sys::ggml_tensor| {
                        std::slice::from_raw_parts((*t).data as *const f32, m * n).to_vec()
                    };
                    let r = (read(ours), read(theirs));
                    let finished = read(finished);
                    let mut activated = x.clone();
                    crate::kernels::vmath::silu_in_place(&mut activated);
                    let mut want = QuantizedCols::default();
                    want.quantize(format.kernel(n), &activated, k, n);
                    let bytes =
                        std::slice::from_raw_parts((*xq_silu).data as *const u8, want.q.len());
                    assert!(bytes == &want.q[..], "{format:?} t{threads}: silu quants");
                    let scales = std::slice::from_raw_parts(
                        ((*xq_silu).data as *const u8).add(want.q.len()) as *const f32,
                        want.d.len(),
                    );
                    assert!(scales == &want.d[..], "{format:?} t{threads}: silu scales");
                    sys::ggml_free(ctx);
                    for (i, (&f, &o)) in finished.iter().zip(&r.0).enumerate() {
                        assert_eq!(
                            f,
                            residual[i] + o * 0.5,
                            "{format:?} t{threads} residual at {i}"
                        );
                    }
                    r
                };
                let mut worst = 0f64;
                for c in 0..n {
                    for r in 0..m {
                        let bound: f64 = (0..k)
                            .map(|i| wq[r * k + i].abs() * xq.d[(c * k + i) / 32] as f64 * 1e-4)
                            .sum::<f64>()
                            + 1e-5;
                        let diff = (ours[c * m + r] as f64 - theirs[c * m + r] as f64).abs();
                        worst = worst.max(diff / bound);
                        assert!(
                            diff <= bound,
                            "{format:?} t{threads} [{r},{c}]: ours {} ggml {} (bound {bound})",
                            ours[c * m + r],
                            theirs[c * m + r]
                        );
                    }
                }
                println!("{format:?} threads {threads}: worst |ours - ggml| / bound = {worst:.3}");
            }
        }
    }
}
