//! CTC greedy decoding: argmax per frame, collapse repeats, drop blanks; optionally with
//! phrase boosting.

use super::boosting::{BoostCursor, BoostingTree};
use crate::tokenizer::Token;

/// Index of the largest value; the first one on ties (as torch.argmax).
pub(crate) fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Greedy CTC over `logits` ([frames][classes] row-major, blank = classes - 1).
pub fn ctc_greedy(logits: &[f32], classes: usize) -> Vec<Token> {
    fold(logits.chunks_exact(classes).map(argmax), classes - 1)
}

/// NeMo's CTC fold of per-frame labels: a token wherever a non-blank label differs from the
/// previous frame's, at that frame.
pub fn fold(labels: impl Iterator<Item = usize>, blank: usize) -> Vec<Token> {
    let mut out = Vec::new();
    let mut prev = blank;
    for (frame, k) in labels.enumerate() {
        if k != blank && k != prev {
            out.push(Token {
                id: k,
                frame,
                duration: 0,
            });
        }
        prev = k;
    }
    out
}

/// Greedy CTC steered by a boosting tree, as NeMo's greedy_batch with `boosting_tree`
/// (`GreedyBatchedCTCInfer._greedy_decode_logprobs_batched_fusion_models_torch`): per frame,
/// the label of the plain log-probabilities decides blank or repeat; otherwise the frame takes
/// the best non-blank label of the log-probabilities plus alpha x the tree's bonus, never the
/// previous frame's label, and the tree moves past it. Blank and repeated frames leave the
/// tree where it is.
pub fn ctc_greedy_boosted(logits: &[f32], classes: usize, tree: &BoostingTree) -> Vec<Token> {
    let blank = classes - 1;
    assert_eq!(
        tree.vocab_size(),
        blank,
        "the boosting tree's labels are the CTC head's non-blank classes"
    );
    let mut cursor = BoostCursor::new(tree);
    let mut prev = blank;
    let labels = logits.chunks_exact(classes).map(|row| {
        // NeMo boosts the head's log-probabilities (its CTC decoder ends in a log-softmax).
        let log_probs = log_softmax_rows(row, classes);
        let mut k = argmax(&log_probs);
        if k != blank && k != prev {
            k = cursor.best(&log_probs[..blank], (prev != blank).then_some(prev));
            cursor.emit(k);
        }
        prev = k;
        k
    });
    fold(labels, blank)
}

/// Row-wise log-softmax in f64 accumulation (CTC log-probabilities, which boosting adds to).
pub fn log_softmax_rows(logits: &[f32], classes: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(logits.len());
    for row in logits.chunks_exact(classes) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
        let lse = max as f64 + sum.ln();
        out.extend(row.iter().map(|&x| (x as f64 - lse) as f32));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_repeats_and_drops_blanks() {
        // classes: 0, 1, blank = 2
        let rows = [
            [0.0, 1.0, 0.5], // 1
            [0.0, 1.0, 0.5], // 1 (repeat)
            [0.0, 0.0, 1.0], // blank
            [0.0, 1.0, 0.5], // 1 again after blank
            [2.0, 1.0, 0.5], // 0
        ];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let ids: Vec<(usize, usize)> = ctc_greedy(&flat, 3)
            .iter()
            .map(|t| (t.id, t.frame))
            .collect();
        assert_eq!(ids, vec![(1, 0), (1, 3), (0, 4)]);
    }

    #[test]
    fn log_softmax_normalises() {
        let l = log_softmax_rows(&[1.0, 2.0, 3.0], 3);
        let total: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!((l[2] - l[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn argmax_takes_first_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
    }
}
