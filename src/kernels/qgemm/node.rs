//! The int8 GEMM as graph nodes: one quantizing a linear's input (shared by every linear that
//! reads it), one multiplying a `q8_0x8` or `q4_0x8` weight by it.

use super::quantize::{quantize_cols, quants_at, reads_tiles};
use super::{Cols, Epilogue, Format, PANEL, QK, STEP_PAD, gemm_panels};
use crate::backend::custom::{Body, CustomOp};
use crate::kernels::panel::GemmNode;

/// Bytes of `n` quantized steps of `k` inputs as [`Quantize`] stores them: all quants
/// (`padded * k`), then all block scales (f32), both for the [`STEP_PAD`]-padded steps.
pub(crate) fn quantized_bytes(k: usize, n: usize) -> usize {
    let padded = n.next_multiple_of(STEP_PAD);
    padded * k + padded * (k / QK) * 4
}

/// The node quantizing `x` (source 0, contiguous f32 `[k, n]`, `k` a multiple of 32) for the
/// int8 GEMM into [`quantized_bytes`] bytes, split over the threads by steps (each GEMM thread
/// needs all of them), laid out for the kernel that multiplies `format`. With `silu`, what it
/// quantizes is `silu(x)`.
pub(crate) struct Quantize {
    pub silu: bool,
    pub format: Format,
}

impl Body for Quantize {
    fn run(&self, op: &CustomOp<'_>) {
        let [k, n, ..] = op.src_shape(0);
        let nb = k / QK;
        let padded = n.next_multiple_of(STEP_PAD);
        assert!(op.shape()[0] >= quantized_bytes(k, n));
        let base = op.dst_ptr::<u8>();
        // SAFETY: the result holds quantized_bytes(k, n); the scales start at padded * k,
        // 4-aligned as k is a multiple of 32.
        let scales = unsafe { base.add(padded * k) } as *mut f32;
        let kernel = self.format.kernel(n);
        if op.ith() + 1 == op.nth() && padded > n {
            // The padding steps' quants: after the last step, or inside each block of the last
            // tile; the threads quantizing the real steps there write other bytes.
            // SAFETY: inside the result, written by this thread only.
            unsafe {
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
        }
        let mine = op.share(n);
        if mine.is_empty() {
            return;
        }
        let xs = &op.src_f32(0)[mine.start * k..mine.end * k];
        // SAFETY: this thread's steps' quants and scales, which no other thread writes.
        unsafe { quantize_cols(kernel, xs, (k, mine.start), (base, scales), self.silu) };
    }
}

/// The node `[m, n] = w^T x (+ bias)`: `w` a weight `[k, m]` in `format` (source 0), `x` the
/// [`Quantize`] node (of the same format) of an f32 `[k, n]` (source 1), then the f32 bias
/// `[m]` and residual `[m, n]` its [`GemmNode`] lists; the threads claim panels of rows from
/// the node's queue.
pub(crate) struct Int8Gemm {
    pub node: GemmNode,
    pub format: Format,
}

impl Body for Int8Gemm {
    fn run(&self, op: &CustomOp<'_>) {
        let [k, m, ..] = op.src_shape(0);
        let n = op.shape()[1];
        let nb = k / QK;
        let w = &op.src_bytes(0)[..m * nb * self.format.row_block_bytes()];
        let xq = op.src_bytes(1);
        let padded = n.next_multiple_of(STEP_PAD);
        assert!(xq.len() >= quantized_bytes(k, n));
        // SAFETY: the quantized node holds padded * k quants, then padded * nb f32 scales
        // (4-aligned, see Quantize).
        let cols = unsafe {
            Cols {
                q: &xq[..padded * k],
                d: std::slice::from_raw_parts(xq.as_ptr().add(padded * k).cast(), padded * nb),
            }
        };
        let bias = self.node.bias(op);
        // SAFETY: a bias source holds m values.
        let bias = (!bias.is_null()).then(|| unsafe { std::slice::from_raw_parts(bias, m) });
        // The VNNI kernel finishes its output in its stores (ReLU, residual): not read again.
        // The others leave it to passes over the claimed rows.
        let kernel = self.format.kernel(n);
        #[cfg(target_arch = "x86_64")]
        let in_store = kernel == crate::kernels::cpu::Kernel::Avx512Vnni;
        #[cfg(not(target_arch = "x86_64"))]
        let in_store = false;
        let epilogue = match in_store {
            true => Epilogue {
                relu: self.node.relu,
                residual: self
                    .node
                    .residual
                    .map(|s| (self.node.residual_source(op), s)),
            },
            false => Epilogue::default(),
        };
        self.node
            .drive(op, (m, n), PANEL, (false, in_store), |panels, _| {
                // SAFETY: the result holds n steps of m rows; this thread owns the claimed panels;
                // a residual source has the result's shape.
                unsafe {
                    gemm_panels(
                        kernel,
                        self.format,
                        w,
                        k,
                        m,
                        (panels.start, panels.end),
                        cols,
                        n,
                        (bias, epilogue),
                        op.dst_ptr(),
                    );
                    if !in_store {
                        self.node.relu_panels(op.dst_ptr(), (m, n), (panels, PANEL));
                    }
                }
            });
    }
}
