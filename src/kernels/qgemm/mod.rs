//! Int8 GEMM over q8_0 weights stored in the `q8_0x8` panel layout (docs/GGUF.md).
//!
//! The quantization is ggml's q8_0 (blocks of 32 along a row, an f16 scale and 32 int8s), so a
//! `q8_0x8` tensor holds exactly the values of a plain q8_0 one, only reordered: 8 output rows
//! form a panel, and inside a panel each block of 32 columns is stored as the 8 scales followed
//! by 8 groups of 32 bytes, group `g` holding 4 consecutive quants of each of the 8 rows. One
//! 256-bit load then feeds 8 rows at once, and the integer dot products land in one register
//! lane per row, so the per-block scaling is a plain vector multiply.
//!
//! Activations are quantized per time step on the fly, in blocks of 32 exactly like ggml's q8_0
//! (scale `max|x| / 127` as f16, quants rounded to nearest), by a graph node of their own: the
//! threads split the steps, and the linears that read the same input share the result.
//!
//! The AVX2 kernel multiplies with `vpmaddubsw` on |w| and sign(w) * x (both within 127 in
//! magnitude, so the pairwise i16 sums cannot saturate), widens with `vpmaddwd`, sums a block in
//! i32 and scales it once per block. With AVX-512 VNNI, one `vpdpbusd` does all three for 64
//! bytes (the `vnni` module); with AMX, one `tdpbssd` does a block for 16 steps x 8 rows (the
//! `amx` module). Other CPUs run a portable loop.

use llama_cpp_sys_2 as sys;

/// Output rows per panel.
pub const PANEL: usize = 8;
/// Weights per q8_0 block.
const QK: usize = 32;
/// Bytes of a plain q8_0 block (f16 scale + 32 quants).
const Q8_BLOCK: usize = 2 + QK;
/// Bytes of one block of a panel: 8 f16 scales, then 8 x 32 quants.
const PANEL_BLOCK: usize = PANEL * Q8_BLOCK;
/// Quantized activations are padded with zero steps to a multiple of this, so that the AMX
/// kernel's 16-step tiles never read past them.
const STEP_PAD: usize = 16;
/// Fewest steps for which the AMX kernel beats VNNI.
const AMX_MIN_STEPS: usize = 4;

#[cfg(target_arch = "x86_64")]
mod amx;

pub use super::gguf::Layout;

/// GGUF key listing the tensors stored in the `q8_0x8` layout.
pub const Q8_0X8_KEY: &str = "parakeet.layout.q8_0x8";

/// Whether a q8_0 weight of ggml shape `ne` can be stored as `q8_0x8`: a matrix whose rows split
/// into blocks and whose row count splits into panels.
pub fn can_repack(ne: &[usize]) -> bool {
    ne.len() == 2
        && ne[0] > 0
        && ne[0].is_multiple_of(QK)
        && ne[1] > 0
        && ne[1].is_multiple_of(PANEL)
}

/// Byte offset of quant `(row r of the panel, column j of the block)` inside a panel block.
fn quant_offset(r: usize, j: usize) -> usize {
    2 * PANEL + (j / 4) * 4 * PANEL + r * 4 + j % 4
}

/// Reorders plain q8_0 rows (`m` rows of `k` weights) into the `q8_0x8` layout (same size).
pub fn repack_q8_0x8(plain: &[u8], k: usize, m: usize) -> Vec<u8> {
    assert!(
        can_repack(&[k, m]),
        "q8_0x8 needs k % 32 == 0 and m % 8 == 0"
    );
    let nb = k / QK;
    assert_eq!(plain.len(), m * nb * Q8_BLOCK, "q8_0 data size");
    let mut out = vec![0u8; plain.len()];
    for p in 0..m / PANEL {
        for b in 0..nb {
            let dst = &mut out[(p * nb + b) * PANEL_BLOCK..][..PANEL_BLOCK];
            for r in 0..PANEL {
                let src = &plain[((p * PANEL + r) * nb + b) * Q8_BLOCK..][..Q8_BLOCK];
                dst[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                for j in 0..QK {
                    dst[quant_offset(r, j)] = src[2 + j];
                }
            }
        }
    }
    out
}

/// The inverse of [`repack_q8_0x8`].
pub fn unpack_q8_0x8(packed: &[u8], k: usize, m: usize) -> Vec<u8> {
    assert!(
        can_repack(&[k, m]),
        "q8_0x8 needs k % 32 == 0 and m % 8 == 0"
    );
    let nb = k / QK;
    assert_eq!(packed.len(), m * nb * Q8_BLOCK, "q8_0x8 data size");
    let mut out = vec![0u8; packed.len()];
    for p in 0..m / PANEL {
        for b in 0..nb {
            let src = &packed[(p * nb + b) * PANEL_BLOCK..][..PANEL_BLOCK];
            for r in 0..PANEL {
                let dst = &mut out[((p * PANEL + r) * nb + b) * Q8_BLOCK..][..Q8_BLOCK];
                dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
                for j in 0..QK {
                    dst[2 + j] = src[quant_offset(r, j)];
                }
            }
        }
    }
    out
}

/// The kernels this build can run; [`Kernel::best`] picks one at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust (any CPU; the compiler vectorises what it can).
    Portable,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 (F, BW) with VNNI's `vpdpbusd`, plus the AVX2 set for quantizing.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
    /// AMX-INT8 tiles for the products, AVX-512 for the scaling (and VNNI for a single step,
    /// where a 16-step tile would be mostly empty).
    #[cfg(target_arch = "x86_64")]
    Amx,
}

