//! NeMo's `malsd_batch`: batched modified alignment-length synchronous decoding, for TDT and
//! RNN-T. Every step looks at each live hypothesis' current frame once: it proposes the
//! beam's best (label, duration) extensions of every hypothesis, keeps the beam's best of all
//! of them, merges hypotheses that became equal (same labels, same last label and, for TDT,
//! the same frame) by adding their probabilities, and feeds the new labels through the
//! prediction net. A hypothesis past the last frame is finished and competes with its score
//! as it is; one that emitted `max_symbols_per_step` labels on a frame is forced to a blank.
//!
//! A boosting tree fuses as NeMo's late pruning with `lm_weighted_full` blank scoring: before
//! the candidates are chosen, every non-blank label gains alpha x (its tree bonus + the log of
//! the non-blank probability) and the blank's log-probability is scaled by 1 + alpha.

use super::toolkit::{Candidate, log_softmax, rank, recombine_groups, top_k};
use super::{BeamConfig, NBest, SearchRun, TransducerSearch, fuse_boost};
use crate::decoder::boosting::BoostingTree;
use crate::decoder::nets::{JointInput, PredictInput};
use crate::tokenizer::Token;
use anyhow::{Result, bail};

/// One hypothesis of the beam; its `hyp.frame` is the frame looked at next (NeMo's time
/// index).
type Slot = Candidate<f32, Step>;

/// What a `malsd_batch` hypothesis keeps besides.
#[derive(Clone, Default)]
struct Step {
    /// Labels emitted since the frame last advanced (NeMo's `last_timestamp_lasts`).
    on_frame: usize,
    /// The joint's output at `hyp.frame`, once computed.
    logits: Option<Vec<f32>>,
}

/// One proposed extension of a slot.
struct Proposal {
    parent: usize,
    /// The label, or `None` for a finished hypothesis carried over unchanged.
    label: Option<usize>,
    /// Index into the model's durations (TDT; 0 for RNN-T).
    duration: usize,
    score: f32,
}

/// NeMo's `malsd_batch`, TDT and RNN-T.
pub(super) struct MalsdBatch;

