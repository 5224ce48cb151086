//! NeMo's `maes` (modified adaptive expansion search) for TDT and RNN-T. Per frame, the
//! hypotheses waiting on it first absorb the probability of their one-token-shorter prefixes
//! in the beam (prefix search); then, for `maes_num_steps` rounds, each is expanded by its
//! best labels within `maes_expansion_gamma` of its best (at most beam + beta of them): a
//! blank (or, for TDT, a label that moves on) ends its frame, any other label is fed to the
//! prediction net and expanded again in the next round; after the last round those still on
//! the frame take a blank. The beam's best survive.
//!
//! NeMo keeps these scores in Python floats (f64); where it merges duplicates (TDT) it rounds
//! both through f32, as here. Every round runs one joint graph and one prediction graph for
//! all the hypotheses it expands.

use super::toolkit::{
    Candidate, best_n, first_best, log_add_exp, log_softmax, merge_duplicates, rank,
    sort_worst_first, top_k,
};
use super::{BeamConfig, NBest, Projection, SearchRun, TransducerSearch};
use crate::backend::Backend;
use crate::decoder::nets::{JointInput, Nets, PredictInput};
use crate::tokenizer::Token;
use anyhow::{Result, bail};

/// A hypothesis of `maes`: its `hyp.pred_out` is NeMo's `dec_out[-1]`, its `hyp.frame` the
/// frame it waits on (TDT).
type Hyp = Candidate<f64, Outputs>;

/// What a `maes` hypothesis keeps besides.
#[derive(Clone, Default)]
struct Outputs {
    /// The decoder outputs before `pred_out`, newest last: only the `maes_prefix_alpha - 1`
    /// that prefix search can reach.
    older: Vec<Vec<f32>>,
    /// The joint of `pred_out` at a frame, once computed.
    logits: Option<(usize, Vec<f32>)>,
}

/// NeMo's `len(y_sequence)`: the tokens and the start symbol.
fn seq_len(h: &Hyp) -> usize {
    h.tokens.len() + 1
}

fn logits_at(h: &Hyp, t: usize) -> Result<&[f32]> {
    match &h.own.logits {
        Some((frame, logits)) if *frame == t => Ok(logits),
        _ => bail!("internal: a hypothesis' joint at frame {t} was not computed"),
    }
}

/// `h` extended by `label` (to be fed), stamped `frame`, moving on by `duration`, with
/// `score`.
fn child(h: &Hyp, label: usize, frame: usize, duration: usize, score: f64) -> Hyp {
    let token = Token {
        id: label,
        frame,
        duration: 0,
    };
    let own = Outputs {
        older: h.own.older.clone(),
        logits: None,
    };
    let mut child = h.child_with(token, score, own);
    child.hyp.frame += duration;
    child
}

/// The search's fixed parts.
struct Search<'a, 'm> {
    nets: Nets<'m>,
    backend: &'a mut Backend,
    input: Projection<'a>,
    frames: usize,
    blank: usize,
    classes: usize,
    durations: &'m [usize],
    cfg: &'a BeamConfig,
}

impl Search<'_, '_> {
    /// Makes sure every hypothesis has its joint at frame `t`: one graph for those missing.
    fn join_all(&mut self, hyps: &mut [Hyp], t: usize) -> Result<()> {
        let need: Vec<usize> = (0..hyps.len())
            .filter(|&i| !matches!(&hyps[i].own.logits, Some((f, _)) if *f == t))
            .collect();
        let enc = self.input.at(t);
        let inputs: Vec<JointInput> = need
            .iter()
            .map(|&i| JointInput {
                enc,
                pred_out: &hyps[i].hyp.pred_out,
            })
            .collect();
        let out = self.nets.joint(&mut *self.backend, &inputs)?;
        for (&i, logits) in need.iter().zip(out) {
            hyps[i].own.logits = Some((t, logits));
        }
        Ok(())
    }

    /// Feeds every pending label, in one graph, with the joint at each hypothesis' frame.
    fn feed_all(&mut self, hyps: &mut [Hyp]) -> Result<()> {
        let alpha = self.cfg.maes_prefix_alpha;
        let (input, frames) = (self.input, self.frames);
        let need: Vec<usize> = (0..hyps.len())
            .filter(|&i| hyps[i].unfed.is_some())
            .collect();
        let inputs: Vec<PredictInput> = need
            .iter()
            .map(|&i| {
                let h = &hyps[i];
                PredictInput {
                    token: h.unfed.unwrap_or(self.blank),
                    state: &h.hyp.state,
                    next_enc: (h.hyp.frame < frames).then(|| input.at(h.hyp.frame)),
                }
            })
            .collect();
        let out = self.nets.predict(&mut *self.backend, &inputs)?;
        for (&i, p) in need.iter().zip(out) {
            let h = &mut hyps[i];
            let previous = std::mem::replace(&mut h.hyp.pred_out, p.pred_out);
            if alpha > 1 {
                h.own.older.push(previous);
                if h.own.older.len() > alpha - 1 {
                    h.own.older.remove(0);
                }
            }
            h.hyp.state = p.state;
            h.unfed = None;
            h.own.logits = p.logits.map(|l| (h.hyp.frame, l));
        }
        Ok(())
    }

