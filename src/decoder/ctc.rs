//! CTC greedy decoding: argmax per frame, collapse repeats, drop blanks.

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
    let blank = classes - 1;
    let mut out = Vec::new();
    let mut prev = blank;
    for (frame, row) in logits.chunks_exact(classes).enumerate() {
        let k = argmax(row);
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

/// Row-wise log-softmax in f64 accumulation (for reporting CTC log-probabilities).
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
