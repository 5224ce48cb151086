//! The transducer's two networks as graph steps over N hypotheses at once: the prediction net
//! (embedding + stacked LSTM + `joint.pred`) fed one token per hypothesis, and the joint
//! (`relu(enc + pred)` -> `joint_net.2`) over one frame per hypothesis. Greedy search steps one
//! hypothesis; a beam steps its K hypotheses (or several streams theirs) in one graph each.
//!
//! Both run as small graphs on the caller's persistent backend, with its one gallocr, reading
//! the weights in place. With one hypothesis the graphs are exactly the ones greedy decoding
//! has always built (same nodes, same bits); with more, the matrix products take all the
//! hypotheses' columns at once and the LSTM's pointwise node runs once per column.

use super::hypothesis::{Hypothesis, LstmState};
use crate::backend::{Backend, CaptureId, Graph, Tensor};
use crate::kernels::FusedOps;
use crate::model::{Joint, LstmLayer, Model, PredictionNetwork};

/// Per-token cache of the first LSTM layer's input product `weight_ih_l0 · embed[token]`, a
/// function of the token alone, kept after its first computation. Each emission otherwise
/// streams `weight_ih_l0` (a quarter of the LSTM's weights, 6.5 MB in f32 for the 0.6b) for a
/// value that only depends on the token; the kept value is the one the graph computed, so
/// decoding is unchanged. At most `(V + 1) x 4H` floats (10.5 MB for the 0.6b), filled as
/// tokens occur. Decoding writes it, so it belongs to a session, not to the shared model.
#[derive(Clone, Debug, Default)]
pub struct InputGates(Vec<Option<Box<[f32]>>>);

impl InputGates {
    /// An empty cache for a model's tokens (none for a model without a transducer).
    pub fn for_model(model: &Model) -> InputGates {
        let tokens = match model.transducer() {
            Some(_) => model.hparams().vocab_size + 1,
            None => 0,
        };
        InputGates(vec![None; tokens])
    }

    pub fn get(&self, token: usize) -> Option<&[f32]> {
        self.0.get(token)?.as_deref()
    }

    /// Keeps `gates` for `token` (a value already kept stays: every computation of it gives
    /// the same).
    fn keep(&mut self, token: usize, gates: Vec<f32>) {
        if let Some(slot @ None) = self.0.get_mut(token) {
            *slot = Some(gates.into_boxed_slice());
        }
    }
}
use crate::bail;
use crate::error::Result;

/// Graph work done, for `--profile`: per hypothesis, not per graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounts {
    /// Joint evaluations (one per hypothesis and frame looked at).
    pub joint_steps: u64,
    /// Prediction-net updates (one per hypothesis and token fed).
    pub predictor_steps: u64,
}

/// One hypothesis' part of a prediction step.
#[derive(Clone, Copy)]
pub struct PredictInput<'a> {
    /// The token fed to the prediction net (the blank is the start symbol).
    pub token: usize,
    /// The state before it.
    pub state: &'a LstmState,
    /// The encoder projection of the frame this hypothesis' next joint step looks at, if
    /// known: the same graph then evaluates that joint too (one graph per emission instead of
    /// two).
    pub next_enc: Option<&'a [f32]>,
}

/// One hypothesis' result of a prediction step.
pub struct Prediction {
    /// The state after the token.
    pub state: LstmState,
    /// `joint.pred` of the new LSTM output.
    pub pred_out: Vec<f32>,
    /// The joint's logits for `next_enc`, when it was given.
    pub logits: Option<Vec<f32>>,
}

/// One hypothesis' part of a joint step.
#[derive(Clone, Copy)]
pub struct JointInput<'a> {
    /// `joint.enc` of the frame looked at.
    pub enc: &'a [f32],
    /// The hypothesis' cached `joint.pred`.
    pub pred_out: &'a [f32],
}

/// The prediction net and the joint of a transducer model.
pub struct Nets<'m> {
    pred: &'m PredictionNetwork,
    gates: &'m mut InputGates,
    joint: &'m Joint,
    blank: usize,
    hidden: usize,
    durations: &'m [usize],
    counts: NetCounts,
}

