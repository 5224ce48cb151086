//! NeMo's `maes_batch` for RNN-T: modified adaptive expansion search over a fixed beam of
//! slots, batched. Per frame: prefix search (a hypothesis absorbs the probability of reaching
//! it from a one-label-shorter hypothesis in the beam), then up to `maes_num_steps`
//! expansion rounds (each slot still expanding proposes its beam + beta best labels within
//! gamma of its best; proposals that recreate a live hypothesis or repeat another proposal
//! are dropped; the beam's best survive; finished slots carry over), then a blank for the
//! slots still expanding.
//!
//! The slots are positional as in NeMo: which slot is still expanding is tracked by position
//! across a round's reordering (as NeMo's `to_update` mask is), and a token's timestamp is
//! the slot's count of blanks (NeMo's `next_timestamp`). A boosting tree fuses like
//! `malsd_batch` (late pruning, `lm_weighted_full`), with NeMo's 1e-6 clamp of this search.

use super::toolkit::{Candidate, extend_hash, log_add_exp, log_softmax, rank, top_k};
use super::{NBest, SearchRun, TransducerSearch, fuse_boost};
use crate::backend::Backend;
use crate::decoder::nets::{JointInput, Nets, PredictInput};
use crate::tokenizer::Token;
use anyhow::Result;

const DEAD: f32 = f32::NEG_INFINITY;

/// One slot of the beam (dead at a score of minus infinity).
type Slot = Candidate<f32, Stamps>;

/// What a `maes_batch` slot keeps besides.
#[derive(Clone, Default)]
struct Stamps {
    /// The hash of the transcript without its last label (NeMo's `transcript_prefix_hash`).
    prefix_hash: i64,
    /// Blanks so far: the frame a label emitted now is stamped with.
    next_timestamp: usize,
}

fn live(slot: &Slot) -> bool {
    slot.score != DEAD
}

/// NeMo's RNN-T `maes_batch`.
pub(super) struct MaesBatch;

impl TransducerSearch for MaesBatch {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, boost) = run.parts();
        let frames = input.frames;
        let blank = nets.blank();
        let beam = cfg.beam_size;
        let expansions = cfg.beam_size + cfg.maes_expansion_beta;
        let gamma = cfg.maes_expansion_gamma as f32;
        let start = Slot::start(&mut nets, backend, boost)?;
        let mut slots = vec![
            Slot {
                score: DEAD,
                ..start.clone()
            };
            beam
        ];
        slots[0] = start;
        // Whether any label was added yet (NeMo skips prefix search on an empty beam).
        let mut started = false;
        let mut bonus = vec![0.0f32; blank];
        let mut bonus_next = vec![0u32; blank];
        for t in 0..frames {
            let enc = input.at(t);
            let mut logps = feed_and_join(&mut nets, backend, &mut slots, enc)?;
            let mut fused = |slot: &Slot, lp: &[f32]| -> Vec<f32> {
                let mut row = lp.to_vec();
                if let Some(tree) = boost {
                    tree.advance_all(slot.boost_state, &mut bonus, &mut bonus_next);
                    // NeMo's `combine_scores` clamps with 1e-6 here.
                    fuse_boost(&mut row, &bonus, tree.alpha(), 1e-6);
                }
                row
            };
            let updated: Vec<Vec<f32>> =
                slots.iter().zip(&logps).map(|(s, l)| fused(s, l)).collect();
            if started {
                prefix_search(&mut slots, &updated, blank);
            }
            let mut expanding = vec![true; beam];
            let mut round = 0;
            while expanding.iter().any(|&e| e) && round < cfg.maes_num_steps {
                // Each slot's proposals: (label or None for a carried-over slot, score).
                let mut labels: Vec<Option<usize>> = Vec::with_capacity(beam * expansions);
                let mut probs: Vec<f32> = Vec::with_capacity(beam * expansions);
                for (i, slot) in slots.iter().enumerate() {
                    let row = if boost.is_some() {
                        fused(slot, &logps[i])
                    } else {
                        logps[i].clone()
                    };
                    let top = top_k(&row, expansions);
                    let mut p: Vec<f32> = top.iter().map(|&k| slot.score + row[k]).collect();
                    let max = p.iter().copied().fold(DEAD, f32::max);
                    for x in &mut p {
                        if *x <= max - gamma {
                            *x = DEAD;
                        }
                    }
                    if !expanding[i] {
                        p.fill(DEAD);
                    }
                    labels.extend(top.iter().map(|&k| expanding[i].then_some(k)));
                    probs.extend(p);
                }
                remove_duplicates(&slots, &labels, &mut probs, expansions, blank);
                for (i, slot) in slots.iter().enumerate() {
                    if !expanding[i] {
                        probs[i * expansions + expansions - 1] = slot.score;
                    }
                }
                let chosen = top_k(&probs, beam);
                let mut next: Vec<Slot> = Vec::with_capacity(beam);
                for &c in &chosen {
                    let parent = &slots[c / expansions];
                    let mut slot = Slot {
                        score: probs[c],
                        ..parent.clone()
                    };
                    let label = labels[c];
                    match label {
                        Some(l) if l == blank => slot.own.next_timestamp += 1,
                        Some(l) => {
                            slot.own.prefix_hash = slot.hash;
                            slot.emit(Token {
                                id: l,
                                frame: slot.own.next_timestamp,
                                duration: 0,
                            });
                            if let Some(tree) = boost {
                                slot.boost_state = tree.advance(slot.boost_state, l).1;
                            }
                        }
                        None => {}
                    }
                    next.push(slot);
                }
                slots = next;
                started = true;
                let extended: Vec<bool> = slots.iter().map(|s| s.unfed.is_some()).collect();
                logps = feed_and_join(&mut nets, backend, &mut slots, enc)?;
                for (e, &x) in expanding.iter_mut().zip(&extended) {
                    *e &= x;
                }
                round += 1;
            }
            for (i, slot) in slots.iter_mut().enumerate() {
                if expanding[i] {
                    slot.score += logps[i][blank];
                    slot.own.next_timestamp += 1;
                }
            }
        }
        let hyps = slots.into_iter().filter(live).map(|s| (s.tokens, s.score));
        Ok(rank(hyps, cfg.score_norm))
    }
}