impl TransducerSearch for MalsdBatch {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, boost) = run.parts();
        let frames = input.frames;
        let (blank, classes, durations) = (nets.blank(), nets.classes(), nets.durations());
        let tdt = !durations.is_empty();
        let beam = cfg.beam_size;
        let enc = |t: usize| input.at(t);
        let mut slots = vec![Slot::start(&mut nets, backend, boost)?];
        let mut fusion = boost.map(|tree| Fusion::new(tree, blank));
        let active = |s: &Slot| s.hyp.frame < frames;
        while slots.iter().any(active) {
            // The joint for every active hypothesis whose logits the last prediction step did not
            // already give, in one graph.
            let need: Vec<usize> = (0..slots.len())
                .filter(|&i| active(&slots[i]) && slots[i].own.logits.is_none())
                .collect();
            let inputs: Vec<JointInput> = need
                .iter()
                .map(|&i| JointInput {
                    enc: enc(slots[i].hyp.frame),
                    pred_out: &slots[i].hyp.pred_out,
                })
                .collect();
            let outputs = nets.joint(backend, &inputs)?;
            for (&i, logits) in need.iter().zip(outputs) {
                slots[i].own.logits = Some(logits);
            }

            let mut candidates = Vec::with_capacity(slots.len() * beam);
            for (i, slot) in slots.iter().enumerate() {
                if active(slot) {
                    let shape = (blank, classes, durations.len());
                    propose(slot, i, cfg, shape, fusion.as_mut(), &mut candidates)?;
                } else {
                    // Past the last frame: carried over as it is.
                    candidates.push(Proposal {
                        parent: i,
                        label: None,
                        duration: 0,
                        score: slot.score,
                    });
                }
            }
            let scores: Vec<f32> = candidates.iter().map(|c| c.score).collect();
            let best = top_k(&scores, beam);

            let mut next: Vec<Slot> = Vec::with_capacity(best.len());
            for c in best.into_iter().map(|k| &candidates[k]) {
                if c.score == f32::NEG_INFINITY {
                    continue;
                }
                let parent = &slots[c.parent];
                let mut slot = Slot {
                    hyp: parent.hyp.clone(),
                    unfed: None,
                    tokens: parent.tokens.clone(),
                    hash: parent.hash,
                    score: c.score,
                    boost_state: parent.boost_state,
                    own: Step {
                        on_frame: parent.own.on_frame,
                        logits: None,
                    },
                };
                let advance = if tdt { durations[c.duration] } else { 0 };
                match c.label {
                    None => {}
                    Some(label) if label == blank => {
                        slot.hyp.frame += if tdt { advance } else { 1 };
                        slot.own.on_frame = 0;
                    }
                    Some(label) => {
                        slot.emit(Token {
                            id: label,
                            frame: slot.hyp.frame,
                            duration: advance,
                        });
                        slot.hyp.frame += advance;
                        let on_frame = &mut slot.own.on_frame;
                        *on_frame = if advance > 0 { 0 } else { *on_frame + 1 };
                        if let Some(tree) = boost {
                            slot.boost_state = tree.advance(slot.boost_state, label).1;
                        }
                    }
                }
                next.push(slot);
            }
            slots = recombine(next, tdt);

            // The prediction net for every new label and the joint at the frame every active
            // hypothesis looks at next, in one graph.
            let unfed: Vec<usize> = (0..slots.len())
                .filter(|&i| slots[i].unfed.is_some())
                .collect();
            let moved: Vec<usize> = (0..slots.len())
                .filter(|&i| {
                    slots[i].unfed.is_none() && slots[i].own.logits.is_none() && active(&slots[i])
                })
                .collect();
            let extra: Vec<JointInput> = moved
                .iter()
                .map(|&i| JointInput {
                    enc: enc(slots[i].hyp.frame),
                    pred_out: &slots[i].hyp.pred_out,
                })
                .collect();
            let inputs: Vec<PredictInput> = unfed
                .iter()
                .map(|&i| {
                    let s = &slots[i];
                    PredictInput {
                        token: s.unfed.unwrap_or(blank),
                        state: &s.hyp.state,
                        next_enc: active(s).then(|| enc(s.hyp.frame)),
                    }
                })
                .collect();
            let (predictions, joints) = nets.predict_and_join(backend, &inputs, &extra)?;
            for (&i, logits) in moved.iter().zip(joints) {
                slots[i].own.logits = Some(logits);
            }
            for (&i, p) in unfed.iter().zip(predictions) {
                let s = &mut slots[i];
                s.hyp.state = p.state;
                s.hyp.pred_out = p.pred_out;
                s.own.logits = p.logits;
                s.unfed = None;
            }
        }
        Ok(rank(
            slots.into_iter().map(|s| (s.tokens, s.score)),
            cfg.score_norm,
        ))
    }
}