impl Kernel {
    /// The fastest kernel this CPU runs (found once: every int8 op asks, on every thread).
    pub fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            *Kernel::available()
                .last()
                .expect("portable is always there")
        })
    }

    /// The kernel for a product over `n` steps: the best one, except that AMX gives way to VNNI
    /// below [`AMX_MIN_STEPS`] (a 16-step tile holding a few would waste its work).
    pub fn for_steps(n: usize) -> Kernel {
        match Kernel::best() {
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx if n < AMX_MIN_STEPS => Kernel::Avx512Vnni,
            best => best,
        }
    }

    /// Every kernel this CPU can run, slowest first (for tests and benchmarks).
    pub fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(Kernel::Avx2);
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                v.push(Kernel::Avx512Vnni);
                if amx::usable() {
                    v.push(Kernel::Amx);
                }
            }
        }
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => "avx512-vnni",
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => "amx-int8",
        }
    }
}

/// Activations of `n` time steps quantized per block of 32, as `kernel` reads them: the quants
/// of step `c`, block `b` at [`quants_at`] (int8 bits; +128 as unsigned bytes for the VNNI
/// kernel, whose `vpdpbusd` multiplies unsigned by signed) and their scale at
/// `d[quants_at(..) / 32]`. Both hold [`STEP_PAD`]-padded steps, the padding zero.
#[derive(Clone, Copy)]
struct Cols<'a> {
    q: &'a [u8],
    d: &'a [f32],
}

/// Owned [`Cols`], for tests and benchmarks outside a graph.
#[derive(Default)]
struct QuantizedCols {
    q: Vec<u8>,
    d: Vec<f32>,
}

