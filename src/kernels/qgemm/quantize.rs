//! The int8 GEMM's activations: each time step quantized per block of 32 exactly like ggml's
//! q8_0, laid out as each kernel reads them.

use super::{Cols, Kernel, QK, STEP_PAD};
use llama_cpp_sys_2 as sys;

/// Owned [`Cols`], for tests and benchmarks outside a graph.
#[derive(Default)]
pub(super) struct QuantizedCols {
    pub(super) q: Vec<u8>,
    pub(super) d: Vec<f32>,
}

impl QuantizedCols {
    pub(super) fn quantize(&mut self, kernel: Kernel, x: &[f32], k: usize, n: usize) {
        assert!(k.is_multiple_of(QK) && x.len() == k * n);
        let padded = n.next_multiple_of(STEP_PAD);
        self.q.clear();
        self.q.resize(k * padded, 0);
        self.d.clear();
        self.d.resize(k / QK * padded, 0.0);
        // SAFETY: q and d hold every (padded) step's quants and scales; this is the only writer.
        unsafe {
            quantize_cols(
                kernel,
                x,
                (k, 0),
                (self.q.as_mut_ptr(), self.d.as_mut_ptr()),
                false,
            )
        };
    }

    /// The quants of step `c`, block `b`, and their scale.
    #[cfg(test)]
    pub(super) fn block(&self, kernel: Kernel, k: usize, c: usize, b: usize) -> (&[u8], f32) {
        let at = quants_at(kernel, k, c, b);
        (&self.q[at..][..QK], self.d[at / QK])
    }

    pub(super) fn cols(&self) -> Cols<'_> {
        Cols {
            q: &self.q,
            d: &self.d,
        }
    }
}

/// Byte offset of the quants of step `c`, block `b` among quantized activations of `k` inputs,
/// as `kernel` reads them: step after step, except for AMX, which reads a block of 16 steps as
/// one tile and gets it as 512 contiguous bytes (a tile load of 16 steps `k` bytes apart touches
/// twice the cache lines). Their scale is at this offset / 32 among the scales (for AMX, the 16
/// steps' scales of a block side by side). A 16-step tile starts at `c * k` in both layouts.
pub(super) fn quants_at(kernel: Kernel, k: usize, c: usize, b: usize) -> usize {
    if reads_tiles(kernel) {
        let tile = c - c % STEP_PAD;
        tile * k + b * STEP_PAD * QK + (c % STEP_PAD) * QK
    } else {
        c * k + b * QK
    }
}

/// Whether `kernel` reads quantized activations a 16-step tile at a time ([`quants_at`]).
pub(super) fn reads_tiles(kernel: Kernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    return kernel == Kernel::Amx;
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// Quantizes whole steps `c0..` (`x`, `k` inputs each) into the quants and scales at `q` and
/// `d`, laid out by [`quants_at`]. With `silu`, what it quantizes is `silu(x)`.
///
/// # Safety
/// `q` and `d` point to the quants and scales of every step `x` covers, and no other thread
/// writes those.
pub(super) unsafe fn quantize_cols(
    kernel: Kernel,
    x: &[f32],
    (k, c0): (usize, usize),
    (q, d): (*mut u8, *mut f32),
    silu: bool,
) {
    debug_assert!(x.len().is_multiple_of(k));
    // Block `b` of step `c`, to its place.
    let place = |(c, b): (usize, usize)| {
        let at = quants_at(kernel, k, c, b);
        // SAFETY: the quants and scale of step c (one of these steps), ours per the contract.
        unsafe {
            (
                std::slice::from_raw_parts_mut(q.add(at), QK),
                &mut *d.add(at / QK),
            )
        }
    };
    let nb = k / QK;
    if !silu {
        quantize_blocks(kernel, x, ((c0, 0), nb), place);
        return;
    }
    // SiLU first, a stack buffer of blocks at a time (a call per block cost more than the
    // separate pass it saves).
    const CHUNK: usize = 32 * QK;
    let mut activated = [0f32; CHUNK];
    for (i, xc) in x.chunks(CHUNK).enumerate() {
        let buf = &mut activated[..xc.len()];
        buf.copy_from_slice(xc);
        crate::kernels::vmath::silu_in_place(buf);
        let j = i * (CHUNK / QK);
        quantize_blocks(kernel, buf, ((c0 + j / nb, j % nb), nb), place);
    }
}

/// The blocks of `x`, the first being block `b` of step `c` (`nb` blocks a step), into their
/// places `place((c, b))` (quants, scale).
fn quantize_blocks<'q>(
    kernel: Kernel,
    x: &[f32],
    ((mut c, mut b), nb): ((usize, usize), usize),
    place: impl Fn((usize, usize)) -> (&'q mut [u8], &'q mut f32),
) {
    for xb in x.chunks_exact(QK) {
        let (qb, d) = place((c, b));
        (c, b) = if b + 1 == nb { (c + 1, 0) } else { (c, b + 1) };
        *d = match kernel {
            Kernel::Portable => quantize_block(xb, qb),
            // SAFETY: these kernels are only chosen when the CPU has AVX2.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { super::avx2::quantize_block(xb, qb, false) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => unsafe { super::avx2::quantize_block(xb, qb, true) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => unsafe { super::avx2::quantize_block(xb, qb, false) },
        };
    }
}

/// One block of 32 to int8 (stored as its bits); returns the scale. Exactly ggml's q8_0
/// activation quantization: quants `round(x * 127 / max|x|)`, the scale `max|x| / 127` rounded to
/// f16 (its rounding, 2^-11 relative, is far below the quantization's own), so that our products
/// equal ggml's up to the order of the sums.
pub(super) fn quantize_block(x: &[f32], q: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8 as u8;
    }
    // SAFETY: pure conversions.
    unsafe { sys::ggml_fp16_to_fp32(sys::ggml_fp32_to_fp16(amax / 127.0)) }
}