/// Feeds the pending label of every live slot and returns every live slot's label
/// log-probabilities at `enc`, in one graph (zeros for dead slots, whose scores make them
/// irrelevant). No slot has a pending label after it.
fn feed_and_join(
    nets: &mut Nets,
    backend: &mut Backend,
    slots: &mut [Slot],
    enc: &[f32],
) -> Result<Vec<Vec<f32>>> {
    let classes = nets.classes();
    let mut feeding: Vec<(usize, usize)> = Vec::new();
    let mut joining: Vec<usize> = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        match slot.unfed.take() {
            Some(label) if live(slot) => feeding.push((i, label)),
            _ if live(slot) => joining.push(i),
            _ => {}
        }
    }
    let inputs: Vec<PredictInput> = feeding
        .iter()
        .map(|&(i, token)| PredictInput {
            token,
            state: &slots[i].hyp.state,
            next_enc: Some(enc),
        })
        .collect();
    let extra: Vec<JointInput> = joining
        .iter()
        .map(|&i| JointInput {
            enc,
            pred_out: &slots[i].hyp.pred_out,
        })
        .collect();
    let (predictions, joints) = nets.predict_and_join(backend, &inputs, &extra)?;
    let mut out = vec![vec![0.0; classes]; slots.len()];
    for (&i, logits) in joining.iter().zip(joints) {
        out[i] = log_softmax(&logits[..classes]);
    }
    for (&(i, _), p) in feeding.iter().zip(predictions) {
        let Some(logits) = p.logits else {
            anyhow::bail!("internal: a prediction step without its joint");
        };
        out[i] = log_softmax(&logits[..classes]);
        slots[i].hyp.state = p.state;
        slots[i].hyp.pred_out = p.pred_out;
    }
    Ok(out)
}

/// NeMo's `recombine_prefixes`: every live slot adds (log-sum) the probability of reaching it
/// from each slot holding its transcript minus its last label.
fn prefix_search(slots: &mut [Slot], logps: &[Vec<f32>], blank: usize) {
    let scores: Vec<f32> = (0..slots.len())
        .map(|i| {
            let me = &slots[i];
            if !live(me) || me.tokens.len() == 0 {
                return me.score;
            }
            // NeMo's last label, the blank standing for none.
            let last = me.hyp.last.unwrap_or(blank);
            let paths: Vec<f32> = (0..slots.len())
                .filter(|&j| slots[j].hash == me.own.prefix_hash)
                .map(|j| slots[j].score + logps[j][last])
                .collect();
            let max = paths.iter().copied().fold(DEAD, f32::max);
            if max == DEAD {
                return me.score;
            }
            let sum: f64 = paths.iter().map(|&p| ((p - max) as f64).exp()).sum();
            let through = (max as f64 + sum.ln()) as f32;
            log_add_exp(me.score, through)
        })
        .collect();
    for (slot, s) in slots.iter_mut().zip(scores) {
        slot.score = s;
    }
}

/// NeMo's `remove_duplicates`: a label proposal that recreates a live hypothesis is dropped,
/// and of proposals with the same transcript only the first best stays.
fn remove_duplicates(
    slots: &[Slot],
    labels: &[Option<usize>],
    probs: &mut [f32],
    expansions: usize,
    blank: usize,
) {
    if slots.len() <= 1 {
        return;
    }
    let hash_of = |c: usize| {
        let parent = &slots[c / expansions];
        match labels[c] {
            Some(l) if l == blank => parent.hash,
            Some(l) => extend_hash(parent.hash, l),
            // NeMo hashes the missing label as -1.
            None => parent.hash.wrapping_mul(6364136223846793005),
        }
    };
    let hashes: Vec<i64> = (0..labels.len()).map(hash_of).collect();
    let mut scores: Vec<f32> = probs.to_vec();
    for c in 0..labels.len() {
        let non_blank = labels[c] != Some(blank);
        if non_blank && slots.iter().any(|s| live(s) && s.hash == hashes[c]) {
            scores[c] = DEAD;
        }
    }
    for c in 0..labels.len() {
        let mut best = c;
        for d in 0..labels.len() {
            if hashes[d] == hashes[c] && scores[d] > scores[best] {
                best = d;
            }
            if hashes[d] == hashes[c] && scores[d] == scores[best] && d < best {
                best = d;
            }
        }
        probs[c] = if best == c { scores[c] } else { DEAD };
    }
}