impl QuantizedCols {
    fn quantize(&mut self, kernel: Kernel, x: &[f32], k: usize, n: usize) {
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
    fn block(&self, kernel: Kernel, k: usize, c: usize, b: usize) -> (&[u8], f32) {
        let at = quants_at(kernel, k, c, b);
        (&self.q[at..][..QK], self.d[at / QK])
    }

    fn cols(&self) -> Cols<'_> {
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
fn quants_at(kernel: Kernel, k: usize, c: usize, b: usize) -> usize {
    if reads_tiles(kernel) {
        let tile = c - c % STEP_PAD;
        tile * k + b * STEP_PAD * QK + (c % STEP_PAD) * QK
    } else {
        c * k + b * QK
    }
}

/// Whether `kernel` reads quantized activations a 16-step tile at a time ([`quants_at`]).
fn reads_tiles(kernel: Kernel) -> bool {
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
unsafe fn quantize_cols(
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
        super::vmath::silu_in_place(buf);
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
            Kernel::Avx2 => unsafe { avx2::quantize_block(xb, qb, false) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => unsafe { avx2::quantize_block(xb, qb, true) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Amx => unsafe { avx2::quantize_block(xb, qb, false) },
        };
    }
}

/// One block of 32 to int8 (stored as its bits); returns the scale. Exactly ggml's q8_0
/// activation quantization: quants `round(x * 127 / max|x|)`, the scale `max|x| / 127` rounded to
/// f16 (its rounding, 2^-11 relative, is far below the quantization's own), so that our products
/// equal ggml's up to the order of the sums.
fn quantize_block(x: &[f32], q: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8 as u8;
    }
    // SAFETY: pure conversions.
    unsafe { sys::ggml_fp16_to_fp32(sys::ggml_fp32_to_fp16(amax / 127.0)) }
}

/// `out[c * m + r] = sum_i w[r, i] x[c, i] (+ bias[r])` for the rows of panels `p0..p1`, all
/// `n` steps. `w` is the whole `q8_0x8` matrix ([k, m]).
///
/// # Safety
/// `out` points to `n * m` writable f32s; no other thread writes the rows of these panels.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_panels(
    kernel: Kernel,
    w: &[u8],
    k: usize,
    m: usize,
    (p0, p1): (usize, usize),
    x: Cols,
    n: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
) {
    let nb = k / QK;
    // The extents every kernel relies on (the SIMD ones read the activations' padding too).
    let padded = n.next_multiple_of(STEP_PAD);
    assert!(w.len() >= p1 * nb * PANEL_BLOCK && p1 * PANEL <= m);
    assert!(x.q.len() >= padded * k && x.d.len() >= padded * nb);
    assert!(bias.is_none_or(|b| b.len() >= m));
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Amx {
        // SAFETY: chosen only where amx::usable(); the activations are signed and padded.
        return unsafe { amx::panels(w, k, m, (p0, p1), x, n, bias, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx512Vnni {
        // SAFETY: chosen only on CPUs with AVX-512 F/BW/VNNI; out per the contract.
        return unsafe { vnni::panels(w, k, m, (p0, p1), x, n, bias, out) };
    }
    for p in p0..p1 {
        let panel = &w[p * nb * PANEL_BLOCK..][..nb * PANEL_BLOCK];
        let bias = bias.map(|b| &b[p * PANEL..][..PANEL]);
        // SAFETY: rows p*8..p*8+8 of every step are inside out and ours (the contract).
        let out = unsafe { out.add(p * PANEL) };
        match kernel {
            // SAFETY: as above.
            Kernel::Portable => unsafe { portable_panel(panel, k, x, n, bias, out, m) },
            // SAFETY: chosen only on CPUs with AVX2/FMA/F16C; as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::panel(panel, k, x, n, bias, out, m) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni | Kernel::Amx => unreachable!("runs all its panels above"),
        }
    }
}

/// # Safety
/// `out` holds 8 rows of `n` steps with step stride `m`.
unsafe fn portable_panel(
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
        for (b, blk) in panel.chunks_exact(PANEL_BLOCK).enumerate() {
            let xb = &xq[b * QK..][..QK];
            let mut sums = [0i32; PANEL];
            for (g, group) in blk[2 * PANEL..].chunks_exact(4 * PANEL).enumerate() {
                for (r, s) in sums.iter_mut().enumerate() {
                    for i in 0..4 {
                        *s += i32::from(group[r * 4 + i] as i8) * i32::from(xb[g * 4 + i] as i8);
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Cols, PANEL, PANEL_BLOCK, QK};
    use std::arch::x86_64::*;

    /// Columns per register tile: 4 f32 and 4 i32 accumulators plus the weights fit in 16 ymm.
    const NC: usize = 4;

    /// [`super::quantize_block`]; with `biased`, the quants are stored +128 as unsigned bytes.
    ///
    /// # Safety
    /// AVX2 and F16C are available; `x` and `q` hold 32 values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [u8], biased: bool) -> f32 {
        assert!(x.len() >= QK && q.len() >= QK);
        let p = x.as_ptr();
        // SAFETY: 32 floats readable, 32 bytes writable (asserted).
        unsafe {
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let mut mx = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, *vi));
            }
            let mut m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            let amax = _mm_cvtss_f32(m4);
            let id = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
            // Round to nearest even (the default MXCSR mode), as the portable path does.
            let i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], id));
            let i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], id));
            let i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], id));
            let i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], id));
            let w16 = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            // The packs interleave 128-bit lanes: restore the order.
            let mut w8 =
                _mm256_permutevar8x32_epi32(w16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            if biased {
                w8 = _mm256_xor_si256(w8, _mm256_set1_epi8(0x80u8 as i8));
            }
            _mm256_storeu_si256(q.as_mut_ptr().cast(), w8);
            let d = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(amax / 127.0));
            _mm_cvtss_f32(_mm_cvtph_ps(d))
        }
    }

    /// # Safety
    /// AVX2/FMA/F16C available; `out` holds 8 rows of `n` steps with step stride `m`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel(
        panel: &[u8],
        k: usize,
        x: Cols,
        n: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
        m: usize,
    ) {
        let nb = k / QK;
        assert!(panel.len() == nb * PANEL_BLOCK && x.q.len() >= n * k && x.d.len() >= n * nb);
        let bias = bias.map(|b| {
            assert!(b.len() >= PANEL);
            b.as_ptr()
        });
        let mut c = 0;
        // SAFETY: sizes asserted above; out per the contract.
        unsafe {
            while c + NC <= n {
                tile::<NC>(panel, k, x, c, bias, out.add(c * m), m);
                c += NC;
            }
            match n - c {
                3 => tile::<3>(panel, k, x, c, bias, out.add(c * m), m),
                2 => tile::<2>(panel, k, x, c, bias, out.add(c * m), m),
                1 => tile::<1>(panel, k, x, c, bias, out.add(c * m), m),
                _ => {}
            }
        }
    }

    /// 8 rows x `N` steps starting at step `c0`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile<const N: usize>(
        panel: &[u8],
        k: usize,
        x: Cols,
        c0: usize,
        bias: Option<*const f32>,
        out: *mut f32,
        m: usize,
    ) {
        let nb = k / QK;
        // SAFETY: the caller checked the panel and activation sizes for steps c0..c0+N.
        unsafe {
            let wp = panel.as_ptr();
            let xq = x.q.as_ptr().add(c0 * k);
            let xd = x.d.as_ptr().add(c0 * nb);
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); N];
            for b in 0..nb {
                let blk = wp.add(b * PANEL_BLOCK);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
                let mut isum = [_mm256_setzero_si256(); N];
                for g in 0..QK / 4 {
                    let w = _mm256_loadu_si256(blk.add(2 * PANEL + g * 4 * PANEL).cast());
                    let aw = _mm256_abs_epi8(w);
                    for (j, s) in isum.iter_mut().enumerate() {
                        let xv = xq
                            .add(j * k + b * QK + g * 4)
                            .cast::<i32>()
                            .read_unaligned();
                        let sx = _mm256_sign_epi8(_mm256_set1_epi32(xv), w);
                        let p16 = _mm256_maddubs_epi16(aw, sx);
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p16, ones));
                    }
                }
                for (j, a) in acc.iter_mut().enumerate() {
                    let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*xd.add(j * nb + b)));
                    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[j]), scale, *a);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                let v = match bias {
                    Some(bp) => _mm256_add_ps(*a, _mm256_loadu_ps(bp)),
                    None => *a,
                };
                _mm256_storeu_ps(out.add(j * m), v);
            }
        }
    }
}

