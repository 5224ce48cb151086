//! What every beam search shares: the one candidate type each strategy keeps its hypotheses
//! in, and choosing, sorting, merging and ranking candidates by score as NeMo's Python does
//! (`max` takes the first of equals; `sorted` is stable), with probabilities added in log
//! space. A score is f32 where NeMo keeps it in a tensor, f64 where in a Python float.

use super::NBest;
use super::path::TokenPath;
use crate::backend::Backend;
use crate::decoder::boosting::BoostingTree;
use crate::decoder::hypothesis::Hypothesis;
use crate::decoder::nets::{JointInput, Nets, PredictInput};
use crate::err;
use crate::error::Result;
use crate::tokenizer::Token;
use std::cmp::Ordering;

/// One hypothesis of a beam, as every strategy keeps it; `X` holds what only its strategy
/// needs besides, `D` the decoder's state (a transducer's [`Hypothesis`]; CTC keeps only its
/// last label, so extending its beam copies nothing that allocates).
#[derive(Clone)]
pub(super) struct Candidate<S, X = (), D = Hypothesis> {
    /// The decoder state after the last fed label; its last label is the last emitted one
    /// (CTC's: the last frame's, blank included); a transducer's `hyp.frame` is the frame
    /// looked at next and its own score is unused (see `score`).
    pub(super) hyp: D,
    /// A label emitted but not yet fed to the prediction net (`hyp.state` is the state before
    /// it).
    pub(super) unfed: Option<usize>,
    pub(super) tokens: TokenPath,
    /// NeMo's transcript hash of the labels ([`extend_hash`]).
    pub(super) hash: i64,
    pub(super) score: S,
    /// The boosting tree's state (the start state without a tree).
    pub(super) boost_state: u32,
    pub(super) own: X,
}

/// What a candidate's decoder state tells the shared helpers: the last label.
pub(super) trait DecoderState: Clone {
    fn set_last(&mut self, label: usize);
}

impl DecoderState for Hypothesis {
    fn set_last(&mut self, label: usize) {
        self.last = Some(label);
    }
}

impl<S: Score, X: Default> Candidate<S, X> {
    /// The empty hypothesis after the start symbol.
    pub(super) fn start(
        nets: &mut Nets,
        backend: &mut Backend,
        boost: Option<&BoostingTree>,
    ) -> Result<Candidate<S, X>> {
        Ok(Candidate::with_state(nets.start(backend)?, boost))
    }
}

impl<S: Score, X: Default, D: DecoderState> Candidate<S, X, D> {
    /// The empty hypothesis with the decoder state `hyp`.
    pub(super) fn with_state(hyp: D, boost: Option<&BoostingTree>) -> Candidate<S, X, D> {
        Candidate {
            hyp,
            unfed: None,
            tokens: TokenPath::default(),
            hash: 0,
            score: S::from_f64(0.0),
            boost_state: boost.map_or(0, BoostingTree::start),
            own: X::default(),
        }
    }
}

impl<S: Score, X, D: DecoderState> Candidate<S, X, D> {
    /// Whether both hold the same labels (NeMo compares hashes, lengths, then the labels).
    pub(super) fn same_tokens(&self, other: &Candidate<S, X, D>) -> bool {
        self.hash == other.hash
            && self.tokens.len() == other.tokens.len()
            && self.tokens.same_ids(&other.tokens)
    }

    /// Appends `token`, to be fed: the last label, the hash and the tokens follow it.
    pub(super) fn emit(&mut self, token: Token) {
        let label = token.id;
        self.hash = extend_hash(self.hash, label);
        self.hyp.set_last(label);
        self.unfed = Some(label);
        self.tokens = self.tokens.push(token);
    }

    /// This candidate extended by `token` (to be fed) with `score`, keeping `own`.
    pub(super) fn child_with(&self, token: Token, score: S, own: X) -> Candidate<S, X, D> {
        let mut child = Candidate {
            hyp: self.hyp.clone(),
            unfed: None,
            tokens: self.tokens.clone(),
            hash: self.hash,
            score,
            boost_state: self.boost_state,
            own,
        };
        child.emit(token);
        child
    }
}