impl<'m> Nets<'m> {
    /// The model's transducer, keeping first-layer input products in `gates` (the session's).
    pub fn new(model: &'m Model, gates: &'m mut InputGates) -> Result<Nets<'m>> {
        let hp = model.hparams();
        let (Some(transducer), Some(t)) = (model.transducer(), &hp.transducer) else {
            bail!(
                Internal,
                "{}: the model has no transducer decoder",
                model.shown()
            );
        };
        if gates.0.len() != hp.vocab_size + 1 {
            bail!(Internal, "internal: an input-gate cache of another model");
        }
        Ok(Nets {
            pred: &transducer.prediction,
            gates,
            joint: &transducer.joint,
            blank: hp.blank_id(),
            hidden: t.pred_hidden,
            durations: &t.durations,
            counts: NetCounts::default(),
        })
    }

    /// The blank label (the last token logit).
    pub fn blank(&self) -> usize {
        self.blank
    }

    /// Token logits per joint output (the vocabulary and the blank); TDT's duration logits
    /// follow them.
    pub fn classes(&self) -> usize {
        self.blank + 1
    }

    /// The frame advances TDT's duration logits stand for (empty for RNN-T).
    pub fn durations(&self) -> &'m [usize] {
        self.durations
    }

    /// Values per frame of the encoder's joint projection (`joint.enc`'s output width).
    pub fn enc_width(&self) -> usize {
        self.joint.enc.weight.shape()[1]
    }

    /// The width of one frame of `joint_enc` (`[frames][enc_width]`), or why it does not
    /// hold `frames` frames.
    pub fn frame_width(&self, joint_enc: &[f32], frames: usize) -> Result<usize> {
        let width = self.enc_width();
        if joint_enc.len() != frames * width {
            bail!(
                Internal,
                "encoder projection holds {} values, expected {frames} x {width}",
                joint_enc.len()
            );
        }
        Ok(width)
    }

    pub fn counts(&self) -> NetCounts {
        self.counts
    }

    /// The hypothesis every search starts from: the zero state fed the start symbol (the
    /// blank, whose embedding row is zero), at frame 0, nothing emitted.
    pub fn start(&mut self, backend: &mut Backend) -> Result<Hypothesis> {
        let zeros = LstmState::zeros(self.pred.lstm.len(), self.hidden);
        let input = PredictInput {
            token: self.blank,
            state: &zeros,
            next_enc: None,
        };
        let Some(first) = self.predict(backend, &[input])?.pop() else {
            bail!(Internal, "internal: a prediction step without its result");
        };
        Ok(Hypothesis {
            state: first.state,
            pred_out: first.pred_out,
            last: None,
            score: 0.0,
            frame: 0,
            tokens: Vec::new(),
        })
    }

    /// Feeds each input's token through the prediction net from its state, in one graph.
    /// The first LSTM layer's input product of a token is kept in the session's
    /// [`InputGates`] after its first use and read from there after that.
    pub fn predict(
        &mut self,
        backend: &mut Backend,
        inputs: &[PredictInput],
    ) -> Result<Vec<Prediction>> {
        Ok(self.predict_and_join(backend, inputs, &[])?.0)
    }

    /// [`predict`](Self::predict) with the joint of `extra` (hypotheses not fed a token) in
    /// the same graph: a beam step's one graph. Without `extra` the graph is `predict`'s.
    pub fn predict_and_join(
        &mut self,
        backend: &mut Backend,
        inputs: &[PredictInput],
        extra: &[JointInput],
    ) -> Result<(Vec<Prediction>, Vec<Vec<f32>>)> {
        let (pred, joint, h) = (self.pred, self.joint, self.hidden);
        let kept = &*self.gates;
        let n = inputs.len();
        if n == 0 {
            return Ok((Vec::new(), self.joint(backend, extra)?));
        }
        let width = self.enc_width();
        if extra
            .iter()
            .any(|i| i.pred_out.len() != width || i.enc.len() != width)
        {
            bail!(
                Internal,
                "joint: encoder and prediction rows of different widths"
            );
        }
        for input in inputs {
            let fits = input.state.layers.len() == pred.lstm.len()
                && input
                    .state
                    .layers
                    .iter()
                    .all(|(hs, cs)| hs.len() == h && cs.len() == h);
            if !fits {
                bail!(
                    Internal,
                    "prediction network: a hypothesis' state does not fit this model"
                );
            }
        }
        let with_enc: Vec<(usize, &[f32])> = inputs
            .iter()
            .enumerate()
            .filter_map(|(i, input)| input.next_enc.map(|e| (i, e)))
            .collect();
        let mut state_ids = Vec::with_capacity(pred.lstm.len());
        let mut fresh_gates: Vec<(usize, CaptureId)> = Vec::new();
        let mut logits_id = None;
        let mut extra_id = None;
        let mut out = backend.compute_step(|g| {
            // Tokens whose input product this graph computes, each once.
            let mut made: Vec<(usize, Tensor)> = Vec::new();
            let mut x = None;
            for (l, layer) in pred.lstm.iter().enumerate() {
                let gx = match x {
                    None => {
                        let mut columns = Vec::with_capacity(n);
                        for input in inputs {
                            let token = input.token;
                            let gates = match made.iter().find(|&&(t, _)| t == token) {
                                Some(&(_, gates)) => gates,
                                None => {
                                    let (gates, fresh) = input_gates(g, pred, kept, token, h);
                                    if fresh {
                                        made.push((token, gates));
                                        fresh_gates.push((token, g.capture("input_gates", gates)));
                                    }
                                    gates
                                }
                            };
                            columns.push(gates);
                        }
                        stack_columns(g, &columns)
                    }
                    Some(x) => g.linear(x, &layer.weight_ih, None),
                };
                let h0: Vec<f32> = inputs
                    .iter()
                    .flat_map(|i| i.state.layers[l].0.iter().copied())
                    .collect();
                let c0: Vec<f32> = inputs
                    .iter()
                    .flat_map(|i| i.state.layers[l].1.iter().copied())
                    .collect();
                let h0 = g.input_f32_owned(h0, &[h, n]);
                let c0 = g.input_f32_owned(c0, &[h, n]);
                let (h1, c1) = lstm_step(g, layer, gx, h0, c0);
                state_ids.push((
                    g.capture(&format!("h{l}"), h1),
                    g.capture(&format!("c{l}"), c1),
                ));
                x = Some(h1);
            }
            let Some(x) = x else {
                bail!(Internal, "prediction network without LSTM layers");
            };
            let p = g.linear(x, &joint.pred.weight, joint.pred.bias.as_ref());
            if !with_enc.is_empty() {
                let p_used = if with_enc.len() == n {
                    p
                } else {
                    let columns: Vec<Tensor> =
                        with_enc.iter().map(|&(i, _)| column(g, p, i)).collect();
                    stack_columns(g, &columns)
                };
                let enc: Vec<&[f32]> = with_enc.iter().map(|&(_, e)| e).collect();
                let logits = joint_net(g, joint, &enc, p_used);
                logits_id = Some(g.capture("logits", logits));
            }
            if !extra.is_empty() {
                let rows: Vec<f32> = extra.iter().flat_map(|i| i.pred_out).copied().collect();
                let extra_pred = g.input_f32_owned(rows, &[width, extra.len()]);
                let enc: Vec<&[f32]> = extra.iter().map(|i| i.enc).collect();
                let logits = joint_net(g, joint, &enc, extra_pred);
                extra_id = Some(g.capture("extra_logits", logits));
            }
            Ok(p)
        })?;
        for (token, id) in fresh_gates {
            self.gates.keep(token, out.take(id)?);
        }
        if state_ids.len() != pred.lstm.len() {
            bail!(
                Internal,
                "prediction network: missing LSTM state in the graph's results"
            );
        }
        let mut states = vec![Vec::with_capacity(state_ids.len()); n];
        for (h_id, c_id) in state_ids {
            let hs = split_columns(out.take(h_id)?, n);
            let cs = split_columns(out.take(c_id)?, n);
            for (layers, hc) in states.iter_mut().zip(hs.into_iter().zip(cs)) {
                layers.push(hc);
            }
        }
        let mut logits = match logits_id {
            Some(id) => split_columns(out.take(id)?, with_enc.len()),
            None => Vec::new(),
        }
        .into_iter();
        let mut logits_of = with_enc.iter().map(|&(i, _)| i).peekable();
        let extra_logits = match extra_id {
            Some(id) => split_columns(out.take(id)?, extra.len()),
            None => Vec::new(),
        };
        let pred_outs = split_columns(out.output, n);
        self.counts.predictor_steps += n as u64;
        self.counts.joint_steps += (with_enc.len() + extra.len()) as u64;
        let predictions = states
            .into_iter()
            .zip(pred_outs)
            .enumerate()
            .map(|(i, (layers, pred_out))| Prediction {
                state: LstmState { layers },
                pred_out,
                logits: logits_of.next_if_eq(&i).and_then(|_| logits.next()),
            })
            .collect();
        Ok((predictions, extra_logits))
    }

    /// The joint's logits (tokens, then TDT's durations) for each input, in one graph.
    pub fn joint(&mut self, backend: &mut Backend, inputs: &[JointInput]) -> Result<Vec<Vec<f32>>> {
        let joint = self.joint;
        let n = inputs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let width = inputs[0].pred_out.len();
        if inputs
            .iter()
            .any(|i| i.pred_out.len() != width || i.enc.len() != width)
        {
            bail!(
                Internal,
                "joint: encoder and prediction rows of different widths"
            );
        }
        let out = backend.compute_step(|g| {
            let pred: Vec<f32> = inputs.iter().flat_map(|i| i.pred_out).copied().collect();
            let p = g.input_f32_owned(pred, &[width, n]);
            let enc: Vec<&[f32]> = inputs.iter().map(|i| i.enc).collect();
            Ok(joint_net(g, joint, &enc, p))
        })?;
        self.counts.joint_steps += n as u64;
        Ok(split_columns(out.output, n))
    }
}

