//! The same panels with AVX-512 VNNI. `vpdpbusd` multiplies unsigned by signed bytes, so the
//! activations come biased by +128 and each block subtracts `128 * sum(w)`, which one more
//! `vpdpbusd` per weight load computes for every column at once.
//!
//! A 64-byte load holds two 4-byte groups of the panel's 8 rows (`[group][row]`). Panels go in
//! pairs: the same group of both panels makes one register of 16 rows (one shuffle per load),
//! a 4-byte broadcast of the activations feeds it, and each block's sum is scaled once per row
//! per 8 `vpdpbusd` (the scaling, not the products, bounds this kernel: 10 % faster than single
//! panels). A last odd panel permutes each load into `[row][group]` (lane `2r + h` = row `r`,
//! group `h`) for an 8-byte broadcast, and sums a row's two lanes after the last block.
//!
//! With `Q4` the weights are `q4_0x8`: [`quant_loads`] unpacks two 64-byte registers from
//! each 64-byte load of nibbles, the rest is the same.

use super::{Cols, Epilogue, PANEL, QK, panel_block};
use std::arch::x86_64::*;

/// Columns per register tile: one accumulator each, plus about 10 shared registers.
const NC: usize = 16;

/// Blocks of 32 inputs per pass: a 16-step tile's activations (16 KB) stay in L1 also for
/// the 4096-wide inputs of the feed-forward's second linear.
const K_BLOCKS: usize = 32;

/// Panels per group: a group's weights (16 x 8 rows, 140-560 KB at the encoder's widths)
/// stay in L2 while each column tile's activations, read from L1, meet all of them.
const GROUP: usize = 16;

/// Panels `p0..p1` of the whole `q8_0x8` (with `Q4`, `q4_0x8`) matrix `w`, every step: per
/// group of panels, column tile by column tile. Whole-line results are stored non-temporally
/// (visible to other threads once this returns).
///
/// # Safety
/// AVX-512 F/BW/VNNI and F16C available; the activations were quantized for this kernel;
/// the extents checked by `gemm_panels`; `out` holds `n` steps of `m` rows (step stride
/// `m`) and the rows of these panels are ours alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panels<const Q4: bool>(
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
    let mut g0 = p0;
    while g0 < p1 {
        let group = (g0, (g0 + GROUP).min(p1));
        let mut b0 = 0;
        while b0 < nb {
            let blocks = (b0, (b0 + K_BLOCKS).min(nb));
            let mut c = 0;
            // SAFETY: sizes asserted above; out per the contract.
            unsafe {
                // Non-temporal stores in the last pass, for a node of a tile of steps or more
                // (a decoder's single step reads its result at once).
                let stream = blocks.1 == nb && n >= NC;
                let span = Span {
                    group,
                    blocks,
                    stream,
                };
                while c + NC <= n {
                    tiles::<NC, Q4>(w, k, m, span, x, c, (bias, epilogue), out);
                    c += NC;
                }
                if n - c >= 8 {
                    tiles::<8, Q4>(w, k, m, span, x, c, (bias, epilogue), out);
                    c += 8;
                }
                match n - c {
                    7 => tiles::<7, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    6 => tiles::<6, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    5 => tiles::<5, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    4 => tiles::<4, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    3 => tiles::<3, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    2 => tiles::<2, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    1 => tiles::<1, Q4>(w, k, m, span, x, c, (bias, epilogue), out),
                    _ => {}
                }
            }
            b0 = blocks.1;
        }
        g0 = group.1;
    }
    // The non-temporal stores are weakly ordered: done before the node's threads meet.
    _mm_sfence();
}

