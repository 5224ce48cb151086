//! Relative-position self-attention as one fused ggml custom op.
//!
//! For every head and query frame `i` it computes, over the keys `j` of the window
//! `[i - left, i + right]` clipped to the utterance,
//! `softmax(((q_i + u) . k_j + (q_i + v) . p[j - i + left]) / sqrt(d_k)) . v_j`
//! with f32 accumulation, without ever holding a `[T, T, heads]` tensor: the memory is
//! `O(T * d)` and the work `O(T * window * d)`. The rel-shift of Transformer-XL is folded into
//! the indexing (`p` has one row per offset `j - i`), so full attention is the window
//! `[T - 1, T - 1]` with NeMo's `2T - 1` positional rows, and NeMo's local attention
//! (`rel_pos_local_attn`) is the window `[L, R]` with its `L + R + 1` rows. NeMo's
//! `chunked_limited` mask narrows each query's window to whole chunks, and a streaming cache
//! puts keys before the first query ([`KeyWindow`]).
//!
//! Keys outside the utterance get exactly zero weight, as NeMo's `-inf` / `-10000` masks give
//! after an f32 softmax.

#[cfg(target_arch = "x86_64")]
use super::cpu::avx512;
use super::cpu::multiversioned;
use super::vmath::exp_in_place;
#[cfg(target_arch = "x86_64")]
use super::vmath::exp_nonpositive_fma;
use crate::backend::custom::{Body, CustomOp, Out};
use crate::backend::{DType, Graph, Lowering, Tensor};

/// The keys each query attends to.
///
/// Keys are the query frames, optionally preceded by `past` frames (a streaming cache): query
/// `i` sits at key `past + i`. Each query sees the keys of the band `[-left, right]` around it
/// that exist, from `first_valid` on (earlier cache frames are not filled yet), and with
/// `chunk`, only its own chunk and the chunks before it that the chunking allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyWindow {
    pub left: usize,
    pub right: usize,
    pub past: usize,
    pub first_valid: usize,
    pub chunk: Option<Chunking>,
}

/// NeMo's `chunked_limited` mask: key position `j` is in chunk `j / size`; a query sees its own
/// chunk and `left_chunks` chunks before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunking {
    pub size: usize,
    pub left_chunks: usize,
}

impl KeyWindow {
    /// Every key within `[-left, right]` of its query (full or local attention).
    pub fn band(left: usize, right: usize) -> KeyWindow {
        KeyWindow {
            left,
            right,
            past: 0,
            first_valid: 0,
            chunk: None,
        }
    }

    /// The keys `[lo, hi]` query `i` attends to among `keys` keys.
    fn keys_of(&self, i: usize, keys: usize) -> (usize, usize) {
        let at = self.past + i;
        let mut lo = at.saturating_sub(self.left).max(self.first_valid);
        let mut hi = (at + self.right).min(keys - 1);
        if let Some(c) = self.chunk {
            let chunk = at / c.size;
            lo = lo.max(chunk.saturating_sub(c.left_chunks) * c.size);
            hi = hi.min((chunk + 1) * c.size - 1);
        }
        (lo, hi)
    }
}

/// Fused rel-pos multi-head attention over the keys `window` gives each query. `q`: `[d_k, h,
/// T]` (a linear's `[d, T]` output reshaped); `k`, `v`: `[d_k, h, past + T + later]` (`later`
/// keys after the last query's: a time slice of a longer input); `p`: the projected
/// positional rows `[d_k, h, left + right + 1]`, row `j - (past + i) + left` for key `j` of
/// query `i`; `bias_u`, `bias_v`: `[d_k, h]`. Returns `[d_k, h, T]` (before `linear_out`).
/// `after`: nodes the op must follow though it does not read their results (the writes of
/// a stream's new keys and values into the cache that `k` and `v` view), at most four.
#[allow(clippy::too_many_arguments)]
pub fn rel_pos_attention_over<'g>(
    g: &mut Graph<'g>,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    p: Tensor<'g>,
    bias_u: Tensor<'g>,
    bias_v: Tensor<'g>,
    window: KeyWindow,
    after: &[Tensor<'g>],
) -> Tensor<'g> {
    let [dk, h, t, one] = q.shape();
    let KeyWindow { left, right, .. } = window;
    let ok = one == 1
        && t > 0
        && k.ne(2) >= window.past + t
        && k.shape() == [dk, h, k.ne(2), 1]
        && v.shape() == k.shape()
        && window.first_valid <= window.past
        && window.chunk.is_none_or(|c| c.size > 0)
        && p.shape() == [dk, h, left + right + 1, 1]
        && bias_u.shape() == [dk, h, 1, 1]
        && bias_v.shape() == [dk, h, 1, 1]
        && after.len() <= 4;
    assert!(
        ok,
        "graph shape error: rel_pos_attention q {:?} k {:?} v {:?} p {:?} u {:?} v {:?} \
         keys {window:?}",
        q.shape(),
        k.shape(),
        v.shape(),
        p.shape(),
        bias_u.shape(),
        bias_v.shape()
    );
    let sources = [q, k, v, p, bias_u, bias_v].map(|x| {
        let x = if x.is_contiguous() { x } else { g.cont(x) };
        assert!(
            x.dtype() == Some(DType::F32),
            "graph shape error: rel_pos_attention needs f32 operands"
        );
        x
    });
    if g.lowering() == Lowering::Builtin {
        // Reads no row `after` writes: a stream's keys come from `Graph::append_rows`.
        return attention_builtin(g, q, k, v, Some((p, bias_u, bias_v)), window);
    }
    // The body reads sources 0..6 only; the ones after are for ordering.
    let sources: Vec<Tensor<'g>> = sources.into_iter().chain(after.iter().copied()).collect();
    // SAFETY: a [d_k, h, T] f32 result over the six contiguous f32 operands checked above, as
    // RelPosAttention reads them; each task writes its own rows of the result.
    unsafe {
        g.custom(
            Out::F32,
            [dk, h, t, 1],
            &sources,
            RelPosAttention { window },
            "rel_pos_attention",
        )
    }
}

