//! Greedy TDT and RNN-T decoding with NeMo's label-looping semantics, over one
//! [`Hypothesis`] stepped by the [`Nets`].
//!
//! The prediction net runs once per emitted token and its `joint.pred` is reused until the
//! next emission; the joint runs once per step. An emission's prediction step also evaluates
//! the joint of the frame the next step looks at (one graph per emission instead of two).

use super::boosting::{BoostCursor, BoostingTree};
use super::confidence::{ConfidenceConfig, ScoredStep};
use super::ctc::argmax;
use super::hypothesis::Hypothesis;
use super::nets::{InputGates, JointInput, NetCounts, Nets, PredictInput};
use crate::backend::Backend;
use crate::bail;
use crate::error::Result;
use crate::model::Model;
use crate::tokenizer::Token;

/// One decoding step, for traces and tests (NeMo's `decode_trace.json` fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Encoder frame.
    pub t: usize,
    /// Last emitted token fed to the prediction net (`None` at the start).
    pub input: Option<usize>,
    /// Chosen label (blank = vocab size).
    pub token: usize,
    /// TDT duration chosen (RNN-T: 0).
    pub duration: usize,
}

/// Greedy transducer search over one utterance's encoder projection.
pub struct GreedyTransducer<'m> {
    nets: Nets<'m>,
    max_symbols: usize,
    /// When set, every step's confidence is recorded into `steps`.
    confidence: Option<ConfidenceConfig>,
    steps: Vec<ScoredStep>,
    /// Told the fraction of the frames decoded, about every percent (a long file's decoder
    /// runs for minutes).
    progress: Option<Box<dyn FnMut(f64) + 'm>>,
}