impl<S: Score, X> Candidate<S, X> {
    /// Feeds the pending label, if any, and returns the joint's output at the frame
    /// projection `enc`: one graph either way.
    pub(super) fn feed_and_join(
        &mut self,
        nets: &mut Nets,
        backend: &mut Backend,
        enc: &[f32],
    ) -> Result<Vec<f32>> {
        if let Some(token) = self.unfed.take() {
            let input = PredictInput {
                token,
                state: &self.hyp.state,
                next_enc: Some(enc),
            };
            let p = nets
                .predict(backend, &[input])?
                .pop()
                .ok_or_else(|| err!(Internal, "internal: a prediction step without its result"))?;
            self.hyp.state = p.state;
            self.hyp.pred_out = p.pred_out;
            return p
                .logits
                .ok_or_else(|| err!(Internal, "internal: a prediction step without its joint"));
        }
        let input = JointInput {
            enc,
            pred_out: &self.hyp.pred_out,
        };
        nets.joint(backend, &[input])?
            .pop()
            .ok_or_else(|| err!(Internal, "internal: a joint step without its result"))
    }
}

impl<S: Score, X: Clone, D: DecoderState> Candidate<S, X, D> {
    /// This candidate extended by `token` (to be fed) with `score`.
    pub(super) fn child(&self, token: Token, score: S) -> Candidate<S, X, D> {
        self.child_with(token, score, self.own.clone())
    }
}

/// The index of the first of the best-scored candidates (as Python's `max`).
pub(super) fn first_best_of<S: Score, X>(candidates: &[Candidate<S, X>]) -> Option<usize> {
    first_best(candidates.iter().map(|c| c.score)).map(|(i, _)| i)
}

/// Best first, stable (as Python's `sorted(reverse=True)`), at most `n`.
pub(super) fn best_n<S: Score, X>(
    mut candidates: Vec<Candidate<S, X>>,
    n: usize,
) -> Vec<Candidate<S, X>> {
    sort_best_first(&mut candidates, |c| c.score);
    candidates.truncate(n);
    candidates
}

/// NeMo's `merge_duplicate_hypotheses` (TDT): best first; a later candidate with the same
/// tokens on the same frame adds its probability to the first one's (through f32 tensors, as
/// NeMo) and leaves.
pub(super) fn merge_duplicates<S: Score, X>(
    mut candidates: Vec<Candidate<S, X>>,
) -> Vec<Candidate<S, X>> {
    sort_best_first(&mut candidates, |c| c.score);
    merge_into_first(
        candidates,
        |m, c| m.hyp.frame == c.hyp.frame && m.same_tokens(c),
        |m, c| {
            let sum = log_add_exp(m.score.to_f64() as f32, c.score.to_f64() as f32);
            m.score = S::from_f64(sum as f64);
        },
    )
}

/// NeMo's `recombine_hypotheses`: a later candidate with the same labels adds its
/// probability to the first one's and leaves.
pub(super) fn recombine<S: Score, X>(candidates: Vec<Candidate<S, X>>) -> Vec<Candidate<S, X>> {
    merge_into_first(
        candidates,
        |o, c| o.same_tokens(c),
        |o, c| o.score = log_add_exp(o.score, c.score),
    )
}

/// The batched searches' recombination: of each group of `equal` candidates the first best
/// keeps its place, with the log-sum of the group's probabilities when `sum` (the
/// transducers', torch's `logsumexp`) or its own score (CTC's, which takes the maximum); the
/// others leave.
pub(super) fn recombine_groups<X, D>(
    candidates: Vec<Candidate<f32, X, D>>,
    equal: impl Fn(&Candidate<f32, X, D>, &Candidate<f32, X, D>) -> bool,
    sum: bool,
) -> Vec<Candidate<f32, X, D>> {
    let score = |c: &Candidate<f32, X, D>| c.score;
    let scores: Vec<Option<f32>> = if sum {
        group_leaders(&candidates, &equal, score)
            .into_iter()
            .map(|group| Some(log_sum_exp(group?.iter().map(|&j| candidates[j].score))))
            .collect()
    } else {
        // No group is needed: a leader keeps its own score.
        (0..candidates.len())
            .map(|i| leads(&candidates, i, &equal, score).then_some(candidates[i].score))
            .collect()
    };
    candidates
        .into_iter()
        .zip(scores)
        .filter_map(|(mut c, score)| {
            c.score = score?;
            Some(c)
        })
        .collect()
}

