//! f32 matrix products over weights packed once, at convert time, in the layout the kernel
//! streams ("panel16", docs/GGUF.md): the encoder's linears `y = x W^T` run here as two ggml
//! custom ops, one packing the (small) activations once for every thread and every linear that
//! reads them (`pack_activations`), one computing the panels that each thread claims from a
//! [`PanelQueue`](super::panel::PanelQueue).
//!
//! A torch Linear weight `W [m, k]` (ggml `ne [k, m]`, `m % 16 == 0`) is stored as `m / 16`
//! panels; panel `p` holds, for each input index `kk`, the 16 weights of output channels
//! `16p .. 16p + 16`: `packed[(p * k + kk) * 16 + r] = W[16p + r][kk]`. A micro-kernel keeps a
//! 16 x NR tile of the result in registers, reads its panel strictly sequentially and
//! broadcasts NR activations per step, so no per-call packing of the (large) weight is needed.
//!
//! The kernel is chosen at run time: AVX-512F, AVX2+FMA, or portable Rust that the compiler
//! vectorises for whatever target it builds (aarch64 included).

use super::cpu::Isa;
use super::panel::{GemmNode, relu_f32};
use crate::backend::custom::{Body, CustomOp};
use crate::layout::PANEL16_ROWS as PANEL;

/// Inner-dimension block: a 16 x KC panel slice (16 KiB) stays in L1 while it is reused for
/// every column tile of the block.
const KC: usize = 256;
/// Column block: KC x NC activations (192 KiB) stay in L2 while every panel streams past them.
const NC: usize = 192;

/// What the panel kernels need of an instruction set.
impl Isa {
    /// Whether the kernel has a 32-row tile over two neighbouring panels.
    fn pairs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Isa::Avx512 {
            return true;
        }
        false
    }

    /// Columns per register tile.
    fn nr(self) -> usize {
        match self {
            Isa::Portable => 4,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => 6,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 12,
        }
    }
}

/// Shapes of one product: `y [n][m] = x [n][k] · W^T`, W packed as `m / 16` panels.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// The (column block, inner block) pairs of a product, in the order the kernels walk them:
/// `(n0, nc, k0, kc)`.
fn blocks(d: Dims) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    (0..d.n).step_by(NC).flat_map(move |n0| {
        (0..d.k)
            .step_by(KC)
            .map(move |k0| (n0, NC.min(d.n - n0), k0, KC.min(d.k - k0)))
    })
}

/// `y = bias` (or 0), then ggml's relu with `relu`, for a product with `k = 0`.
///
/// # Safety
/// As [`gemm_panels`].
unsafe fn bias_only(
    bias: *const f32,
    relu: bool,
    y: *mut f32,
    d: Dims,
    panels: std::ops::Range<usize>,
) {
    for j in 0..d.n {
        for p in panels.clone() {
            for r in 0..PANEL {
                let b = if bias.is_null() {
                    0.0
                } else {
                    // SAFETY: bias holds m values per the contract.
                    unsafe { *bias.add(p * PANEL + r) }
                };
                // SAFETY: within y per the contract.
                unsafe { *y.add(j * d.m + p * PANEL + r) = if relu { relu_f32(b) } else { b } };
            }
        }
    }
}

/// Values of a product's activations packed by [`pack_activations`]: every block of
/// [`pack_block`]'s layout, block `(n0, k0)` at `n0 * k + k0 * nc`.
fn packed_activations_len(d: Dims) -> usize {
    d.n * d.k
}

