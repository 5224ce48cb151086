//! The Silero VAD network: weights from a GGUF (the built-in one or a file), state carried
//! between windows as the package carries it, and probabilities for a whole signal.

use crate::backend::{Backend, HostWeights, Threads, Weight};
use crate::error::{Context, Result};
use crate::gguf::header::{TensorSpan, check_header};
use crate::kernels::FusedOps;
use crate::{bail, err};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The Silero VAD v6.2 weights as a GGUF, made from the package's model by
/// `scripts/silero_vad_gguf.py` (MIT, Silero Team: see assets/silero_vad.LICENSE).
pub const BUILTIN_GGUF: &[u8] = include_bytes!("../../assets/silero_vad_v6.2.gguf");

/// Units of the LSTM (and width of the encoder's output).
const HIDDEN: usize = 128;
/// Windows one graph computes at most: bounds the compute buffer (~40 kB a window).
const CHUNK_WINDOWS: usize = 512;

/// The two rates the model takes, each with its own net.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleRate {
    Hz16000,
    Hz8000,
}

impl SampleRate {
    /// The net for `hz`, if the model takes it without resampling.
    pub fn from_hz(hz: u32) -> Option<SampleRate> {
        match hz {
            16000 => Some(SampleRate::Hz16000),
            8000 => Some(SampleRate::Hz8000),
            _ => None,
        }
    }

    pub fn hz(self) -> u32 {
        match self {
            SampleRate::Hz16000 => 16000,
            SampleRate::Hz8000 => 8000,
        }
    }

    /// New samples per model call: 32 ms.
    pub fn window(self) -> usize {
        match self {
            SampleRate::Hz16000 => 512,
            SampleRate::Hz8000 => 256,
        }
    }

    /// Samples of the previous call the model sees before each window (4 ms).
    pub fn context(self) -> usize {
        self.window() / 8
    }

    /// STFT frame length (the basis' width); frames hop by a quarter window.
    fn frame(self) -> usize {
        self.window() / 2
    }

    fn prefix(self) -> &'static str {
        match self {
            SampleRate::Hz16000 => "_model",
            SampleRate::Hz8000 => "_model_8k",
        }
    }
}

/// One rate's net, its weights laid out for the graph.
struct Net {
    rate: SampleRate,
    /// STFT basis [frame, 2 * bins]: rows of cos then -sin, Hann-windowed.
    basis: Weight,
    /// The four encoder convolutions as GEMM weights [3 * Cin, Cout] (tap-major: column
    /// `k * Cin + c` is torch's `[o, c, k]`) and their biases.
    convs: [(Weight, Weight); 4],
    /// `W_ih` [128, 512] and `b_ih + b_hh`.
    w_ih: Weight,
    bias: Weight,
    /// `W_hh` transposed, [512, 128].
    w_hh_t: Weight,
    /// The output conv (1x1, 128 -> 1) and its bias.
    head: (Weight, Weight),
}

/// The loaded Silero VAD: both nets, immutable and shareable.
pub struct VadModel {
    nets: Vec<Net>,
}

/// Rows of the STFT basis as stored for the GEMM: the `2 * bins` rows (cos, then sin) and zero
/// rows up to the panel height of 16.
fn basis_rows(bins: usize) -> usize {
    (2 * bins).next_multiple_of(16)
}

/// Conv strides of the four encoder blocks.
const STRIDES: [usize; 4] = [1, 2, 2, 1];
/// Output channels of the four encoder blocks.
const CHANNELS: [usize; 4] = [128, 64, 64, 128];

impl VadModel {
    /// The model built into the binary.
    pub fn builtin() -> Result<Arc<VadModel>> {
        Ok(Arc::new(VadModel::from_gguf_bytes(
            BUILTIN_GGUF,
            "the built-in VAD model",
        )?))
    }