/// Plain multi-head attention without positions, every query over every key:
/// `softmax(q_i . k_j / sqrt(d_k)) . v_j` (the Transformer blocks of NeMo's `MultiHeadAttention`,
/// whose `d_k^-1/4` on q and on k is this one scale). `q`, `k`, `v`: `[d_k, h, T]`; returns
/// `[d_k, h, T]`. The same blocked kernel as [`rel_pos_attention_over`] without its positional
/// product: no `[T, T, h]` scores are ever held.
pub fn dot_product_attention<'g>(
    g: &mut Graph<'g>,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
) -> Tensor<'g> {
    let [dk, h, t, one] = q.shape();
    assert!(
        one == 1 && t > 0 && k.shape() == q.shape() && v.shape() == q.shape(),
        "graph shape error: dot_product_attention q {:?} k {:?} v {:?}",
        q.shape(),
        k.shape(),
        v.shape()
    );
    if g.lowering() == Lowering::Builtin {
        return attention_builtin(g, q, k, v, None, KeyWindow::band(t - 1, t - 1));
    }
    let sources = [q, k, v].map(|x| {
        let x = if x.is_contiguous() { x } else { g.cont(x) };
        assert!(
            x.dtype() == Some(DType::F32),
            "graph shape error: dot_product_attention needs f32 operands"
        );
        x
    });
    // SAFETY: a [d_k, h, T] f32 result over the three contiguous f32 operands checked above,
    // as DotProductAttention reads them; each task writes its own rows of the result.
    unsafe {
        g.custom(
            Out::F32,
            [dk, h, t, 1],
            &sources,
            DotProductAttention,
            "dot_product_attention",
        )
    }
}

/// Queries per block of the built-in lowering: each block's scores span the keys its queries'
/// windows reach, `[keys, block, heads]`, never `[keys, T, heads]` for a long input.
const BUILTIN_QUERY_BLOCK: usize = 256;

/// Attention in ggml's built-in ops, per block of queries and every head at once: the content
/// scores `k^T (q + u)` and the positional scores `p^T (q + v)` as `mul_mat`s, the rel-shift as
/// a strided view of the positional scores (row `j - i + left` of query `i`, one row less per
/// query: NeMo's `rel_shift` without its copy), the window as a `-inf` mask in
/// `soft_max_ext` (which also scales by `1 / sqrt(d_k)`), and `v^T` times the probabilities.
/// All f32. `positions`: `p` (`[d_k, h, rows]`), `bias_u`, `bias_v`; none for plain attention.
fn attention_builtin<'g>(
    g: &mut Graph<'g>,
    q: Tensor<'g>,
    k: Tensor<'g>,
    v: Tensor<'g>,
    positions: Option<(Tensor<'g>, Tensor<'g>, Tensor<'g>)>,
    window: KeyWindow,
) -> Tensor<'g> {
    let [dk, h, t, _] = q.shape();
    let keys = k.ne(2);
    // Heads outermost: [d_k, n, h], keys transposed for the last product ([keys, d_k, h]).
    let heads_last = |g: &mut Graph<'g>, x: Tensor<'g>| {
        let x = g.permute(x, [0, 2, 1, 3]);
        g.cont(x)
    };
    let kh = heads_last(g, k);
    let vt = g.permute(v, [1, 2, 0, 3]);
    let vt = g.cont(vt);
    let (qu, pos) = match positions {
        Some((p, bu, bv)) => {
            let qu = g.add(q, bu);
            let qv = g.add(q, bv);
            let qv = heads_last(g, qv);
            let ph = heads_last(g, p);
            (heads_last(g, qu), Some((ph, qv)))
        }
        None => (heads_last(g, q), None),
    };
    let row = |x: Tensor<'g>| x.ne(0) * 4;
    // Rows `from..from + n` along ne1 of a [c, n, h] tensor, every head (a view).
    let span = |g: &mut Graph<'g>, x: Tensor<'g>, from: usize, n: usize| {
        let (c, m) = (x.ne(0), x.ne(1));
        g.view(x, &[c, n, h], &[c * 4, c * m * 4], from * c * 4)
    };
    let o = Operands {
        h,
        dk,
        t,
        keys,
        window,
        q: &[],
        k: &[],
        v: &[],
        positions: None,
    };
    let mut parts = Vec::new();
    for i0 in (0..t).step_by(BUILTIN_QUERY_BLOCK) {
        let queries = i0..(i0 + BUILTIN_QUERY_BLOCK).min(t);
        let nq = queries.len();
        let (j0, j1, r0, r1) = o.reach(&queries);
        let (nk, nr) = (j1 + 1 - j0, r1 + 1 - r0);
        let kb = span(g, kh, j0, nk);
        let qb = span(g, qu, i0, nq);
        let mut scores = g.mul_mat(kb, qb); // [nk, nq, h]
        if let Some((ph, qv)) = pos {
            let pb = span(g, ph, r0, nr);
            let qvb = span(g, qv, i0, nq);
            let bd = g.mul_mat(pb, qvb); // [nr, nq, h]
            // Key j0 + c of query i0 + b reads row `off + c - b` of the query's column, the
            // columns padded to `width` rows: every read inside the tensor (ggml also wants
            // the view's extent as if it were contiguous there).
            let off = j0 + window.left - (window.past + i0) - r0;
            let width = nr.max(off + nk);
            let bd = match width > nr {
                true => g.pad(bd, [(0, width - nr), (0, 0), (0, 0), (0, 0)]),
                false => bd,
            };
            let shifted = g.view(
                bd,
                &[nk, nq, h],
                &[(width - 1) * 4, width * nq * 4],
                off * 4,
            );
            scores = g.add(scores, shifted);
        }
        // One mask per window and block for every layer of the graph (an input lives as long
        // as the graph).
        let key = ("attention mask", mask_key(&window, keys, &queries), false);
        let mask = g.shared(key, |g| {
            let mask: Vec<f32> = queries
                .clone()
                .flat_map(|i| {
                    let (lo, hi) = window.keys_of(i, keys);
                    (j0..=j1).map(move |j| match (lo..=hi).contains(&j) {
                        true => 0.0,
                        false => f32::NEG_INFINITY,
                    })
                })
                .collect();
            g.input_f32_owned(mask, &[nk, nq])
        });
        let probs = g.softmax_masked(scores, mask, 1.0 / (dk as f32).sqrt());
        let vb = g.view(vt, &[nk, dk, h], &[row(vt), row(vt) * dk], j0 * 4);
        let ob = g.mul_mat(vb, probs); // [dk, nq, h]
        let ob = g.permute(ob, [0, 2, 1, 3]);
        let ob = g.cont(ob);
        parts.push(g.reshape(ob, &[dk * h, nq]));
    }
    let o = match parts.len() {
        1 => parts[0],
        _ => g.stack_rows(&parts),
    };
    g.reshape(o, &[dk, h, t])
}