/// A panel block's quants (`blk` at its scales) as four registers of signed bytes, register
/// `q` holding groups `2q` and `2q + 1` of the 8 rows (`[group][row]`, 4 bytes each): the
/// `q8_0x8` bytes as they are, or with `Q4` the `q4_0x8` nibbles of two loads (low nibbles:
/// groups 0-3, high: 4-7) minus their offset of 8.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn quant_loads<const Q4: bool>(blk: *const u8) -> [__m512i; 4] {
    // SAFETY: the caller's block holds its scales and quants after blk.
    unsafe {
        let quants = blk.add(2 * PANEL);
        let first = _mm512_loadu_si512(quants.cast());
        let second = _mm512_loadu_si512(quants.add(8 * PANEL).cast());
        if !Q4 {
            let third = _mm512_loadu_si512(quants.add(16 * PANEL).cast());
            let fourth = _mm512_loadu_si512(quants.add(24 * PANEL).cast());
            return [first, second, third, fourth];
        }
        let nibble = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let (first_hi, second_hi) = (
            _mm512_srli_epi16::<4>(first),
            _mm512_srli_epi16::<4>(second),
        );
        [
            _mm512_sub_epi8(_mm512_and_si512(first, nibble), eight),
            _mm512_sub_epi8(_mm512_and_si512(second, nibble), eight),
            _mm512_sub_epi8(_mm512_and_si512(first_hi, nibble), eight),
            _mm512_sub_epi8(_mm512_and_si512(second_hi, nibble), eight),
        ]
    }
}

/// The panels and the blocks of 32 inputs one pass covers, and whether it stores its results
/// non-temporally (see [`pair_tile`]).
#[derive(Clone, Copy)]
struct Span {
    group: (usize, usize),
    blocks: (usize, usize),
    stream: bool,
}

/// [`Epilogue`] on sixteen rows, `at` floats from the tile's first output (and residual).
#[target_feature(enable = "avx512f")]
#[inline]
fn finish16(v: __m512, e: Epilogue, at: usize) -> __m512 {
    let v = if e.relu {
        _mm512_max_ps(v, _mm512_setzero_ps())
    } else {
        v
    };
    match e.residual {
        // SAFETY: the residual has the output's layout (the caller's contract).
        Some((r, scale)) => unsafe {
            let r = _mm512_loadu_ps(r.add(at));
            if scale == 1.0 {
                _mm512_add_ps(v, r)
            } else {
                _mm512_add_ps(r, _mm512_mul_ps(v, _mm512_set1_ps(scale)))
            }
        },
        None => v,
    }
}

/// [`finish16`] on eight rows.
#[target_feature(enable = "avx2")]
#[inline]
fn finish8(v: __m256, e: Epilogue, at: usize) -> __m256 {
    let v = if e.relu {
        _mm256_max_ps(v, _mm256_setzero_ps())
    } else {
        v
    };
    match e.residual {
        // SAFETY: the residual has the output's layout (the caller's contract).
        Some((r, scale)) => unsafe {
            let r = _mm256_loadu_ps(r.add(at));
            if scale == 1.0 {
                _mm256_add_ps(v, r)
            } else {
                _mm256_add_ps(r, _mm256_mul_ps(v, _mm256_set1_ps(scale)))
            }
        },
        None => v,
    }
}