    /// A Silero VAD GGUF file (`--vad-model`).
    pub fn open(path: &Path) -> Result<Arc<VadModel>> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("{}: cannot read the VAD model", path.display()))?;
        Ok(Arc::new(VadModel::from_gguf_bytes(
            &bytes,
            &path.display().to_string(),
        )?))
    }

    /// The built-in model, or the file `path` names.
    pub fn load(path: Option<&Path>) -> Result<Arc<VadModel>> {
        match path {
            Some(p) => VadModel::open(p),
            None => VadModel::builtin(),
        }
    }

    /// Parses a whole GGUF held in memory; `shown` names it in errors.
    pub fn from_gguf_bytes(bytes: &[u8], shown: &str) -> Result<VadModel> {
        let header = check_header(bytes).map_err(|e| {
            err!(
                Model,
                "{shown}: not a Silero VAD model: malformed GGUF: {e}"
            )
        })?;
        let spans: HashMap<&str, &TensorSpan> = header
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        // `torch` is the tensor's torch shape; GGUF stores it reversed.
        let read = |name: &str, torch: &[usize]| -> Result<Vec<f32>> {
            let t = spans.get(name).ok_or_else(|| {
                err!(
                    Model,
                    "{shown}: not a Silero VAD model: tensor '{name}' is missing"
                )
            })?;
            let mut want = [1u64; 4];
            for (w, &n) in want.iter_mut().zip(torch.iter().rev()) {
                *w = n as u64;
            }
            if t.ggml_type != 0 || t.ne != want {
                bail!(
                    Model,
                    "{shown}: not a Silero VAD model: tensor '{name}' is type {} shape {:?}, expected f32 {:?}",
                    t.ggml_type,
                    t.ne,
                    want
                );
            }
            let data = &bytes[t.start as usize..t.end as usize];
            let values: Vec<f32> = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                bail!(
                    Model,
                    "{shown}: not a usable VAD model: tensor '{name}' value {i} is not finite"
                );
            }
            Ok(values)
        };
        let mut host = HostWeights::new();
        for rate in [SampleRate::Hz16000, SampleRate::Hz8000] {
            let p = rate.prefix();
            let frame = rate.frame();
            let bins = frame / 2 + 1;
            let mut basis = read(
                &format!("{p}.stft.forward_basis_buffer"),
                &[2 * bins, 1, frame],
            )?;
            basis.resize(basis_rows(bins) * frame, 0.0);
            host.push_panel16(&format!("{p}.basis"), basis_rows(bins), frame, &basis);
            let mut cin = bins;
            for (i, &cout) in CHANNELS.iter().enumerate() {
                let w = read(
                    &format!("{p}.encoder.{i}.reparam_conv.weight"),
                    &[cout, cin, 3],
                )?;
                let b = read(&format!("{p}.encoder.{i}.reparam_conv.bias"), &[cout])?;
                let mut taps = vec![0f32; cout * 3 * cin];
                for o in 0..cout {
                    for c in 0..cin {
                        for k in 0..3 {
                            taps[o * 3 * cin + k * cin + c] = w[(o * cin + c) * 3 + k];
                        }
                    }
                }
                host.push_panel16(&format!("{p}.conv{i}.weight"), cout, 3 * cin, &taps);
                host.push(&format!("{p}.conv{i}.bias"), &[cout], b);
                cin = cout;
            }
            let gates = 4 * HIDDEN;
            let w_ih = read(&format!("{p}.decoder.rnn.weight_ih"), &[gates, HIDDEN])?;
            let w_hh = read(&format!("{p}.decoder.rnn.weight_hh"), &[gates, HIDDEN])?;
            let b_ih = read(&format!("{p}.decoder.rnn.bias_ih"), &[gates])?;
            let b_hh = read(&format!("{p}.decoder.rnn.bias_hh"), &[gates])?;
            host.push_panel16(&format!("{p}.w_ih"), gates, HIDDEN, &w_ih);
            let bias = b_ih.iter().zip(&b_hh).map(|(a, b)| a + b).collect();
            host.push(&format!("{p}.bias"), &[gates], bias);
            let mut w_hh_t = vec![0f32; gates * HIDDEN];
            for r in 0..gates {
                for j in 0..HIDDEN {
                    w_hh_t[j * gates + r] = w_hh[r * HIDDEN + j];
                }
            }
            host.push(&format!("{p}.w_hh_t"), &[gates, HIDDEN], w_hh_t);
            let head_w = read(&format!("{p}.decoder.decoder.2.weight"), &[1, HIDDEN, 1])?;
            let head_b = read(&format!("{p}.decoder.decoder.2.bias"), &[1])?;
            host.push(&format!("{p}.head.weight"), &[HIDDEN, 1], head_w);
            host.push(&format!("{p}.head.bias"), &[1], head_b);
        }
        let mut w = host.realize()?;
        let mut take = |name: String| {
            w.remove(&name)
                .ok_or_else(|| err!(Internal, "internal: VAD weight {name} was not realized"))
        };
        let mut nets = Vec::new();
        for rate in [SampleRate::Hz16000, SampleRate::Hz8000] {
            let p = rate.prefix();
            let mut conv = |i: usize| -> Result<(Weight, Weight)> {
                Ok((
                    take(format!("{p}.conv{i}.weight"))?,
                    take(format!("{p}.conv{i}.bias"))?,
                ))
            };
            let convs = [conv(0)?, conv(1)?, conv(2)?, conv(3)?];
            nets.push(Net {
                rate,
                basis: take(format!("{p}.basis"))?,
                convs,
                w_ih: take(format!("{p}.w_ih"))?,
                bias: take(format!("{p}.bias"))?,
                w_hh_t: take(format!("{p}.w_hh_t"))?,
                head: (
                    take(format!("{p}.head.weight"))?,
                    take(format!("{p}.head.bias"))?,
                ),
            });
        }
        Ok(VadModel { nets })
    }

    fn net(&self, rate: SampleRate) -> &Net {
        self.nets
            .iter()
            .find(|n| n.rate == rate)
            .expect("both nets are loaded")
    }
}

