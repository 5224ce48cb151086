//! Weight layouts: how a matrix's elements are ordered in a GGUF and in memory, the GGUF keys
//! that list the tensors stored in each, their pack and unpack functions, and
//! [`choose`], the one place that decides which layout a tensor gets (and so which GEMM
//! multiplies it: ggml's `mul_mat` for [`Layout::Plain`], our f32 panel kernel for
//! [`Layout::Panel16`], our int8 kernel for [`Layout::Q8_0x8`] and [`Layout::Q4_0x8`]).
//!
//! Pure Rust, below every other room: the converter, the file reader and writer, the model
//! loader and the kernels all agree on a layout through this module (docs/GGUF.md).

/// How a weight's elements are ordered in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// ggml's own order (`ne0` fastest); every ggml op can read it.
    Plain,
    /// An f32 matrix packed in 16-row panels for the encoder's f32 GEMM ([`pack_panels`]); only
    /// the fused linear ops read it.
    Panel16,
    /// q8_0 blocks repacked into 8-row panels for the int8 GEMM ([`repack_q8_0x8`]); only the
    /// fused linear ops read it.
    Q8_0x8,
    /// q4_0 blocks repacked into 8-row panels for the int8 GEMM ([`repack_q4_0x8`]); only the
    /// fused linear ops read it.
    Q4_0x8,
}

/// GGUF key listing the tensors stored in the [`Layout::Panel16`] order.
pub const PANEL16_KEY: &str = "parakeet.layout.panel16";
/// GGUF key listing the tensors stored in the [`Layout::Q8_0x8`] order.
pub const Q8_0X8_KEY: &str = "parakeet.layout.q8_0x8";
/// GGUF key listing the tensors stored in the [`Layout::Q4_0x8`] order.
pub const Q4_0X8_KEY: &str = "parakeet.layout.q4_0x8";

/// Output rows (channels) per [`Layout::Panel16`] panel.
pub const PANEL16_ROWS: usize = 16;
/// Output rows per [`Layout::Q8_0x8`] panel.
pub const Q8_0X8_ROWS: usize = 8;
/// Weights per q8_0 block (ggml's `QK8_0`).
pub const Q8_0_BLOCK: usize = 32;
/// Bytes of a plain q8_0 block: an f16 scale and 32 quants.
pub const Q8_0_BLOCK_BYTES: usize = 2 + Q8_0_BLOCK;
/// Bytes of one block of a [`Layout::Q8_0x8`] panel: 8 f16 scales, then 8 x 32 quants.
pub const Q8_0X8_BLOCK_BYTES: usize = Q8_0X8_ROWS * Q8_0_BLOCK_BYTES;
/// Bytes of a plain q4_0 block: an f16 scale and 16 bytes of two 4-bit quants each (ggml's
/// `block_q4_0`: quant `j` in the low nibble of byte `j`, quant `j + 16` in its high nibble,
/// both stored +8).
pub const Q4_0_BLOCK_BYTES: usize = 2 + Q8_0_BLOCK / 2;
/// Bytes of one block of a [`Layout::Q4_0x8`] panel: 8 f16 scales, then 8 x 16 nibble pairs.
pub const Q4_0X8_BLOCK_BYTES: usize = Q8_0X8_ROWS * Q4_0_BLOCK_BYTES;

/// What a matrix is multiplied by, which is what decides its layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A matrix product over many steps at once (the encoder's linears, the joint's encoder
    /// projection, the subsampling's pointwise convs).
    Gemm,
    /// A matrix-vector product per step (the decoder's LSTM and the joint's prediction
    /// projection).
    MatVec,
    /// Anything else: read by ggml's own ops.
    Other,
}

/// The element type of a stored tensor, as far as layouts care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    Q8_0,
    Q4_0,
    Other,
}