/// Share `part` of `parts` of packing all of `x` (as [`gemm_panels`] reads it) into `out`, for
/// [`gemm_panels`]: the blocks are dealt round-robin.
///
/// # Safety
/// `x` holds `n * k` values; `out` has room for [`packed_activations_len`]; concurrent calls
/// take distinct parts.
///
/// With `silu`, the packed values are `silu(x)` (applied to each block as it is packed: the
/// packing only moves values, so this is the packing of `silu(x)` without a pass of its own).
pub(crate) unsafe fn pack_activations(
    isa: Isa,
    x: *const f32,
    d: Dims,
    (part, parts): (usize, usize),
    out: *mut f32,
    silu: bool,
) {
    for (i, (n0, nc, k0, kc)) in blocks(d).enumerate() {
        if i % parts == part {
            // SAFETY: each block's `nc * kc` values lie within out, disjoint between blocks.
            unsafe {
                let block = std::slice::from_raw_parts_mut(out.add(n0 * d.k + k0 * nc), nc * kc);
                pack_block(isa, x, d.k, (n0, nc), (k0, kc), isa.nr(), block);
                if silu {
                    super::vmath::silu_in_place(block);
                }
            }
        }
    }
}

/// Panels `panels` of the product, every column, with kernel `isa`, over activations packed by
/// [`pack_activations`] (with the same `isa`: one packing shared by every thread and by every
/// product reading the same input).
///
/// The activations are packed into column tiles, step-major (`[tile][kk][column]`), so that a
/// micro-kernel reads its NR broadcasts at fixed offsets of one pointer: reading them in place,
/// NR rows apart, made the compiler chain the address computations (one dependent add per
/// FMA), which halved the AVX-512 kernel's rate.
///
/// `then` is the range of panels the calling thread computes next (empty if none): the last
/// block's last pair fetches the weights of its first pair.
///
/// `bias` (null, or `m` values) is added in the last block's store: `(sum) + bias`, the order
/// of a separate add after the product; with `relu`, ggml's relu follows (`v > 0 ? v : 0`).
///
/// # Safety
/// `w` holds `m * k` packed values, `xp` the packed activations of `n` columns of `k` values,
/// `y` has room for `n * m` values (column `j` at `y + j * m`); the panel range is within
/// `m / 16`, and so is `then`; `isa` runs on this CPU. Concurrent calls must write disjoint
/// panel ranges.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_panels(
    isa: Isa,
    w: *const f32,
    xp: *const f32,
    bias: *const f32,
    y: *mut f32,
    d: Dims,
    panels: std::ops::Range<usize>,
    then: std::ops::Range<usize>,
    relu: bool,
) {
    if d.k == 0 {
        // SAFETY: per the contract.
        unsafe { bias_only(bias, relu, y, d, panels) };
        return;
    }
    for (n0, nc, k0, kc) in blocks(d) {
        // SAFETY: the packed block `(n0, k0)` per the contract.
        unsafe {
            let block = xp.add(n0 * d.k + k0 * nc);
            block_panels(
                isa,
                w,
                block,
                bias,
                y,
                d,
                (&panels, &then),
                (n0, nc),
                (k0, kc),
                relu,
            );
        }
    }
}

