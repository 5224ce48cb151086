//! A PyTorch LSTM cell run over a whole sequence in one node: the recurrence of a small
//! recurrent net (Silero VAD's decoder) whose input products were computed for every step at
//! once by a GEMM, so that only `W_hh h` and the pointwise part remain per step.

use super::cpu::multiversioned;
use super::vmath;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor};

/// The LSTM cell (gate order i, f, g, o) over `N` steps: from `gx` [4H, N] (`W_ih x_t + b_ih +
/// b_hh` for every step), `w_hh_t` [4H, H] (`W_hh` transposed: row `j` is column `j` of the
/// torch weight, so that a step adds `h[j]` times one contiguous row) and `state` [H, 2] (`h`,
/// `c` before the first step), the result [H, N + 1]: `h` after each step, then the last `c`.
/// A recurrence is sequential: one thread computes it (a step is ~65k multiply-adds).
pub fn lstm_sequence<'g>(
    g: &mut Graph<'g>,
    gx: Tensor<'g>,
    w_hh_t: Tensor<'g>,
    state: Tensor<'g>,
) -> Tensor<'g> {
    let (h4, n) = (gx.ne(0), gx.ne(1));
    let h = h4 / 4;
    check(
        h4 == 4 * h
            && h > 0
            && n > 0
            && gx.shape() == [h4, n, 1, 1]
            && w_hh_t.shape() == [h4, h, 1, 1]
            && state.shape() == [h, 2, 1, 1]
            && [gx, w_hh_t, state]
                .iter()
                .all(|t| t.dtype() == Some(DType::F32) && t.is_contiguous()),
        || {
            format!(
                "lstm_sequence: gates {:?}, recurrent weight {:?}, state {:?}",
                gx.shape(),
                w_hh_t.shape(),
                state.shape()
            )
        },
    );
    // SAFETY: an f32 [H, N + 1] result over the three contiguous f32 tensors checked above, as
    // LstmSequence reads them; thread 0 writes all of it.
    if g.lowering() == Lowering::Builtin {
        return steps_builtin(g, gx, w_hh_t, state);
    }
    unsafe {
        g.custom(
            Out::F32,
            [h, n + 1, 1, 1],
            &[gx, w_hh_t, state],
            LstmSequence,
            "lstm_sequence",
        )
    }
}

/// The sequence in ggml's built-in ops, one step after another: per step the recurrent
/// product (`mul_mat`), the gates and the cell ([`super::lstm::cell_builtin`]); the steps' `h`
/// and the last `c` stacked as the kernel's result.
fn steps_builtin<'g>(
    g: &mut Graph<'g>,
    gx: Tensor<'g>,
    w_hh_t: Tensor<'g>,
    state: Tensor<'g>,
) -> Tensor<'g> {
    let n = gx.ne(1);
    let w_t = g.transpose(w_hh_t);
    let w_hh = g.cont(w_t); // [H, 4H]: mul_mat's row-major W_hh
    let (mut h, mut c) = (g.rows(state, 0, 1), g.rows(state, 1, 1));
    let mut parts = Vec::with_capacity(n + 1);
    for t in 0..n {
        let gx_t = g.rows(gx, t, 1);
        let gh = g.mul_mat(w_hh, h);
        let gates = g.add(gx_t, gh);
        let out = super::lstm::cell_builtin(g, gates, c);
        h = g.rows(out, 0, 1);
        c = g.rows(out, 1, 1);
        parts.push(h);
    }
    parts.push(c);
    g.stack_rows(&parts)
}

/// The node of [`lstm_sequence`].
struct LstmSequence;

impl Body for LstmSequence {
    fn run(&self, op: &CustomOp<'_>) {
        if op.ith() != 0 {
            return;
        }
        let [h, cols, ..] = op.shape();
        // SAFETY: thread 0 alone writes the result.
        let out = unsafe { op.dst_mut::<f32>(0..h * cols) };
        steps(op.src_f32(0), op.src_f32(1), op.src_f32(2), out);
    }
}

multiversioned! {
    /// Every step of the recurrence (see [`lstm_sequence`] for the layouts).
    fn steps(gx: &[f32], w_hh_t: &[f32], state: &[f32], out: &mut [f32]) {
        let h = state.len() / 2;
        let h4 = 4 * h;
        let n = gx.len() / h4;
        let mut prev = state[..h].to_vec();
        let mut c = state[h..].to_vec();
        let mut gates = vec![0f32; h4];
        for (t, gx_t) in gx.chunks_exact(h4).enumerate() {
            gates.copy_from_slice(gx_t);
            for (&hj, row) in prev.iter().zip(w_hh_t.chunks_exact(h4)) {
                for (gv, &w) in gates.iter_mut().zip(row) {
                    *gv += w * hj;
                }
            }
            let (i_f, g_o) = gates.split_at_mut(2 * h);
            let (g, o) = g_o.split_at_mut(h);
            vmath::sigmoid_in_place(i_f);
            vmath::tanh_in_place(g);
            vmath::sigmoid_in_place(o);
            let (i, f) = i_f.split_at(h);
            for k in 0..h {
                c[k] = f[k] * c[k] + i[k] * g[k];
            }
            let h_t = &mut out[t * h..(t + 1) * h];
            h_t.copy_from_slice(&c);
            vmath::tanh_in_place(h_t);
            for (v, &o) in h_t.iter_mut().zip(o.iter()) {
                *v *= o;
            }
            prev.copy_from_slice(h_t);
        }
        out[n * h..(n + 1) * h].copy_from_slice(&c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sigmoid(x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }

    #[test]
    fn steps_match_an_f64_lstm_cell() {
        let (h, n) = (8, 5);
        let mut v = crate::kernels::TestValues::new(3);
        let gx = v.take(4 * h * n);
        let w = v.take(4 * h * h);
        let state = v.take(2 * h);
        let mut out = vec![0f32; h * (n + 1)];
        steps(&gx, &w, &state, &mut out);
        let mut hp: Vec<f64> = state[..h].iter().map(|&x| x as f64).collect();
        let mut c: Vec<f64> = state[h..].iter().map(|&x| x as f64).collect();
        for t in 0..n {
            let gate = |r: usize| {
                gx[t * 4 * h + r] as f64
                    + (0..h).map(|j| w[j * 4 * h + r] as f64 * hp[j]).sum::<f64>()
            };
            let mut next = vec![0f64; h];
            for k in 0..h {
                let (i, f) = (sigmoid(gate(k)), sigmoid(gate(h + k)));
                let (g, o) = (gate(2 * h + k).tanh(), sigmoid(gate(3 * h + k)));
                c[k] = f * c[k] + i * g;
                next[k] = o * c[k].tanh();
            }
            hp = next;
            for k in 0..h {
                assert!(
                    (out[t * h + k] as f64 - hp[k]).abs() < 1e-6,
                    "step {t} unit {k}"
                );
            }
        }
        for k in 0..h {
            assert!((out[n * h + k] as f64 - c[k]).abs() < 1e-5, "cell {k}");
        }
    }
}
