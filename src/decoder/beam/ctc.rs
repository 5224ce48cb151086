//! NeMo's CTC `beam_batch` (batched CTC beam search without a language model): per frame,
//! every hypothesis is extended by every label; a label that is neither the blank nor a
//! repeat of the hypothesis' last label emits a token and earns `beam_beta`; the beam's best
//! extensions are kept, those more than `beam_threshold` below the best are dropped, and
//! hypotheses that became equal (same tokens, same last label) keep the best of their scores.
//! With a boosting tree, an emitting label also earns alpha times the tree's bonus for it
//! from the hypothesis' tree state, and moves that state.

use super::toolkit::{Candidate, DecoderState, rank, recombine_groups, top_k};
use super::{BeamConfig, BeamHead, NBest, check_boost};
use crate::bail;
use crate::decoder::boosting::BoostingTree;
use crate::error::Result;
use crate::tokenizer::Token;

/// A CTC hypothesis: no prediction net, so its decoder state is the last label alone.
type Slot = Candidate<f32, (), LastLabel>;

/// The last frame's label, blank included (`None` before the first frame): what the next
/// frame's repeats compare with.
#[derive(Clone, Copy, Default)]
struct LastLabel {
    last: Option<usize>,
}

impl DecoderState for LastLabel {
    fn set_last(&mut self, label: usize) {
        self.last = Some(label);
    }
}

/// Beam search over CTC log-probabilities (`[frames][classes]`, blank = classes - 1): the
/// N-best list NeMo returns, best by raw score first (NeMo's CTC beam does not normalise).
pub fn ctc_beam(
    log_probs: &[f32],
    classes: usize,
    cfg: &BeamConfig,
    boost: Option<&BoostingTree>,
) -> Result<Vec<NBest>> {
    cfg.check(BeamHead::Ctc)?;
    check_boost(boost, classes - 1)?;
    if classes < 2 || !log_probs.len().is_multiple_of(classes) {
        bail!(
            Internal,
            "CTC log-probabilities: {} values are not rows of {classes} classes",
            log_probs.len()
        );
    }
    let blank = classes - 1;
    let beam = cfg.beam_size;
    let mut slots = vec![Slot::with_state(LastLabel::default(), boost)];
    let mut scores = Vec::with_capacity(beam * classes);
    // Per slot: alpha x the tree's bonus of every non-blank label, and the states they lead to.
    let mut bonus = vec![0.0f32; blank];
    let mut bonus_next = vec![0u32; blank];
    for (frame, row) in log_probs.chunks_exact(classes).enumerate() {
        scores.clear();
        for slot in &slots {
            let from = scores.len();
            // Every non-blank label earns beta, but a repeat of the last one (in a loop
            // without a branch per label, so it vectorises).
            scores.extend(
                row[..blank]
                    .iter()
                    .map(|&lp| lp + slot.score + cfg.beam_beta),
            );
            scores.push(row[blank] + slot.score);
            if let Some(last) = slot.hyp.last.filter(|&l| l < blank) {
                scores[from + last] = row[last] + slot.score;
            }
            if let Some(tree) = boost {
                tree.advance_all(slot.boost_state, &mut bonus, &mut bonus_next);
                let alpha = tree.alpha();
                for (label, s) in scores[from..from + blank].iter_mut().enumerate() {
                    if Some(label) != slot.hyp.last {
                        *s += alpha * bonus[label];
                    }
                }
            }
        }
        let best = top_k(&scores, beam);
        let Some(&first) = best.first() else {
            bail!(Internal, "internal: no candidate on frame {frame}");
        };
        let floor = scores[first] - cfg.beam_threshold;
        let mut next: Vec<Slot> = Vec::with_capacity(best.len());
        for k in best {
            let score = scores[k];
            if score <= floor || score == f32::NEG_INFINITY {
                continue;
            }
            let (parent, label) = (&slots[k / classes], k % classes);
            let emits = label != blank && Some(label) != parent.hyp.last;
            let mut slot = if emits {
                let token = Token {
                    id: label,
                    frame,
                    duration: 0,
                };
                let mut child = parent.child(token, score);
                if let Some(tree) = boost {
                    child.boost_state = tree.advance(parent.boost_state, label).1;
                }
                child
            } else {
                Slot {
                    score,
                    ..parent.clone()
                }
            };
            // Nothing is fed: the label is only what the next frame's repeats compare with.
            slot.unfed = None;
            slot.hyp.last = Some(label);
            next.push(slot);
        }
        slots = recombine(next);
    }
    Ok(rank(slots.into_iter().map(|s| (s.tokens, s.score)), false))
}

/// Of hypotheses with the same tokens and last label, the first best stays (with its own
/// score: NeMo's CTC recombination takes the maximum, not the sum).
fn recombine(slots: Vec<Slot>) -> Vec<Slot> {
    let equal = |a: &Slot, b: &Slot| a.hyp.last == b.hyp.last && a.same_tokens(b);
    recombine_groups(slots, equal, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decoder::beam::BeamStrategy;

    #[test]
    fn folds_repeats_and_sums_beta() {
        // Two frames, classes 0, 1, blank: "1 1" folds to one token.
        let lp = [-5.0f32, -0.1, -5.0, -5.0, -0.1, -5.0];
        let mut cfg = BeamConfig::new(BeamStrategy::BeamBatch, 2).unwrap();
        cfg.beam_beta = 0.5;
        let nbest = ctc_beam(&lp, 3, &cfg, None).unwrap();
        let ids: Vec<usize> = nbest[0].tokens.iter().map(|t| t.id).collect();
        assert_eq!(ids, [1]);
        assert!((nbest[0].score - (-0.2 + 0.5)).abs() < 1e-6);
    }
}
