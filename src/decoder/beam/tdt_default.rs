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

use super::toolkit::{
    Candidate, first_best_of, log_softmax, merge_duplicates, rank, sort_best_first,
    sort_worst_first, top_k,
};
use super::{NBest, SearchRun, TransducerSearch};
use crate::tokenizer::Token;
use anyhow::{Result, bail};

/// NeMo's TDT `beam`.
pub(super) struct TdtBeam;

impl TransducerSearch for TdtBeam {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, _) = run.parts();
        let frames = input.frames;
        let (blank, classes, durations) = (nets.blank(), nets.classes(), nets.durations());
        let n_durations = durations.len();
        let Some(zero_duration) = durations.iter().position(|&d| d == 0) else {
            bail!("TDT beam search: the model's durations {durations:?} lack 0");
        };
        let Some(shortest_move) = (0..n_durations)
            .filter(|&i| durations[i] > 0)
            .min_by_key(|&i| durations[i])
        else {
            bail!("TDT beam search: the model's durations {durations:?} never move");
        };
        // NeMo's vocabulary size excludes the blank.
        let beam = cfg.beam_size.min(blank);
        let beam_k = beam.min(blank.saturating_sub(1)).max(1);
        let durations_k = beam.min(n_durations);

        // A candidate's frame (`hyp.frame`) is the frame it waits on.
        let mut kept = vec![Candidate::<f32>::start(&mut nets, backend, None)?];
        for t in 0..frames {
            let (mut waiting, later): (Vec<Candidate<f32>>, Vec<Candidate<f32>>) =
                kept.into_iter().partition(|c| c.hyp.frame == t);
            kept = later.into_iter().filter(|c| c.hyp.frame > t).collect();
            while let Some(at) = first_best_of(&waiting) {
                let mut best = waiting.remove(at);
                let logits = best.feed_and_join(&mut nets, backend, input.at(t))?;
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
                    let stamped = Token {
                        id: token,
                        // NeMo's timestamp here is the frame the token moves to.
                        frame: t + duration,
                        duration: 0,
                    };
                    let mut child = best.child(stamped, best.score + pairs[p]);
                    child.hyp.frame += duration;
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
                    let mut moved = Candidate {
                        score: best.score + label_logp[blank] + duration_logp[d],
                        ..best.clone()
                    };
                    moved.hyp.frame += durations[d];
                    kept.push(moved);
                }
                kept = merge_duplicates(kept);
                if let Some(at) = first_best_of(&waiting) {
                    let waiting_best = waiting[at].score;
                    let ahead = kept.iter().filter(|c| c.score > waiting_best).count();
                    if ahead >= beam {
                        // NeMo keeps these in ascending order.
                        kept.retain(|c| c.score > waiting_best);
                        sort_worst_first(&mut kept, |c| c.score);
                        break;
                    }
                } else {
                    sort_best_first(&mut kept, |c| c.score);
                    kept.truncate(beam);
                }
            }
        }
        let ranked = kept.into_iter().map(|c| (c.tokens, c.score));
        Ok(rank(ranked, cfg.score_norm))
    }
}