/// Ranks finished hypotheses NeMo's way, in their score's precision: by score per (emitted
/// tokens + 1) when `score_norm` (the + 1 counts NeMo's start symbol), else by score; best
/// first, reported in f32.
pub(super) fn rank<S: Score>(
    hyps: impl IntoIterator<Item = (TokenPath, S)>,
    score_norm: bool,
) -> Vec<NBest> {
    let mut hyps: Vec<(TokenPath, S)> = hyps.into_iter().collect();
    let key = |(tokens, score): &(TokenPath, S)| {
        if score_norm {
            S::from_f64(score.to_f64() / (tokens.len() as f64 + 1.0))
        } else {
            *score
        }
    };
    sort_best_first(&mut hyps, key);
    hyps.into_iter()
        .map(|(tokens, score)| NBest {
            tokens: tokens.to_vec(),
            score: score.to_f64() as f32,
        })
        .collect()
}

/// NeMo's transcript hash (a 64-bit linear congruential step per emitted label), used with
/// the last label and the length to recognise equal hypotheses.
pub(super) fn extend_hash(hash: i64, label: usize) -> i64 {
    const MULTIPLIER: i64 = 6364136223846793005;
    hash.wrapping_mul(MULTIPLIER)
        .wrapping_add(1)
        .wrapping_add(label as i64)
}

/// Indices of the `k` largest values, largest first; equal values keep index order (NeMo's
/// ties are measure-zero events). One pass keeping the best `k` so far: a beam's `k` is a
/// handful against a vocabulary (times durations) of thousands, so once `k` are kept nearly
/// every value falls at or below the worst of them, and whole blocks of values are passed
/// over with one vectorised maximum.
pub(super) fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    const BLOCK: usize = 16;
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    // The worst kept value's order key once `k` are kept: what a value must beat to enter.
    let mut floor: Option<i32> = None;
    for (b, block) in values.chunks(BLOCK).enumerate() {
        if let Some(f) = floor
            && block
                .iter()
                .map(|&v| order_key(v))
                .max()
                .is_none_or(|m| m <= f)
        {
            continue;
        }
        for (j, &v) in block.iter().enumerate() {
            let key = order_key(v);
            if floor.is_some_and(|f| key <= f) || k == 0 {
                continue;
            }
            let at = best.partition_point(|&i| order_key(values[i]) >= key);
            best.insert(at, b * BLOCK + j);
            best.truncate(k);
            if best.len() == k {
                floor = best.last().map(|&i| order_key(values[i]));
            }
        }
    }
    best
}

/// `v`'s place in IEEE 754's total order (the order of `f32::total_cmp`) as an integer, so a
/// block's maximum vectorises.
fn order_key(v: f32) -> i32 {
    let bits = v.to_bits() as i32;
    bits ^ (((bits >> 31) as u32) >> 1) as i32
}

/// Log-softmax of one row in f32 (as NeMo's `F.log_softmax(dtype=float32)`), accumulated in
/// f64.
pub(super) fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // exp(x - max) <= 1 from the vectorised exponential (2e-7 relative, libm's per-value call
    // was most of a beam step's host time), summed in f64.
    let mut e: Vec<f32> = row.iter().map(|&x| x - max).collect();
    crate::kernels::vmath::exp_in_place(&mut e);
    let sum: f64 = e.iter().map(|&v| v as f64).sum();
    let lse = sum.ln() as f32;
    row.iter().map(|&x| x - max - lse).collect()
}

/// torch's `logsumexp` of a few scores (max plus the log of the shifted sum).
pub(super) fn log_sum_exp(scores: impl Iterator<Item = f32> + Clone) -> f32 {
    let max = scores.clone().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = scores.map(|s| ((s - max) as f64).exp()).sum();
    (max as f64 + sum.ln()) as f32
}