    /// Log-probabilities of a label after a decoder output at frame `t` (plus, for TDT, of
    /// duration 0, in f32 as NeMo adds them).
    fn prefix_step_logp(&mut self, logits: &[f32], label: usize) -> f64 {
        let lp = log_softmax(&logits[..self.classes]);
        match self.durations.iter().position(|&d| d == 0) {
            Some(zero) if !self.durations.is_empty() => {
                let dlp = log_softmax(&logits[self.classes..]);
                (lp[label] + dlp[zero]) as f64
            }
            _ => lp[label] as f64,
        }
    }

    /// NeMo's prefix search over `hyps` sorted longest first: a hypothesis that extends a
    /// shorter one by at most `maes_prefix_alpha` labels adds the probability of reaching it
    /// through that one. Every hypothesis' joint at `t` must be computed.
    fn prefix_search(&mut self, hyps: &mut [Hyp], t: usize) -> Result<()> {
        let alpha = self.cfg.maes_prefix_alpha;
        for j in 0..hyps.len().saturating_sub(1) {
            for i in j + 1..hyps.len() {
                let (curr, pref) = (&hyps[j], &hyps[i]);
                let gap = seq_len(curr).saturating_sub(seq_len(pref));
                if gap == 0 || gap > alpha {
                    continue;
                }
                let (before, tail) = curr.tokens.split_tail(gap);
                if !before.same_ids(&pref.tokens) {
                    continue;
                }
                let first = logits_at(pref, t)?.to_vec();
                let mut score = pref.score + self.prefix_step_logp(&first, tail[0]);
                // The later labels, after the current hypothesis' own older decoder outputs.
                let older = &curr.own.older;
                let older: Vec<Vec<f32>> = older[older.len() + 1 - gap..].to_vec();
                for (m, dec_out) in older.iter().enumerate() {
                    let input = JointInput {
                        enc: self.input.at(t),
                        pred_out: dec_out,
                    };
                    let Some(logits) = self.nets.joint(&mut *self.backend, &[input])?.pop() else {
                        bail!("internal: a joint step without its result");
                    };
                    score += self.prefix_step_logp(&logits, tail[m + 1]);
                }
                let h = &mut hyps[j];
                h.score = log_add_exp(h.score, score);
            }
        }
        Ok(())
    }
}

/// NeMo's `maes`, TDT and RNN-T.
pub(super) struct Maes;

impl TransducerSearch for Maes {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, _) = run.parts();
        let (blank, classes, durations) = (nets.blank(), nets.classes(), nets.durations());
        if blank < cfg.beam_size + cfg.maes_expansion_beta {
            bail!(
                "maes: beam size {} + expansion beta {} exceed the vocabulary ({blank})",
                cfg.beam_size,
                cfg.maes_expansion_beta
            );
        }
        let start = Hyp::start(&mut nets, backend, None)?;
        let mut search = Search {
            nets,
            backend,
            frames: input.frames,
            input,
            blank,
            classes,
            durations,
            cfg,
        };
        let kept = if durations.is_empty() {
            search_rnnt(&mut search, start)?
        } else {
            search_tdt(&mut search, start)?
        };
        let ranked = kept.into_iter().map(|h| (h.tokens, h.score));
        Ok(rank(ranked, cfg.score_norm))
    }
}

fn search_rnnt(s: &mut Search, start: Hyp) -> Result<Vec<Hyp>> {
    let cfg = s.cfg;
    let beam = cfg.beam_size.min(s.blank);
    let candidates = cfg.beam_size + cfg.maes_expansion_beta;
    let blank = s.blank;
    let mut kept = vec![start];
    for t in 0..s.frames {
        let mut hyps = std::mem::take(&mut kept);
        // Every RNN-T hypothesis looks at the current frame (labels never move it).
        for h in &mut hyps {
            h.hyp.frame = t;
        }
        hyps.sort_by_key(|h| std::cmp::Reverse(seq_len(h)));
        s.join_all(&mut hyps, t)?;
        s.prefix_search(&mut hyps, t)?;
        let existing = hyps.clone();
        let mut ended: Vec<Hyp> = Vec::new();
        for round in 0..cfg.maes_num_steps {
            s.join_all(&mut hyps, t)?;
            let mut expanded: Vec<Hyp> = Vec::new();
            for h in &hyps {
                let lp = log_softmax(&logits_at(h, t)?[..s.classes]);
                let options: Vec<(usize, f64)> = top_k(&lp, candidates)
                    .into_iter()
                    .map(|k| (k, h.score + lp[k] as f64))
                    .collect();
                let Some((_, best)) = first_best(options.iter().map(|o| o.1)) else {
                    continue;
                };
                let mut chosen: Vec<(usize, f64)> = options
                    .into_iter()
                    .filter(|o| best - cfg.maes_expansion_gamma <= o.1)
                    .collect();
                sort_worst_first(&mut chosen, |c| c.1);
                for (k, score) in chosen {
                    if k == blank {
                        ended.push(Hyp { score, ..h.clone() });
                        continue;
                    }
                    let child = child(h, k, t, 0, score);
                    if !existing.iter().any(|e| e.same_tokens(&child)) {
                        expanded.push(child);
                    }
                }
            }
            if expanded.is_empty() {
                kept = best_n(ended, beam);
                break;
            }
            s.feed_all(&mut expanded)?;
            if round + 1 < cfg.maes_num_steps {
                hyps = expanded;
            } else {
                for h in &mut expanded {
                    let lp = log_softmax(&logits_at(h, t)?[..s.classes]);
                    h.score += lp[blank] as f64;
                }
                ended.extend(expanded);
                kept = best_n(ended, beam);
                break;
            }
        }
    }
    Ok(kept)
}