/// Steps `c..c + N` of every panel of the span, over its blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<const N: usize, const Q4: bool>(
    w: &[u8],
    k: usize,
    m: usize,
    span: Span,
    x: Cols,
    c: usize,
    (bias, epilogue): (Option<&[f32]>, Epilogue),
    out: *mut f32,
) {
    let size = k / QK * panel_block::<Q4>();
    let mut p = span.group.0;
    // Panels in pairs (16 rows, one lane per row), a last odd one on its own.
    while p < span.group.1 {
        let bias = bias.map(|b| b[p * PANEL..].as_ptr());
        // SAFETY: per panels' contract.
        unsafe {
            let out = out.add(c * m + p * PANEL);
            let residual = epilogue
                .residual
                .map(|(r, s)| (r.add(c * m + p * PANEL), s));
            let bias = (
                bias,
                Epilogue {
                    residual,
                    ..epilogue
                },
            );
            if p + 1 < span.group.1 {
                let pair = &w[p * size..][..2 * size];
                let blocks = (span.blocks, span.stream);
                pair_tile::<N, Q4>(pair, k, x, c, blocks, bias, out, m);
                p += 2;
            } else {
                let panel = &w[p * size..][..size];
                tile::<N, Q4>(panel, k, x, c, span.blocks, bias, out, m);
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
unsafe fn pair_tile<const N: usize, const Q4: bool>(
    pair: &[u8],
    k: usize,
    x: Cols,
    c0: usize,
    ((b0, b1), stream): ((usize, usize), bool),
    (bias, epilogue): (Option<*const f32>, Epilogue),
    out: *mut f32,
    m: usize,
) {
    let nb = k / QK;
    // SAFETY: the caller checked the panel and activation sizes for steps c0..c0+N.
    unsafe {
        let wa = pair.as_ptr();
        let wb = wa.add(nb * panel_block::<Q4>());
        let xq = x.q.as_ptr().add(c0 * k);
        let xd = x.d.as_ptr().add(c0 * nb);
        let bias128 = _mm512_set1_epi8(0x80u8 as i8);
        let mut acc = [_mm512_setzero_ps(); N];
        for b in b0..b1 {
            let (ba, bb) = (
                wa.add(b * panel_block::<Q4>()),
                wb.add(b * panel_block::<Q4>()),
            );
            let dw = _mm512_cvtph_ps(_mm256_set_m128i(
                _mm_loadu_si128(bb.cast()),
                _mm_loadu_si128(ba.cast()),
            ));
            let mut w = [_mm512_setzero_si512(); QK / 4];
            let mut corr = _mm512_setzero_si512();
            let (la, lb) = (quant_loads::<Q4>(ba), quant_loads::<Q4>(bb));
            for q in 0..QK / 8 {
                let (ra, rb) = (la[q], lb[q]);
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
        // With `stream` (the last pass of a node of many steps) the stores write whole 64-byte
        // lines that are not in cache (a node's output is megabytes): non-temporal stores skip
        // reading each line in first. 7-11 % off the q8_0 encoders (0.6b, 110m, Sortformer)
        // from 3 s to 66 s on AMD Zen 5; `panels` fences.
        let stream = stream && m.is_multiple_of(16) && (out as usize).is_multiple_of(64);
        for (j, a) in acc.iter().enumerate() {
            // The first pass over the blocks adds the bias, later ones what is there.
            let v = match bias {
                _ if b0 > 0 => _mm512_add_ps(*a, _mm512_loadu_ps(out.add(j * m))),
                Some(bp) => _mm512_add_ps(*a, _mm512_loadu_ps(bp)),
                None => *a,
            };
            // The last pass finishes the output.
            let v = if b1 == nb {
                finish16(v, epilogue, j * m)
            } else {
                v
            };
            if stream {
                _mm512_stream_ps(out.add(j * m), v);
            } else {
                _mm512_storeu_ps(out.add(j * m), v);
            }
        }
    }
}

/// 8 rows x `N` steps starting at step `c0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const N: usize, const Q4: bool>(
    panel: &[u8],
    k: usize,
    x: Cols,
    c0: usize,
    (b0, b1): (usize, usize),
    (bias, epilogue): (Option<*const f32>, Epilogue),
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
            let blk = wp.add(b * panel_block::<Q4>());
            let dw8 = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
            let dw = _mm512_permutexvar_ps(pair_scales, _mm512_castps256_ps512(dw8));
            let mut w = [_mm512_setzero_si512(); QK / 8];
            let mut corr = _mm512_setzero_si512();
            let loads = quant_loads::<Q4>(blk);
            for (wq, &raw) in w.iter_mut().zip(&loads) {
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
            // The last pass finishes the output.
            let v = if b1 == nb {
                finish8(v, epilogue, j * m)
            } else {
                v
            };
            _mm256_storeu_ps(out.add(j * m), v);
        }
    }
}
