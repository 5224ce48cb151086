//! NeMo's RNN-T `beam` (search_type `default`): on every frame the best hypothesis is
//! expanded again and again, with the beam's best labels (which stay on the frame, to be
//! expanded further) and with a blank (which ends its frame), until the beam's worth of
//! frame-ending hypotheses beat every one still being expanded. NeMo sums these scores in
//! Python floats (f64), and so does this search; the list it returns can be longer than the
//! beam.
//!
//! Each expansion depends on the one before, so this search runs one joint (with the
//! prediction step, when one is due) per expansion, as NeMo does.

use super::{
    BeamConfig, NBest, Projection, TokenPath, TransducerSearch, feed_and_join, log_softmax,
    rank_f64, toolkit, top_k,
};
use crate::backend::Backend;
use crate::bail;
use crate::decoder::boosting::BoostingTree;
use crate::decoder::hypothesis::Hypothesis;
use crate::decoder::nets::Nets;
use crate::error::Result;
use crate::tokenizer::Token;

struct Candidate {
    /// Decoder state after the last fed token (`hyp.score` is unused: see `score`).
    hyp: Hypothesis,
    /// A label emitted but not yet fed to the prediction net (`hyp.state` is the state
    /// before it).
    unfed: Option<usize>,
    tokens: TokenPath,
    score: f64,
}

/// NeMo's RNN-T `beam`.
pub(super) struct RnntBeam;

impl TransducerSearch for RnntBeam {
    fn search(
        &self,
        backend: &mut Backend,
        mut nets: Nets,
        input: Projection,
        cfg: &BeamConfig,
        _boost: Option<&BoostingTree>,
    ) -> Result<Vec<NBest>> {
        let frames = input.frames;
        let (blank, classes) = (nets.blank(), nets.classes());
        // NeMo's vocabulary size excludes the blank.
        let beam = cfg.beam_size.min(blank);
        let beam_k = beam.min(blank.saturating_sub(1)).max(1);
        let mut kept = vec![Candidate {
            hyp: nets.start(backend)?,
            unfed: None,
            tokens: TokenPath::default(),
            score: 0.0,
        }];
        for t in 0..frames {
            let enc = input.at(t);
            let mut expanding = std::mem::take(&mut kept);
            loop {
                let Some(at) = first_best(&expanding) else {
                    bail!(
                        Internal,
                        "internal: no hypothesis left to expand on frame {t}"
                    );
                };
                let mut best = expanding.remove(at);
                let logits =
                    feed_and_join(&mut nets, backend, &mut best.hyp, &mut best.unfed, enc)?;
                let logp = log_softmax(&logits[..classes]);
                for k in top_k(&logp[..blank], beam_k) {
                    expanding.push(Candidate {
                        hyp: Hypothesis {
                            last: Some(k),
                            ..best.hyp.clone()
                        },
                        unfed: Some(k),
                        tokens: best.tokens.push(Token {
                            id: k,
                            frame: t,
                            duration: 0,
                        }),
                        score: best.score + logp[k] as f64,
                    });
                }
                kept.push(Candidate {
                    score: best.score + logp[blank] as f64,
                    ..best
                });
                let Some(at) = first_best(&expanding) else {
                    bail!(
                        Internal,
                        "internal: no hypothesis left to expand on frame {t}"
                    );
                };
                let expanding_best = expanding[at].score;
                if kept.iter().filter(|c| c.score > expanding_best).count() >= beam {
                    kept.retain(|c| c.score > expanding_best);
                    // NeMo keeps these in ascending order.
                    toolkit::sort_worst_first(&mut kept, |c| c.score);
                    break;
                }
            }
        }
        let ranked = kept.into_iter().map(|c| (c.tokens, c.score)).collect();
        Ok(rank_f64(ranked, cfg.score_norm))
    }
}

/// The first of the best-scored candidates (as Python's `max`).
fn first_best(candidates: &[Candidate]) -> Option<usize> {
    toolkit::first_best(candidates.iter().map(|c| c.score)).map(|(i, _)| i)
}
