//! f32 matrix products over weights packed once, at convert time, in the layout the kernel
//! streams ("panel16", docs/GGUF.md): the encoder's linears `y = x W^T` run here as a ggml
//! custom op.
//!
//! A torch Linear weight `W [m, k]` (ggml `ne [k, m]`, `m % 16 == 0`) is stored as `m / 16`
//! panels; panel `p` holds, for each input index `kk`, the 16 weights of output channels
//! `16p .. 16p + 16`: `packed[(p * k + kk) * 16 + r] = W[16p + r][kk]`. A micro-kernel keeps a
//! 16 x NR tile of the result in registers, reads its panel strictly sequentially and
//! broadcasts NR activations per step, so no per-call packing of the (large) weight is needed
//! and the (small) activations are read in place.
//!
//! The kernel is chosen at run time: AVX-512F, AVX2+FMA, or portable Rust that the compiler
//! vectorises for whatever target it builds (aarch64 included).

/// Output channels per panel.
pub const PANEL: usize = 16;

/// Inner-dimension block: a 16 x KC panel slice (16 KiB) stays in L1 while it is reused for
/// every column tile of the block.
const KC: usize = 256;
/// Column block: KC x NC activations (192 KiB) stay in L2 while every panel streams past them.
const NC: usize = 192;

/// Pack a row-major torch weight `w [m][k]` into panels. `m` must be a multiple of [`PANEL`].
pub fn pack_panels(w: &[f32], m: usize, k: usize) -> Vec<f32> {
    assert!(
        m.is_multiple_of(PANEL) && w.len() == m * k,
        "pack_panels {m} x {k}"
    );
    let mut out = vec![0f32; m * k];
    for p in 0..m / PANEL {
        for r in 0..PANEL {
            let row = &w[(p * PANEL + r) * k..][..k];
            for (kk, &v) in row.iter().enumerate() {
                out[(p * k + kk) * PANEL + r] = v;
            }
        }
    }
    out
}

/// The inverse of [`pack_panels`].
pub fn unpack_panels(packed: &[f32], m: usize, k: usize) -> Vec<f32> {
    assert!(
        m.is_multiple_of(PANEL) && packed.len() == m * k,
        "unpack_panels {m} x {k}"
    );
    let mut out = vec![0f32; m * k];
    for p in 0..m / PANEL {
        for kk in 0..k {
            for r in 0..PANEL {
                out[(p * PANEL + r) * k + kk] = packed[(p * k + kk) * PANEL + r];
            }
        }
    }
    out
}

/// The instruction sets a kernel can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The best kernel this CPU runs.
    pub fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every kernel this CPU can run (for tests).
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2+fma",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512f",
        }
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

/// Panels `panels` of the product, every column, with kernel `isa`.
///
/// # Safety
/// `w` holds `m * k` packed values, `x` `n * k` values (column `j` at `x + j * k`), `y` has
/// room for `n * m` values (column `j` at `y + j * m`); the panel range is within `m / 16`;
/// `isa` runs on this CPU. Concurrent calls must write disjoint panel ranges.
pub(crate) unsafe fn gemm_panels(
    isa: Isa,
    w: *const f32,
    x: *const f32,
    y: *mut f32,
    d: Dims,
    panels: std::ops::Range<usize>,
) {
    if d.k == 0 {
        for j in 0..d.n {
            for p in panels.clone() {
                // SAFETY: within y per the contract.
                unsafe { std::ptr::write_bytes(y.add(j * d.m + p * PANEL), 0, PANEL) };
            }
        }
        return;
    }
    let nr = isa.nr();
    let mut n0 = 0;
    while n0 < d.n {
        let nc = NC.min(d.n - n0);
        let mut k0 = 0;
        while k0 < d.k {
            let kc = KC.min(d.k - k0);
            let first = k0 == 0;
            for p in panels.clone() {
                // SAFETY: offsets stay within the extents in the contract.
                unsafe {
                    let a = w.add((p * d.k + k0) * PANEL);
                    let mut j = n0;
                    while j < n0 + nc {
                        let cols = nr.min(n0 + nc - j);
                        let xb = x.add(j * d.k + k0);
                        let yb = y.add(j * d.m + p * PANEL);
                        tile(isa, cols, a, xb, d.k, kc, yb, d.m, first);
                        j += cols;
                    }
                }
            }
            k0 += kc;
        }
        n0 += nc;
    }
}