/// What a block's mask depends on: the window, the keys and the block's queries.
fn mask_key(w: &KeyWindow, keys: usize, queries: &std::ops::Range<usize>) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let chunk = w.chunk.map(|c| (c.size, c.left_chunks));
    (w.left, w.right, w.past, w.first_valid, chunk).hash(&mut h);
    (keys, queries.start, queries.end).hash(&mut h);
    h.finish() as usize
}

/// Queries handled together by one task (keeps a block of keys hot in cache).
const QUERY_BLOCK: usize = 32;

/// The node of [`rel_pos_attention`]. Sources: `q`, `k`, `v` `[d_k, h, T]`, `p`
/// `[d_k, h, left + right + 1]`, `pos_bias_u`, `pos_bias_v` `[d_k, h]`, all contiguous f32; the
/// result `[d_k, h, T]`. Tasks are (head, block of queries) pairs dealt round-robin over the
/// threads.
struct RelPosAttention {
    window: KeyWindow,
}

impl Body for RelPosAttention {
    fn run(&self, op: &CustomOp<'_>) {
        run_tasks(op, &Operands::of(op, self.window, true));
    }
}

/// The node of [`dot_product_attention`]. Sources: `q`, `k`, `v` `[d_k, h, T]`, contiguous f32;
/// the result `[d_k, h, T]`. Tasks as [`RelPosAttention`]'s.
struct DotProductAttention;

impl Body for DotProductAttention {
    fn run(&self, op: &CustomOp<'_>) {
        let t = op.src_shape(0)[2];
        run_tasks(op, &Operands::of(op, KeyWindow::band(t - 1, t - 1), false));
    }
}

/// This thread's (head, block of queries) tasks of an attention node, dealt round-robin.
fn run_tasks(op: &CustomOp<'_>, ops: &Operands<'_>) {
    let (dk, h, t) = (ops.dk, ops.h, ops.t);
    // SAFETY: each task writes only its own (head, query block) rows of the result.
    let out = unsafe { op.dst_mut::<f32>(0..dk * h * t) };
    let (nth, blocks) = (op.nth(), t.div_ceil(QUERY_BLOCK));
    let chunks = chunks_per_head(h, nth, blocks);
    let mut scratch = Scratch::default();
    for task in (op.ith()..h * chunks).step_by(nth) {
        let (head, chunk) = (task / chunks, task % chunks);
        let block_range = chunk * blocks / chunks..(chunk + 1) * blocks / chunks;
        attend_chunk(ops, head, block_range, &mut scratch, out);
    }
}

/// Query blocks per head are split into this many tasks: one per head when the heads divide
/// evenly over the threads (each task copies its head's keys, values and positional rows once
/// for all its blocks), more when there are fewer heads than it takes to keep every thread busy.
fn chunks_per_head(h: usize, threads: usize, blocks: usize) -> usize {
    let chunks = if h.is_multiple_of(threads) {
        1
    } else {
        (4 * threads).div_ceil(h)
    };
    chunks.clamp(1, blocks.max(1))
}

/// The op's operands (see [`RelPosAttention`]).
struct Operands<'a> {
    h: usize,
    dk: usize,
    /// Queries, and keys (`window.past` more).
    t: usize,
    keys: usize,
    window: KeyWindow,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// The relative-position term; none for plain attention.
    positions: Option<Positions<'a>>,
}

/// The positional operands of rel-pos attention: `p` `[d_k, h, left + right + 1]`, `bu`, `bv`
/// `[d_k, h]`.
struct Positions<'a> {
    p: &'a [f32],
    bu: &'a [f32],
    bv: &'a [f32],
}

impl<'a> Operands<'a> {
    /// Floats per staged value row: `d_k`, rounded up to whole vectors where the 512-bit
    /// product runs (zero columns, so that a head of 24 multiplies in two vectors, not in a
    /// scalar tail).
    fn v_width(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        if avx512() {
            return self.dk.next_multiple_of(LANES);
        }
        self.dk
    }

    /// The sources of an attention node over `window`: `q`, `k`, `v`, then with `positional`
    /// `p`, `bu`, `bv`.
    fn of(op: &'a CustomOp<'_>, window: KeyWindow, positional: bool) -> Operands<'a> {
        let [dk, h, t, _] = op.src_shape(0);
        Operands {
            h,
            dk,
            t,
            keys: op.src_shape(1)[2],
            window,
            q: op.src_f32(0),
            k: op.src_f32(1),
            v: op.src_f32(2),
            positions: positional.then(|| Positions {
                p: op.src_f32(3),
                bu: op.src_f32(4),
                bv: op.src_f32(5),
            }),
        }
    }

    /// Head `head`'s `d_k` values of frame (or positional row) `n` of `x`.
    fn row<'b>(&self, x: &'b [f32], n: usize, head: usize) -> &'b [f32] {
        let at = (n * self.h + head) * self.dk;
        &x[at..at + self.dk]
    }

    /// The keys `[j0, j1]` that queries `queries` attend to (the union of their windows), and
    /// the positional rows `[r0, r1]` those pairs need (row `j - i + left`).
    fn reach(&self, queries: &std::ops::Range<usize>) -> (usize, usize, usize, usize) {
        let w = &self.window;
        let (i0, i_last) = (queries.start, queries.end - 1);
        let (j0, _) = w.keys_of(i0, self.keys);
        let (_, j1) = w.keys_of(i_last, self.keys);
        let (a0, a_last) = (w.past + i0, w.past + i_last);
        let r0 = (j0 + w.left).saturating_sub(a_last);
        let r1 = (j1 + w.left - a0).min(w.left + w.right);
        (j0, j1, r0, r1)
    }
}

/// Per-thread buffers, grown to the largest task seen.
#[derive(Default)]
struct Scratch {
    q_u: Vec<f32>,
    q_v: Vec<f32>,
    /// The task's keys, then positional rows, transposed: `[d_k][n]`, `n` padded by
    /// [`LANES`] so that a block may read whole vectors past its last column.
    kt: Vec<f32>,
    pt: Vec<f32>,
    /// The task's values, one contiguous row per frame (the tensor's rows of one head lie
    /// `h * d_k` floats apart: a 4 KiB stride that mapped every row to the same L1 sets), of
    /// [`Operands::v_width`] floats.
    vr: Vec<f32>,
    /// `[block][n]` content scores (then probabilities) and positional scores.
    ac: Vec<f32>,
    bd: Vec<f32>,
}

/// Columns computed together: two 8-lane (or one 16-lane) vectors.
const LANES: usize = 16;

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// The operands one task's blocks share, copied once per task.
struct Staged<'s> {
    /// First key (row 0 of `vr`), and the padded width of `kt`.
    j0: usize,
    k_width: usize,
    /// First positional row, and the padded width of `pt`.
    r0: usize,
    p_width: usize,
    kt: &'s [f32],
    pt: &'s [f32],
    vr: &'s [f32],
    /// Floats per row of `vr`.
    v_width: usize,
}