/// The first LSTM layer's input product `weight_ih · embed[token]` ([4H, 1]) and whether it
/// is computed here (to be kept) rather than read from what an earlier step kept. Always a
/// one-column product, so that what is kept is the same bits whatever the number of
/// hypotheses of the step that first computed it.
fn input_gates<'g>(
    g: &mut Graph<'g>,
    pred: &PredictionNetwork,
    kept: &InputGates,
    token: usize,
    hidden: usize,
) -> (Tensor<'g>, bool) {
    if let Some(gates) = kept.get(token) {
        return (g.input_f32(gates, &[4 * hidden, 1]), false);
    }
    let id = g.input_i32(&[token as i32], &[1]);
    let embed = g.weight(&pred.embed);
    let e = g.get_rows(embed, id); // [H, 1]
    (g.linear(e, &pred.lstm[0].weight_ih, None), true)
}

/// `joint_net(relu(enc + pred))`: token (and duration) logits for one encoder frame per
/// column of `pred` (`enc[j]` for column j).
fn joint_net<'g>(g: &mut Graph<'g>, joint: &Joint, enc: &[&[f32]], pred: Tensor<'g>) -> Tensor<'g> {
    let width = enc.first().map_or(0, |e| e.len());
    let e = if let [row] = enc {
        g.input_f32(row, &[width, 1])
    } else {
        let rows: Vec<f32> = enc.iter().flat_map(|e| e.iter()).copied().collect();
        g.input_f32_owned(rows, &[width, enc.len()])
    };
    let s = g.add(e, pred);
    let s = g.relu(s);
    let logits = g.linear(s, &joint.joint_net.weight, joint.joint_net.bias.as_ref());
    if logits.ne(0) == joint.n_logits {
        return logits;
    }
    // Without the zero rows padded at load.
    let logits = g.cols(logits, 0, joint.n_logits);
    g.cont(logits)
}