/// One 16 x `cols` tile over `kc` inner steps; `first` stores, otherwise accumulates.
///
/// # Safety
/// As [`gemm_panels`], for this tile.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile(
    isa: Isa,
    cols: usize,
    a: *const f32,
    x: *const f32,
    ldx: usize,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    first: bool,
) {
    macro_rules! by_cols {
        ($f:ident, $($n:literal)*) => {
            match cols {
                $($n => $f::<$n>(a, x, ldx, kc, y, ldy, first),)*
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

/// # Safety
/// As [`tile`].
unsafe fn tile_portable<const NR: usize>(
    a: *const f32,
    x: *const f32,
    ldx: usize,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    first: bool,
) {
    let mut acc = [[0f32; PANEL]; NR];
    // SAFETY: per the contract.
    unsafe {
        for kk in 0..kc {
            let w: &[f32; PANEL] = &*(a.add(kk * PANEL) as *const [f32; PANEL]);
            for (j, acc) in acc.iter_mut().enumerate() {
                let xv = *x.add(j * ldx + kk);
                for r in 0..PANEL {
                    acc[r] = w[r].mul_add(xv, acc[r]);
                }
            }
        }
        for (j, acc) in acc.iter().enumerate() {
            let out = std::slice::from_raw_parts_mut(y.add(j * ldy), PANEL);
            for r in 0..PANEL {
                out[r] = if first { acc[r] } else { out[r] + acc[r] };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// As [`tile`], on a CPU with AVX2 and FMA.
unsafe fn tile_avx2<const NR: usize>(
    a: *const f32,
    x: *const f32,
    ldx: usize,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    first: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY: per the contract; unaligned loads and stores throughout.
    unsafe {
        let mut lo = [_mm256_setzero_ps(); NR];
        let mut hi = [_mm256_setzero_ps(); NR];
        for kk in 0..kc {
            let w0 = _mm256_loadu_ps(a.add(kk * PANEL));
            let w1 = _mm256_loadu_ps(a.add(kk * PANEL + 8));
            for j in 0..NR {
                let b = _mm256_broadcast_ss(&*x.add(j * ldx + kk));
                lo[j] = _mm256_fmadd_ps(w0, b, lo[j]);
                hi[j] = _mm256_fmadd_ps(w1, b, hi[j]);
            }
        }
        for j in 0..NR {
            let out = y.add(j * ldy);
            if !first {
                lo[j] = _mm256_add_ps(lo[j], _mm256_loadu_ps(out));
                hi[j] = _mm256_add_ps(hi[j], _mm256_loadu_ps(out.add(8)));
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
unsafe fn tile_avx512<const NR: usize>(
    a: *const f32,
    x: *const f32,
    ldx: usize,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    first: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY: per the contract; unaligned loads and stores throughout.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); NR];
        for kk in 0..kc {
            let w = _mm512_loadu_ps(a.add(kk * PANEL));
            for (j, acc) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*x.add(j * ldx + kk));
                *acc = _mm512_fmadd_ps(w, b, *acc);
            }
        }
        for (j, &acc) in acc.iter().enumerate() {
            let out = y.add(j * ldy);
            let v = if first {
                acc
            } else {
                _mm512_add_ps(acc, _mm512_loadu_ps(out))
            };
            _mm512_storeu_ps(out, v);
        }
    }
}

/// A whole product on the calling thread, for tests and benchmarks: `y [n][m]`.
pub fn gemm_packed(isa: Isa, packed: &[f32], x: &[f32], d: Dims) -> Vec<f32> {
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
    let mut y = vec![0f32; d.n * d.m];
    // SAFETY: extents asserted above; the kernel is supported.
    unsafe {
        gemm_panels(
            isa,
            packed.as_ptr(),
            x.as_ptr(),
            y.as_mut_ptr(),
            d,
            0..d.m / PANEL,
        )
    };
    y
}
