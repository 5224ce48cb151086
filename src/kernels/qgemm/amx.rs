//! The int8 GEMM on Intel AMX tiles (`tdpbssd`), over the same `q8_0x8` weights.
//!
//! A q8_0x8 panel block is already in the layout AMX wants for its second operand: group `g`
//! holds 4 consecutive quants of each of the panel's 8 rows, so the block's 8 groups are a
//! tile of 8 rows x 32 bytes (stride 32). The activations are the first operand as the
//! quantizer lays them out for this kernel: 16 steps x the block's 32 quants, 512 contiguous
//! bytes (`super::quantize::quants_at`), signed as for the AVX2 kernel. One `tdpbssd` then gives
//! the 16 x 8 integer sums of a block for a panel; two panels' sums are stored side by side, so
//! each step's 16 rows are one register that the block's weight and activation scales multiply
//! into the f32 accumulators. The per-block scaling, on the vector units, and the tile
//! multiplies, on the AMX unit, run side by side. (Measured: a `tdpbssd` costs ~19 cycles
//! whatever its K and N, so this quarter-size product per block and panel, which q8_0's
//! per-32 scales impose on the `q8_0x8` layout, leaves most of the unit idle.)
//!
//! Steps are taken 16 at a time; the quantized activations are padded to a multiple of 16 steps
//! with zeros ([`super::STEP_PAD`]), so the last tile reads zeros and only its real steps are
//! stored.
//!
//! Tile registers: tmm0 activations, tmm1/tmm2 the two panels' weights, tmm3/tmm4 their sums
//! for even blocks and tmm5/tmm6 for odd ones: a block's sums are stored and scaled while the
//! next block's products run (a tile store read back at once stalls for its whole latency).

use super::{Cols, PANEL, QK, STEP_PAD, panel_block};

/// Bytes of a `q8_0x8` panel block (the only format this kernel reads).
const PANEL_BLOCK: usize = panel_block::<false>();
use std::arch::asm;
use std::arch::x86_64::*;

/// Steps per tile: the rows of the activation and sum tiles.
const ROWS: usize = 16;
const _: () = assert!(STEP_PAD == ROWS);

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn gemm() -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        // tmm0: 16 steps x one block's 32 quants.
        c.bytes_per_row[0] = QK as u16;
        c.rows[0] = ROWS as u8;
        // tmm1, tmm2: a panel block's 8 groups of (8 rows x 4 quants).
        for t in [1, 2] {
            c.bytes_per_row[t] = (4 * PANEL) as u16;
            c.rows[t] = (QK / 4) as u8;
        }
        // tmm3, tmm4 and tmm5, tmm6: 16 steps x 8 rows of i32 sums, two blocks in flight.
        for t in [3, 4, 5, 6] {
            c.bytes_per_row[t] = (4 * PANEL) as u16;
            c.rows[t] = ROWS as u8;
        }
        c
    }
}

/// The integer sums of two blocks' tiles (even, odd), two panels side by side: step `t`'s 16
/// rows at `t * 16`.
#[repr(C, align(64))]
struct Sums([i32; 2 * ROWS * 2 * PANEL]);

/// Panels `p0..p1` of the whole `q8_0x8` matrix `w`, every step (as `vnni::panels`).
///
/// # Safety
/// The CPU runs `Kernel::Amx` (`crate::kernels::cpu`); the activations were quantized signed,
/// in tiles, and padded to [`STEP_PAD`] steps; the extents checked by `gemm_panels`; `out`
/// holds `n` steps of `m` rows (step stride `m`) and the rows of these panels are ours.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
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
    let config = TileConfig::gemm();
    let mut sums = Sums([0; 2 * ROWS * 2 * PANEL]);
    // SAFETY: AMX is usable (the contract); the configuration is a valid palette-1 one.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly)) };
    let mut p = p0;
    while p < p1 {
        // A last odd panel runs as a pair with itself and stores half.
        let pair = p + 1 < p1;
        let mut c = 0;
        while c < n {
            // SAFETY: sizes asserted above; out per the contract.
            unsafe {
                tile(
                    w,
                    k,
                    (p, pair),
                    x,
                    (c, ROWS.min(n - c)),
                    bias,
                    out.add(c * m + p * PANEL),
                    m,
                    &mut sums,
                )
            };
            c += ROWS;
        }
        p += if pair { 2 } else { 1 };
    }
    // SAFETY: releases the tile state this call configured.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Steps `c0..c0 + steps` of panel `p` (and `p + 1` when `pair`) over every block.