/// One (column block, inner block) of the product for `panels`: every pair (or single) panel
/// against every column tile of the packed `block`.
///
/// # Safety
/// As [`gemm_panels`]; `block` holds the packed `(n0, k0)` block.
#[allow(clippy::too_many_arguments)]
unsafe fn block_panels(
    isa: Isa,
    w: *const f32,
    block: *const f32,
    bias: *const f32,
    y: *mut f32,
    d: Dims,
    (panels, then): (&std::ops::Range<usize>, &std::ops::Range<usize>),
    (n0, nc): (usize, usize),
    (k0, kc): (usize, usize),
    relu: bool,
) {
    let nr = isa.nr();
    // Panels in pairs (32 rows) where the kernel has a pair tile.
    let step = if isa.pairs() { 2 } else { 1 };
    let first = k0 == 0;
    let last = k0 + kc == d.k;
    let mut p = panels.start;
    while p < panels.end {
        let pair = step == 2 && p + 1 < panels.end;
        // The slices the next pair of panels will read (this block's, the next block's
        // first pair, or the first pair of the thread's next range), fetched into L2 while
        // this pair computes; see [`Prefetch`].
        let next = if p + 2 < panels.end {
            Some((p + 2, panels.end, k0))
        } else if k0 + kc < d.k && KC.min(d.k - k0 - kc) == kc {
            Some((panels.start, panels.end, k0 + kc))
        } else if k0 + kc == d.k && n0 + nc == d.n && !then.is_empty() && KC.min(d.k) == kc {
            Some((then.start, then.end, 0))
        } else {
            None
        };
        let mut j = n0;
        while j < n0 + nc {
            let cols = nr.min(n0 + nc - j);
            // SAFETY: offsets stay within the extents in the contract; the tile's
            // activations are `cols * kc` values at `(j - n0) * kc` of the block.
            unsafe {
                let a = w.add((p * d.k + k0) * PANEL);
                let xb = block.add((j - n0) * kc);
                let yb = y.add(j * d.m + p * PANEL);
                let bias = if last && !bias.is_null() {
                    bias.add(p * PANEL)
                } else {
                    std::ptr::null()
                };
                let fetch = Prefetch::for_tiles(nc.div_ceil(nr));
                let prefetch = match next {
                    Some((np, end, nk0)) if pair => {
                        fetch.part((j - n0) / nr, kc, np, end).map(|(q, line)| {
                            w.add((q * d.k + nk0) * PANEL).cast::<u8>().add(line * 64)
                        })
                    }
                    _ => None,
                };
                let t = Tile {
                    a,
                    x: xb,
                    kc,
                    y: yb,
                    ldy: d.m,
                    first,
                    bias,
                    relu: relu && last,
                    prefetch: prefetch.unwrap_or(a.cast()),
                    prefetch_shift: fetch.shift,
                };
                if pair {
                    pair_tile(isa, cols, t, d.k * PANEL);
                } else {
                    tile(isa, cols, t);
                }
            }
            j += cols;
        }
        p += if pair { 2 } else { 1 };
    }
}

/// Copies columns `n0..n0 + nc`, inputs `k0..k0 + kc` of `x` into `block`: tile by tile of
/// `nr` columns (fewer in the last), each `[kk][column]`.
///
/// # Safety
/// `x` holds the columns `n0..n0 + nc` of `ldx` values each.
unsafe fn pack_block(
    isa: Isa,
    x: *const f32,
    ldx: usize,
    (n0, nc): (usize, usize),
    (k0, kc): (usize, usize),
    nr: usize,
    block: &mut [f32],
) {
    let mut t0 = 0;
    while t0 < nc {
        let cols = nr.min(nc - t0);
        let dst = &mut block[t0 * kc..][..cols * kc];
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 && cols <= 16 && (cols - 1) * ldx <= i32::MAX as usize {
            // SAFETY: the kernel runs on this CPU; the columns are within x (the contract).
            unsafe { pack_tile_avx512(x.add((n0 + t0) * ldx + k0), ldx, cols, kc, dst) };
            t0 += cols;
            continue;
        }
        for c in 0..cols {
            // SAFETY: column n0 + t0 + c is within x per the contract.
            let src = unsafe { std::slice::from_raw_parts(x.add((n0 + t0 + c) * ldx + k0), kc) };
            for (kk, &v) in src.iter().enumerate() {
                dst[kk * cols + c] = v;
            }
        }
        t0 += cols;
    }
}

/// One tile of [`pack_block`] with a masked gather per step: the `cols` values of step `kk`
/// (one per column, `ldx` apart) land at `dst[kk * cols..]` in one store, about a third of the
/// scalar copy's time.
///
/// # Safety
/// AVX-512F; `x` holds `cols` columns of `kc` values, `ldx` apart; `(cols - 1) * ldx` fits
/// an i32; `dst` holds `cols * kc` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_tile_avx512(x: *const f32, ldx: usize, cols: usize, kc: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(cols <= 16 && dst.len() >= cols * kc);
    let mask: __mmask16 = ((1u32 << cols) - 1) as __mmask16;
    let ld = ldx as i32;
    let index = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(ld),
    );
    let out = dst.as_mut_ptr();
    // SAFETY: lanes below `cols` read x[c * ldx + kk] and write dst[kk * cols + c], both within
    // their extents; the other lanes are masked off.
    unsafe {
        for kk in 0..kc {
            let v =
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, index, x.add(kk).cast());
            _mm512_mask_storeu_ps(out.add(kk * cols), mask, v);
        }
    }
}