/// The same panels with AVX-512 VNNI. `vpdpbusd` multiplies unsigned by signed bytes, so the
/// activations come biased by +128 and each block subtracts `128 * sum(w)`, which one more
/// `vpdpbusd` per weight load computes for every column at once.
///
/// A 64-byte load holds two 4-byte groups of the panel's 8 rows (`[group][row]`). Panels go in
/// pairs: the same group of both panels makes one register of 16 rows (one shuffle per load),
/// a 4-byte broadcast of the activations feeds it, and each block's sum is scaled once per row
/// per 8 `vpdpbusd` (the scaling, not the products, bounds this kernel: 10 % faster than single
/// panels). A last odd panel permutes each load into `[row][group]` (lane `2r + h` = row `r`,
/// group `h`) for an 8-byte broadcast, and sums a row's two lanes after the last block.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Cols, PANEL, PANEL_BLOCK, QK};
    use std::arch::x86_64::*;

    /// Columns per register tile: one accumulator each, plus about 10 shared registers.
    const NC: usize = 16;

    /// Blocks of 32 inputs per pass: a 16-step tile's activations (16 KB) stay in L1 also for
    /// the 4096-wide inputs of the feed-forward's second linear.
    const K_BLOCKS: usize = 32;

    /// Panels per group: a group's weights (16 x 8 rows, 140-560 KB at the encoder's widths)
    /// stay in L2 while each column tile's activations, read from L1, meet all of them.
    const GROUP: usize = 16;

    /// Panels `p0..p1` of the whole `q8_0x8` matrix `w`, every step: per group of panels,
    /// column tile by column tile.
    ///
    /// # Safety
    /// AVX-512 F/BW/VNNI and F16C available; the activations were quantized for this kernel;
    /// the extents checked by `gemm_panels`; `out` holds `n` steps of `m` rows (step stride
    /// `m`) and the rows of these panels are ours alone.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn panels(
        w: &[u8],
        k: usize,
        m: usize,
        (p0, p1): (usize, usize),
        x: Cols,
        n: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
    ) {
        let nb = k / QK;
        let mut g0 = p0;
        while g0 < p1 {
            let group = (g0, (g0 + GROUP).min(p1));
            let mut b0 = 0;
            while b0 < nb {
                let blocks = (b0, (b0 + K_BLOCKS).min(nb));
                let mut c = 0;
                // SAFETY: sizes asserted above; out per the contract.
                unsafe {
                    let span = Span { group, blocks };
                    while c + NC <= n {
                        tiles::<NC>(w, k, m, span, x, c, bias, out);
                        c += NC;
                    }
                    if n - c >= 8 {
                        tiles::<8>(w, k, m, span, x, c, bias, out);
                        c += 8;
                    }
                    match n - c {
                        7 => tiles::<7>(w, k, m, span, x, c, bias, out),
                        6 => tiles::<6>(w, k, m, span, x, c, bias, out),
                        5 => tiles::<5>(w, k, m, span, x, c, bias, out),
                        4 => tiles::<4>(w, k, m, span, x, c, bias, out),
                        3 => tiles::<3>(w, k, m, span, x, c, bias, out),
                        2 => tiles::<2>(w, k, m, span, x, c, bias, out),
                        1 => tiles::<1>(w, k, m, span, x, c, bias, out),
                        _ => {}
                    }
                }
                b0 = blocks.1;
            }
            g0 = group.1;
        }
    }

    /// The panels and the blocks of 32 inputs one pass covers.
    #[derive(Clone, Copy)]
    struct Span {
        group: (usize, usize),
        blocks: (usize, usize),
    }

    /// Steps `c..c + N` of every panel of the span, over its blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tiles<const N: usize>(
        w: &[u8],
        k: usize,
        m: usize,
        span: Span,
        x: Cols,
        c: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
    ) {
        let size = k / QK * PANEL_BLOCK;
        let mut p = span.group.0;
        // Panels in pairs (16 rows, one lane per row), a last odd one on its own.
        while p < span.group.1 {
            let bias = bias.map(|b| b[p * PANEL..].as_ptr());
            // SAFETY: per panels' contract.
            unsafe {
                let out = out.add(c * m + p * PANEL);
                if p + 1 < span.group.1 {
                    let pair = &w[p * size..][..2 * size];
                    pair_tile::<N>(pair, k, x, c, span.blocks, bias, out, m);
                    p += 2;
                } else {
                    let panel = &w[p * size..][..size];
                    tile::<N>(panel, k, x, c, span.blocks, bias, out, m);
                    p += 1;
                }
            }
        }
    }

    /// 16 rows (two neighbouring panels) x `N` steps starting at step `c0`. Lane `r` of a
    /// register is row `r`: the groups of the two panels are interleaved by 256-bit halves, so a
    /// 4-byte broadcast of the activations feeds all 16 rows and each block's integer sum is
    /// scaled once per row, twice the products per scaling of [`tile`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pair_tile<const N: usize>(
        pair: &[u8],
        k: usize,
        x: Cols,
        c0: usize,
        (b0, b1): (usize, usize),
        bias: Option<*const f32>,
        out: *mut f32,
        m: usize,
    ) {
        let nb = k / QK;
        // SAFETY: the caller checked the panel and activation sizes for steps c0..c0+N.
        unsafe {
            let wa = pair.as_ptr();
            let wb = wa.add(nb * PANEL_BLOCK);
            let xq = x.q.as_ptr().add(c0 * k);
            let xd = x.d.as_ptr().add(c0 * nb);
            let bias128 = _mm512_set1_epi8(0x80u8 as i8);
            let mut acc = [_mm512_setzero_ps(); N];
            for b in b0..b1 {
                let (ba, bb) = (wa.add(b * PANEL_BLOCK), wb.add(b * PANEL_BLOCK));
                let dw = _mm512_cvtph_ps(_mm256_set_m128i(
                    _mm_loadu_si128(bb.cast()),
                    _mm_loadu_si128(ba.cast()),
                ));
                let mut w = [_mm512_setzero_si512(); QK / 4];
                let mut corr = _mm512_setzero_si512();
                for q in 0..QK / 8 {
                    let ra = _mm512_loadu_si512(ba.add(2 * PANEL + q * 8 * PANEL).cast());
                    let rb = _mm512_loadu_si512(bb.add(2 * PANEL + q * 8 * PANEL).cast());
                    // Group 2q of both panels, then group 2q + 1.
                    w[2 * q] = _mm512_inserti64x4::<1>(ra, _mm512_castsi512_si256(rb));
                    w[2 * q + 1] = _mm512_shuffle_i64x2::<0xEE>(ra, rb);
                    corr = _mm512_dpbusd_epi32(corr, bias128, w[2 * q]);
                    corr = _mm512_dpbusd_epi32(corr, bias128, w[2 * q + 1]);
                }
                let start = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
                for (j, a) in acc.iter_mut().enumerate() {
                    let xp = xq.add(j * k + b * QK);
                    let mut sum = start;
                    for (g, &wg) in w.iter().enumerate() {
                        let xv = xp.add(g * 4).cast::<i32>().read_unaligned();
                        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi32(xv), wg);
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xd.add(j * nb + b)));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, *a);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                // The first pass over the blocks adds the bias, later ones what is there.
                let v = match bias {
                    _ if b0 > 0 => _mm512_add_ps(*a, _mm512_loadu_ps(out.add(j * m))),
                    Some(bp) => _mm512_add_ps(*a, _mm512_loadu_ps(bp)),
                    None => *a,
                };
                _mm512_storeu_ps(out.add(j * m), v);
            }
        }
    }

    /// 8 rows x `N` steps starting at step `c0`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const N: usize>(
        panel: &[u8],
        k: usize,
        x: Cols,
        c0: usize,
        (b0, b1): (usize, usize),
        bias: Option<*const f32>,
        out: *mut f32,
        m: usize,
    ) {
        let nb = k / QK;
        // SAFETY: the caller checked the panel and activation sizes for steps c0..c0+N.
        unsafe {
            let wp = panel.as_ptr();
            let xq = x.q.as_ptr().add(c0 * k);
            let xd = x.d.as_ptr().add(c0 * nb);
            // Lane 2r + h takes row r of group h, found at lane 8h + r of the load.
            let to_rows = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
            let pair_scales = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            let bias128 = _mm512_set1_epi8(0x80u8 as i8);
            let mut acc = [_mm512_setzero_ps(); N];
            for b in b0..b1 {
                let blk = wp.add(b * PANEL_BLOCK);
                let dw8 = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
                let dw = _mm512_permutexvar_ps(pair_scales, _mm512_castps256_ps512(dw8));
                let mut w = [_mm512_setzero_si512(); QK / 8];
                let mut corr = _mm512_setzero_si512();
                for (q, wq) in w.iter_mut().enumerate() {
                    let raw = _mm512_loadu_si512(blk.add(2 * PANEL + q * 8 * PANEL).cast());
                    *wq = _mm512_permutexvar_epi32(to_rows, raw);
                    corr = _mm512_dpbusd_epi32(corr, bias128, *wq);
                }
                // Every column's sums start at -128 * sum(w): what the bias added.
                let start = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
                // Column by column, so that each column's broadcasts are used at once (loading
                // them all first spills registers).
                for (j, a) in acc.iter_mut().enumerate() {
                    let xp = xq.add(j * k + b * QK);
                    let mut sum = start;
                    for (q, &wq) in w.iter().enumerate() {
                        let xv = xp.add(q * 8).cast::<i64>().read_unaligned();
                        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi64(xv), wq);
                    }
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xd.add(j * nb + b)));
                    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, *a);
                }
            }
            // Even lanes (group 0 of each row) and odd lanes into the two halves, then add.
            let split = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
            for (j, a) in acc.iter().enumerate() {
                let s = _mm512_permutexvar_ps(split, *a);
                let rows = _mm256_add_ps(
                    _mm512_castps512_ps256(s),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s))),
                );
                // The first pass over the blocks adds the bias, later ones what is there.
                let v = match bias {
                    _ if b0 > 0 => _mm256_add_ps(rows, _mm256_loadu_ps(out.add(j * m))),
                    Some(bp) => _mm256_add_ps(rows, _mm256_loadu_ps(bp)),
                    None => rows,
                };
                _mm256_storeu_ps(out.add(j * m), v);
            }
        }
    }
}

