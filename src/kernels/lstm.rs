//! The pointwise part of one PyTorch LSTM cell step as one node (the decoder's prediction
//! net).

use super::vmath;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::graph::check;
use crate::backend::{DType, Graph, Lowering, Tensor, Weight};

/// The pointwise part of one PyTorch LSTM cell step (gate order i, f, g, o) as one node, for N
/// columns (a beam's hypotheses) at once: from the gate products `gx = W_ih x` and
/// `gh = W_hh h` ([4H, N] each), their biases ([4H]) and the cells `c` ([H, N]),
/// `[h1 | c1]` ([H, 2N]: the N columns of h1, then the N of c1) with `gates = (gx + b_ih) + (gh + b_hh)`,
/// `c1 = σ(f) c + σ(i) tanh(g)`, `h1 = σ(o) tanh(c1)`: one node for what took ten ggml nodes
/// (each a barrier of the decoder's per-step graph), σ and tanh from `vmath`'s vectorised `e^x`
/// (within 2e-7 of the exact functions).
pub fn lstm_pointwise<'g>(
    g: &mut Graph<'g>,
    gx: Tensor<'g>,
    gh: Tensor<'g>,
    (b_ih, b_hh): (&Weight, &Weight),
    c: Tensor<'g>,
) -> Tensor<'g> {
    let (h, n) = (c.ne(0), c.ne(1));
    let gates = [h * 4, n, 1, 1];
    let bias = [h * 4, 1, 1, 1];
    check(
        c.shape() == [h, n, 1, 1]
            && n >= 1
            && gx.shape() == gates
            && gh.shape() == gates
            && b_ih.shape() == bias
            && b_hh.shape() == bias
            && [gx, gh, c]
                .iter()
                .all(|t| t.dtype() == Some(DType::F32) && t.is_contiguous())
            && [b_ih, b_hh].iter().all(|b| b.dtype() == DType::F32),
        || {
            format!(
                "lstm_pointwise: gates {:?} {:?}, cell {:?}",
                gx.shape(),
                gh.shape(),
                c.shape()
            )
        },
    );
    if g.lowering() == Lowering::Builtin {
        let (b_ih, b_hh) = (g.weight(b_ih), g.weight(b_hh));
        let gx = g.add(gx, b_ih);
        let gh = g.add(gh, b_hh);
        let gates = g.add(gx, gh);
        return cell_builtin(g, gates, c);
    }
    let sources = [gx, gh, g.weight_source(b_ih), g.weight_source(b_hh), c];
    // SAFETY: an f32 [H, 2N] result over the five contiguous f32 tensors checked above, as
    // LstmPointwise reads them; split over the threads by units.
    unsafe {
        g.custom(
            Out::F32,
            [h, 2 * n, 1, 1],
            &sources,
            LstmPointwise,
            "lstm_pointwise",
        )
    }
}

/// An LSTM cell's pointwise step in ggml's built-in ops: from the summed `gates` ([4H, N], gate
/// order i, f, g, o) and the cells `c` ([H, N]), `[h1 | c1]` ([H, 2N]).
pub(super) fn cell_builtin<'g>(g: &mut Graph<'g>, gates: Tensor<'g>, c: Tensor<'g>) -> Tensor<'g> {
    let h = c.ne(0);
    let mut gate = |q: usize| g.cols(gates, q * h, h);
    let (i, f, gg, o) = (gate(0), gate(1), gate(2), gate(3));
    let i = g.sigmoid(i);
    let f = g.sigmoid(f);
    let gg = g.tanh(gg);
    let o = g.sigmoid(o);
    let fc = g.mul(f, c);
    let ig = g.mul(i, gg);
    let c1 = g.add(fc, ig);
    let t = g.tanh(c1);
    let h1 = g.mul(t, o);
    g.concat(h1, c1, 1)
}

/// The node of [`lstm_pointwise`]: sources gx, gh (f32 [4H, N]), b_ih, b_hh (f32 [4H]) and c
/// (f32 [H, N]), result f32 [H, 2N] (the columns of `h1`, then those of `c1`); each thread
/// computes its own units of every column.
struct LstmPointwise;

impl Body for LstmPointwise {
    fn run(&self, op: &CustomOp<'_>) {
        let h = op.shape()[0];
        let n = op.shape()[1] / 2;
        let [gx_all, gh_all, b_ih, b_hh] = [0, 1, 2, 3].map(|i| op.src_f32(i));
        let c_all = op.src_f32(4);
        let mine = op.share(h);
        for col in 0..n {
            let (gx, gh) = (&gx_all[col * 4 * h..], &gh_all[col * 4 * h..]);
            let c = &c_all[col * h..];
            // SAFETY: this thread's units of column `col` of h1 and of c1, written by no other
            // thread.
            let (h1, c1) = unsafe {
                (
                    op.dst_mut::<f32>(col * h + mine.start..col * h + mine.end),
                    op.dst_mut::<f32>((n + col) * h + mine.start..(n + col) * h + mine.end),
                )
            };
            let column = CellInputs {
                gx,
                gh,
                b_ih,
                b_hh,
                c,
            };
            cell_units(h, mine.clone(), &column, (h1, c1));
        }
    }
}

/// One column's gate products (from its start), the biases and its cell.
struct CellInputs<'a> {
    gx: &'a [f32],
    gh: &'a [f32],
    b_ih: &'a [f32],
    b_hh: &'a [f32],
    c: &'a [f32],
}

/// Units `mine` of one column: `h1`, `c1` (this thread's slices) from its [`CellInputs`].
fn cell_units(
    h: usize,
    mine: std::ops::Range<usize>,
    inputs: &CellInputs<'_>,
    (h1, c1): (&mut [f32], &mut [f32]),
) {
    let CellInputs {
        gx,
        gh,
        b_ih,
        b_hh,
        c,
    } = *inputs;
    // The four gates of up to CHUNK of this thread's units, each gate contiguous on the stack,
    // so that the sigmoids and tanh run sixteen lanes at a time (libm's expf and tanhf, a call
    // per value, took ~13 us of a 0.6b decoder step, 10 % of a q8_0 one).
    const CHUNK: usize = 64;
    let mut buf = [0f32; 4 * CHUNK];
    let mut done = 0;
    while done < mine.len() {
        let (j0, u) = (mine.start + done, CHUNK.min(mine.len() - done));
        let gates = &mut buf[..4 * u];
        for (q, slot) in gates.chunks_exact_mut(u).enumerate() {
            for (v, j) in slot.iter_mut().zip(q * h + j0..) {
                *v = (gx[j] + b_ih[j]) + (gh[j] + b_hh[j]);
            }
        }
        let (ifg, o) = gates.split_at_mut(3 * u);
        let (i_f, g) = ifg.split_at_mut(2 * u);
        vmath::sigmoid_in_place(i_f);
        vmath::tanh_in_place(g);
        vmath::sigmoid_in_place(o);
        let (i, f) = i_f.split_at(u);
        let (c1, h1) = (&mut c1[done..done + u], &mut h1[done..done + u]);
        for k in 0..u {
            c1[k] = f[k] * c[j0 + k] + i[k] * g[k];
        }
        h1.copy_from_slice(c1);
        vmath::tanh_in_place(h1);
        for (v, &o) in h1.iter_mut().zip(o.iter()) {
            *v *= o;
        }
        done += u;
    }
}