/// One micro-tile's operands: panel slice `a` (16 x kc), packed activations `x` (`[kk][col]`),
/// output `y` (column stride `ldy`); `first` stores, otherwise accumulates; a non-null `bias`
/// (the panel's 16, or 32 for a pair) is added after that.
#[derive(Clone, Copy)]
struct Tile {
    a: *const f32,
    x: *const f32,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    first: bool,
    bias: *const f32,
    /// `max(0, .)` after the bias, in the last block's store (a fused ReLU).
    relu: bool,
    /// `kc >> prefetch_shift` cache lines from here are prefetched into L2 (pair kernel
    /// only), one every `1 << prefetch_shift` steps; the tile's own weights when there is
    /// nothing to fetch (a no-op on lines already cached). Read by the x86-64 kernels only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    prefetch: *const u8,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    prefetch_shift: u32,
}

/// How a pair's tiles fetch the next pair's weight slices (2 panels x `kc` lines of 64 bytes)
/// into L2 ahead of use: the first `2 << shift` tiles each take `kc >> shift` consecutive
/// lines. Without it the next pair's first tile waits on memory (the 0.6b's weights stream
/// from DRAM, 2.3 GB per utterance): measured per tile at 1 thread, about 5x a tile's compute
/// time for that first tile; all lines in the first two tiles still left ~2x in each (too
/// many misses in flight at once); spread over eight tiles, within 1.3x.
#[derive(Clone, Copy)]
struct Prefetch {
    shift: u32,
}

impl Prefetch {
    /// Spread over as many tiles as the block has, up to eight (`shift` <= 2).
    fn for_tiles(tiles: usize) -> Prefetch {
        let shift = match tiles {
            0..4 => 0,
            4..8 => 1,
            _ => 2,
        };
        Prefetch { shift }
    }

    /// Tile `index`'s share: the panel of the next pair (`np` or `np + 1`, if below `end`)
    /// and the first line of that panel's slice to fetch.
    fn part(self, index: usize, kc: usize, np: usize, end: usize) -> Option<(usize, usize)> {
        let per_panel = 1usize << self.shift;
        let q = np + index / per_panel;
        (index < 2 * per_panel && q < end).then(|| (q, (index % per_panel) * (kc >> self.shift)))
    }
}

/// One 16 x `cols` tile over `kc` inner steps.
///
/// # Safety
/// As [`gemm_panels`], for this tile.
#[inline(always)]
unsafe fn tile(isa: Isa, cols: usize, t: Tile) {
    macro_rules! by_cols {
        ($f:ident, $($n:literal)*) => {
            match cols {
                $($n => $f::<$n>(t),)*
                _ => unreachable!("tile of {cols} columns"),
            }
        };
    }
    // SAFETY: the caller checked the CPU supports `isa`; extents per the contract.
    unsafe {
        match isa {
            Isa::Portable => by_cols!(tile_portable, 1 2 3 4),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => by_cols!(tile_avx2, 1 2 3 4 5 6),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => by_cols!(tile_avx512, 1 2 3 4 5 6 7 8 9 10 11 12),
        }
    }
}