/// `w^T x (+ bias)` for a `q8_0x8` weight `w` ([k, m]) and f32 `x` ([k, n]) -> [m, n], on
/// `threads` threads split exactly as inside a ggml graph. For tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn gemm_q8_0x8(
    kernel: Kernel,
    w: &[u8],
    k: usize,
    m: usize,
    x: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    threads: usize,
) -> Vec<f32> {
    assert!(can_repack(&[k, m]) && w.len() == m * k / QK * Q8_BLOCK);
    assert!(x.len() == k * n && bias.is_none_or(|b| b.len() == m));
    assert!(Kernel::available().contains(&kernel));
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
            let mine = super::thread_share(m / PANEL, ith, nth);
            // SAFETY: out has n * m values; each thread writes only the rows of its panels.
            s.spawn(move || unsafe {
                gemm_panels(
                    kernel,
                    w,
                    k,
                    m,
                    (mine.start, mine.end),
                    cols,
                    n,
                    bias,
                    dst.0,
                )
            });
        }
    });
    out
}

/// Bytes of `n` quantized steps of `k` inputs as the [`quantize_op`] stores them: all quants
/// (`padded * k`), then all block scales (f32), both for the [`STEP_PAD`]-padded steps.
fn quantized_bytes(k: usize, n: usize) -> usize {
    let padded = n.next_multiple_of(STEP_PAD);
    padded * k + padded * (k / QK) * 4
}