multiversioned! {
    /// One head, a range of query blocks: the keys, values and positional rows they reach are
    /// staged once (transposed where the products want columns), then each block is attended.
    fn attend_chunk(
        o: &Operands<'_>,
        head: usize,
        blocks: std::ops::Range<usize>,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        if blocks.is_empty() {
            return;
        }
        let queries = blocks.start * QUERY_BLOCK..(blocks.end * QUERY_BLOCK).min(o.t);
        let (j0, j1, r0, r1) = o.reach(&queries);
        let (nk, nr) = (j1 + 1 - j0, r1 + 1 - r0);
        let (k_width, p_width) = (nk + LANES, nr + LANES);
        let dk = o.dk;
        transpose_rows(o, o.k, head, j0, nk, k_width, grow(&mut s.kt, dk * k_width));
        if let Some(pos) = &o.positions {
            transpose_rows(o, pos.p, head, r0, nr, p_width, grow(&mut s.pt, dk * p_width));
        }
        let v_width = o.v_width();
        let vr = grow(&mut s.vr, nk * v_width);
        for (j, row) in vr.chunks_exact_mut(v_width).enumerate() {
            row[..dk].copy_from_slice(o.row(o.v, j0 + j, head));
            row[dk..].fill(0.0);
        }
        let Scratch {
            q_u,
            q_v,
            kt,
            pt,
            vr,
            ac,
            bd,
        } = s;
        let staged = Staged {
            j0,
            k_width,
            r0,
            p_width,
            kt,
            pt,
            vr,
            v_width,
        };
        for block in blocks {
            let i0 = block * QUERY_BLOCK;
            let queries = i0..(i0 + QUERY_BLOCK).min(o.t);
            attend_block(o, head, queries, &staged, [q_u, q_v, ac, bd], out);
        }
    }
}

/// One head, a block of queries: the content and positional scores as two small matrix
/// products over the union of the block's windows, the rel-shift as an index, a softmax per
/// query, and the probabilities times `v` as a third product. Products keep a 4 x 64 tile of
/// accumulators over contiguous operands so that they vectorise; work outside a query's
/// window is skipped by zero probabilities (at most `block - 1` extra keys per query).
/// Inlined into each version of [`attend_chunk`], like the helpers below.
#[inline(always)]
fn attend_block(
    o: &Operands<'_>,
    head: usize,
    queries: std::ops::Range<usize>,
    st: &Staged<'_>,
    [q_u, q_v, ac, bd]: [&mut Vec<f32>; 4],
    out: &mut [f32],
) {
    let (dk, nq, i0) = (o.dk, queries.len(), queries.start);
    let (j0, j1, r0, r1) = o.reach(&queries);
    let (nk, nr) = (j1 + 1 - j0, r1 + 1 - r0);
    let (nk_pad, nr_pad) = (nk.next_multiple_of(LANES), nr.next_multiple_of(LANES));

    let q_u = grow(q_u, nq * dk);
    let ac = grow(ac, nq * nk_pad);
    let kt = Columns {
        data: &st.kt[j0 - st.j0..],
        stride: st.k_width,
    };
    // The positional scores `[block][nr_pad]`, when there is a positional term.
    let bd = match &o.positions {
        Some(pos) => {
            let q_v = grow(q_v, nq * dk);
            let (bu, bv) = (
                &pos.bu[head * dk..(head + 1) * dk],
                &pos.bv[head * dk..(head + 1) * dk],
            );
            for (b, i) in queries.clone().enumerate() {
                let q = o.row(o.q, i, head);
                for c in 0..dk {
                    q_u[b * dk + c] = q[c] + bu[c];
                    q_v[b * dk + c] = q[c] + bv[c];
                }
            }
            product_qt(q_u, kt, dk, nq, nk_pad, ac);
            let bd = grow(bd, nq * nr_pad);
            let pt = Columns {
                data: &st.pt[r0 - st.r0..],
                stride: st.p_width,
            };
            product_qt(q_v, pt, dk, nq, nr_pad, bd);
            Some(&*bd)
        }
        None => {
            for (b, i) in queries.clone().enumerate() {
                q_u[b * dk..(b + 1) * dk].copy_from_slice(o.row(o.q, i, head));
            }
            product_qt(q_u, kt, dk, nq, nk_pad, ac);
            None
        }
    };

    // Each query's exponentials stay unnormalised in `ac`; the products scale by `inv`.
    let scale = 1.0 / (dk as f32).sqrt();
    let mut inv = [0f32; QUERY_BLOCK];
    for (b, i) in queries.clone().enumerate() {
        let row = &mut ac[b * nk_pad..(b + 1) * nk_pad];
        // This query's keys, as columns of the block's key range.
        let (lo, hi) = o.window.keys_of(i, o.keys);
        let (lo, hi) = (lo - j0, hi - j0);
        // Key j0 + c needs positional row (j0 + c) - (past + i) + left: column c + first of
        // the block's positional scores.
        let shift = bd.map(|bd| {
            let first = j0 + lo + o.window.left - (o.window.past + i) - r0;
            &bd[b * nr_pad + first..(b + 1) * nr_pad]
        });
        inv[b] = softmax_row(&mut row[lo..=hi], shift, scale);
        row[..lo].fill(0.0);
        row[hi + 1..].fill(0.0);
    }
    // out_i = sum_j prob[i][j] v_j, four queries and 64 channels at a time.
    let dv = st.v_width;
    let v = &st.vr[(j0 - st.j0) * dv..];
    #[cfg(target_arch = "x86_64")]
    if avx512() && dk.is_multiple_of(LANES) {
        // Query rows straight into the result (`dv` is `dk` here), `h` heads apart.
        let (at, stride) = ((i0 * o.h + head) * dk, o.h * dk);
        // SAFETY: AVX-512F present; the extents are the ones the portable loop below indexes.
        unsafe {
            probs_times_v_avx512(
                v,
                dv,
                (nk, nk_pad),
                (ac, &inv),
                nq,
                (&mut out[at..], stride),
            )
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // Rows of whole vectors (the values' zero columns give zeros), then the d_k wanted.
        let rows = grow(q_v, nq * dv);
        // SAFETY: AVX-512F present; `v` holds nk rows of dv (a multiple of LANES), `ac` nq
        // rows of nk_pad probabilities, `rows` nq rows of dv.
        unsafe { probs_times_v_avx512(v, dv, (nk, nk_pad), (ac, &inv), nq, (rows, dv)) };
        for (b, row) in rows.chunks_exact(dv).enumerate() {
            let at = ((i0 + b) * o.h + head) * dk;
            out[at..at + dk].copy_from_slice(&row[..dk]);
        }
        return;
    }
    let mut b = 0;
    while b < nq {
        let nb = (nq - b).min(4);
        let mut c0 = 0;
        while c0 < dk {
            let nc = (dk - c0).min(LANES);
            let mut acc = [[0f32; LANES]; 4];
            for j in 0..nk {
                let vj = &v[j * dv + c0..][..nc];
                for (qb, acc) in acc.iter_mut().enumerate().take(nb) {
                    let pr = ac[(b + qb) * nk_pad + j];
                    for (a, &x) in acc.iter_mut().zip(vj) {
                        *a = pr.mul_add(x, *a);
                    }
                }
            }
            for (qb, acc) in acc.iter().enumerate().take(nb) {
                let at = ((i0 + b + qb) * o.h + head) * dk + c0;
                for (y, &a) in out[at..at + nc].iter_mut().zip(acc) {
                    *y = a * inv[b + qb];
                }
            }
            c0 += nc;
        }
        b += nb;
    }
}

/// One query's softmax over its window `x` of raw scores, left unnormalised: `x` becomes
/// `e^(s - max s)` for the scaled scores `s = (x + shift) * scale` (`shift`: the positional
/// scores lined up with `x`, for rel-pos attention); returns `1 / sum`, by which the
/// products with the values scale their results (one multiply per output value instead of
/// one per key).
#[inline(always)]
fn softmax_row(x: &mut [f32], shift: Option<&[f32]>, scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F present.
        return unsafe { softmax_row_avx512(x, shift, scale) };
    }
    match shift {
        Some(shift) => {
            for (v, &p) in x.iter_mut().zip(shift) {
                *v = (*v + p) * scale;
            }
        }
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
    let max = max_of(x);
    for v in x.iter_mut() {
        *v -= max;
    }
    exp_in_place(x);
    1.0 / sum_of(x)
}

/// [`softmax_row`] in two passes of 512-bit registers: the scaled scores and their maximum,
/// then the exponentials ([`exp_nonpositive_fma`]) and their sum (the same partial sums as
/// [`sum_of`]).
///
/// # Safety
/// AVX-512F; `shift`, where given, is at least as long as `x`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row_avx512(x: &mut [f32], shift: Option<&[f32]>, scale: f32) -> f32 {
    use std::arch::x86_64::*;
    assert!(shift.is_none_or(|p| p.len() >= x.len()));
    let n = x.len();
    let mask_at = |c: usize| -> __mmask16 {
        let left = n - c;
        if left >= LANES {
            !0
        } else {
            ((1u32 << left) - 1) as __mmask16
        }
    };
    let px = x.as_mut_ptr();
    // SAFETY: every access is masked to lanes inside x (and shift, as long, asserted above).
    unsafe {
        let sc = _mm512_set1_ps(scale);
        let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
        for c in (0..n).step_by(LANES) {
            let k = mask_at(c);
            let mut v = _mm512_maskz_loadu_ps(k, px.add(c));
            if let Some(p) = shift {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, p.as_ptr().add(c)));
            }
            v = _mm512_mul_ps(v, sc);
            _mm512_mask_storeu_ps(px.add(c), k, v);
            mx = _mm512_mask_max_ps(mx, k, mx, v);
        }
        let mx = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        let mut sum = _mm512_setzero_ps();
        for c in (0..n).step_by(LANES) {
            let k = mask_at(c);
            let v = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, px.add(c)), mx);
            let e = exp_nonpositive_fma(v);
            _mm512_mask_storeu_ps(px.add(c), k, e);
            sum = _mm512_mask_add_ps(sum, k, sum, e);
        }
        // Halves added pairwise, as `sum_of`.
        let lo = _mm512_castps512_ps256(sum);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sum)));
        let s8 = _mm256_add_ps(lo, hi);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2));
        1.0 / _mm_cvtss_f32(s1)
    }
}

