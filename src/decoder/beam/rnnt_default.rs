//! NeMo's RNN-T `beam` (search_type `default`): on every frame the best hypothesis is
//! expanded again and again, with the beam's best labels (which stay on the frame, to be
//! expanded further) and with a blank (which ends its frame), until the beam's worth of
//! frame-ending hypotheses beat every one still being expanded. NeMo sums these scores in
//! Python floats (f64), and so does this search; the list it returns can be longer than the
//! beam.
//!
//! Each expansion depends on the one before, so this search runs one joint (with the
//! prediction step, when one is due) per expansion, as NeMo does.

use super::toolkit::{Candidate, first_best_of, log_softmax, rank, sort_worst_first, top_k};
use super::{NBest, SearchRun, TransducerSearch};
use crate::tokenizer::Token;
use anyhow::{Result, bail};

/// NeMo's RNN-T `beam`.
pub(super) struct RnntBeam;

impl TransducerSearch for RnntBeam {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, _) = run.parts();
        let frames = input.frames;
        let (blank, classes) = (nets.blank(), nets.classes());
        // NeMo's vocabulary size excludes the blank.
        let beam = cfg.beam_size.min(blank);
        let beam_k = beam.min(blank.saturating_sub(1)).max(1);
        let mut kept = vec![Candidate::<f64>::start(&mut nets, backend, None)?];
        for t in 0..frames {
            let enc = input.at(t);
            let mut expanding = std::mem::take(&mut kept);
            loop {
                let Some(at) = first_best_of(&expanding) else {
                    bail!("internal: no hypothesis left to expand on frame {t}");
                };
                let mut best = expanding.remove(at);
                let logits = best.feed_and_join(&mut nets, backend, enc)?;
                let logp = log_softmax(&logits[..classes]);
                for k in top_k(&logp[..blank], beam_k) {
                    let token = Token {
                        id: k,
                        frame: t,
                        duration: 0,
                    };
                    expanding.push(best.child(token, best.score + logp[k] as f64));
                }
                kept.push(Candidate {
                    score: best.score + logp[blank] as f64,
                    ..best
                });
                let Some(at) = first_best_of(&expanding) else {
                    bail!("internal: no hypothesis left to expand on frame {t}");
                };
                let expanding_best = expanding[at].score;
                if kept.iter().filter(|c| c.score > expanding_best).count() >= beam {
                    kept.retain(|c| c.score > expanding_best);
                    // NeMo keeps these in ascending order.
                    sort_worst_first(&mut kept, |c| c.score);
                    break;
                }
            }
        }
        let ranked = kept.into_iter().map(|c| (c.tokens, c.score));
        Ok(rank(ranked, cfg.score_norm))
    }
}
