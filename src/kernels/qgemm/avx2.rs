//! The int8 GEMM's AVX2 kernels: a block's quantization and 8-row panels.

use super::{Cols, PANEL, QK, panel_block};
use std::arch::x86_64::*;

/// Columns per register tile: 4 f32 and 4 i32 accumulators plus the weights fit in 16 ymm.
const NC: usize = 4;

/// The AVX2 form of the quantize module's portable `quantize_block`; with `biased`, the quants
/// are stored +128 as unsigned bytes.
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
        let mut w8 = _mm256_permutevar8x32_epi32(w16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        if biased {
            w8 = _mm256_xor_si256(w8, _mm256_set1_epi8(0x80u8 as i8));
        }
        _mm256_storeu_si256(q.as_mut_ptr().cast(), w8);
        let d = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(amax / 127.0));
        _mm_cvtss_f32(_mm_cvtph_ps(d))
    }
}

/// One `q8_0x8` panel (with `Q4`, `q4_0x8`), every step.
///
/// # Safety
/// AVX2/FMA/F16C available; `out` holds 8 rows of `n` steps with step stride `m`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn panel<const Q4: bool>(
    panel: &[u8],
    k: usize,
    x: Cols,
    n: usize,
    bias: Option<&[f32]>,
    out: *mut f32,
    m: usize,
) {
    let nb = k / QK;
    assert!(panel.len() == nb * panel_block::<Q4>() && x.q.len() >= n * k && x.d.len() >= n * nb);
    let bias = bias.map(|b| {
        assert!(b.len() >= PANEL);
        b.as_ptr()
    });
    let mut c = 0;
    // SAFETY: sizes asserted above; out per the contract.
    unsafe {
        while c + NC <= n {
            tile::<NC, Q4>(panel, k, x, c, bias, out.add(c * m), m);
            c += NC;
        }
        match n - c {
            3 => tile::<3, Q4>(panel, k, x, c, bias, out.add(c * m), m),
            2 => tile::<2, Q4>(panel, k, x, c, bias, out.add(c * m), m),
            1 => tile::<1, Q4>(panel, k, x, c, bias, out.add(c * m), m),
            _ => {}
        }
    }
}

/// Group `g` (quants `4g..4g + 4`) of a panel block's 8 rows (`blk` at its scales) as signed
/// bytes: the `q8_0x8` bytes, or with `Q4` the low (groups 0-3) or high (4-7) `q4_0x8`
/// nibbles minus their offset of 8.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn quant_load<const Q4: bool>(blk: *const u8, g: usize) -> __m256i {
    // SAFETY: the caller's block holds its scales and quants after blk.
    unsafe {
        if !Q4 {
            return _mm256_loadu_si256(blk.add(2 * PANEL + g * 4 * PANEL).cast());
        }
        let v = _mm256_loadu_si256(blk.add(2 * PANEL + (g % 4) * 4 * PANEL).cast());
        let v = if g < 4 { v } else { _mm256_srli_epi16::<4>(v) };
        let nibbles = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
        _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8))
    }
}

/// 8 rows x `N` steps starting at step `c0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile<const N: usize, const Q4: bool>(
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
            let blk = wp.add(b * panel_block::<Q4>());
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
            let mut isum = [_mm256_setzero_si256(); N];
            for g in 0..QK / 4 {
                let w = quant_load::<Q4>(blk, g);
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