/// A beam score: f32 or f64.
pub(super) trait Score: Copy + PartialOrd + std::ops::Sub<Output = Self> {
    const NEG_INFINITY: Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn total_cmp(&self, other: &Self) -> Ordering;
}

impl Score for f32 {
    const NEG_INFINITY: f32 = f32::NEG_INFINITY;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn total_cmp(&self, other: &f32) -> Ordering {
        f32::total_cmp(self, other)
    }
}

impl Score for f64 {
    const NEG_INFINITY: f64 = f64::NEG_INFINITY;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
    fn total_cmp(&self, other: &f64) -> Ordering {
        f64::total_cmp(self, other)
    }
}

/// `log(exp(a) + exp(b))` as torch's and NumPy's `logaddexp`: -inf on both sides stays -inf.
/// The difference is taken in the score's precision, the rest in f64.
pub(super) fn log_add_exp<S: Score>(a: S, b: S) -> S {
    let (hi, lo) = if a >= b { (a, b) } else { (b, a) };
    if hi == S::NEG_INFINITY {
        return hi;
    }
    S::from_f64(hi.to_f64() + (lo - hi).to_f64().exp().ln_1p())
}

/// The index and score of the first of the best scores (as Python's `max`).
pub(super) fn first_best<S: Score>(scores: impl IntoIterator<Item = S>) -> Option<(usize, S)> {
    let mut best: Option<(usize, S)> = None;
    for (i, s) in scores.into_iter().enumerate() {
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((i, s));
        }
    }
    best
}

/// Best first, stable (as Python's `sorted(..., reverse=True)`).
pub(super) fn sort_best_first<T, S: Score>(items: &mut [T], score: impl Fn(&T) -> S) {
    items.sort_by(|a, b| score(b).total_cmp(&score(a)));
}

/// Worst first, stable (as Python's `sorted`).
pub(super) fn sort_worst_first<T, S: Score>(items: &mut [T], score: impl Fn(&T) -> S) {
    items.sort_by(|a, b| score(a).total_cmp(&score(b)));
}

/// Each item that is `same` as an earlier one is folded into the first such (`fold` adds its
/// probability there) and leaves; the others keep their order. NeMo's duplicate merging (on a
/// list sorted best first) and its label-sync recombination.
pub(super) fn merge_into_first<T>(
    items: Vec<T>,
    same: impl Fn(&T, &T) -> bool,
    fold: impl Fn(&mut T, T),
) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(items.len());
    for item in items {
        match out.iter_mut().find(|o| same(o, &item)) {
            Some(o) => fold(o, item),
            None => out.push(item),
        }
    }
    out
}

/// Whether item `i` leads its group of `equal` items: no equal item scores better, nor as
/// well from an earlier place.
pub(super) fn leads<T, S: Score>(
    items: &[T],
    i: usize,
    equal: impl Fn(&T, &T) -> bool,
    score: impl Fn(&T) -> S,
) -> bool {
    let si = score(&items[i]);
    !items.iter().enumerate().any(|(j, item)| {
        j != i && {
            let sj = score(item);
            (sj > si || (sj == si && j < i)) && equal(&items[i], item)
        }
    })
}