/// What the model carries from one window to the next: the LSTM's `h` and `c` and the last
/// samples of the previous window (the context). Zeros after a reset, as in the package.
#[derive(Clone, Debug)]
pub struct VadState {
    rate: SampleRate,
    context: Vec<f32>,
    h: Vec<f32>,
    c: Vec<f32>,
}

impl VadState {
    pub fn new(rate: SampleRate) -> VadState {
        VadState {
            rate,
            context: vec![0.0; rate.context()],
            h: vec![0.0; HIDDEN],
            c: vec![0.0; HIDDEN],
        }
    }

    /// Back to the start (the package's `reset_states`).
    pub fn reset(&mut self) {
        *self = VadState::new(self.rate);
    }

    pub fn rate(&self) -> SampleRate {
        self.rate
    }

    /// The LSTM's hidden state after the last window.
    pub fn h(&self) -> &[f32] {
        &self.h
    }

    /// The LSTM's cell after the last window.
    pub fn c(&self) -> &[f32] {
        &self.c
    }
}

/// A VAD runner: the shared model and a backend of its own.
pub struct Vad {
    model: Arc<VadModel>,
    backend: Backend,
}

impl Vad {
    pub fn new(model: Arc<VadModel>, threads: Threads) -> Result<Vad> {
        Ok(Vad {
            model,
            backend: Backend::cpu(threads.get())?,
        })
    }

    pub fn model(&self) -> &Arc<VadModel> {
        &self.model
    }

    /// The backend (thread count, op timing, compute statistics).
    pub fn backend_mut(&mut self) -> &mut Backend {
        &mut self.backend
    }

    /// Speech probabilities of a whole signal at `rate`, from a fresh state: one per window,
    /// the last window zero-padded (as `get_speech_timestamps` runs the model).
    pub fn probabilities(&mut self, samples: &[f32], rate: SampleRate) -> Result<Vec<f32>> {
        let w = rate.window();
        let mut state = VadState::new(rate);
        let whole = samples.len() / w * w;
        let mut probs = self.process(&mut state, &samples[..whole])?;
        if whole < samples.len() {
            let mut last = samples[whole..].to_vec();
            last.resize(w, 0.0);
            probs.extend(self.process(&mut state, &last)?);
        }
        Ok(probs)
    }

    /// Runs whole windows (`samples.len()` a multiple of the window) from `state`, which is
    /// left as after the last window; one probability per window.
    pub fn process(&mut self, state: &mut VadState, samples: &[f32]) -> Result<Vec<f32>> {
        let rate = state.rate;
        let w = rate.window();
        if !samples.len().is_multiple_of(w) {
            bail!(
                Internal,
                "internal: VAD input of {} samples is not whole windows of {w}",
                samples.len()
            );
        }
        let mut probs = Vec::with_capacity(samples.len() / w);
        for chunk in samples.chunks(CHUNK_WINDOWS * w) {
            probs.extend(self.run_chunk(state, chunk)?);
        }
        Ok(probs)
    }