/// The extensions of active slot `index` that compete for the beam, in NeMo's candidate
/// order.
fn propose(
    slot: &Slot,
    index: usize,
    cfg: &BeamConfig,
    (blank, classes, n_durations): (usize, usize, usize),
    fusion: Option<&mut Fusion>,
    out: &mut Vec<Proposal>,
) -> Result<()> {
    let Some(logits) = slot.own.logits.as_ref() else {
        bail!("internal: an active hypothesis without its joint output");
    };
    let mut label_logp = log_softmax(&logits[..classes]);
    if let Some(fusion) = fusion {
        fusion.apply(slot.boost_state, &mut label_logp);
    }
    let tdt = n_durations > 0;
    let duration_logp = if tdt {
        log_softmax(&logits[classes..classes + n_durations])
    } else {
        Vec::new()
    };
    // The best (label, duration) pairs by joint log-probability, as NeMo's top-k over the
    // label-major [labels x durations] matrix (index = label * durations + duration). A pair in
    // that top-k has its label among the `beam` best labels (each better label with the same
    // duration scores at least as much), so only those labels' rows are looked at: 4 x 5
    // candidates instead of 5125.
    let per_label = n_durations.max(1);
    let (top, joint_of): (Vec<usize>, Vec<f32>) = if tdt {
        let mut labels = top_k(&label_logp, cfg.beam_size);
        labels.sort_unstable();
        let (mut index, mut value) = (Vec::new(), Vec::new());
        for &l in &labels {
            for (d, &dl) in duration_logp.iter().enumerate() {
                index.push(l * per_label + d);
                value.push(label_logp[l] + dl);
            }
        }
        // Positions are in index order, so top_k's ties go to the lower index, as before.
        let best = top_k(&value, cfg.beam_size);
        (
            best.iter().map(|&p| index[p]).collect(),
            best.iter().map(|&p| value[p]).collect(),
        )
    } else {
        let best = top_k(&label_logp, cfg.beam_size);
        let values = best.iter().map(|&k| label_logp[k]).collect();
        (best, values)
    };
    // A blank must advance: duration index 0 becomes 1 (its score stays the one of index 0).
    let split = |k: usize| {
        let (label, duration) = (k / per_label, k % per_label);
        let duration = if tdt && label == blank && duration == 0 {
            1
        } else {
            duration
        };
        (label, duration)
    };
    if slot.own.on_frame >= cfg.max_symbols_per_step {
        // Forced blank: the blank's probability with the best duration's, moving by the
        // duration of the best extension (at least 1), as NeMo does.
        let Some(&first) = top.first() else {
            bail!("internal: no candidate for a hypothesis");
        };
        let duration_best = duration_logp
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let blank_logp = if tdt {
            label_logp[blank] + duration_best
        } else {
            label_logp[blank]
        };
        let duration = if tdt { split(first).1.max(1) } else { 0 };
        out.push(Proposal {
            parent: index,
            label: Some(blank),
            duration,
            score: slot.score + blank_logp,
        });
        return Ok(());
    }
    for (k, joint) in top.into_iter().zip(joint_of) {
        let (label, duration) = split(k);
        out.push(Proposal {
            parent: index,
            label: Some(label),
            duration,
            score: slot.score + joint,
        });
    }
    Ok(())
}

/// A boosting tree fused into the label scores, with its scratch rows.
struct Fusion<'t> {
    tree: &'t BoostingTree,
    bonus: Vec<f32>,
    next: Vec<u32>,
}

impl<'t> Fusion<'t> {
    fn new(tree: &'t BoostingTree, labels: usize) -> Fusion<'t> {
        Fusion {
            tree,
            bonus: vec![0.0; labels],
            next: vec![0; labels],
        }
    }

    /// NeMo's late-pruning fusion of the tree's bonuses from `state` into one row.
    fn apply(&mut self, state: u32, label_logp: &mut [f32]) {
        self.tree
            .advance_all(state, &mut self.bonus, &mut self.next);
        // NeMo clamps the blank probability below 1 - 1e-2 here (for bf16's sake).
        fuse_boost(label_logp, &self.bonus, self.tree.alpha(), 1e-2);
    }
}

/// Merges equal hypotheses (NeMo's `recombine_hyps_`): of each group with the same labels,
/// last label and (TDT) frame, the best keeps its place with the log-sum of the group's
/// probabilities; the others leave the beam.
fn recombine(slots: Vec<Slot>, tdt: bool) -> Vec<Slot> {
    let equal = |a: &Slot, b: &Slot| {
        a.hyp.last == b.hyp.last && (!tdt || a.hyp.frame == b.hyp.frame) && a.same_tokens(b)
    };
    recombine_groups(slots, equal, true)
}