/// Two neighbouring panels (32 rows; the second `next` values after the first) x `cols`.
///
/// # Safety
/// As [`gemm_panels`], for both panels' tiles; `isa.pairs()`.
#[inline(always)]
unsafe fn pair_tile(isa: Isa, cols: usize, t: Tile, next: usize) {
    macro_rules! by_cols {
        ($f:ident, $($n:literal)*) => {
            match cols {
                $($n => $f::<$n>(t, next),)*
                _ => unreachable!("tile of {cols} columns"),
            }
        };
    }
    // SAFETY: the caller checked the CPU supports `isa`; extents per the contract.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => by_cols!(pair_avx512, 1 2 3 4 5 6 7 8 9 10 11 12),
            _ => unreachable!("{} has no pair tile", isa.name()),
        }
    }
}

/// # Safety
/// As [`tile`].
unsafe fn tile_portable<const NR: usize>(t: Tile) {
    let mut acc = [[0f32; PANEL]; NR];
    // SAFETY: per the contract.
    unsafe {
        for kk in 0..t.kc {
            let w: &[f32; PANEL] = &*(t.a.add(kk * PANEL) as *const [f32; PANEL]);
            let xs: &[f32; NR] = &*(t.x.add(kk * NR) as *const [f32; NR]);
            for (acc, &xv) in acc.iter_mut().zip(xs) {
                for r in 0..PANEL {
                    acc[r] = w[r].mul_add(xv, acc[r]);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            let out = std::slice::from_raw_parts_mut(t.y.add(j * t.ldy), PANEL);
            for r in 0..PANEL {
                let v = if t.first { acc[r] } else { out[r] + acc[r] };
                let v = if t.bias.is_null() {
                    v
                } else {
                    v + *t.bias.add(r)
                };
                out[r] = if t.relu { relu_f32(v) } else { v };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// As [`tile`], on a CPU with AVX2 and FMA.
unsafe fn tile_avx2<const NR: usize>(t: Tile) {
    use std::arch::x86_64::*;
    // SAFETY: per the contract; unaligned loads and stores throughout.
    unsafe {
        let mut lo = [_mm256_setzero_ps(); NR];
        let mut hi = [_mm256_setzero_ps(); NR];
        for kk in 0..t.kc {
            let w0 = _mm256_loadu_ps(t.a.add(kk * PANEL));
            let w1 = _mm256_loadu_ps(t.a.add(kk * PANEL + 8));
            let xs = t.x.add(kk * NR);
            for j in 0..NR {
                let b = _mm256_broadcast_ss(&*xs.add(j));
                lo[j] = _mm256_fmadd_ps(w0, b, lo[j]);
                hi[j] = _mm256_fmadd_ps(w1, b, hi[j]);
            }
        }
        for j in 0..NR {
            let out = t.y.add(j * t.ldy);
            if !t.first {
                lo[j] = _mm256_add_ps(lo[j], _mm256_loadu_ps(out));
                hi[j] = _mm256_add_ps(hi[j], _mm256_loadu_ps(out.add(8)));
            }
            if !t.bias.is_null() {
                lo[j] = _mm256_add_ps(lo[j], _mm256_loadu_ps(t.bias));
                hi[j] = _mm256_add_ps(hi[j], _mm256_loadu_ps(t.bias.add(8)));
            }
            if t.relu {
                // maxps returns its second operand for -0 and NaN: ggml's `v > 0 ? v : 0`.
                lo[j] = _mm256_max_ps(lo[j], _mm256_setzero_ps());
                hi[j] = _mm256_max_ps(hi[j], _mm256_setzero_ps());
            }
            _mm256_storeu_ps(out, lo[j]);
            _mm256_storeu_ps(out.add(8), hi[j]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
/// # Safety
/// As [`tile`], on a CPU with AVX-512F.
unsafe fn tile_avx512<const NR: usize>(t: Tile) {
    use std::arch::x86_64::*;
    // SAFETY: per the contract; unaligned loads and stores throughout.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); NR];
        for kk in 0..t.kc {
            let w = _mm512_loadu_ps(t.a.add(kk * PANEL));
            let xs = t.x.add(kk * NR);
            for (j, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(w, _mm512_set1_ps(*xs.add(j)), *acc);
            }
        }
        for (j, &acc) in acc.iter().enumerate() {
            let out = t.y.add(j * t.ldy);
            let mut v = if t.first {
                acc
            } else {
                _mm512_add_ps(acc, _mm512_loadu_ps(out))
            };
            if !t.bias.is_null() {
                v = _mm512_add_ps(v, _mm512_loadu_ps(t.bias));
            }
            if t.relu {
                // maxps returns its second operand for -0 and NaN: ggml's `v > 0 ? v : 0`.
                v = _mm512_max_ps(v, _mm512_setzero_ps());
            }
            _mm512_storeu_ps(out, v);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
/// 32 rows (two panels) x NR: two weight loads per NR broadcasts and 2 NR FMAs, so the two
/// FMA ports, not the loads, set the pace.
///
/// # Safety
/// As [`pair_tile`], on a CPU with AVX-512F.
unsafe fn pair_avx512<const NR: usize>(t: Tile, next: usize) {
    use std::arch::x86_64::*;
    // SAFETY: per the contract; unaligned loads and stores throughout.
    unsafe {
        let mut lo = [_mm512_setzero_ps(); NR];
        let mut hi = [_mm512_setzero_ps(); NR];
        let a1 = t.a.add(next);
        let step = |kk: usize, lo: &mut [__m512; NR], hi: &mut [__m512; NR]| {
            let w0 = _mm512_loadu_ps(t.a.add(kk * PANEL));
            let w1 = _mm512_loadu_ps(a1.add(kk * PANEL));
            let xs = t.x.add(kk * NR);
            for j in 0..NR {
                let b = _mm512_set1_ps(*xs.add(j));
                lo[j] = _mm512_fmadd_ps(w0, b, lo[j]);
                hi[j] = _mm512_fmadd_ps(w1, b, hi[j]);
            }
        };
        // Four steps per prefetch round: the lines of steps kk..kk + 4.
        let whole = t.kc - t.kc % 4;
        let mut kk = 0;
        while kk < whole {
            let first = kk >> t.prefetch_shift;
            for line in first..=(kk + 3) >> t.prefetch_shift {
                _mm_prefetch::<_MM_HINT_T1>(t.prefetch.add(line * 64).cast());
            }
            for u in 0..4 {
                step(kk + u, &mut lo, &mut hi);
            }
            kk += 4;
        }
        while kk < t.kc {
            _mm_prefetch::<_MM_HINT_T1>(t.prefetch.add((kk >> t.prefetch_shift) * 64).cast());
            step(kk, &mut lo, &mut hi);
            kk += 1;
        }
        for j in 0..NR {
            let out = t.y.add(j * t.ldy);
            let out1 = t.y.add(j * t.ldy + PANEL);
            let (mut l, mut h) = if t.first {
                (lo[j], hi[j])
            } else {
                (
                    _mm512_add_ps(lo[j], _mm512_loadu_ps(out)),
                    _mm512_add_ps(hi[j], _mm512_loadu_ps(out1)),
                )
            };
            if !t.bias.is_null() {
                l = _mm512_add_ps(l, _mm512_loadu_ps(t.bias));
                h = _mm512_add_ps(h, _mm512_loadu_ps(t.bias.add(PANEL)));
            }
            if t.relu {
                // maxps returns its second operand for -0 and NaN: ggml's `v > 0 ? v : 0`.
                l = _mm512_max_ps(l, _mm512_setzero_ps());
                h = _mm512_max_ps(h, _mm512_setzero_ps());
            }
            _mm512_storeu_ps(out, l);
            _mm512_storeu_ps(out1, h);
        }
    }
}

/// The node packing a linear's f32 input `x` (source 0, `[k, n...]`, contiguous) for the
/// panel GEMM into its result (`n * k` values), the blocks split over the threads; with
/// `silu`, what it packs is `silu(x)`.
pub(crate) struct PackActivations {
    pub silu: bool,
}

impl Body for PackActivations {
    fn run(&self, op: &CustomOp<'_>) {
        let x = op.src_f32(0);
        let [k, n1, n2, n3] = op.src_shape(0);
        let dims = Dims {
            m: 0,
            k,
            n: n1 * n2 * n3,
        };
        // SAFETY: the result holds x's values; each thread writes only its own blocks.
        unsafe {
            pack_activations(
                Isa::best(),
                x.as_ptr(),
                dims,
                (op.ith(), op.nth()),
                op.dst_ptr(),
                self.silu,
            )
        };
    }
}

/// The node `y [m, n...] = W x` with `W` panel-packed (source 0, `[k, m]`) and `x` packed by
/// [`PackActivations`] (source 1), then the bias and residual its [`GemmNode`] lists; the
/// threads take panels from the node's queue.
pub(crate) struct Panel16Gemm {
    pub node: GemmNode,
}

impl Body for Panel16Gemm {
    fn run(&self, op: &CustomOp<'_>) {
        let [k, m, ..] = op.src_shape(0);
        let [_, n1, n2, n3] = op.shape();
        let dims = Dims {
            m,
            k,
            n: n1 * n2 * n3,
        };
        let (w, xp) = (op.src_f32(0).as_ptr(), op.src_f32(1).as_ptr());
        let bias = self.node.bias(op);
        // The next range is claimed before this one is computed, so that its first panels'
        // weights are fetched while this range's last ones compute.
        self.node
            .drive(op, (m, dims.n), PANEL, (true, false), |panels, next| {
                // SAFETY: the sources are as the builder checked; this thread owns the claimed
                // panels' rows.
                unsafe {
                    gemm_panels(
                        Isa::best(),
                        w,
                        xp,
                        bias,
                        op.dst_ptr(),
                        dims,
                        panels,
                        next,
                        self.node.relu,
                    )
                }
            });
    }
}

/// `y [n][m] = max(0, x W^T + bias)` on the calling thread (the bias and the ReLU in the
/// store, as the graph's fused nodes run them), for tests.
pub fn gemm_packed_bias_relu(
    isa: Isa,
    packed: &[f32],
    x: &[f32],
    bias: &[f32],
    d: Dims,
) -> Vec<f32> {
    assert_eq!(bias.len(), d.m, "gemm_packed_bias_relu: {d:?}");
    whole_product(isa, packed, x, bias.as_ptr(), true, d)
}

/// A whole product on the calling thread, for tests and benchmarks: `y [n][m]`.
pub fn gemm_packed(isa: Isa, packed: &[f32], x: &[f32], d: Dims) -> Vec<f32> {
    whole_product(isa, packed, x, std::ptr::null(), false, d)
}

/// Packs `x` and runs every panel on the calling thread; `bias` null or `m` values.
fn whole_product(
    isa: Isa,
    packed: &[f32],
    x: &[f32],
    bias: *const f32,
    relu: bool,
    d: Dims,
) -> Vec<f32> {
    assert!(
        Isa::available().contains(&isa),
        "kernel {} is not supported by this CPU",
        isa.name()
    );
    assert!(
        d.m.is_multiple_of(PANEL) && packed.len() == d.m * d.k && x.len() == d.n * d.k,
        "gemm_packed: {d:?} with {} weights and {} activations",
        packed.len(),
        x.len()
    );
    let mut xp = vec![0f32; packed_activations_len(d)];
    let mut y = vec![0f32; d.n * d.m];
    // SAFETY: extents asserted above (bias per the callers); the kernel is supported; one
    // thread takes every part and every panel.
    unsafe {
        pack_activations(isa, x.as_ptr(), d, (0, 1), xp.as_mut_ptr(), false);
        gemm_panels(
            isa,
            packed.as_ptr(),
            xp.as_ptr(),
            bias,
            y.as_mut_ptr(),
            d,
            0..d.m / PANEL,
            0..0,
            relu,
        )
    };
    y
}