///
/// # Safety
/// As [`panels`], with the tiles configured by [`TileConfig::gemm`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    w: &[u8],
    k: usize,
    (p, pair): (usize, bool),
    x: Cols,
    (c0, steps): (usize, usize),
    bias: Option<&[f32]>,
    out: *mut f32,
    m: usize,
    sums: &mut Sums,
) {
    let nb = k / QK;
    // SAFETY: the caller checked the panel and (padded) activation sizes.
    unsafe {
        let wa = w.as_ptr().add(p * nb * PANEL_BLOCK);
        let wb = if pair { wa.add(nb * PANEL_BLOCK) } else { wa };
        let xq = x.q.as_ptr().add(c0 * k);
        // The block's 16 step scales side by side (`quants_at`).
        let xd = x.d.as_ptr().add(c0 * nb);
        let s = sums.0.as_mut_ptr();
        let mut acc = [_mm512_setzero_ps(); ROWS];
        // A block of the 16 steps is one 512-byte tile (`quants_at`).
        let (lda, ldw) = (QK, 4 * PANEL);
        let operands = |b: usize| {
            (
                xq.add(b * ROWS * QK),
                wa.add(b * PANEL_BLOCK + 2 * PANEL),
                wb.add(b * PANEL_BLOCK + 2 * PANEL),
            )
        };
        // Block b's products, block b - 1's sums stored, block b - 2's sums scaled: a tile
        // store read back at once stalls for its whole latency.
        let scale = |acc: &mut [__m512; ROWS], b: usize| {
            let sb = s.add((b % 2) * ROWS * 2 * PANEL);
            let (ba, bb) = (wa.add(b * PANEL_BLOCK), wb.add(b * PANEL_BLOCK));
            let dw = _mm512_cvtph_ps(_mm256_set_m128i(
                _mm_loadu_si128(bb.cast()),
                _mm_loadu_si128(ba.cast()),
            ));
            let xdb = xd.add(b * ROWS);
            for (t, a) in acc.iter_mut().enumerate() {
                let v = _mm512_cvtepi32_ps(_mm512_load_si512(sb.add(t * 2 * PANEL).cast()));
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*xdb.add(t)));
                *a = _mm512_fmadd_ps(v, scale, *a);
            }
        };
        for b in 0..nb + 2 {
            if b < nb {
                let (xb, wab, wbb) = operands(b);
                if b % 2 == 0 {
                    multiply::<0>(xb, lda, wab, wbb, ldw);
                } else {
                    multiply::<1>(xb, lda, wab, wbb, ldw);
                }
            }
            if (1..=nb).contains(&b) {
                let done = b - 1;
                let sb = s.add((done % 2) * ROWS * 2 * PANEL);
                if done % 2 == 0 {
                    store::<0>(sb);
                } else {
                    store::<1>(sb);
                }
            }
            if b >= 2 {
                scale(&mut acc, b - 2);
            }
        }
        let mask: __mmask16 = if pair { 0xffff } else { 0x00ff };
        let bias = bias.map_or(_mm512_setzero_ps(), |b| {
            _mm512_maskz_loadu_ps(mask, b.as_ptr().add(p * PANEL))
        });
        for (t, a) in acc.iter().take(steps).enumerate() {
            _mm512_mask_storeu_ps(out.add(t * m), mask, _mm512_add_ps(*a, bias));
        }
    }
}

/// One block's products for both panels into sum set `SET` (0: tmm3/tmm4, 1: tmm5/tmm6).
///
/// # Safety
/// Tiles configured by [`TileConfig::gemm`]; `x` 16 rows of 32 quants at stride `ldx`, `wa`
/// and `wb` 8 rows of 32 bytes at stride `ldw`.
#[inline(always)]
unsafe fn multiply<const SET: usize>(
    x: *const u8,
    ldx: usize,
    wa: *const u8,
    wb: *const u8,
    ldw: usize,
) {
    // SAFETY: per the contract.
    unsafe {
        asm!(
            "tileloadd tmm0, [{x} + {ldx} * 1]",
            "tileloadd tmm1, [{wa} + {ldw} * 1]",
            "tileloadd tmm2, [{wb} + {ldw} * 1]",
            "tilezero tmm{sa}",
            "tilezero tmm{sb}",
            "tdpbssd tmm{sa}, tmm0, tmm1",
            "tdpbssd tmm{sb}, tmm0, tmm2",
            x = in(reg) x, ldx = in(reg) ldx, wa = in(reg) wa, wb = in(reg) wb,
            ldw = in(reg) ldw, sa = const 3 + 2 * SET, sb = const 4 + 2 * SET,
            options(nostack, readonly),
        );
    }
}

/// Stores sum set `SET` to `s`: step `t`'s 16 rows (both panels) at `s + 16 t`.
///
/// # Safety
/// `s` has room for [`Sums`]; tiles configured by [`TileConfig::gemm`].
#[inline(always)]
unsafe fn store<const SET: usize>(s: *mut i32) {
    let ld = 2 * PANEL * 4;
    // SAFETY: per the contract.
    unsafe {
        asm!(
            "tilestored [{a} + {ld} * 1], tmm{sa}",
            "tilestored [{b} + {ld} * 1], tmm{sb}",
            a = in(reg) s, b = in(reg) s.add(PANEL), ld = in(reg) ld,
            sa = const 3 + 2 * SET, sb = const 4 + 2 * SET, options(nostack),
        );
    }
}