fn search_tdt(s: &mut Search, start: Hyp) -> Result<Vec<Hyp>> {
    let cfg = s.cfg;
    let beam = cfg.beam_size.min(s.blank);
    let candidates = cfg.beam_size + cfg.maes_expansion_beta;
    let (blank, classes, durations) = (s.blank, s.classes, s.durations);
    let zero = durations.iter().position(|&d| d == 0);
    let Some(shortest_move) = (0..durations.len())
        .filter(|&i| durations[i] > 0)
        .min_by_key(|&i| durations[i])
    else {
        bail!("TDT maes: the model's durations {durations:?} never move");
    };
    let gamma = cfg.maes_expansion_gamma as f32;
    let mut kept = vec![start];
    for t in 0..s.frames {
        let (mut hyps, later): (Vec<Hyp>, Vec<Hyp>) =
            kept.into_iter().partition(|h| h.hyp.frame == t);
        kept = later.into_iter().filter(|h| h.hyp.frame > t).collect();
        if hyps.is_empty() {
            continue;
        }
        hyps.sort_by_key(|h| std::cmp::Reverse(seq_len(h)));
        s.join_all(&mut hyps, t)?;
        if zero.is_some() {
            s.prefix_search(&mut hyps, t)?;
        }
        let mut ended: Vec<Hyp> = Vec::new();
        let mut moved: Vec<Hyp> = Vec::new();
        for round in 0..cfg.maes_num_steps {
            s.join_all(&mut hyps, t)?;
            let mut staying: Vec<Hyp> = Vec::new();
            let mut moving: Vec<Hyp> = Vec::new();
            for h in &hyps {
                let logits = logits_at(h, t)?;
                let lp = log_softmax(&logits[..classes]);
                let dlp = log_softmax(&logits[classes..classes + durations.len()]);
                let top = top_k(&lp, candidates);
                // Duration-major pairs of (duration, one of the top labels), in f32.
                let lp = &lp;
                let pairs: Vec<f32> = dlp
                    .iter()
                    .flat_map(|&d| top.iter().map(move |&k| d + lp[k]))
                    .collect();
                let best_pairs = top_k(&pairs, candidates);
                let Some(&first) = best_pairs.first() else {
                    continue;
                };
                let floor = pairs[first] - gamma;
                for p in best_pairs.into_iter().filter(|&p| pairs[p] >= floor) {
                    let k = top[p % candidates];
                    let mut d = durations[p / candidates];
                    if k == blank && d == 0 {
                        d = durations[shortest_move];
                    }
                    let score = h.score + pairs[p] as f64;
                    if k == blank {
                        let mut ending = Hyp { score, ..h.clone() };
                        ending.hyp.frame += d;
                        ending.own.logits = None;
                        ended.push(ending);
                    } else if d == 0 {
                        staying.push(child(h, k, t, 0, score));
                    } else {
                        moving.push(child(h, k, t + d, d, score));
                    }
                }
            }
            s.feed_all(&mut moving)?;
            s.feed_all(&mut staying)?;
            moved.extend(moving);
            if staying.is_empty() {
                kept.extend(ended);
                kept.extend(moved);
                kept = best_n(merge_duplicates(kept), beam);
                break;
            }
            if round + 1 < cfg.maes_num_steps {
                hyps = merge_duplicates(staying);
            } else {
                for h in &mut staying {
                    let logits = logits_at(h, t)?;
                    let lp = log_softmax(&logits[..classes]);
                    let dlp = log_softmax(&logits[classes..classes + durations.len()]);
                    let mut di = first_best(dlp.iter().map(|&x| x as f64)).map_or(0, |b| b.0);
                    if Some(di) == zero {
                        di = shortest_move;
                    }
                    h.score += (lp[blank] + dlp[di]) as f64;
                    h.hyp.frame += durations[di];
                }
                kept.extend(ended);
                kept.extend(staying);
                kept.extend(moved);
                kept = best_n(merge_duplicates(kept), beam);
                break;
            }
        }
    }
    Ok(kept)
}