/// The largest value (exact in any order).
#[inline(always)]
fn max_of(x: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v);
        }
    }
    let rest = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// The sum in [`LANES`] interleaved partial sums (a single chain waited on the add latency
/// for every term).
#[inline(always)]
fn sum_of(x: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (s, &v) in lanes.iter_mut().zip(chunk) {
            *s += v;
        }
    }
    for (s, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *s += v;
    }
    // Pairwise, as one vector halved at each step.
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            lanes[i] += lanes[i + n];
        }
    }
    lanes[0]
}

/// Columns of a transposed operand: row `c` of `d_k` starts at `c * stride`; a product reads
/// whole vectors from the first column on.
#[derive(Clone, Copy)]
struct Columns<'a> {
    data: &'a [f32],
    stride: usize,
}

/// Rows `first .. first + n` of head `head` of `x`, transposed into `dst` `[d_k][n_pad]`
/// (padding columns zero).
fn transpose_rows(
    o: &Operands<'_>,
    x: &[f32],
    head: usize,
    first: usize,
    n: usize,
    n_pad: usize,
    dst: &mut [f32],
) {
    // Sixteen rows at a time, so that each store fills one contiguous run of a destination row
    // and the sixteen source rows stay in L1 while their channels are walked (a row-by-row
    // scatter wrote one float per cache line); with AVX-512, 16 x 16 blocks in registers (the
    // scalar copy was ~15 % of the op at 1 thread).
    const STRIP: usize = 16;
    let mut j0 = 0;
    while j0 < n {
        let nj = (n - j0).min(STRIP);
        #[cfg(target_arch = "x86_64")]
        if avx512() && o.dk.is_multiple_of(16) {
            let mask = ((1u32 << nj) - 1) as u16;
            for c0 in (0..o.dk).step_by(16) {
                let src = o.row(x, first + j0, head)[c0..].as_ptr();
                assert!(dst.len() >= (c0 + 15) * n_pad + j0 + nj);
                assert!(x.len() >= ((first + j0 + nj - 1) * o.h + head) * o.dk + c0 + 16);
                // SAFETY: AVX-512F present; the nj source rows (h * dk apart) have 16 channels
                // from c0, and the 16 destination rows (n_pad apart) room for nj values from
                // j0 (both asserted).
                unsafe {
                    transpose16(
                        src,
                        o.h * o.dk,
                        nj,
                        dst[c0 * n_pad + j0..].as_mut_ptr(),
                        n_pad,
                        mask,
                    )
                };
            }
            j0 += nj;
            continue;
        }
        let rows: [&[f32]; STRIP] =
            std::array::from_fn(|jj| o.row(x, first + j0 + jj.min(nj - 1), head));
        for c in 0..o.dk {
            let out = &mut dst[c * n_pad + j0..][..nj];
            for (jj, v) in out.iter_mut().enumerate() {
                *v = rows[jj][c];
            }
        }
        j0 += nj;
    }
    for c in 0..o.dk {
        dst[c * n_pad + n..(c + 1) * n_pad].fill(0.0);
    }
}