    /// One graph over the windows of `samples`.
    fn run_chunk(&mut self, state: &mut VadState, samples: &[f32]) -> Result<Vec<f32>> {
        let rate = state.rate;
        let net = self.model.net(rate);
        let (w, ctx, frame) = (rate.window(), rate.context(), rate.frame());
        let hop = frame / 2;
        let n = samples.len() / w;
        let bins = frame / 2 + 1;
        // The STFT frames of every window: the model's input is [context | window] (w + ctx),
        // reflect-padded on the right by ctx, cut into 4 frames of `frame` hopping by `hop`.
        let mut frames = Vec::with_capacity(n * 4 * frame);
        let mut x = vec![0f32; w + 2 * ctx];
        for (i, win) in samples.chunks_exact(w).enumerate() {
            if i == 0 {
                x[..ctx].copy_from_slice(&state.context);
            } else {
                x[..ctx].copy_from_slice(&samples[i * w - ctx..i * w]);
            }
            x[ctx..ctx + w].copy_from_slice(win);
            let len = w + ctx;
            for j in 0..ctx {
                x[len + j] = x[len - 2 - j];
            }
            for f in 0..4 {
                frames.extend_from_slice(&x[f * hop..f * hop + frame]);
            }
        }
        let mut state_in = state.h.clone();
        state_in.extend_from_slice(&state.c);
        let mut lstm = None;
        let mut out = self.backend.compute(|g| {
            let frames = g.input_f32_owned(frames, &[frame, 4 * n]);
            let spec = g.linear(frames, &net.basis, None);
            let row = basis_rows(bins) * 4;
            let re = g.view(spec, &[bins, 4 * n], &[row], 0);
            let im = g.view(spec, &[bins, 4 * n], &[row], bins * 4);
            let re2 = g.mul(re, re);
            let im2 = g.mul(im, im);
            let power = g.add(re2, im2);
            let mag = g.sqrt(power);
            let mut x = g.reshape(mag, &[bins, 4, n]);
            for (i, (wt, b)) in net.convs.iter().enumerate() {
                x = conv3(g, x, (wt, b), STRIDES[i]);
            }
            let feat = g.reshape(x, &[HIDDEN, n]);
            let gx = g.linear(feat, &net.w_ih, Some(&net.bias));
            let w_hh_t = g.weight(&net.w_hh_t);
            let s = g.input_f32_owned(state_in, &[HIDDEN, 2]);
            let hs = g.lstm_sequence(gx, w_hh_t, s);
            lstm = Some(g.capture("lstm", hs));
            let h_all = g.view(hs, &[HIDDEN, n], &[HIDDEN * 4], 0);
            let h_all = g.relu(h_all);
            let head_w = g.weight(&net.head.0);
            let logit = g.matmul(head_w, h_all);
            let head_b = g.weight(&net.head.1);
            let logit = g.add(logit, head_b);
            Ok(g.sigmoid(logit))
        })?;
        let lstm = lstm.ok_or_else(|| err!(Internal, "internal: the VAD graph lost its state"))?;
        let hs = out.take(lstm)?;
        state.h.copy_from_slice(&hs[(n - 1) * HIDDEN..n * HIDDEN]);
        state.c.copy_from_slice(&hs[n * HIDDEN..(n + 1) * HIDDEN]);
        state
            .context
            .copy_from_slice(&samples[samples.len() - ctx..]);
        Ok(out.output)
    }
}

/// A Conv1d of kernel 3, zero padding 1, then bias and ReLU, applied to each window's frames
/// on its own: `x` [Cin, T, N] -> [Cout, T', N], as one GEMM over the taps side by side.
fn conv3<'g>(
    g: &mut crate::backend::Graph<'g>,
    x: crate::backend::Tensor<'g>,
    (wt, b): (&Weight, &Weight),
    stride: usize,
) -> crate::backend::Tensor<'g> {
    let [cin, t, n, _] = x.shape();
    let cout = wt.shape()[1];
    let t_out = (t - 1) / stride + 1;
    let cols = g.conv1d_columns(x, stride);
    let cols = g.reshape(cols, &[3 * cin, t_out * n]);
    let y = g.linear_relu(cols, wt, Some(b));
    g.reshape(y, &[cout, t_out, n])
}