impl<'m> GreedyTransducer<'m> {
    /// A search over `model`'s transducer, keeping input products in the session's `gates`.
    pub fn new(model: &'m Model, gates: &'m mut InputGates) -> Result<GreedyTransducer<'m>> {
        Ok(GreedyTransducer {
            nets: Nets::new(model, gates)?,
            max_symbols: model.hparams().max_symbols,
            confidence: None,
            steps: Vec::new(),
            progress: None,
        })
    }

    /// Tell `progress` how far each decode is, as a fraction of its frames (`None`: stop).
    pub fn set_progress(&mut self, progress: Option<Box<dyn FnMut(f64) + 'm>>) {
        self.progress = progress;
    }

    /// Record each step's confidence by `cfg` from the next decode on (`None`: stop).
    pub fn set_confidence(&mut self, cfg: Option<ConfidenceConfig>) {
        self.confidence = cfg;
    }

    /// The steps of the last decode with their confidences (empty unless
    /// [`set_confidence`](Self::set_confidence) was given a method).
    pub fn take_steps(&mut self) -> Vec<ScoredStep> {
        std::mem::take(&mut self.steps)
    }

    /// Joint evaluations and prediction-net updates so far, for `--profile`.
    pub fn counts(&self) -> NetCounts {
        self.nets.counts()
    }

    /// Greedy decode of one utterance. `joint_enc` is `joint.enc(encoder output)`,
    /// `[frames][joint_hidden]`. With `boost`, phrases steer the choice of non-blank labels
    /// (NeMo's greedy_batch with `boosting_tree`). With `trace`, every step is recorded.
    pub fn decode(
        &mut self,
        backend: &mut Backend,
        joint_enc: &[f32],
        frames: usize,
        boost: Option<&BoostingTree>,
        trace: Option<&mut Vec<Step>>,
    ) -> Result<Vec<Token>> {
        let mut hyp = self.nets.start(backend)?;
        let mut at = boost.map(BoostingTree::start);
        let boost = boost.zip(at.as_mut());
        self.run(backend, joint_enc, frames, &mut hyp, boost, trace)?;
        Ok(hyp.into_tokens())
    }

    /// The hypothesis a stream starts from (the start symbol fed).
    pub fn start(&mut self, backend: &mut Backend) -> Result<Hypothesis> {
        self.nets.start(backend)
    }

    /// Continues `hyp` over the next chunk of a stream, as NeMo's label looping continues its
    /// previous hypotheses: the prediction net's state and last label carry over, and a TDT
    /// duration that runs past the chunk's end skips as many frames of the next one. The new
    /// tokens' frames count from the chunk's first frame. With `boost`, the phrases steer the
    /// search from the tree state given, which is left where the chunk ended (NeMo keeps a
    /// stream's fusion state with its decoder state).
    pub fn resume(
        &mut self,
        backend: &mut Backend,
        joint_enc: &[f32],
        frames: usize,
        hyp: &mut Hypothesis,
        boost: Option<(&BoostingTree, &mut u32)>,
    ) -> Result<()> {
        self.run(backend, joint_enc, frames, hyp, boost, None)?;
        hyp.frame = hyp.frame.saturating_sub(frames);
        Ok(())
    }

    /// NeMo's label-looping frame loop over `frames` frames from `hyp`.
    fn run(
        &mut self,
        backend: &mut Backend,
        joint_enc: &[f32],
        frames: usize,
        hyp: &mut Hypothesis,
        boost: Option<(&BoostingTree, &mut u32)>,
        mut trace: Option<&mut Vec<Step>>,
    ) -> Result<()> {
        let nets = &mut self.nets;
        let (confidence, steps) = (self.confidence.as_ref(), &mut self.steps);
        steps.clear();
        let width = nets.frame_width(joint_enc, frames)?;
        let (blank, classes, durations) = (nets.blank(), nets.classes(), nets.durations());
        let max_symbols = self.max_symbols;
        let tdt = !durations.is_empty();
        let (tree, boost_state) = boost.unzip();
        if let Some(tree) = tree
            && tree.vocab_size() != blank
        {
            bail!(
                Options,
                "the boosting tree was built for {} labels, the model has {blank}",
                tree.vocab_size()
            );
        }
        let mut cursor = tree
            .zip(boost_state.as_deref())
            .map(|(t, &s)| BoostCursor::at(t, s));
        // Logits already evaluated (with the last emission's prediction) for a frame.
        let mut ready: Option<(usize, Vec<f32>)> = None;
        let progress = &mut self.progress;
        let report_every = frames.div_ceil(100).max(1);
        let mut next_report = 0;
        // NeMo's frame loop: up to max_symbols labels per visit of a frame; TDT moves by the
        // predicted duration, RNN-T by one frame after a blank.
        while hyp.frame < frames {
            if let Some(p) = progress.as_mut()
                && hyp.frame >= next_report
            {
                p(hyp.frame as f64 / frames as f64);
                next_report = hyp.frame + report_every;
            }
            let mut symbols = 0;
            // The last evaluation left the frame where it was (TDT: a duration of 0).
            let mut stayed;
            loop {
                let t = hyp.frame;
                let logits = match ready.take() {
                    Some((frame, logits)) if frame == t => logits,
                    _ => {
                        let input = JointInput {
                            enc: &joint_enc[t * width..(t + 1) * width],
                            pred_out: &hyp.pred_out,
                        };
                        let Some(logits) = nets.joint(backend, &[input])?.pop() else {
                            bail!(Internal, "internal: a joint step without its result");
                        };
                        logits
                    }
                };
                let mut k = argmax(&logits[..classes]);
                // NeMo decides blank or not on the plain logits; a non-blank label is then
                // the best of the logits plus alpha x the tree's bonus (durations untouched).
                if k != blank
                    && let Some(cursor) = &cursor
                {
                    k = cursor.best(&logits[..blank], None);
                }
                let d = if tdt {
                    durations[argmax(&logits[classes..classes + durations.len()])]
                } else {
                    0
                };
                if let Some(c) = confidence
                    && (k != blank || !c.exclude_blank)
                {
                    // NeMo's label-looping record: one entry per joint evaluation, measured
                    // over the labels (and, apart, the durations) of the unbiased logits. With
                    // blanks excluded only emissions count, so only they are measured.
                    steps.push(ScoredStep {
                        frame: t,
                        label: k,
                        label_confidence: c.of_logits(&logits[..classes], classes),
                        duration_confidence: (tdt && c.tdt_include_duration).then(|| {
                            c.of_logits(&logits[classes..classes + durations.len()], classes)
                        }),
                    });
                }
                let step = Step {
                    t,
                    input: hyp.last,
                    token: k,
                    duration: d,
                };
                symbols += 1;
                stayed = d == 0;
                if k == blank && d == 0 && tdt {
                    // Nothing changes until this frame's budget runs out: NeMo repeats the same
                    // evaluation; record the repeats without recomputing them.
                    if let Some(tr) = trace.as_deref_mut() {
                        tr.extend(std::iter::repeat_n(step, max_symbols - symbols + 1));
                    }
                    symbols = max_symbols;
                    break;
                }
                if let Some(tr) = trace.as_deref_mut() {
                    tr.push(step);
                }
                if k != blank {
                    hyp.tokens.push(Token {
                        id: k,
                        frame: t,
                        duration: d,
                    });
                    hyp.last = Some(k);
                    if let Some(cursor) = &mut cursor {
                        cursor.emit(k);
                    }
                    // The frame the next step evaluates (as the loop below moves).
                    let stay = symbols < max_symbols;
                    let next = if tdt && d > 0 {
                        t + d
                    } else if stay {
                        t
                    } else {
                        t + 1
                    };
                    let input = PredictInput {
                        token: k,
                        state: &hyp.state,
                        next_enc: (next < frames).then(|| &joint_enc[next * width..][..width]),
                    };
                    let Some(p) = nets.predict(backend, &[input])?.pop() else {
                        bail!(Internal, "internal: a prediction step without its result");
                    };
                    hyp.state = p.state;
                    hyp.pred_out = p.pred_out;
                    if let Some(logits) = p.logits {
                        ready = Some((next, logits));
                    }
                }
                let again = if tdt {
                    hyp.frame += d;
                    d == 0
                } else {
                    k != blank
                };
                if !again || symbols >= max_symbols {
                    break;
                }
            }
            // After max_symbols labels on a frame NeMo's label loop moves on by one frame,
            // unless the last label's duration already did.
            if !tdt || (symbols >= max_symbols && stayed) {
                hyp.frame += 1;
            }
        }
        if let (Some(state), Some(cursor)) = (boost_state, cursor) {
            *state = cursor.state();
        }
        Ok(())
    }
}