/// Transposes `rows` (<= 16) rows of 16 floats, `ldx` apart from `x`, into 16 rows of `rows`
/// floats, `ldo` apart from `out` (output row `i` holds element `i` of every input row): one
/// load per input row, a 16 x 16 transpose in registers (missing rows zero), and one store
/// per output row masked by `mask` (the low `rows` bits).
///
/// # Safety
/// AVX-512F; rows `0..rows` hold 16 readable values each; every output row has room for
/// `rows` values; `mask` has exactly the low `rows` bits set.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(
    x: *const f32,
    ldx: usize,
    rows: usize,
    out: *mut f32,
    ldo: usize,
    mask: u16,
) {
    use std::arch::x86_64::*;
    // SAFETY: per the contract.
    unsafe {
        let r: [__m512; 16] = std::array::from_fn(|c| {
            if c < rows {
                _mm512_loadu_ps(x.add(c * ldx))
            } else {
                _mm512_setzero_ps()
            }
        });
        // Stage 1: interleave pairs of rows (32-bit elements).
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // Stage 2: 64-bit elements of rows (b, b + 2) and (b + 1, b + 3) within each group of
        // four: u[4g + s], 128-bit lane L, holds columns 4g..4g + 4 of step 4L + s.
        let mut u = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let b = 4 * g;
            let pd = |v: __m512| _mm512_castps_pd(v);
            u[b] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[b]), pd(t[b + 2])));
            u[b + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[b]), pd(t[b + 2])));
            u[b + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[b + 1]), pd(t[b + 3])));
            u[b + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[b + 1]), pd(t[b + 3])));
        }
        // Stage 3: 128-bit lanes of groups (0, 1) and (2, 3): lanes 0/2 (0x88) or 1/3 (0xdd).
        let mut v = [_mm512_setzero_ps(); 16];
        for i in 0..4 {
            v[i] = _mm512_shuffle_f32x4::<0x88>(u[i], u[4 + i]);
            v[4 + i] = _mm512_shuffle_f32x4::<0xdd>(u[i], u[4 + i]);
            v[8 + i] = _mm512_shuffle_f32x4::<0x88>(u[8 + i], u[12 + i]);
            v[12 + i] = _mm512_shuffle_f32x4::<0xdd>(u[8 + i], u[12 + i]);
        }
        // Stage 4: 128-bit lanes across the two halves; `lo` is then step i (columns 0..16 in
        // order) and `hi` step 8 + i.
        for i in 0..8 {
            let lo = _mm512_shuffle_f32x4::<0x88>(v[i], v[8 + i]);
            let hi = _mm512_shuffle_f32x4::<0xdd>(v[i], v[8 + i]);
            _mm512_mask_storeu_ps(out.add(i * ldo), mask, lo);
            _mm512_mask_storeu_ps(out.add((8 + i) * ldo), mask, hi);
        }
    }
}

/// The register tiles of a `rows` x `cols` product (`cols` a multiple of [`LANES`]): up to 4
/// rows by 4 vectors of 16 columns (16 accumulators, enough independent chains for both FMA
/// ports), as `(first row, rows, first column, vectors)`. Columns outer: one 64-column slab
/// of the right operand stays in L1 while every row tile passes over it.
#[cfg(target_arch = "x86_64")]
fn tiles(rows: usize, cols: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    (0..cols).step_by(4 * LANES).flat_map(move |c0| {
        (0..rows)
            .step_by(4)
            .map(move |b| (b, (rows - b).min(4), c0, ((cols - c0) / LANES).min(4)))
    })
}

/// Calls the const-generic tile kernel `$f::<R, V>($t)` for the runtime shape `($nb, $nv)`
/// from [`tiles`].
#[cfg(target_arch = "x86_64")]
macro_rules! by_tile_shape {
    ($f:ident, $nb:expr, $nv:expr, $t:expr) => {
        match ($nb, $nv) {
            (1, 1) => $f::<1, 1>($t),
            (1, 2) => $f::<1, 2>($t),
            (1, 3) => $f::<1, 3>($t),
            (1, 4) => $f::<1, 4>($t),
            (2, 1) => $f::<2, 1>($t),
            (2, 2) => $f::<2, 2>($t),
            (2, 3) => $f::<2, 3>($t),
            (2, 4) => $f::<2, 4>($t),
            (3, 1) => $f::<3, 1>($t),
            (3, 2) => $f::<3, 2>($t),
            (3, 3) => $f::<3, 3>($t),
            (3, 4) => $f::<3, 4>($t),
            (4, 1) => $f::<4, 1>($t),
            (4, 2) => $f::<4, 2>($t),
            (4, 3) => $f::<4, 3>($t),
            (4, 4) => $f::<4, 4>($t),
            (r, v) => unreachable!("tile {r} x {v}"),
        }
    };
}

/// The probabilities-times-values loop of [`attend_block`] in 512-bit registers (the same
/// fused multiply-adds in the same order, so the same bits): `nq` output rows of `dv` floats,
/// `out_stride` apart in `out`, from values of `dv` floats a row.
///
/// # Safety
/// AVX-512F; `dv` a multiple of [`LANES`]; `probs` holds `nq` rows of `nk_pad` (`nk <= nk_pad`);
/// `v` holds `nk` rows of `dv`; `out` holds `nq` rows of `dv`, `out_stride` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn probs_times_v_avx512(
    v: &[f32],
    dv: usize,
    (nk, nk_pad): (usize, usize),
    (probs, inv): (&[f32], &[f32]),
    nq: usize,
    (out, out_stride): (&mut [f32], usize),
) {
    assert!(nk <= nk_pad && probs.len() >= nq * nk_pad && dv.is_multiple_of(LANES));
    assert!(inv.len() >= nq);
    assert!(nq == 0 || out.len() >= (nq - 1) * out_stride + dv);
    assert!(v.len() >= nk * dv);
    for (b, nb, c0, nv) in tiles(nq, dv) {
        let t = PvTile {
            probs: &probs[b * nk_pad..],
            inv: &inv[b..],
            nk_pad,
            nk,
            v: &v[c0..],
            v_stride: dv,
            out: &mut out[b * out_stride + c0..],
            out_stride,
        };
        // SAFETY: AVX-512F (this function's contract); extents asserted above.
        unsafe { by_tile_shape!(pv_tile, nb, nv, t) };
    }
}