/// For each item, its group (the indices of the items `equal` to it, itself included) when it
/// leads the group: the first of the group's best scores. None for the others. NeMo's
/// recombination of equal hypotheses keeps the leaders.
pub(super) fn group_leaders<T, S: Score>(
    items: &[T],
    equal: impl Fn(&T, &T) -> bool,
    score: impl Fn(&T) -> S,
) -> Vec<Option<Vec<usize>>> {
    (0..items.len())
        .map(|i| {
            leads(items, i, &equal, &score).then(|| {
                (0..items.len())
                    .filter(|&j| equal(&items[i], &items[j]))
                    .collect()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_add_exp_handles_minus_infinity() {
        assert_eq!(log_add_exp(f32::NEG_INFINITY, -1.0), -1.0);
        assert_eq!(
            log_add_exp(f64::NEG_INFINITY, f64::NEG_INFINITY),
            f64::NEG_INFINITY
        );
        assert!((log_add_exp(0.0f32, 0.0) - 2f32.ln()).abs() < 1e-7);
        assert!((log_add_exp(0.0f64, 0.0) - 2f64.ln()).abs() < 1e-15);
    }

    #[test]
    fn first_best_takes_the_first_of_equals() {
        assert_eq!(first_best([1.0f64, 3.0, 3.0, 2.0]), Some((1, 3.0)));
        assert_eq!(first_best(Vec::<f32>::new()), None);
    }

    #[test]
    fn sorts_are_stable() {
        let mut v = [(0, 1.0f32), (1, 2.0), (2, 1.0), (3, 2.0)];
        sort_best_first(&mut v, |x| x.1);
        assert_eq!(v.map(|x| x.0), [1, 3, 0, 2]);
        sort_worst_first(&mut v, |x| x.1);
        assert_eq!(v.map(|x| x.0), [0, 2, 1, 3]);
    }

    #[test]
    fn merging_and_leaders() {
        let merged = merge_into_first(
            vec![(1, -1.0f64), (2, -2.0), (1, -1.0)],
            |a, b| a.0 == b.0,
            |a, b| a.1 = log_add_exp(a.1, b.1),
        );
        assert_eq!(merged.len(), 2);
        assert!((merged[0].1 - (-1.0 + 2f64.ln())).abs() < 1e-12);
        let leaders = group_leaders(
            &[(1, -2.0f32), (1, -1.0), (2, -3.0), (1, -1.0)],
            |a, b| a.0 == b.0,
            |x| x.1,
        );
        assert_eq!(leaders, [None, Some(vec![0, 1, 3]), Some(vec![2]), None]);
    }

    #[test]
    fn hash_wraps_like_torch_int64() {
        // torch: (0 * M + 1 + 5) = 6; then 6 * M + 1 + 7 wraps in int64.
        let h = extend_hash(extend_hash(0, 5), 7);
        assert_eq!(h, 6i64.wrapping_mul(6364136223846793005).wrapping_add(8));
    }

    #[test]
    fn ranking_normalises_by_length_plus_one() {
        let token = Token {
            id: 0,
            frame: 0,
            duration: 0,
        };
        let three = (0..3).fold(TokenPath::default(), |p, _| p.push(token.clone()));
        let hyps = || [(TokenPath::default(), -2.0f32), (three.clone(), -6.0)];
        let ranked = rank(hyps(), true);
        assert_eq!(ranked[0].score, -6.0); // -1.5 per token beats -2.0
        assert_eq!(ranked[0].tokens.len(), 3);
        let ranked = rank(hyps(), false);
        assert_eq!(ranked[0].score, -2.0);
    }

    #[test]
    fn top_k_is_a_stable_descending_sort_cut_to_k() {
        let values = [0.5f32, 2.0, f32::NEG_INFINITY, 2.0, -1.0, 0.5, 3.0];
        let mut sorted: Vec<usize> = (0..values.len()).collect();
        sorted.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
        for k in 0..=values.len() + 1 {
            assert_eq!(top_k(&values, k), sorted[..k.min(values.len())], "k = {k}");
        }
        // Many blocks, with ties, infinities and NaNs of both signs.
        let mut x = 12345u32;
        let values: Vec<f32> = (0..1000)
            .map(|i| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                match i % 97 {
                    0 => f32::NAN,
                    1 => -f32::NAN,
                    2 => f32::NEG_INFINITY,
                    3 => f32::INFINITY,
                    _ => ((x >> 20) % 64) as f32 * -0.25,
                }
            })
            .collect();
        let mut sorted: Vec<usize> = (0..values.len()).collect();
        sorted.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
        for k in [0, 1, 2, 4, 15, 16, 17, 64, 999, 1000, 1001] {
            assert_eq!(top_k(&values, k), sorted[..k.min(values.len())], "k = {k}");
        }
    }

    #[test]
    fn log_sum_exp_of_one_is_itself() {
        assert_eq!(log_sum_exp([-3.25f32].into_iter()), -3.25);
        let two = log_sum_exp([-1.0f32, -1.0].into_iter());
        assert!((two - (-1.0 + 2f32.ln())).abs() < 1e-6);
        assert_eq!(log_add_exp(-1.0f32, -1.0), two);
    }
}