impl Layout {
    /// Every layout, for a caller that allows them all.
    pub const ALL: &'static [Layout] = &[
        Layout::Plain,
        Layout::Panel16,
        Layout::Q8_0x8,
        Layout::Q4_0x8,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Plain => "plain",
            Layout::Panel16 => "panel16",
            Layout::Q8_0x8 => "q8_0x8",
            Layout::Q4_0x8 => "q4_0x8",
        }
    }

    /// Whether a tensor of element type `elem` and ggml shape `ne` (trailing 1s trimmed) can be
    /// stored in this layout.
    pub fn fits(self, elem: Elem, ne: &[usize]) -> bool {
        match self {
            Layout::Plain => true,
            Layout::Panel16 => {
                elem == Elem::F32 && ne.len() == 2 && ne[1].is_multiple_of(PANEL16_ROWS)
            }
            Layout::Q8_0x8 => elem == Elem::Q8_0 && can_repack(ne),
            Layout::Q4_0x8 => elem == Elem::Q4_0 && can_repack(ne),
        }
    }

    /// The GGUF key listing the tensors stored in this layout (none for [`Layout::Plain`]).
    pub fn key(self) -> Option<&'static str> {
        match self {
            Layout::Plain => None,
            Layout::Panel16 => Some(PANEL16_KEY),
            Layout::Q8_0x8 => Some(Q8_0X8_KEY),
            Layout::Q4_0x8 => Some(Q4_0X8_KEY),
        }
    }
}

/// The layout a tensor is stored in, among `allowed`: the f32 matrices of a GEMM go to
/// [`Layout::Panel16`] (our panel kernel, about twice ggml's f32 throughput on the encoder's
/// linears); every q8_0 matrix our int8 kernel multiplies, GEMM or matrix-vector, goes to
/// [`Layout::Q8_0x8`] (its matrix-vector products run at about 1.7x ggml's q8_0 ones), every
/// such q4_0 matrix to [`Layout::Q4_0x8`] (the same kernels; ggml's generic q4_0 path was
/// 4.3x slower than our q8_0); the rest, and shapes the layouts cannot hold, stay
/// [`Layout::Plain`] on ggml.
pub fn choose(role: Role, elem: Elem, ne: &[usize], allowed: &[Layout]) -> Layout {
    let want = match (role, elem) {
        (Role::Gemm, Elem::F32) if ne.len() == 2 && ne[0] > 0 => Layout::Panel16,
        (Role::Gemm | Role::MatVec, Elem::Q8_0) => Layout::Q8_0x8,
        (Role::Gemm | Role::MatVec, Elem::Q4_0) => Layout::Q4_0x8,
        _ => Layout::Plain,
    };
    if allowed.contains(&want) && want.fits(elem, ne) {
        want
    } else {
        Layout::Plain
    }
}

/// Pack a row-major torch weight `w [m][k]` into 16-row panels: panel `p` holds, for each input
/// index `kk`, the 16 weights of output channels `16p .. 16p + 16`,
/// `packed[(p * k + kk) * 16 + r] = W[16p + r][kk]`. `m` must be a multiple of 16.
pub fn pack_panels(w: &[f32], m: usize, k: usize) -> Vec<f32> {
    assert!(
        m.is_multiple_of(PANEL16_ROWS) && w.len() == m * k,
        "pack_panels {m} x {k}"
    );
    let mut out = vec![0f32; m * k];
    for p in 0..m / PANEL16_ROWS {
        for r in 0..PANEL16_ROWS {
            let row = &w[(p * PANEL16_ROWS + r) * k..][..k];
            for (kk, &v) in row.iter().enumerate() {
                out[(p * k + kk) * PANEL16_ROWS + r] = v;
            }
        }
    }
    out
}

/// The inverse of [`pack_panels`].
pub fn unpack_panels(packed: &[f32], m: usize, k: usize) -> Vec<f32> {
    assert!(
        m.is_multiple_of(PANEL16_ROWS) && packed.len() == m * k,
        "unpack_panels {m} x {k}"
    );
    let mut out = vec![0f32; m * k];
    for p in 0..m / PANEL16_ROWS {
        for kk in 0..k {
            for r in 0..PANEL16_ROWS {
                out[(p * PANEL16_ROWS + r) * k + kk] = packed[(p * k + kk) * PANEL16_ROWS + r];
            }
        }
    }
    out
}

/// Whether a q8_0 (q4_0) weight of ggml shape `ne` can be stored as `q8_0x8` (`q4_0x8`): a
/// matrix whose rows split into blocks and whose row count splits into panels.
pub fn can_repack(ne: &[usize]) -> bool {
    ne.len() == 2
        && ne[0] > 0
        && ne[0].is_multiple_of(Q8_0_BLOCK)
        && ne[1] > 0
        && ne[1].is_multiple_of(Q8_0X8_ROWS)
}