/// Operands of one [`pv_tile`]: `R` rows of probabilities (`nk_pad` apart, `nk` used), the
/// values' channels from the tile's first (frames `v_stride` apart), the output rows
/// (`out_stride` apart) from the same channel.
#[cfg(target_arch = "x86_64")]
struct PvTile<'a> {
    probs: &'a [f32],
    /// Each row's scale (its softmax's `1 / sum`).
    inv: &'a [f32],
    nk_pad: usize,
    nk: usize,
    v: &'a [f32],
    v_stride: usize,
    out: &'a mut [f32],
    out_stride: usize,
}

/// `R` queries x `V` 16-channel vectors of [`probs_times_v_avx512`].
///
/// # Safety
/// AVX-512F; the extents described on [`PvTile`] for `R` rows, `nk` frames and `V * 16`
/// channels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pv_tile<const R: usize, const V: usize>(t: PvTile<'_>) {
    use std::arch::x86_64::*;
    assert!(t.nk >= 1 && t.probs.len() >= (R - 1) * t.nk_pad + t.nk);
    assert!(t.v.len() >= (t.nk - 1) * t.v_stride + V * LANES);
    assert!(t.out.len() >= (R - 1) * t.out_stride + V * LANES && t.inv.len() >= R);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for j in 0..t.nk {
        // SAFETY: V vectors of frame j (asserted extents).
        let x: [__m512; V] = std::array::from_fn(|v| unsafe {
            _mm512_loadu_ps(t.v.as_ptr().add(j * t.v_stride + v * LANES))
        });
        for (r, acc) in acc.iter_mut().enumerate() {
            let pr = _mm512_set1_ps(t.probs[r * t.nk_pad + j]);
            for (acc, &x) in acc.iter_mut().zip(&x) {
                *acc = _mm512_fmadd_ps(pr, x, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let inv = _mm512_set1_ps(t.inv[r]);
        for (v, &acc) in acc.iter().enumerate() {
            let y = _mm512_mul_ps(acc, inv);
            // SAFETY: within out (asserted above).
            unsafe { _mm512_storeu_ps(t.out.as_mut_ptr().add(r * t.out_stride + v * LANES), y) };
        }
    }
}

/// [`product_qt`] in 512-bit registers (same operations, same order per output, so the
/// same bits): tiles of up to 4 rows x 64 columns, 16 accumulators, enough independent
/// chains for both FMA ports (a 4 x 16 tile left them half idle on the FMA latency).
///
/// # Safety
/// AVX-512F; the extents of [`product_qt`], `n_pad` a multiple of [`LANES`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn product_qt_avx512(
    a: &[f32],
    bt: Columns<'_>,
    dk: usize,
    nq: usize,
    n_pad: usize,
    out: &mut [f32],
) {
    assert!(a.len() >= nq * dk && out.len() >= nq * n_pad);
    assert!(n_pad.is_multiple_of(LANES) && bt.data.len() >= (dk - 1) * bt.stride + n_pad);
    for (b, nb, j0, nv) in tiles(nq, n_pad) {
        let t = QtTile {
            a: &a[b * dk..],
            bt: &bt.data[j0..],
            bt_stride: bt.stride,
            dk,
            n_pad,
            out: &mut out[b * n_pad + j0..],
        };
        // SAFETY: AVX-512F (this function's contract); nb rows of a and out, nv vectors of
        // columns from j0 (within n_pad, asserted above).
        unsafe { by_tile_shape!(qt_tile, nb, nv, t) };
    }
}

/// Operands of one [`qt_tile`]: rows of `a` from its first, columns of `bt` and `out` from the
/// tile's first (row strides `dk`, `bt_stride`, `n_pad`).
#[cfg(target_arch = "x86_64")]
struct QtTile<'a> {
    a: &'a [f32],
    bt: &'a [f32],
    bt_stride: usize,
    dk: usize,
    n_pad: usize,
    out: &'a mut [f32],
}

/// `R` rows x `V` 16-column vectors of [`product_qt_avx512`].
///
/// # Safety
/// AVX-512F; `a` holds `R` rows of `dk`, `bt` `dk` rows of `bt_stride` with `V * 16` columns
/// from its start, `out` `R` rows of `n_pad` with as many.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn qt_tile<const R: usize, const V: usize>(t: QtTile<'_>) {
    use std::arch::x86_64::*;
    let (dk, n_pad, stride) = (t.dk, t.n_pad, t.bt_stride);
    assert!(t.a.len() >= (R - 1) * dk + dk && t.bt.len() >= (dk - 1) * stride + V * LANES);
    assert!(t.out.len() >= (R - 1) * n_pad + V * LANES);
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for c in 0..dk {
        // SAFETY: V vectors of row c (asserted extents).
        let cols: [__m512; V] = std::array::from_fn(|v| unsafe {
            _mm512_loadu_ps(t.bt.as_ptr().add(c * stride + v * LANES))
        });
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(t.a[r * dk + c]);
            for (acc, &col) in acc.iter_mut().zip(&cols) {
                *acc = _mm512_fmadd_ps(x, col, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, &acc) in acc.iter().enumerate() {
            // SAFETY: within out (asserted above).
            unsafe { _mm512_storeu_ps(t.out.as_mut_ptr().add(r * n_pad + v * LANES), acc) };
        }
    }
}