/// One LSTM cell step (PyTorch gate order i, f, g, o; both biases) for every column, from the
/// input's gate product `gx = weight_ih · x` ([4H, N]): the hidden state's product and the
/// pointwise rest for all columns at once (two nodes, whatever the beam).
fn lstm_step<'g>(
    g: &mut Graph<'g>,
    w: &LstmLayer,
    gx: Tensor<'g>,
    h: Tensor<'g>,
    c: Tensor<'g>,
) -> (Tensor<'g>, Tensor<'g>) {
    let n = h.ne(1);
    let gh = g.linear(h, &w.weight_hh, None);
    let out = g.lstm_pointwise(gx, gh, (&w.bias_ih, &w.bias_hh), c); // [H, 2N]: h1, c1
    (g.rows(out, 0, n), g.rows(out, n, n))
}

/// Column `j` of a `[rows, N]` tensor: the tensor itself when it has one column (the graph of a
/// single hypothesis stays the one greedy decoding always built).
fn column<'g>(g: &mut Graph<'g>, t: Tensor<'g>, j: usize) -> Tensor<'g> {
    if t.ne(1) == 1 { t } else { g.rows(t, j, 1) }
}

/// `[rows, 1]` columns side by side; a single column as it is.
fn stack_columns<'g>(g: &mut Graph<'g>, columns: &[Tensor<'g>]) -> Tensor<'g> {
    match columns {
        [one] => *one,
        _ => g.stack_rows(columns),
    }
}

/// A `[rows, n]` result as n columns (no copy for one).
fn split_columns(data: Vec<f32>, n: usize) -> Vec<Vec<f32>> {
    if n == 1 {
        return vec![data];
    }
    let rows = data.len() / n.max(1);
    data.chunks_exact(rows.max(1))
        .map(<[f32]>::to_vec)
        .collect()
}