/// Byte offset of quant `(row r of the panel, column j of the block)` inside a panel block: the
/// 8 scales first, then 8 groups of 32 bytes, group `g` holding 4 consecutive quants of each of
/// the 8 rows (one 256-bit load feeds 8 rows at once).
fn quant_offset(r: usize, j: usize) -> usize {
    2 * Q8_0X8_ROWS + (j / 4) * 4 * Q8_0X8_ROWS + r * 4 + j % 4
}

/// Reorders plain q8_0 rows (`m` rows of `k` weights) into the `q8_0x8` layout (same size, the
/// same values): 8 output rows form a panel, and inside a panel each block of 32 columns is
/// stored as the 8 scales followed by the quants in [`quant_offset`] order.
pub fn repack_q8_0x8(plain: &[u8], k: usize, m: usize) -> Vec<u8> {
    assert!(
        can_repack(&[k, m]),
        "q8_0x8 needs k % 32 == 0 and m % 8 == 0"
    );
    let nb = k / Q8_0_BLOCK;
    assert_eq!(plain.len(), m * nb * Q8_0_BLOCK_BYTES, "q8_0 data size");
    let mut out = vec![0u8; plain.len()];
    for p in 0..m / Q8_0X8_ROWS {
        for b in 0..nb {
            let dst = &mut out[(p * nb + b) * Q8_0X8_BLOCK_BYTES..][..Q8_0X8_BLOCK_BYTES];
            for r in 0..Q8_0X8_ROWS {
                let src = &plain[((p * Q8_0X8_ROWS + r) * nb + b) * Q8_0_BLOCK_BYTES..]
                    [..Q8_0_BLOCK_BYTES];
                dst[2 * r..2 * r + 2].copy_from_slice(&src[..2]);
                for j in 0..Q8_0_BLOCK {
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
    let nb = k / Q8_0_BLOCK;
    assert_eq!(packed.len(), m * nb * Q8_0_BLOCK_BYTES, "q8_0x8 data size");
    let mut out = vec![0u8; packed.len()];
    for p in 0..m / Q8_0X8_ROWS {
        for b in 0..nb {
            let src = &packed[(p * nb + b) * Q8_0X8_BLOCK_BYTES..][..Q8_0X8_BLOCK_BYTES];
            for r in 0..Q8_0X8_ROWS {
                let dst = &mut out[((p * Q8_0X8_ROWS + r) * nb + b) * Q8_0_BLOCK_BYTES..]
                    [..Q8_0_BLOCK_BYTES];
                dst[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
                for j in 0..Q8_0_BLOCK {
                    dst[2 + j] = src[quant_offset(r, j)];
                }
            }
        }
    }
    out
}

/// Byte offset, inside a `q4_0x8` panel block, of the byte holding quants `l` (low nibble) and
/// `l + 16` (high nibble) of row `r` (`l < 16`): after the 8 scales, the low nibbles of the
/// 128 bytes are quants 0-15 of the 8 rows in the `q8_0x8` order ([`quant_offset`]), the high
/// nibbles quants 16-31 in the same order. One load masked and shifted then gives two
/// registers exactly as `q8_0x8` loads them, so the kernels share everything after the load.
fn nibble_offset(r: usize, l: usize) -> usize {
    // The same place as quant `l` (< 16) of a `q8_0x8` block: scales first, then by groups.
    quant_offset(r, l)
}

/// Reorders plain q4_0 rows (`m` rows of `k` weights) into the `q4_0x8` layout (same size, the
/// same bytes): 8 output rows form a panel, and inside a panel each block of 32 columns is
/// stored as the 8 scales followed by the nibble pairs in [`nibble_offset`] order.
pub fn repack_q4_0x8(plain: &[u8], k: usize, m: usize) -> Vec<u8> {
    move_q4_0x8(plain, k, m, true)
}

/// The inverse of [`repack_q4_0x8`].
pub fn unpack_q4_0x8(packed: &[u8], k: usize, m: usize) -> Vec<u8> {
    move_q4_0x8(packed, k, m, false)
}

/// The byte moves of [`repack_q4_0x8`] (`to_panels`) or [`unpack_q4_0x8`].
fn move_q4_0x8(src: &[u8], k: usize, m: usize, to_panels: bool) -> Vec<u8> {
    assert!(
        can_repack(&[k, m]),
        "q4_0x8 needs k % 32 == 0 and m % 8 == 0"
    );
    let nb = k / Q8_0_BLOCK;
    assert_eq!(src.len(), m * nb * Q4_0_BLOCK_BYTES, "q4_0 data size");
    let mut out = vec![0u8; src.len()];
    for p in 0..m / Q8_0X8_ROWS {
        for b in 0..nb {
            let panel = (p * nb + b) * Q4_0X8_BLOCK_BYTES;
            for r in 0..Q8_0X8_ROWS {
                let row = ((p * Q8_0X8_ROWS + r) * nb + b) * Q4_0_BLOCK_BYTES;
                let scale = [(row, panel + 2 * r), (row + 1, panel + 2 * r + 1)];
                let quants =
                    (0..Q8_0_BLOCK / 2).map(|l| (row + 2 + l, panel + nibble_offset(r, l)));
                for (plain_at, packed_at) in scale.into_iter().chain(quants) {
                    if to_panels {
                        out[packed_at] = src[plain_at];
                    } else {
                        out[plain_at] = src[packed_at];
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_round_trip() {
        let (m, k) = (32, 5);
        let w: Vec<f32> = (0..m * k).map(|v| v as f32).collect();
        let packed = pack_panels(&w, m, k);
        assert_eq!(packed[1], w[k], "row 1's first weight next to row 0's");
        assert_eq!(unpack_panels(&packed, m, k), w);
    }

    #[test]
    fn q8_0x8_round_trips() {
        let (k, m) = (64, 16);
        let plain: Vec<u8> = (0..m * k / 32 * 34).map(|v| (v * 7) as u8).collect();
        let packed = repack_q8_0x8(&plain, k, m);
        assert_ne!(packed, plain);
        assert_eq!(unpack_q8_0x8(&packed, k, m), plain);
        assert!(can_repack(&[32, 8]) && !can_repack(&[32, 12]) && !can_repack(&[40, 8]));
    }

    #[test]
    fn q4_0x8_round_trips_and_keeps_nibble_pairs() {
        let (k, m) = (96, 16);
        let plain: Vec<u8> = (0..m * k / 32 * 18).map(|v| (v * 13 + 5) as u8).collect();
        let packed = repack_q4_0x8(&plain, k, m);
        assert_ne!(packed, plain);
        assert_eq!(unpack_q4_0x8(&packed, k, m), plain);
        // Row 1, block 2: scale bytes at 2..4 of the panel block, its byte l = 5 (quants 5
        // and 21) in group 1 at row 1's 4 bytes, position 1.
        let src = (k / Q8_0_BLOCK + 2) * Q4_0_BLOCK_BYTES;
        let dst = 2 * Q4_0X8_BLOCK_BYTES;
        assert_eq!(packed[dst + 2..dst + 4], plain[src..src + 2]);
        assert_eq!(packed[dst + 16 + 32 + 4 + 1], plain[src + 2 + 5]);
    }

    #[test]
    fn choose_by_role_element_and_shape() {
        let all = Layout::ALL;
        assert_eq!(
            choose(Role::Gemm, Elem::F32, &[64, 32], all),
            Layout::Panel16
        );
        assert_eq!(choose(Role::Gemm, Elem::F32, &[64, 24], all), Layout::Plain);
        assert_eq!(
            choose(Role::MatVec, Elem::F32, &[64, 32], all),
            Layout::Plain
        );
        assert_eq!(
            choose(Role::MatVec, Elem::Q8_0, &[64, 32], all),
            Layout::Q8_0x8
        );
        assert_eq!(
            choose(Role::Gemm, Elem::Q8_0, &[64, 12], all),
            Layout::Plain
        );
        assert_eq!(
            choose(Role::Other, Elem::Q8_0, &[64, 32], all),
            Layout::Plain
        );
        assert_eq!(
            choose(Role::Gemm, Elem::Q4_0, &[64, 32], all),
            Layout::Q4_0x8
        );
        assert_eq!(
            choose(Role::MatVec, Elem::Q4_0, &[64, 32], all),
            Layout::Q4_0x8
        );
        // Rows that do not split into panels stay on ggml's q4_0.
        assert_eq!(
            choose(Role::Gemm, Elem::Q4_0, &[64, 12], all),
            Layout::Plain
        );
        let no_int8 = &[Layout::Plain, Layout::Panel16];
        assert_eq!(
            choose(Role::Gemm, Elem::Q8_0, &[64, 32], no_int8),
            Layout::Plain
        );
        assert_eq!(
            choose(Role::Gemm, Elem::F32, &[64, 32], no_int8),
            Layout::Panel16
        );
    }
}
