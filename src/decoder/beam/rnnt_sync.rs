//! NeMo's synchronous RNN-T searches: `tsd` (time-synchronous decoding: on every frame, up to
//! `tsd_max_sym_exp_per_step` rounds in which the beam's hypotheses each take a blank, which
//! ends their frame, or one of their best labels) and `alsd` (alignment-length synchronous
//! decoding: step i looks at frame i - (labels so far) of each hypothesis, for up to
//! frames + `alsd_max_target_len` x frames steps). Both score in Python floats (f64) as NeMo
//! and run one prediction and one joint graph per step for the whole beam.

use super::path::TokenPath;
use super::toolkit::{Candidate, best_n, log_add_exp, log_softmax, rank, recombine, top_k};
use super::{BeamConfig, NBest, SearchRun, TransducerSearch};
use crate::backend::Backend;
use crate::decoder::nets::{JointInput, Nets, PredictInput};
use crate::tokenizer::Token;
use anyhow::Result;

type Hyp = Candidate<f64>;

/// `hyp` extended by `label`, stamped `stamp`, with `score`.
fn child(hyp: &Hyp, label: usize, stamp: usize, score: f64) -> Hyp {
    let token = Token {
        id: label,
        frame: stamp,
        duration: 0,
    };
    hyp.child(token, score)
}

/// Feeds every pending label and returns each hypothesis' label log-probabilities at its
/// frame row `enc[i]`, in one graph.
fn score_all(
    nets: &mut Nets,
    backend: &mut Backend,
    hyps: &mut [Hyp],
    enc: &[&[f32]],
) -> Result<Vec<Vec<f32>>> {
    let classes = nets.classes();
    let mut logits: Vec<Option<Vec<f32>>> = vec![None; hyps.len()];
    let unfed: Vec<usize> = (0..hyps.len())
        .filter(|&i| hyps[i].unfed.is_some())
        .collect();
    let inputs: Vec<PredictInput> = unfed
        .iter()
        .map(|&i| PredictInput {
            token: hyps[i].unfed.unwrap_or(classes - 1),
            state: &hyps[i].hyp.state,
            next_enc: Some(enc[i]),
        })
        .collect();
    let rest: Vec<usize> = (0..hyps.len())
        .filter(|&i| hyps[i].unfed.is_none())
        .collect();
    let extra: Vec<JointInput> = rest
        .iter()
        .map(|&i| JointInput {
            enc: enc[i],
            pred_out: &hyps[i].hyp.pred_out,
        })
        .collect();
    let (predictions, joints) = nets.predict_and_join(backend, &inputs, &extra)?;
    for (&i, l) in rest.iter().zip(joints) {
        logits[i] = Some(l);
    }
    for (&i, p) in unfed.iter().zip(predictions) {
        let h = &mut hyps[i];
        h.hyp.state = p.state;
        h.hyp.pred_out = p.pred_out;
        h.unfed = None;
        logits[i] = p.logits;
    }
    logits
        .into_iter()
        .map(|l| {
            let l = l.ok_or_else(|| anyhow::anyhow!("internal: a hypothesis without its joint"))?;
            Ok(log_softmax(&l[..classes]))
        })
        .collect()
}

/// The N-best list, ranked NeMo's way.
fn finish(hyps: Vec<Hyp>, cfg: &BeamConfig) -> Vec<NBest> {
    rank(
        hyps.into_iter().map(|h| (h.tokens, h.score)),
        cfg.score_norm,
    )
}

/// NeMo's RNN-T `tsd`.
pub(super) struct Tsd;

impl TransducerSearch for Tsd {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, _) = run.parts();
        let blank = nets.blank();
        let beam = cfg.beam_size.min(blank);
        let mut kept = vec![Hyp::start(&mut nets, backend, None)?];
        for t in 0..input.frames {
            let mut ended: Vec<Hyp> = Vec::new();
            let mut expanding = std::mem::take(&mut kept);
            for _ in 0..cfg.tsd_max_sym_exp_per_step {
                let enc = vec![input.at(t); expanding.len()];
                let logp = score_all(&mut nets, backend, &mut expanding, &enc)?;
                let known = ended.len();
                for (h, lp) in expanding.iter().zip(&logp) {
                    let score = h.score + lp[blank] as f64;
                    match ended[..known].iter().position(|e| e.same_tokens(h)) {
                        Some(at) => ended[at].score = log_add_exp(ended[at].score, score),
                        None => ended.push(Hyp { score, ..h.clone() }),
                    }
                }
                let mut next = Vec::with_capacity(expanding.len() * beam);
                for (h, lp) in expanding.iter().zip(&logp) {
                    for k in top_k(&lp[..blank], beam) {
                        next.push(child(h, k, t, h.score + lp[k] as f64));
                    }
                }
                expanding = best_n(next, beam);
            }
            kept = best_n(ended, beam);
        }
        Ok(finish(kept, cfg))
    }
}

/// NeMo's RNN-T `alsd`.
pub(super) struct Alsd;

impl TransducerSearch for Alsd {
    fn search(&self, run: SearchRun) -> Result<Vec<NBest>> {
        let (backend, mut nets, input, cfg, _) = run.parts();
        let blank = nets.blank();
        let beam = cfg.beam_size.min(blank);
        let frames = input.frames;
        let u_max = (cfg.alsd_max_target_len * frames as f64) as usize;
        let mut kept = vec![Hyp::start(&mut nets, backend, None)?];
        // Only tokens and score: up to a beam of these per step of the last frame, an hour's
        // worth of decoder states would not fit.
        let mut finished: Vec<(TokenPath, f64)> = Vec::new();
        for step in 0..frames + u_max {
            // Each hypothesis looks at frame step - (its labels); past the last frame it drops.
            let mut live: Vec<Hyp> = Vec::new();
            let mut at: Vec<usize> = Vec::new();
            for h in std::mem::take(&mut kept) {
                let t = step - h.tokens.len().min(step);
                if t < frames {
                    live.push(h);
                    at.push(t);
                }
            }
            if live.is_empty() {
                break;
            }
            let enc: Vec<&[f32]> = at.iter().map(|&t| input.at(t)).collect();
            let logp = score_all(&mut nets, backend, &mut live, &enc)?;
            let mut next: Vec<Hyp> = Vec::new();
            for ((h, lp), &t) in live.iter().zip(&logp).zip(&at) {
                let ended = Hyp {
                    score: h.score + lp[blank] as f64,
                    ..h.clone()
                };
                if t == frames - 1 {
                    finished.push((ended.tokens.clone(), ended.score));
                }
                next.push(ended);
                for k in top_k(&lp[..blank], beam) {
                    next.push(child(h, k, step, h.score + lp[k] as f64));
                }
            }
            kept = recombine(best_n(next, beam));
        }
        Ok(if finished.is_empty() {
            // NeMo returns the last beam as it stands (best score first) when no hypothesis
            // reached the last frame.
            kept.into_iter()
                .map(|h| NBest {
                    tokens: h.tokens.to_vec(),
                    score: h.score as f32,
                })
                .collect()
        } else {
            // NeMo returns every hypothesis that reached the last frame, one per step for each of
            // up to a beam of them: at a large beam, many times the beam. The beam's best are
            // the list's (ranked as NeMo ranks it), as every other strategy's list holds at most
            // the beam.
            let mut ranked = rank(finished, cfg.score_norm);
            ranked.truncate(beam);
            ranked
        })
    }
}
