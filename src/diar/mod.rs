//! Speaker diarization with NeMo's Sortformer (`SortformerEncLabelModel`): who speaks when, as
//! per-frame speaker probabilities (80 ms frames) and segments.
//!
//! The forward is NeMo's: the waveform scaled by its signed peak (offline models), log-mel
//! features, the FastConformer encoder (the `encoder` room's, as for ASR), `encoder_proj`, a
//! post-LN Transformer without positional encoding, and the head (ReLU, `first_hidden_to_hidden`,
//! ReLU, `single_hidden_to_spks`, sigmoid). [`postprocess`] turns the probabilities into NeMo's
//! segments; [`stream`] is NeMo's streaming loop with its speaker cache and FIFO; [`words`]
//! gives a transcript's words their speakers.

pub mod postprocess;
pub mod stream;
pub mod words;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bail;
use crate::error::Result;

use crate::audio::mel::{Features, MelConfig, log_mel};
use crate::backend::{Backend, Graph, Stats, Tensor, Threads};
use crate::encoder::EncoderState;
use crate::encoder::{AttentionChoice, FeatureImage, Outputs, encode, last_linear};
use crate::hparams::{ModelType, SortformerParams};
use crate::kernels::FusedOps;
use crate::model::{Linear, Model, TransformerLayer};

/// The diarization model a transcript's speakers come from unless one is named: NVIDIA's
/// streaming Sortformer, whose speaker cache and FIFO keep memory bounded however long the
/// recording.
pub const DEFAULT_MODEL: &str = "nvidia/diar_streaming_sortformer_4spk-v2";

/// The longest recording an offline pass takes: its full attention needs about 45 bytes per
/// squared encoder frame (the full-size v1's peak RSS, its 0.49 GB file included: 0.56 GB at
/// 60 s, 0.60 GB at 120 s, 0.83 GB at 240 s), some 10 GB at 20 minutes.
pub const MAX_OFFLINE_SECONDS: f64 = 20.0 * 60.0;

/// LayerNorm epsilon of NeMo's Transformer blocks.
const LN_EPS: f32 = 1e-5;

/// Per-frame speaker activity of one recording.
#[derive(Clone, Debug, Default)]
pub struct Activity {
    /// Output frames (80 ms each).
    pub frames: usize,
    pub n_spks: usize,
    /// `[frames][n_spks]` row-major: each speaker's probability of speaking in each frame.
    pub probs: Vec<f32>,
    /// Seconds per frame.
    pub frame_seconds: f64,
}

impl Activity {
    /// Speaker `spk`'s probability in every frame.
    pub fn speaker(&self, spk: usize) -> Vec<f32> {
        self.probs
            .iter()
            .skip(spk)
            .step_by(self.n_spks.max(1))
            .copied()
            .collect()
    }
}

/// Named intermediate results.
pub type Taps = Vec<(String, Vec<f32>)>;

/// What an offline pass produced, with its intermediate results when asked for (named like
/// NeMo's reference dumps: `features` [n_mels][T], then `[T'][width]` matrices).
#[derive(Debug, Default)]
pub struct Forward {
    pub activity: Activity,
    pub taps: Taps,
}

/// A Sortformer with its own backend: diarizes recordings one at a time.
pub struct Diarizer {
    model: Arc<Model>,
    params: SortformerParams,
    backend: Backend,
    mel: MelConfig,
    times: DiarTimes,
}

/// Time spent so far in two stages (`--profile`); the rest of a recording's time is the
/// encoder's (and a stream's features and state).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiarTimes {
    /// Waveform scaling and log-mel features of whole recordings.
    pub features: Duration,
    /// `encoder_proj`, the Transformer and the head (one graph per pass or chunk).
    pub transformer: Duration,
}

impl Diarizer {
    /// Refuses a model that is not a Sortformer (a speech recognition model).
    pub fn check(model: &Model) -> Result<()> {
        if model.hparams().sortformer.is_none() {
            bail!(
                Model,
                "{} is a {} speech recognition model, not a Sortformer diarization model",
                model.shown(),
                model.hparams().model_type.name()
            );
        }
        Ok(())
    }

    /// A diarizer over `model`, which must be a Sortformer.
    pub fn new(model: Arc<Model>, threads: Threads) -> Result<Diarizer> {
        Diarizer::check(&model)?;
        let Some(params) = model.hparams().sortformer.clone() else {
            bail!(Internal, "internal: a Sortformer without its parameters");
        };
        debug_assert_eq!(model.hparams().model_type, ModelType::Sortformer);
        let mel = model.hparams().preprocessor.mel_config();
        let mut backend = Backend::new(model.device(), threads.get())?;
        backend.set_lowering(model.lowering());
        backend.set_device_weight_bytes(model.device_weight_bytes());
        Ok(Diarizer {
            model,
            params,
            backend,
            mel,
            times: DiarTimes::default(),
        })
    }