/// A graph node quantizing `x` (contiguous f32 [k, n], k a multiple of 32) for the int8 GEMM,
/// once for every linear that reads `x` and split over the threads by steps (each GEMM thread
/// needs all of them). With `silu`, what it quantizes is `silu(x)`.
///
/// # Safety
/// `ctx` is a live context and `x` a contiguous f32 [k, n] tensor of it.
pub(super) unsafe fn quantize_node(
    ctx: *mut sys::ggml_context,
    x: *mut sys::ggml_tensor,
    silu: bool,
) -> *mut sys::ggml_tensor {
    // SAFETY: per the contract.
    unsafe {
        let (k, n) = ((*x).ne[0] as usize, (*x).ne[1] as usize);
        let mut args = [x];
        sys::ggml_custom_4d(
            ctx,
            sys::GGML_TYPE_I8,
            quantized_bytes(k, n) as i64,
            1,
            1,
            1,
            args.as_mut_ptr(),
            1,
            Some(quantize_op),
            -1, // every thread of the backend
            super::flag(silu),
        )
    }
}

/// A graph node `[m, n] = w^T x (+ bias)` over the output of [`quantize_node`], then the
/// node's residual ([`GemmNode`](super::sgemm::GemmNode)), the threads claiming panels of rows from `queue`
/// ([`PanelQueue`](super::sgemm::PanelQueue)).
///
/// # Safety
/// `args` are `w`, a `q8_0x8` weight [k, m] (q8_0 type), `xq`, the [`quantize_node`] of an f32
/// [k, n], then an f32 bias [m] and an f32 residual [m, n] (contiguous) where `queue`'s
/// [`GemmNode`](super::sgemm::GemmNode) says so; that node's counter is zero, and it outlives
/// the graph's compute.
pub(super) unsafe fn linear_node(
    ctx: *mut sys::ggml_context,
    args: &mut [*mut sys::ggml_tensor],
    n: usize,
    queue: *mut std::ffi::c_void,
) -> *mut sys::ggml_tensor {
    // SAFETY: per the contract.
    unsafe {
        sys::ggml_custom_4d(
            ctx,
            sys::GGML_TYPE_F32,
            (*args[0]).ne[1],
            n as i64,
            1,
            1,
            args.as_mut_ptr(),
            args.len() as std::os::raw::c_int,
            Some(linear_op),
            -1,
            queue,
        )
    }
}