/// `out[b][j] = sum_c a[b][c] * bt[c][j]` for `nq` rows of `a` (`[nq][dk]`) and the first
/// `n_pad` columns of `bt`; four rows by 16 columns of accumulators at a time.
#[inline(always)]
fn product_qt(a: &[f32], bt: Columns<'_>, dk: usize, nq: usize, n_pad: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F present; n_pad is a multiple of LANES (the callers pad to it).
        unsafe { product_qt_avx512(a, bt, dk, nq, n_pad, out) };
        return;
    }
    let mut b = 0;
    while b < nq {
        let nb = (nq - b).min(4);
        for j0 in (0..n_pad).step_by(LANES) {
            let mut acc = [[0f32; LANES]; 4];
            for c in 0..dk {
                let col: &[f32; LANES] = bt.data[c * bt.stride + j0..][..LANES]
                    .try_into()
                    .expect("lanes");
                for (qb, acc) in acc.iter_mut().enumerate().take(nb) {
                    let x = a[(b + qb) * dk + c];
                    for (acc, &y) in acc.iter_mut().zip(col) {
                        *acc = x.mul_add(y, *acc);
                    }
                }
            }
            for (qb, acc) in acc.iter().enumerate().take(nb) {
                out[(b + qb) * n_pad + j0..][..LANES].copy_from_slice(acc);
            }
        }
        b += nb;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain per-query reference of the op's math, in f64.
    fn naive(o: &Operands<'_>) -> Vec<f64> {
        let (dk, h, t) = (o.dk, o.h, o.t);
        let w = o.window;
        let mut out = vec![0f64; dk * h * t];
        for head in 0..h {
            for i in 0..t {
                let q = o.row(o.q, i, head);
                // Written out from the definitions, not from `keys_of`.
                let at = w.past + i;
                let keys: Vec<usize> = (w.first_valid..o.keys)
                    .filter(|&j| j + w.left >= at && j <= at + w.right)
                    .filter(|&j| {
                        w.chunk.is_none_or(|c| {
                            let (cq, ck) = (at / c.size, j / c.size);
                            ck <= cq && cq - ck <= c.left_chunks
                        })
                    })
                    .collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let k = o.row(o.k, j, head);
                        let content = |c: usize, bias: f32| (q[c] + bias) as f64 * k[c] as f64;
                        let score: f64 = match &o.positions {
                            Some(pos) => {
                                let p = o.row(pos.p, j + w.left - at, head);
                                let (bu, bv) = (&pos.bu[head * dk..], &pos.bv[head * dk..]);
                                (0..dk)
                                    .map(|c| {
                                        content(c, bu[c]) + (q[c] + bv[c]) as f64 * p[c] as f64
                                    })
                                    .sum()
                            }
                            None => (0..dk).map(|c| content(c, 0.0)).sum(),
                        };
                        score / (dk as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (&j, w) in keys.iter().zip(&e) {
                    for (c, &x) in o.row(o.v, j, head).iter().enumerate() {
                        out[(i * h + head) * dk + c] += w / sum * x as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn blocks_match_a_per_query_reference_for_full_and_local_windows() {
        let chunked = |left_chunks, size, past, first_valid| KeyWindow {
            left: left_chunks * size + size - 1,
            right: size - 1,
            past,
            first_valid,
            chunk: Some(Chunking { size, left_chunks }),
        };
        check_windows(&[
            (8, 2, 5, KeyWindow::band(4, 4)),
            (16, 2, 70, KeyWindow::band(69, 69)),
            (8, 3, 70, KeyWindow::band(16, 16)),
            (24, 1, 33, KeyWindow::band(3, 7)),
            (8, 2, 16, KeyWindow::band(16, 16)),
            (8, 2, 100, KeyWindow::band(0, 5)),
            (32, 3, 41, KeyWindow::band(40, 40)),
        ]);
        // NeMo's chunked_limited masks, whole-file and over a streaming cache (some of it not
        // filled yet).
        check_windows(&[
            (8, 2, 100, chunked(5, 14, 0, 0)),
            (16, 2, 61, chunked(35, 2, 0, 0)),
            (8, 2, 37, chunked(70, 1, 0, 0)),
            (8, 2, 14, chunked(5, 14, 70, 56)),
            (16, 2, 2, chunked(35, 2, 70, 0)),
            (8, 3, 1, chunked(70, 1, 70, 69)),
            (8, 2, 9, chunked(10, 7, 70, 14)),
        ]);
    }

    #[test]
    fn plain_attention_matches_a_per_query_reference() {
        // The Sortformer Transformer's heads (24 wide, not a whole vector) and others, over
        // lengths that end mid-block.
        let full = |t: usize| KeyWindow::band(t - 1, t - 1);
        let cases: Vec<_> = [
            (24, 8, 1),
            (24, 8, 33),
            (24, 8, 100),
            (16, 2, 64),
            (64, 3, 45),
        ]
        .into_iter()
        .map(|(dk, h, t)| (dk, h, t, full(t)))
        .collect();
        check(&cases, false);
    }

    fn check_windows(cases: &[(usize, usize, usize, KeyWindow)]) {
        check(cases, true);
    }

    /// Each case's blocks against [`naive`], with or without the positional term.
    fn check(cases: &[(usize, usize, usize, KeyWindow)], positional: bool) {
        let mut rng = crate::kernels::TestValues::new(1);
        let mut rnd = |n: usize| rng.take(n);
        for &(dk, h, t, window) in cases {
            let (left, right) = (window.left, window.right);
            let rows = left + right + 1;
            let keys = window.past + t;
            let (q, k, v, p, bu, bv) = (
                rnd(dk * h * t),
                rnd(dk * h * keys),
                rnd(dk * h * keys),
                rnd(dk * h * rows),
                rnd(dk * h),
                rnd(dk * h),
            );
            let o = Operands {
                h,
                dk,
                t,
                keys,
                window,
                q: &q,
                k: &k,
                v: &v,
                positions: positional.then_some(Positions {
                    p: &p,
                    bu: &bu,
                    bv: &bv,
                }),
            };
            let want = naive(&o);
            let mut s = Scratch::default();
            let blocks = t.div_ceil(QUERY_BLOCK);
            let mut first: Option<Vec<f32>> = None;
            // Any split of a head's blocks into tasks gives the same bits.
            for chunks in [1, 2, 3] {
                let mut got = vec![0f32; dk * h * t];
                for head in 0..h {
                    for c in 0..chunks {
                        let range = c * blocks / chunks..(c + 1) * blocks / chunks;
                        attend_chunk(&o, head, range, &mut s, &mut got);
                    }
                }
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(&a, &b)| (a as f64 - b).abs())
                    .fold(0f64, f64::max);
                assert!(
                    worst < 1e-5,
                    "dk {dk} h {h} t {t} {window:?}, {chunks} chunks: worst {worst:e}"
                );
                match &first {
                    None => first = Some(got),
                    Some(first) => assert!(first == &got, "{chunks} chunks differ from 1"),
                }
            }
        }
    }

    #[test]
    fn chunks_keep_every_thread_busy() {
        // Heads dividing over the threads: one task per head.
        assert_eq!(chunks_per_head(8, 2, 5), 1);
        assert_eq!(chunks_per_head(8, 8, 5), 1);
        // Otherwise at least four tasks per thread, never more than the blocks.
        assert_eq!(chunks_per_head(8, 3, 5), 2);
        assert_eq!(chunks_per_head(8, 16, 5), 5);
        assert_eq!(chunks_per_head(8, 3, 0), 1);
    }
}
