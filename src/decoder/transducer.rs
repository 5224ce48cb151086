//! TDT and RNN-T greedy decoding with NeMo's label-looping semantics.
//!
//! Two small graphs, both on the persistent backend with its one gallocr and with the weights
//! used in place: `predict` (embedding + stacked LSTM + `joint.pred`), run once per emitted token
//! and cached until the next emission, and `joint` (`relu(enc + pred)` -> `joint_net.2`), run
//! once per step.

use super::ctc::argmax;
use crate::backend::{Backend, Graph, Tensor};
use crate::model::{Joint, LstmLayer, Model, PredictionNetwork};
use crate::tokenizer::Token;
use anyhow::{Result, bail};

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

/// Greedy transducer decoder state for one utterance.
pub struct TransducerDecoder<'m> {
    pred: &'m PredictionNetwork,
    joint: &'m Joint,
    blank: usize,
    hidden: usize,
    durations: &'m [usize],
    max_symbols: usize,
    /// (h, c) per LSTM layer.
    state: Vec<(Vec<f32>, Vec<f32>)>,
    /// `joint.pred` of the last LSTM output: reused until the next emission.
    pred_out: Vec<f32>,
    last: Option<usize>,
    /// Steps taken (joint evaluations) and prediction-net updates, for `--profile`.
    pub joint_steps: u64,
    pub predictor_steps: u64,
}