/// ggml custom-op body of [`quantize_node`]: this thread's share of the steps.
///
/// # Safety
/// Called by ggml on a tensor built by [`quantize_node`], allocated; a non-null userdata asks
/// for SiLU first.
unsafe extern "C" fn quantize_op(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    silu: *mut std::os::raw::c_void,
) {
    // SAFETY: per the contract: src[0] is a contiguous f32 [k, n], dst holds
    // quantized_bytes(k, n) (the scales start at padded * k, 4-aligned as k is a multiple of 32).
    unsafe {
        let d = &*dst;
        let x = &*d.src[0];
        let (k, n) = (x.ne[0] as usize, x.ne[1] as usize);
        let nb = k / QK;
        let padded = n.next_multiple_of(STEP_PAD);
        let base = d.data as *mut u8;
        let scales = base.add(padded * k) as *mut f32;
        let kernel = Kernel::for_steps(n);
        if ith + 1 == nth && padded > n {
            // The padding steps' quants: after the last step, or inside each block of the last
            // tile; the threads quantizing the real steps there write other bytes.
            if reads_tiles(kernel) {
                for b in 0..nb {
                    let at = quants_at(kernel, k, n, b);
                    std::ptr::write_bytes(base.add(at), 0, (padded - n) * QK);
                    std::ptr::write_bytes(scales.add(at / QK), 0, padded - n);
                }
            } else {
                std::ptr::write_bytes(base.add(n * k), 0, (padded - n) * k);
                std::ptr::write_bytes(scales.add(n * nb), 0, (padded - n) * nb);
            }
        }
        let mine = super::thread_share(n, ith as usize, nth as usize);
        if mine.is_empty() {
            return;
        }
        let xs =
            std::slice::from_raw_parts((x.data as *const f32).add(mine.start * k), mine.len() * k);
        quantize_cols(kernel, xs, (k, mine.start), (base, scales), !silu.is_null());
    }
}