    /// Loads the GGUF at `path` and opens a diarizer on it.
    pub fn load(path: &Path, threads: Threads) -> Result<Diarizer> {
        Diarizer::new(Arc::new(Model::load(path)?), threads)
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn params(&self) -> &SortformerParams {
        &self.params
    }

    /// Time every graph node by kind from now on (`--profile`; [`Diarizer::stats`]).
    pub fn set_op_timing(&mut self, on: bool) {
        self.backend.set_op_timing(on);
    }

    /// The backend's counters: graphs computed, compute buffer, node times.
    pub fn stats(&self) -> &Stats {
        self.backend.stats()
    }

    /// Threads of the compute backend.
    pub fn threads(&self) -> usize {
        self.backend.threads()
    }

    /// Time spent in the features and the Transformer so far.
    pub fn times(&self) -> DiarTimes {
        self.times
    }

    /// Seconds per output frame (80 ms).
    pub fn frame_seconds(&self) -> f64 {
        self.model.hparams().geometry().frame_seconds()
    }

    /// Audio samples per output frame.
    pub fn samples_per_frame(&self) -> usize {
        self.model.hparams().geometry().samples_per_frame()
    }

    /// NeMo's features of 16 kHz samples: an offline model first scales the waveform by
    /// `1 / (max(x) + eps)`, the signed maximum (`process_signal`); a streaming model does not.
    pub fn features(&mut self, samples: &[f32]) -> Features {
        let start = Instant::now();
        let scaled: Vec<f32>;
        let waveform = match self.params.streaming_mode {
            true => samples,
            false => {
                let peak = samples.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let scale = 1.0 / (peak + self.params.eps);
                scaled = samples.iter().map(|&x| scale * x).collect();
                &scaled
            }
        };
        let features = log_mel(
            waveform,
            self.model.window(),
            self.model.filterbank(),
            &self.mel,
        );
        self.times.features += start.elapsed();
        features
    }

    /// Output frames of `samples` 16 kHz samples.
    pub fn frames_of(&self, samples: usize) -> usize {
        let feature_frames = self.mel.n_frames(samples);
        self.model.hparams().geometry().encoded_len(feature_frames)
    }

    /// The error for audio too short to give one output frame.
    fn check_length(&self, samples: usize) -> Result<()> {
        if self.frames_of(samples) == 0 {
            bail!(
                Audio,
                "audio too short to diarize: {samples} samples ({:.3} s), one frame needs at \
                 least {} samples",
                samples as f64 / self.model.hparams().preprocessor.sample_rate as f64,
                self.mel.hop_length
            );
        }
        Ok(())
    }

    /// Refuses a recording too long for one pass: NeMo runs an offline Sortformer with full
    /// attention over the whole recording (it has no long-form mode; NVIDIA gives v1 about
    /// 12 minutes on a 48 GB GPU), whose memory grows with the square of its length. A
    /// streaming Sortformer streams any length in bounded memory.
    pub fn check_offline_length(&self, samples: usize) -> Result<()> {
        let rate = self.model.hparams().preprocessor.sample_rate as f64;
        let seconds = samples as f64 / rate;
        if seconds > MAX_OFFLINE_SECONDS {
            bail!(
                Audio,
                "{seconds:.1} s of audio is longer than the {:.0} minutes {} diarizes in one \
                 pass (an offline Sortformer attends over the whole recording at once, as in \
                 NeMo, and its memory grows with the square of the length): split the \
                 recording, or use a streaming Sortformer ({DEFAULT_MODEL}), which streams \
                 any length in bounded memory",
                MAX_OFFLINE_SECONDS / 60.0,
                self.model.shown()
            );
        }
        Ok(())
    }

    /// The whole recording in one pass (NeMo's `forward` of an offline model, or a streaming
    /// model with full context).
    pub fn diarize_offline(&mut self, samples: &[f32]) -> Result<Activity> {
        Ok(self.forward(samples, false)?.activity)
    }

    /// [`Diarizer::diarize_offline`], keeping every intermediate result when `taps` is set.
    pub fn forward(&mut self, samples: &[f32], taps: bool) -> Result<Forward> {
        self.check_length(samples.len())?;
        self.check_offline_length(samples.len())?;
        let features = self.features(samples);
        let hp = self.model.hparams();
        let attention = AttentionChoice::Full.resolve(
            hp.encoder.attention,
            hp.geometry().encoded_len(features.n_frames),
            hp.geometry().frame_seconds(),
        );
        let mut out = Forward::default();
        if taps {
            out.taps.push(("features".into(), features.data.clone()));
        }
        let encoded = encode(
            &mut self.backend,
            &self.model,
            &mut EncoderState::new(),
            FeatureImage::from(&features),
            attention,
            Outputs::All { layers: taps },
        )?;
        if taps {
            let pre = encoded
                .layers
                .iter()
                .find(|(name, _)| name == "enc_pre_encode")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            out.taps.push(("enc_pre_encode".into(), pre));
            out.taps
                .push(("encoder_out".into(), encoded.output.clone()));
        }
        let (probs, head_taps) = self.head(&encoded.output, encoded.frames, taps)?;
        out.taps.extend(head_taps);
        out.activity = self.activity(probs, encoded.frames);
        Ok(out)
    }

    fn activity(&self, probs: Vec<f32>, frames: usize) -> Activity {
        Activity {
            frames,
            n_spks: self.params.n_spks,
            probs,
            frame_seconds: self.frame_seconds(),
        }
    }

    /// `encoder_proj`, the Transformer and the head over encoder output `x` (`[frames][fc_d]`):
    /// the speaker probabilities `[frames][n_spks]` (and, with `taps`, `encoder_proj` and
    /// `transformer_out`).
    fn head(&mut self, x: &[f32], frames: usize, taps: bool) -> Result<(Vec<f32>, Taps)> {
        let fc = self.model.hparams().encoder.d_model;
        if frames == 0 || x.len() != frames * fc {
            bail!(
                Internal,
                "internal: encoder output of {} values is not {frames} x {fc}",
                x.len()
            );
        }
        let start = Instant::now();
        let model = self.model.clone();
        let Some(w) = model.sortformer() else {
            bail!(Internal, "internal: a Sortformer without its weights");
        };
        let p = &self.params;
        let mut ids = Vec::new();
        let mut computed = self.backend.compute(|g| {
            let x = g.input_f32(x, &[fc, frames]);
            let x = linear(g, x, &w.encoder_proj);
            if taps {
                ids.push(("encoder_proj", g.capture("encoder_proj", x)));
            }
            let mut x = x;
            for layer in &w.layers {
                x = transformer_layer(g, layer, x, p.tf_n_heads);
            }
            if taps {
                ids.push(("transformer_out", g.capture("transformer_out", x)));
            }
            let h = g.relu(x);
            let hidden = &w.first_hidden_to_hidden;
            let h = g.linear_relu(h, &hidden.weight, hidden.bias.as_ref());
            let logits = linear(g, h, &w.single_hidden_to_spks);
            Ok(g.sigmoid(logits))
        })?;
        let mut out = Vec::new();
        for (name, id) in ids {
            out.push((name.to_string(), computed.take(id)?));
        }
        self.times.transformer += start.elapsed();
        Ok((std::mem::take(&mut computed.output), out))
    }
}

fn linear<'g>(g: &mut Graph<'g>, x: Tensor<'g>, l: &Linear) -> Tensor<'g> {
    g.linear(x, &l.weight, l.bias.as_ref())
}

/// NeMo's `TransformerEncoderBlock.forward_postln` over `x` (`[d, T]`), every frame valid: the
/// attention of `MultiHeadAttention` (q and k each scaled by `d_head^-1/4`, here the product
/// by `d_head^-1/2` in the softmax), no positional encoding.
fn transformer_layer<'g>(
    g: &mut Graph<'g>,
    l: &TransformerLayer,
    x: Tensor<'g>,
    heads: usize,
) -> Tensor<'g> {
    let (d, t) = (x.ne(0), x.ne(1));
    let dh = d / heads;
    // [d, T] as [dh, h, T]: the fused op reads each head's rows in place.
    let mut per_head = |net: &Linear| {
        let y = linear(g, x, net);
        g.reshape(y, &[dh, heads, t])
    };
    let (q, k, v) = (
        per_head(&l.query_net),
        per_head(&l.key_net),
        per_head(&l.value_net),
    );
    let o = g.dot_product_attention(q, k, v);
    let o = g.reshape(o, &[d, t]);
    // The residual adds and the ReLU are done in the GEMMs' stores where the weights are
    // packed (`x + o` and `o + x` are the same sum).
    let x = last_linear(g, o, &l.out_projection, Some((x, 1.0)));
    let x = g.layer_norm(x, &l.layer_norm_1.weight, &l.layer_norm_1.bias, LN_EPS);
    let f = g.linear_relu(x, &l.dense_in.weight, l.dense_in.bias.as_ref());
    let x = last_linear(g, f, &l.dense_out, Some((x, 1.0)));
    g.layer_norm(x, &l.layer_norm_2.weight, &l.layer_norm_2.bias, LN_EPS)
}
