//! NeMo's TDT `beam` (search_type `default`): frame by frame, the best hypothesis waiting on
//! the frame is expanded with the best (token, duration) pairs and with a blank of each of
//! the best durations; a token of duration 0 waits on the same frame again, everything else
//! moves to a later frame. Hypotheses with the same tokens reaching the same frame merge.
//! The frame's expansion stops once the beam's worth of hypotheses beat every one still
//! waiting on it.
//!
//! Each expansion depends on the one before (the best hypothesis left), so this search runs
//! one joint (with the prediction step, when one is due) per expansion: it is NeMo's
//! reference search, not the fast one (`malsd_batch`).

use super::{
    BeamConfig, NBest, Projection, TokenPath, TransducerSearch, extend_hash, feed_and_join,
    log_softmax, rank, toolkit, top_k,
};
use crate::backend::Backend;
use crate::bail;
use crate::decoder::boosting::BoostingTree;
use crate::decoder::hypothesis::Hypothesis;
use crate::decoder::nets::Nets;
use crate::error::Result;
use crate::tokenizer::Token;

struct Candidate {
    /// Decoder state after the last fed token; score.
    hyp: Hypothesis,
    /// A token emitted but not yet fed to the prediction net (`hyp.state` is the state before
    /// it): fed when this hypothesis is expanded.
    unfed: Option<usize>,
    tokens: TokenPath,
    hash: i64,
    /// The frame this hypothesis waits on.
    frame: usize,
}

impl Candidate {
    fn same_as(&self, other: &Candidate) -> bool {
        self.frame == other.frame
            && self.hash == other.hash
            && self.tokens.len() == other.tokens.len()
            && self.tokens.same_ids(&other.tokens)
    }
}

/// NeMo's TDT `beam`.
pub(super) struct TdtBeam;

impl TransducerSearch for TdtBeam {
    fn search(
        &self,
        backend: &mut Backend,
        mut nets: Nets,
        input: Projection,
        cfg: &BeamConfig,
        _boost: Option<&BoostingTree>,
    ) -> Result<Vec<NBest>> {
        let frames = input.frames;
        let (blank, classes, durations) = (nets.blank(), nets.classes(), nets.durations());
        let n_durations = durations.len();
        let Some(zero_duration) = durations.iter().position(|&d| d == 0) else {
            bail!(
                Options,
                "TDT beam search: the model's durations {durations:?} lack 0"
            );
        };
        let Some(shortest_move) = (0..n_durations)
            .filter(|&i| durations[i] > 0)
            .min_by_key(|&i| durations[i])
        else {
            bail!(
                Options,
                "TDT beam search: the model's durations {durations:?} never move"
            );
        };
        // NeMo's vocabulary size excludes the blank.
        let beam = cfg.beam_size.min(blank);
        let beam_k = beam.min(blank.saturating_sub(1)).max(1);
        let durations_k = beam.min(n_durations);

        let mut kept = vec![Candidate {
            hyp: nets.start(backend)?,
            unfed: None,
            tokens: TokenPath::default(),
            hash: 0,
            frame: 0,
        }];
        for t in 0..frames {
            let (mut waiting, later): (Vec<Candidate>, Vec<Candidate>) =
                kept.into_iter().partition(|c| c.frame == t);
            kept = later.into_iter().filter(|c| c.frame > t).collect();
            while let Some(at) = first_best(&waiting) {
                let mut best = waiting.remove(at);
                let enc = input.at(t);
                let logits =
                    feed_and_join(&mut nets, backend, &mut best.hyp, &mut best.unfed, enc)?;
                let label_logp = log_softmax(&logits[..classes]);
                let duration_logp = log_softmax(&logits[classes..classes + n_durations]);
                let top_tokens = top_k(&label_logp[..blank], beam_k);
                let top_durations = top_k(&duration_logp, durations_k);
                // Every (duration, token) pair of the two lists, duration-major, as NeMo's
                // cartesian product.
                let pairs: Vec<f32> = top_durations
                    .iter()
                    .flat_map(|&d| top_tokens.iter().map(move |&k| (d, k)))
                    .map(|(d, k)| duration_logp[d] + label_logp[k])
                    .collect();
                for p in top_k(&pairs, beam_k) {
                    let token = top_tokens[p % beam_k];
                    let duration = durations[top_durations[p / beam_k]];
                    let child = Candidate {
                        hyp: Hypothesis {
                            score: best.hyp.score + pairs[p],
                            last: Some(token),
                            ..best.hyp.clone()
                        },
                        unfed: Some(token),
                        tokens: best.tokens.push(Token {
                            id: token,
                            // NeMo's timestamp here is the frame the token moves to.
                            frame: t + duration,
                            duration: 0,
                        }),
                        hash: extend_hash(best.hash, token),
                        frame: best.frame + duration,
                    };
                    if duration == 0 {
                        waiting.push(child);
                    } else {
                        kept.push(child);
                    }
                }
                for &d in &top_durations {
                    let d = match d {
                        d if d != zero_duration => d,
                        _ if top_durations.len() == 1 => shortest_move,
                        _ => continue,
                    };
                    kept.push(Candidate {
                        hyp: Hypothesis {
                            score: best.hyp.score + label_logp[blank] + duration_logp[d],
                            ..best.hyp.clone()
                        },
                        unfed: None,
                        tokens: best.tokens.clone(),
                        hash: best.hash,
                        frame: best.frame + durations[d],
                    });
                }
                kept = merge_duplicates(kept);
                if let Some(at) = first_best(&waiting) {
                    let waiting_best = waiting[at].hyp.score;
                    let ahead = kept.iter().filter(|c| c.hyp.score > waiting_best).count();
                    if ahead >= beam {
                        // NeMo keeps these in ascending order.
                        kept.retain(|c| c.hyp.score > waiting_best);
                        toolkit::sort_worst_first(&mut kept, |c| c.hyp.score);
                        break;
                    }
                } else {
                    toolkit::sort_best_first(&mut kept, |c| c.hyp.score);
                    kept.truncate(beam);
                }
            }
        }
        let hyps = kept
            .into_iter()
            .map(|c| NBest {
                tokens: c.tokens.to_vec(),
                score: c.hyp.score,
            })
            .collect();
        Ok(rank(hyps, cfg.score_norm))
    }
}

/// The first of the best-scored candidates (as Python's `max`).
fn first_best(candidates: &[Candidate]) -> Option<usize> {
    toolkit::first_best(candidates.iter().map(|c| c.hyp.score)).map(|(i, _)| i)
}

/// NeMo's `merge_duplicate_hypotheses`: best first, each later candidate with the same tokens
/// on the same frame adds its probability to the first one's and leaves.
fn merge_duplicates(mut candidates: Vec<Candidate>) -> Vec<Candidate> {
    toolkit::sort_best_first(&mut candidates, |c| c.hyp.score);
    toolkit::merge_into_first(
        candidates,
        |m, c| m.same_as(c),
        |m, c| m.hyp.score = toolkit::log_add_exp(m.hyp.score, c.hyp.score),
    )
}