/// ggml custom-op body of [`linear_node`]: the panels of rows this thread claims from the
/// node's queue, every step.
///
/// # Safety
/// Called by ggml on a tensor built by [`linear_node`]: src[0] = w (`q8_0x8`, [k, m]), src[1] =
/// the quantized steps, then the f32 bias [m] and residual [m, n] the node's `GemmNode`
/// (`queue`) lists; dst contiguous f32 [m, n]; all allocated.
unsafe extern "C" fn linear_op(
    dst: *mut sys::ggml_tensor,
    _ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    queue: *mut std::os::raw::c_void,
) {
    // SAFETY: per the contract.
    unsafe {
        let d = &*dst;
        let (w, xq) = (&*d.src[0], &*d.src[1]);
        let (k, m, n) = (w.ne[0] as usize, w.ne[1] as usize, d.ne[1] as usize);
        let nb = k / QK;
        let node = &*(queue as *const super::sgemm::GemmNode);
        let (bias, residual) = super::graph::optional_sources(d, node);
        let queue = super::sgemm::PanelQueue {
            next: &node.next,
            panels: m / PANEL,
            threads: nth as usize,
        };
        let wb = std::slice::from_raw_parts(w.data as *const u8, m * nb * Q8_BLOCK);
        let base = xq.data as *const u8;
        let padded = n.next_multiple_of(STEP_PAD);
        let cols = Cols {
            q: std::slice::from_raw_parts(base, padded * k),
            d: std::slice::from_raw_parts(base.add(padded * k) as *const f32, padded * nb),
        };
        let bias = (!bias.is_null()).then(|| std::slice::from_raw_parts(bias, m));
        while let Some(mine) = queue.claim() {
            gemm_panels(
                Kernel::for_steps(n),
                wb,
                k,
                m,
                (mine.start, mine.end),
                cols,
                n,
                bias,
                d.data as *mut f32,
            );
            node.finish_panels(d.data as *mut f32, residual, (m, n), (mine, PANEL));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DType;
    use crate::backend::gguf::quantize_rows;

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

    fn dequant_plain(plain: &[u8], k: usize, m: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(k * m);
        for blk in plain.chunks_exact(Q8_BLOCK) {
            let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]])) as f64;
            out.extend(blk[2..].iter().map(|&q| d * (q as i8) as f64));
        }
        out
    }

    #[test]
    fn repack_round_trips() {
        let (k, m) = (96, 24);
        let plain = quantize_rows(&values(k * m, 1), k, DType::Q8_0).unwrap();
        let packed = repack_q8_0x8(&plain, k, m);
        assert_ne!(packed, plain);
        assert_eq!(unpack_q8_0x8(&packed, k, m), plain);
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
            let w = values(k * m, k as u64);
            let x = values(k * n, n as u64 + 7);
            let bias = values(m, 3);
            let plain = quantize_rows(&w, k, DType::Q8_0).unwrap();
            let wq = dequant_plain(&plain, k, m);
            let packed = repack_q8_0x8(&plain, k, m);
            let mut xq = QuantizedCols::default();
            xq.quantize(Kernel::Portable, &x, k, n);
            for kernel in Kernel::available() {
                for threads in 1..=3 {
                    let got = gemm_q8_0x8(kernel, &packed, k, m, &x, n, Some(&bias), threads);
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
                            let what = format!("{kernel:?} k{k} m{m} n{n} t{threads} [{r},{c}]");
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

    /// The custom op inside a real ggml graph (ggml's threads, 1-3 of them) against ggml's own
    /// q8_0 `ggml_mul_mat` on the same weights. Both quantize the activations the same way and
    /// sum the same integer products, in another order and ggml partly in f16 (its AVX2 q8_0
    /// dot product keeps the products of scales as f32 of f16s): stated bound per output
    /// `1e-4 * sum_i |w_i| * d_x(i) + 1e-5`, about 1/10000 of one activation step summed over
    /// the row, i.e. f32 rounding of the sums.
    #[test]
    fn custom_op_matches_ggml_q8_0_mul_mat() {
        let (k, m, n) = (256, 40, 11);
        let w = values(k * m, 11);
        let x = values(k * n, 12);
        let residual = values(m * n, 13);
        let plain = quantize_rows(&w, k, DType::Q8_0).unwrap();
        let packed = repack_q8_0x8(&plain, k, m);
        let wq = dequant_plain(&plain, k, m);
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
                    let t = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_Q8_0, k as i64, m as i64);
                    std::ptr::copy_nonoverlapping(data.as_ptr(), (*t).data as *mut u8, data.len());
                    t
                };
                let (w_plain, w_packed) = (wt(&plain), wt(&packed));
                let xt = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, k as i64, n as i64);
                std::ptr::copy_nonoverlapping(x.as_ptr(), (*xt).data as *mut f32, x.len());
                let theirs = sys::ggml_mul_mat(ctx, w_plain, xt);
                let xq = quantize_node(ctx, xt, false);
                // The node with SiLU first: the quantization of silu(x).
                let xq_silu = quantize_node(ctx, xt, true);
                let queue = crate::backend::sgemm::GemmNode::default();
                let queue_ptr = &queue as *const _ as *mut std::ffi::c_void;
                let ours = linear_node(ctx, &mut [w_packed, xq], n, queue_ptr);
                // The same product with a residual added in the node: `r + 0.5 * ours`.
                let rt = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, m as i64, n as i64);
                std::ptr::copy_nonoverlapping(residual.as_ptr(), (*rt).data as *mut f32, m * n);
                let with_residual = crate::backend::sgemm::GemmNode {
                    residual: Some(0.5),
                    ..Default::default()
                };
                let node_ptr = &with_residual as *const _ as *mut std::ffi::c_void;
                let finished = linear_node(ctx, &mut [w_packed, xq, rt], n, node_ptr);
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
                crate::backend::vmath::silu_in_place(&mut activated);
                let mut want = QuantizedCols::default();
                want.quantize(Kernel::for_steps(n), &activated, k, n);
                let bytes = std::slice::from_raw_parts((*xq_silu).data as *const u8, want.q.len());
                assert!(bytes == &want.q[..], "t{threads}: silu quants");
                let scales = std::slice::from_raw_parts(
                    ((*xq_silu).data as *const u8).add(want.q.len()) as *const f32,
                    want.d.len(),
                );
                assert!(scales == &want.d[..], "t{threads}: silu scales");
                sys::ggml_free(ctx);
                for (i, (&f, &o)) in finished.iter().zip(&r.0).enumerate() {
                    assert_eq!(f, residual[i] + o * 0.5, "t{threads} residual at {i}");
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
                        "t{threads} [{r},{c}]: ours {} ggml {} (bound {bound})",
                        ours[c * m + r],
                        theirs[c * m + r]
                    );
                }
            }
            println!("threads {threads}: worst |ours - ggml| / bound = {worst:.3}");
        }
    }
}