impl<'m> TransducerDecoder<'m> {
    pub fn new(model: &'m Model) -> Result<TransducerDecoder<'m>> {
        let (Some(pred), Some(joint)) = (&model.prediction, &model.joint) else {
            bail!(
                "{}: the model has no transducer decoder",
                model.path.display()
            );
        };
        let hp = &model.hparams;
        Ok(TransducerDecoder {
            pred,
            joint,
            blank: hp.blank_id(),
            hidden: hp.pred_hidden,
            durations: &hp.durations,
            max_symbols: hp.max_symbols,
            state: Vec::new(),
            pred_out: Vec::new(),
            last: None,
            joint_steps: 0,
            predictor_steps: 0,
        })
    }

    fn is_tdt(&self) -> bool {
        !self.durations.is_empty()
    }

    /// Start of utterance: zero state, and the prediction for the start symbol (the blank,
    /// whose embedding row is zero).
    fn reset(&mut self, backend: &mut Backend) -> Result<()> {
        let h = self.hidden;
        self.state = vec![(vec![0.0; h], vec![0.0; h]); self.pred.lstm.len()];
        self.last = None;
        self.predict(backend, self.blank, None).map(|_| ())
    }

    /// Feed `token` through the prediction network; updates the state and `pred_out`. With
    /// `next_enc` (the encoder projection of the frame the next step will look at), the same
    /// graph also evaluates that step's joint and returns its logits: one graph per emission
    /// instead of two.
    fn predict(
        &mut self,
        backend: &mut Backend,
        token: usize,
        next_enc: Option<&[f32]>,
    ) -> Result<Option<Vec<f32>>> {
        let (pred, joint, state, h) = (self.pred, self.joint, &self.state, self.hidden);
        let mut ids = Vec::with_capacity(state.len());
        let mut logits_id = None;
        let kept = pred.input_gates.get(token);
        let mut gates_id = None;
        let mut out = backend.compute(|g| {
            let mut x = None;
            for (l, (layer, (h0, c0))) in pred.lstm.iter().zip(state).enumerate() {
                let gx = match (l, x, kept) {
                    (0, _, Some(gates)) => g.input_f32(gates, &[4 * h, 1]),
                    (0, _, None) => {
                        let id = g.input_i32(&[token as i32], &[1]);
                        let embed = g.weight(&pred.embed);
                        let e = g.get_rows(embed, id); // [H, 1]
                        let gx = g.linear(e, &layer.weight_ih, None);
                        gates_id = Some(g.capture("input_gates", gx));
                        gx
                    }
                    (_, Some(x), _) => g.linear(x, &layer.weight_ih, None),
                    (_, None, _) => unreachable!("layer {l} follows layer 0"),
                };
                let h0 = g.input_f32(h0, &[h, 1]);
                let c0 = g.input_f32(c0, &[h, 1]);
                let (h1, c1) = lstm_cell(g, layer, gx, h0, c0);
                ids.push((
                    g.capture(&format!("h{l}"), h1),
                    g.capture(&format!("c{l}"), c1),
                ));
                x = Some(h1);
            }
            let Some(x) = x else {
                bail!("prediction network without LSTM layers");
            };
            let p = g.linear(x, &joint.pred.weight, joint.pred.bias.as_ref());
            if let Some(e) = next_enc {
                let logits = joint_net(g, joint, e, p);
                logits_id = Some(g.capture("logits", logits));
            }
            Ok(p)
        })?;
        let logits = logits_id.map(|id| out.take(id)).transpose()?;
        if let Some(id) = gates_id {
            pred.input_gates.keep(token, out.take(id)?);
        }
        if ids.len() != self.state.len() {
            bail!("prediction network: missing LSTM state in the graph's results");
        }
        for (slot, (h, c)) in self.state.iter_mut().zip(ids) {
            *slot = (out.take(h)?, out.take(c)?);
        }
        self.pred_out = out.output;
        self.predictor_steps += 1;
        if logits.is_some() {
            self.joint_steps += 1;
        }
        Ok(logits)
    }

    /// Joint logits for one encoder frame's projection and the cached prediction.
    fn joint_logits(&mut self, backend: &mut Backend, enc_row: &[f32]) -> Result<Vec<f32>> {
        let (joint, pred_out) = (self.joint, &self.pred_out);
        let n = enc_row.len();
        let out = backend.compute(|g| {
            let p = g.input_f32(pred_out, &[n, 1]);
            Ok(joint_net(g, joint, enc_row, p))
        })?;
        self.joint_steps += 1;
        Ok(out.output)
    }

    /// Greedy decode of one utterance. `joint_enc` is `joint.enc(encoder output)`,
    /// `[frames][joint_hidden]`. With `trace`, every step is recorded.
    pub fn decode(
        &mut self,
        backend: &mut Backend,
        joint_enc: &[f32],
        frames: usize,
        mut trace: Option<&mut Vec<Step>>,
    ) -> Result<Vec<Token>> {
        let width = self.joint.enc.weight.shape()[1];
        if joint_enc.len() != frames * width {
            bail!(
                "encoder projection holds {} values, expected {frames} x {width}",
                joint_enc.len()
            );
        }
        self.reset(backend)?;
        let classes = self.blank + 1;
        let tdt = self.is_tdt();
        let mut tokens = Vec::new();
        let mut t = 0usize;
        // Logits already evaluated (with the last emission's prediction) for a frame.
        let mut ready: Option<(usize, Vec<f32>)> = None;
        // NeMo's frame loop: up to max_symbols labels per visit of a frame; TDT moves by the
        // predicted duration, RNN-T by one frame after a blank.
        while t < frames {
            let mut symbols = 0;
            loop {
                let logits = match ready.take() {
                    Some((frame, logits)) if frame == t => logits,
                    _ => self.joint_logits(backend, &joint_enc[t * width..(t + 1) * width])?,
                };
                let k = argmax(&logits[..classes]);
                let d = if tdt {
                    self.durations[argmax(&logits[classes..classes + self.durations.len()])]
                } else {
                    0
                };
                let step = Step {
                    t,
                    input: self.last,
                    token: k,
                    duration: d,
                };
                symbols += 1;
                if k == self.blank && d == 0 && tdt {
                    // Nothing changes until this frame's budget runs out: NeMo repeats the same
                    // evaluation; record the repeats without recomputing them.
                    if let Some(tr) = trace.as_deref_mut() {
                        tr.extend(std::iter::repeat_n(step, self.max_symbols - symbols + 1));
                    }
                    symbols = self.max_symbols;
                    break;
                }
                if let Some(tr) = trace.as_deref_mut() {
                    tr.push(step);
                }
                if k != self.blank {
                    tokens.push(Token {
                        id: k,
                        frame: t,
                        duration: d,
                    });
                    self.last = Some(k);
                    // The frame the next step evaluates (as the loop below moves).
                    let stay = symbols < self.max_symbols;
                    let next = if tdt && d > 0 {
                        t + d + usize::from(!stay)
                    } else if stay {
                        t
                    } else {
                        t + 1
                    };
                    let next_enc = (next < frames).then(|| &joint_enc[next * width..][..width]);
                    if let Some(logits) = self.predict(backend, k, next_enc)? {
                        ready = Some((next, logits));
                    }
                }
                let again = if tdt {
                    t += d;
                    d == 0
                } else {
                    k != self.blank
                };
                if !again || symbols >= self.max_symbols {
                    break;
                }
            }
            if !tdt || symbols >= self.max_symbols {
                t += 1;
            }
        }
        Ok(tokens)
    }
}

/// `joint_net(relu(enc + pred))`: token (and duration) logits for one encoder frame.
fn joint_net<'g>(
    g: &mut Graph<'g>,
    joint: &Joint,
    enc_row: &[f32],
    pred: Tensor<'g>,
) -> Tensor<'g> {
    let e = g.input_f32(enc_row, &[enc_row.len(), 1]);
    let s = g.add(e, pred);
    let s = g.relu(s);
    g.linear(s, &joint.joint_net.weight, joint.joint_net.bias.as_ref())
}

/// One LSTM cell step (PyTorch gate order i, f, g, o; both biases) from the input's gate
/// product `gx = weight_ih · x`: the hidden state's product, then the pointwise rest as one
/// node.
fn lstm_cell<'g>(
    g: &mut Graph<'g>,
    w: &LstmLayer,
    gx: Tensor<'g>,
    h: Tensor<'g>,
    c: Tensor<'g>,
) -> (Tensor<'g>, Tensor<'g>) {
    let gh = g.linear(h, &w.weight_hh, None);
    let out = g.lstm_pointwise(gx, gh, (&w.bias_ih, &w.bias_hh), c); // [H, 2]: h1, c1
    (g.rows(out, 0, 1), g.rows(out, 1, 1))
}
