//! What every beam search shares: choosing, sorting and merging candidates by score as NeMo's
//! Python does (`max` takes the first of equals; `sorted` is stable), and adding probabilities
//! in log space. A score is f32 where NeMo keeps it in a tensor, f64 where in a Python float.

use std::cmp::Ordering;

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
            let group: Vec<usize> = (0..items.len())
                .filter(|&j| equal(&items[i], &items[j]))
                .collect();
            let mut best = i;
            for &j in &group {
                let (sj, sb) = (score(&items[j]), score(&items[best]));
                if sj > sb || (sj == sb && j < best) {
                    best = j;
                }
            }
            (best == i).then_some(group)
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
}
