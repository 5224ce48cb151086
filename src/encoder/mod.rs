//! The FastConformer encoder as ONE ggml graph per utterance.
//!
//! features -> `pre_encode` (dw_striding, x8) -> [xscaling] -> N conformer layers -> and, in the
//! same graph, the joint's encoder projection (`joint.enc`) for every frame and the CTC head.
//! Per-layer outputs are captures of that one graph (no extra computes).
//!
//! Layout: ggml tensors here are `[d, T]` (`ne0` = channels, fastest), i.e. torch's `[T, d]`.

use crate::audio::mel::Features;
use crate::backend::graph::RowStack;
use crate::backend::{Backend, CaptureId, Graph, Tensor};
use crate::bail;
use crate::error::Result;
use crate::hparams::{Attention, EncoderParams};
use crate::kernels::{Chunking, FusedOps, KeyWindow};
use crate::layout::Layout;
use crate::model::{
    ConformerLayer, ConvModule, FeedForward, LayerNorm, Model, PreEncode, RelPositionAttention,
};

mod state;
pub use state::{EncoderState, StreamCaches};
use state::{LayerCache, ResidentCaches};

/// NeMo's LayerNorm epsilon throughout the conformer.
const LN_EPS: f32 = 1e-5;

/// What one encoder pass produced. Matrices are row-major `[frames][width]`.
#[derive(Debug, Default)]
pub struct Encoded {
    /// Encoder frames T' (80 ms each).
    pub frames: usize,
    pub d_model: usize,
    /// `[T'][d_model]`: the last conformer layer's output (empty when only a head was asked
    /// for).
    pub output: Vec<f32>,
    /// `[T'][joint_hidden]`: `joint.enc(output)` (transducer models).
    pub joint_enc: Option<Vec<f32>>,
    /// `[T'][V + 1]`: CTC logits (CTC and hybrid models).
    pub ctc_logits: Option<Vec<f32>>,
    /// Named intermediate results, named like NeMo's reference dumps (`enc_layer_00`, ...),
    /// each `[T'][d_model]`, when asked for.
    pub layers: Vec<(String, Vec<f32>)>,
}

/// Longest audio that `auto` runs with full attention (seconds): up to here the result is
/// exactly NeMo's default. Measured (docs/BENCHMARKS.md, 110m): full attention costs 1.2x the
/// local [128, 128] encoder at 1 min and 5.6x at 5 min, growing with the square of the length,
/// so about 1.6x at 2 min.
pub const AUTO_FULL_MAX_SECONDS: f64 = 120.0;

/// The attention asked for on the command line (`--att-context`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionChoice {
    /// The model's own attention; for a full-attention model, full up to
    /// [`AUTO_FULL_MAX_SECONDS`], then [`Attention::LONG_FORM`].
    #[default]
    Auto,
    Full,
    Local {
        left: usize,
        right: usize,
    },
}

impl AttentionChoice {
    /// The attention for an utterance of `frames` encoder frames (`frame_seconds` each) of a
    /// model configured with `model`.
    pub fn resolve(self, model: Attention, frames: usize, frame_seconds: f64) -> Attention {
        match self {
            AttentionChoice::Full => Attention::Full,
            // A streaming model's lookahead: its own kind of attention, when NeMo builds it.
            AttentionChoice::Local { left, right } => match model {
                Attention::Chunked { .. } => Attention::chunked([left as i64, right as i64])
                    .unwrap_or(Attention::Local { left, right }),
                _ => Attention::Local { left, right },
            },
            AttentionChoice::Auto => match model {
                Attention::Local { .. } | Attention::Chunked { .. } => model,
                Attention::Full
                    if frames <= (AUTO_FULL_MAX_SECONDS / frame_seconds).round() as usize =>
                {
                    Attention::Full
                }
                Attention::Full => Attention::LONG_FORM,
            },
        }
    }
}

impl std::str::FromStr for AttentionChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || format!("'{s}': expected auto, full, or L,R (e.g. 128,128)");
        match s.trim() {
            "auto" => Ok(AttentionChoice::Auto),
            "full" => Ok(AttentionChoice::Full),
            other => {
                let (l, r) = other.split_once(',').ok_or_else(bad)?;
                let left: usize = l.trim().parse().map_err(|_| bad())?;
                let right: usize = r.trim().parse().map_err(|_| bad())?;
                if left.max(right) == 0 || left.max(right) > 1 << 20 {
                    return Err(format!(
                        "'{s}': the window must have 1 to 1048576 frames on at least one side"
                    ));
                }
                Ok(AttentionChoice::Local { left, right })
            }
        }
    }
}

/// What an encoder pass hands back. A long file's decode needs one head only; every other
/// `[T', width]` result would hold memory (in the compute buffer and as a copy) for nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outputs {
    /// The last layer's output, every head the model has and, with `layers`, every layer's
    /// output (and layer 0's sub-blocks).
    All { layers: bool },
    /// Only `joint.enc` of every frame (what a transducer decodes).
    JointEnc,
    /// Only the CTC logits.
    CtcLogits,
}

/// Feature frames laid out for the encoder graph: `[T][n_mels]`, mels fastest.
pub struct FeatureImage {
    data: Vec<f32>,
    n_mels: usize,
    n_frames: usize,
}

impl FeatureImage {
    /// Frames already laid out `[frames][n_mels]` (mels fastest), e.g. a stream's chunk.
    pub fn from_frames(data: Vec<f32>, n_mels: usize) -> Result<FeatureImage> {
        if n_mels == 0 || !data.len().is_multiple_of(n_mels) {
            bail!(
                Internal,
                "{} feature values are not whole frames of {n_mels} mels",
                data.len()
            );
        }
        Ok(FeatureImage {
            n_frames: data.len() / n_mels,
            data,
            n_mels,
        })
    }
}

impl From<&Features> for FeatureImage {
    fn from(features: &Features) -> FeatureImage {
        let (n_mels, n_frames) = (features.n_mels, features.n_frames);
        let mut data = vec![0f32; n_frames * n_mels];
        for m in 0..n_mels {
            for (t, &v) in features.band(m).iter().enumerate() {
                data[t * n_mels + m] = v;
            }
        }
        FeatureImage {
            data,
            n_mels,
            n_frames,
        }
    }
}

/// Run the encoder over the next `chunk` of a stream (valid frames only) from `state`, with the
/// given self-attention, returning only `outputs`. A whole file is one chunk from a fresh
/// state; a chunk of a cache-aware stream (its feature frames as NeMo's buffer gives them: the
/// pre-encode cache first after the first chunk) updates the state's caches.
pub fn encode(
    backend: &mut Backend,
    model: &Model,
    state: &mut EncoderState,
    chunk: FeatureImage,
    attention: Attention,
    outputs: Outputs,
) -> Result<Encoded> {
    if state.started && state.stream.is_none() {
        bail!(
            Internal,
            "a whole-file encoder state takes one chunk: each utterance needs a fresh state"
        );
    }
    let hp = &model.hparams().encoder;
    if chunk.n_mels != hp.feat_in {
        bail!(
            Internal,
            "features have {} mel bins, the model expects {}",
            chunk.n_mels,
            hp.feat_in
        );
    }
    if chunk.n_frames == 0 {
        bail!(Audio, "audio too short: no complete feature frame");
    }
    match outputs {
        Outputs::JointEnc if model.transducer().is_none() => {
            bail!(Options, "the model has no transducer joint")
        }
        Outputs::CtcLogits if model.ctc().is_none() => bail!(Options, "the model has no CTC head"),
        _ => {}
    }
    let t_feat = chunk.n_frames;
    let subsampled = model.hparams().geometry().encoded_len(t_feat);
    // A later chunk of a stream starts with the previous chunk's last feature frames; their
    // subsampled frames are dropped (NeMo's `drop_extra_pre_encoded`).
    let (drop, cache) = match &state.stream {
        Some(c) if c.chunks > 0 => (c.params.drop_extra_pre_encoded, Some(c)),
        Some(c) => (0, Some(c)),
        None => (0, None),
    };
    if subsampled <= drop {
        bail!(
            Internal,
            "a chunk of {t_feat} feature frames leaves no encoder frame after the cache"
        );
    }
    let frames = subsampled - drop;
    // A padded whole file: `total` frames, of which the first `frames` are the audio's.
    let total = match (&state.stream, state.padded_to) {
        (None, Some(t)) => t.max(frames),
        _ => frames,
    };
    let past = cache.map_or(0, |c| c.params.last_channel_cache_size);
    let first_valid = cache.map_or(0, |c| past - c.channel_len);
    let window = key_window(attention, frames, past, first_valid);
    let pos_rows = window.left + window.right + 1;
    let capture_layers = outputs == Outputs::All { layers: true };
    let record = state.record;
    let layer_slice = state.layer_slice.unwrap_or(LAYER_SLICE);

    if let Some(c) = cache
        && state.resident.is_none()
    {
        let most = c.params.valid_out_len.max(frames) + 1;
        let r = ResidentCaches::new(
            backend,
            hp.n_layers,
            hp.d_model,
            &c.params,
            pos_rows,
            most,
            state.cache_room,
        )?;
        state.resident = Some(r);
    }
    let resident = match state.resident.as_mut() {
        Some(r) => {
            r.make_room(hp.n_layers, frames)?;
            Some(&*r)
        }
        None => None,
    };
    // The positional table is projected in the graph unless the stream holds its projection
    // (the same rows: a chunked window does not depend on the chunk's length).
    let stored_positions = resident.is_some_and(|r| r.positions_ready && r.positions == pos_rows);
    let pos = (!stored_positions).then(|| positional_rows(attention, frames, hp.d_model));

    let mut head_ids = HeadIds::default();
    let mut cache_ids: Vec<(CaptureId, CaptureId)> = Vec::new();
    let computed =
        backend.compute_sized(graph_nodes(t_feat, total, hp.n_layers, layer_slice), |g| {
            let x = g.input_f32_owned(chunk.data, &[hp.feat_in, t_feat, 1, 1]);
            let mut x = pre_encode_sliced(g, &model.encoder().pre_encode, x, subsampled, hp);
            if drop > 0 {
                x = g.rows(x, drop, frames);
            }
            if total > frames {
                // NeMo's masked subsampling zeroes the padding's conv outputs, so its frames
                // are the output linear's bias.
                let out = &model.encoder().pre_encode.out;
                let mut pad = g.input_f32_owned(
                    vec![0.0; hp.d_model * (total - frames)],
                    &[hp.d_model, total - frames],
                );
                if let Some(b) = &out.bias {
                    let b = g.weight(b);
                    pad = g.add(pad, b);
                }
                x = g.concat(x, pad, 1);
            }
            if capture_layers {
                g.capture("enc_pre_encode", x);
            }
            if hp.xscaling {
                x = g.scale(x, (hp.d_model as f32).sqrt());
            }
            let pos = pos.map(|p| g.input_f32_owned(p, &[hp.d_model, pos_rows]));
            for (i, layer) in model.encoder().layers.iter().enumerate() {
                let taps = capture_layers && i == 0;
                let layer_cache = resident.map(|r| r.layer(g, i, !stored_positions));
                let positions = match (pos, resident) {
                    (Some(table), _) => LayerPositions::Table(table),
                    (None, Some(r)) => LayerPositions::Projected(r.positions(g, i)),
                    (None, None) => unreachable!("a table is built unless the stream holds one"),
                };
                let (y, next) = conformer_layer(
                    g,
                    hp,
                    layer,
                    (x, frames),
                    (positions, window),
                    taps,
                    layer_cache,
                    layer_slice,
                );
                x = y;
                if let (true, Some(next)) = (record, next) {
                    cache_ids.push((
                        g.capture(&format!("attention_input_{i:02}"), next.attention_input),
                        g.capture(&format!("cache_last_time_{i:02}"), next.time),
                    ));
                }
                if capture_layers {
                    g.capture(&format!("enc_layer_{i:02}"), x);
                }
            }
            Ok(match outputs {
                Outputs::All { .. } => {
                    head_ids = heads(g, model, x);
                    x
                }
                // The one head asked for is the graph's output: no capture, no second copy.
                Outputs::JointEnc => joint_enc(g, model, x).expect("checked above"),
                Outputs::CtcLogits => ctc_logits(g, model, x).expect("checked above"),
            })
        })?;
    state.started = true;
    let mut computed = computed;
    if let Some(r) = state.resident.as_mut() {
        r.kv.start += frames;
        r.time.start += frames;
        r.positions_ready |= r.positions == pos_rows;
    }
    if let Some(c) = state.stream.as_mut() {
        let d = hp.d_model;
        if record && c.channel.is_empty() {
            // NeMo's initial caches: zeros.
            c.channel = vec![vec![0.0; c.params.last_channel_cache_size * d]; hp.n_layers];
            c.time = vec![vec![0.0; c.params.last_time_cache_size * d]; hp.n_layers];
        }
        for (i, (input, time)) in cache_ids.into_iter().enumerate() {
            // NeMo's cache: the last rows of [cache, this chunk's attention input].
            let channel = &mut c.channel[i];
            channel.extend_from_slice(&computed.take(input)?);
            channel.drain(..channel.len() - c.params.last_channel_cache_size * d);
            c.time[i] = computed.take(time)?;
        }
        c.channel_len = (c.channel_len + frames).min(c.params.last_channel_cache_size);
        c.chunks += 1;
    }
    if let Outputs::All { .. } = outputs {
        return collect(total, hp.d_model, computed, head_ids);
    }
    let head = Some(computed.output);
    let (joint_enc, ctc_logits) = match outputs {
        Outputs::JointEnc => (head, None),
        _ => (None, head),
    };
    Ok(Encoded {
        frames: total,
        d_model: hp.d_model,
        joint_enc,
        ctc_logits,
        ..Encoded::default()
    })
}

/// The keys each query of `attention` sees, for `frames` queries after `past` cache frames of
/// which those before `first_valid` are empty.
fn key_window(attention: Attention, frames: usize, past: usize, first_valid: usize) -> KeyWindow {
    let (left, right) = attention.window(frames);
    let chunk = match attention {
        Attention::Chunked { left, right } => Some(Chunking {
            size: right + 1,
            left_chunks: left / (right + 1),
        }),
        _ => None,
    };
    KeyWindow {
        left,
        right,
        past,
        first_valid,
        chunk,
    }
}

/// The decoder-side heads over an encoder output computed elsewhere (e.g. NeMo's
/// `encoder_out`, for teacher-forced decoder tests): `output` is `[frames][d_model]`.
pub fn encode_heads(
    backend: &mut Backend,
    model: &Model,
    output: &[f32],
    frames: usize,
) -> Result<Encoded> {
    let d = model.hparams().encoder.d_model;
    if frames == 0 || output.len() != frames * d {
        bail!(
            Internal,
            "encoder output of {} values is not {frames} x {d}",
            output.len()
        );
    }
    let mut head_ids = HeadIds::default();
    let computed = backend.compute(|g| {
        let x = g.input_f32(output, &[d, frames]);
        head_ids = heads(g, model, x);
        Ok(x)
    })?;
    collect(frames, d, computed, head_ids)
}

/// Handles to the heads' captures in the encoder's graph.
#[derive(Default)]
struct HeadIds {
    joint_enc: Option<crate::backend::CaptureId>,
    ctc_logits: Option<crate::backend::CaptureId>,
}

/// `joint.enc` for every frame and the CTC head, as captures of the encoder's graph.
fn heads<'g>(g: &mut Graph<'g>, model: &Model, x: Tensor<'g>) -> HeadIds {
    HeadIds {
        joint_enc: joint_enc(g, model, x).map(|e| g.capture("joint_enc", e)),
        ctc_logits: ctc_logits(g, model, x).map(|l| g.capture("ctc_logits", l)),
    }
}

/// `joint.enc(x)`, when the model has a transducer joint.
fn joint_enc<'g>(g: &mut Graph<'g>, model: &Model, x: Tensor<'g>) -> Option<Tensor<'g>> {
    let j = model.transducer().map(|t| &t.joint)?;
    Some(g.linear(x, &j.enc.weight, j.enc.bias.as_ref()))
}

/// The CTC head's logits, when the model has one.
fn ctc_logits<'g>(g: &mut Graph<'g>, model: &Model, x: Tensor<'g>) -> Option<Tensor<'g>> {
    let c = model.ctc()?;
    Some(g.linear(x, &c.weight, c.bias.as_ref()))
}

/// The heads are read through their handles; every other capture is a layer tap, kept with
/// its name for dumps.
fn collect(
    frames: usize,
    d_model: usize,
    mut computed: crate::backend::Computed,
    ids: HeadIds,
) -> Result<Encoded> {
    let joint_enc = ids.joint_enc.map(|id| computed.take(id)).transpose()?;
    let ctc_logits = ids.ctc_logits.map(|id| computed.take(id)).transpose()?;
    let output = std::mem::take(&mut computed.output);
    let heads: Vec<_> = [ids.joint_enc, ids.ctc_logits]
        .into_iter()
        .flatten()
        .collect();
    let layers = computed
        .into_others(&heads)
        .into_iter()
        .map(|c| (c.name, c.data))
        .collect();
    Ok(Encoded {
        frames,
        d_model,
        output,
        joint_enc,
        ctc_logits,
        layers,
    })
}

/// The positional table the attention of `attention` reads for `frames` frames: one row of
/// `d` per key offset `j - i` from `-left` to `right`.
pub fn positional_rows(attention: Attention, frames: usize, d: usize) -> Vec<f32> {
    let (left, right) = attention.window(frames);
    match attention {
        // NeMo's RelPositionalEncoding: relative position i - j = -(j - i). The chunked mask
        // only narrows what each query sees of it.
        Attention::Full | Attention::Chunked { .. } => sinusoids(
            (0..left + right + 1).map(|r| Some(left as i64 - r as i64)),
            d,
        ),
        Attention::Local { .. } => sinusoids(local_positions(left, right), d),
    }
}

/// The relative positions NeMo's local attention adds for key offsets `-left ..= right`.
///
/// NeMo's `LocalAttRelPositionalEncoding` holds positions `left .. -right` and
/// `RelPositionMultiHeadAttentionLongformer` adds its first `left` columns to the score
/// columns `0..left` and its last `right + 1` to the last `right + 1` columns of a band of
/// half-width `w = max(left, right)`. For a symmetric window that is position `i - j`; for an
/// asymmetric one some offsets get a shifted position or none (`None`: a zero row), and that is
/// reproduced here because it is what the checkpoints ran with.
fn local_positions(left: usize, right: usize) -> impl Iterator<Item = Option<i64>> {
    let (l, r) = (left as i64, right as i64);
    let w = l.max(r);
    (-l..=r).map(move |off| {
        let col = w + off;
        if col < l {
            Some(l - col)
        } else if col >= 2 * w - r {
            Some(w - r - off)
        } else {
            None
        }
    })
}

/// Sinusoidal rows for the given relative positions (`None`: zeros). Computed in f32 as
/// NeMo/torch does (the f32 rounding of `p * div_term` is visible at long positions, so f64 here
/// would drift from NeMo, not towards it).
fn sinusoids(positions: impl Iterator<Item = Option<i64>>, d: usize) -> Vec<f32> {
    let div: Vec<f32> = (0..d / 2)
        .map(|i| ((2 * i) as f32 * -(10000f32.ln() / d as f32)).exp())
        .collect();
    let mut pe = Vec::new();
    for p in positions {
        let start = pe.len();
        pe.resize(start + d, 0.0);
        let Some(p) = p else { continue };
        let row = &mut pe[start..];
        for (i, &dv) in div.iter().enumerate() {
            let a = p as f32 * dv;
            row[2 * i] = (a as f64).sin() as f32;
            row[2 * i + 1] = (a as f64).cos() as f32;
        }
    }
    pe
}

/// Feature frames per time slice of the subsampling (about 41 s): one slice's conv
/// activations stay within a few tens of MB however long the audio is.
const PRE_ENCODE_SLICE: usize = 4096;

/// Feature frames of left context each later slice recomputes. Three stride-2, kernel-3
/// convolutions see 7 frames back; a multiple of 8 keeps the slices on the encoder frame grid,
/// so every kept output frame is computed from exactly the frames (and edge padding) NeMo's
/// single pass uses.
const PRE_ENCODE_HALO: usize = 16;

/// `pre_encode` over `x` ([n_mels, T]) in time slices when T is long (NeMo's conv chunking
/// does the same); `frames` is the encoder frame count.
fn pre_encode_sliced<'g>(
    g: &mut Graph<'g>,
    p: &PreEncode,
    x: Tensor<'g>,
    frames: usize,
    hp: &EncoderParams,
) -> Tensor<'g> {
    let t_feat = x.ne(1);
    let pre_encode = |g: &mut Graph<'g>, x| pre_encode(g, p, x, hp.causal_downsampling);
    if t_feat <= PRE_ENCODE_SLICE {
        return pre_encode(g, x);
    }
    let per_slice = PRE_ENCODE_SLICE / 8;
    let mut parts = Vec::new();
    let mut a = 0;
    while a < frames {
        let b = (a + per_slice).min(frames);
        let start = (8 * a).saturating_sub(PRE_ENCODE_HALO);
        let end = if b == frames { t_feat } else { 8 * b };
        let xs = g.rows(x, start, end - start);
        let y = pre_encode(g, xs);
        parts.push(g.rows(y, a - start / 8, b - a));
        a = b;
    }
    g.stack_rows(&parts)
}

/// dw_striding subsampling. `x` is the feature image [n_mels, T] (W = mels, H = time).
/// `causal`: NeMo's `causal_downsampling` (each conv pads 2 before and 1 after, in time and in
/// frequency).
fn pre_encode<'g>(g: &mut Graph<'g>, p: &PreEncode, x: Tensor<'g>, causal: bool) -> Tensor<'g> {
    // conv.0: full 3x3 conv, 1 -> C channels, in f32 (f32 kernel -> f32 im2col).
    // Channels fastest ([C, F, T]) from here: the depthwise convs read that layout directly
    // and the pointwise convs are plain matmuls.
    let c = p.conv2.bias.shape()[0];
    // The stem op pads 1 on each side.
    let x = if !causal {
        // conv.0 (packed at load, `Model::derived_weights`) and the depthwise conv.2 as one
        // node that never holds conv.0's whole output, where our kernels run.
        let y = g.conv_stem(
            x,
            (&p.conv0.weight, &p.conv0.bias),
            (&p.conv2.weight, &p.conv2.bias),
        ); // [C, F2, T2]
        pointwise(g, y, &p.conv3)
    } else {
        let (x, pad) = conv_padding(g, x, causal, [0, 1]);
        let k0 = g.weight(&p.conv0.weight);
        let x = g.conv2d(k0, x, 2, pad);
        let b0 = g.weight(&p.conv0.bias);
        let x = g.add(x, b0);
        let x = g.relu(x); // [C, F1, T1]
        dw_pw_block(g, x, &p.conv2, &p.conv3, causal)
    };
    let x = dw_pw_block(g, x, &p.conv5, &p.conv6, causal);
    // torch flattens (C, F) per frame with F fastest.
    let (f, t) = (x.ne(1), x.ne(2));
    let x = g.permute(x, [1, 0, 2, 3]); // [F, C, T]
    let x = g.cont(x);
    let x = g.reshape(x, &[f * c, t]);
    g.linear(x, &p.out.weight, p.out.bias.as_ref())
}

/// Causal padding of NeMo's `CausalConv2D` (kernel 3, stride 2): before, after.
const CAUSAL_PAD: (usize, usize) = (2, 1);

/// The input of a stride-2, kernel-3 conv and the padding the conv adds itself: 1 on each
/// side, or (`causal_downsampling`) none after padding `x` by 2 before and 1 after along the
/// two image axes (frequency and time) `axes`.
fn conv_padding<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    causal: bool,
    axes: [usize; 2],
) -> (Tensor<'g>, usize) {
    if !causal {
        return (x, 1);
    }
    let mut pads = [(0, 0); 4];
    for a in axes {
        pads[a] = CAUSAL_PAD;
    }
    (g.pad_zeros(x, pads), 0)
}

/// Depthwise 3x3 stride-2 conv + pointwise 1x1 conv + ReLU on a channels-fastest [C, F, T].
fn dw_pw_block<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    dw: &crate::model::Conv2d,
    pw: &crate::model::Conv2d,
    causal: bool,
) -> Tensor<'g> {
    let (x, pad) = conv_padding(g, x, causal, [1, 2]);
    let y = g.conv_depthwise_stride2(x, (&dw.weight, &dw.bias), pad);
    pointwise(g, y, pw)
}

/// Pointwise 1x1 conv + ReLU on a channels-fastest [C, F, T].
fn pointwise<'g>(g: &mut Graph<'g>, y: Tensor<'g>, pw: &crate::model::Conv2d) -> Tensor<'g> {
    let (c, f, t) = (y.ne(0), y.ne(1), y.ne(2));
    let y = g.reshape(y, &[c, f * t]);
    let y = if pw.weight.layout() == Layout::Panel16 {
        // Packed at load (`Model::derived_weights`); bias and ReLU in the GEMM's store.
        g.linear_relu(y, &pw.weight, Some(&pw.bias))
    } else {
        let w = g.weight(&pw.weight);
        let w = g.reshape(w, &[c, c]);
        let y = g.matmul(w, y);
        let b = g.weight(&pw.bias);
        let y = g.add(y, b);
        g.relu(y)
    };
    g.reshape(y, &[c, f, t])
}

fn layer_norm<'g>(g: &mut Graph<'g>, x: Tensor<'g>, n: &LayerNorm) -> Tensor<'g> {
    g.layer_norm(x, &n.weight, &n.bias, LN_EPS)
}

/// Encoder frames per slice of the per-frame blocks of a long utterance.
const FRAME_SLICE: usize = 2048;

/// Nodes the encoder graph may need: a fixed part, plus per time slice of the subsampling and of
/// each layer's sliced blocks (generous: about twice what they make).
fn graph_nodes(feature_frames: usize, frames: usize, layers: usize, layer_slice: usize) -> usize {
    let pre_slices = feature_frames.div_ceil(PRE_ENCODE_SLICE);
    let frame_slices = frames.div_ceil(FRAME_SLICE);
    let time_slices = frames.div_ceil(layer_slice.max(1));
    4096 + pre_slices * 64 + layers * (256 + frame_slices * 64 + time_slices * 64)
}

/// `f` applied to `x` ([d, T]) in slices of at most [`FRAME_SLICE`] frames, for blocks that
/// treat every frame on its own (exact): their wide intermediates ([4d, T] in a feed-forward)
/// then never exist for the whole of a long file at once. `f` also gets the same frames of
/// `with` (a residual the block adds), if any.
fn per_frame<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    with: Option<Tensor<'g>>,
    f: &dyn Fn(&mut Graph<'g>, Tensor<'g>, Option<Tensor<'g>>) -> Tensor<'g>,
) -> Tensor<'g> {
    let t = x.ne(1);
    if t <= FRAME_SLICE {
        return f(g, x, with);
    }
    let parts: Vec<Tensor<'g>> = (0..t)
        .step_by(FRAME_SLICE)
        .map(|a| {
            let len = FRAME_SLICE.min(t - a);
            let xs = g.rows(x, a, len);
            let ws = with.map(|w| g.rows(w, a, len));
            f(g, xs, ws)
        })
        .collect();
    g.stack_rows(&parts)
}

/// A residual connection `x + scale * block(..)` that the block's last linear adds in its own
/// node (`FusedOps::linear_residual`).
type Residual<'g> = Option<(Tensor<'g>, f32)>;

/// `linear`, or `linear_residual` when the block ends in a residual connection.
pub(crate) fn last_linear<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    l: &crate::model::Linear,
    residual: Residual<'g>,
) -> Tensor<'g> {
    match residual {
        Some((r, scale)) => g.linear_residual(x, &l.weight, l.bias.as_ref(), r, scale),
        None => g.linear(x, &l.weight, l.bias.as_ref()),
    }
}

fn feed_forward<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    ff: &FeedForward,
    residual: Residual<'g>,
) -> Tensor<'g> {
    let (with, scale) = (residual.map(|r| r.0), residual.map_or(1.0, |r| r.1));
    per_frame(g, x, with, &|g, x, with| {
        let h = g.linear(x, &ff.linear1.weight, ff.linear1.bias.as_ref());
        // The SiLU is applied where linear2 packs or quantizes its input.
        let l2 = &ff.linear2;
        g.silu_linear(h, &l2.weight, l2.bias.as_ref(), with.map(|w| (w, scale)))
    })
}

/// What a chunk leaves for NeMo's caches (recorded streams): the chunk's attention input
/// (`norm_self_att`'s output) and the next `cache_last_time`.
#[derive(Clone, Copy)]
struct NextCache<'g> {
    attention_input: Tensor<'g>,
    time: Tensor<'g>,
}

/// The positional rows a layer's attention reads: the sinusoid table (projected by the layer's
/// `linear_pos` in the graph) or its projection, held by the stream.
#[derive(Clone, Copy)]
enum LayerPositions<'g> {
    Table(Tensor<'g>),
    Projected(Tensor<'g>),
}

/// Frames per time slice of a whole file's layers under local attention; a multiple of the
/// attention's query block (32), so that slicing changes no bit.
const LAYER_SLICE: usize = 512;

/// One conformer layer: macaron FF, rel-pos MHSA, conv module, FF, LayerNorm. With `cache`, one
/// chunk of a stream, which updates the caches in place (and returns what NeMo's caches would
/// hold, for recording).
///
/// A whole file's layer under local attention runs in time slices of `slice` frames, so that a
/// long file's intermediates stay in cache instead of streaming `[d, T]` tensors through memory
/// between every two ops (the per-second cost of an hour grew 1.3x over a minute's). The blocks
/// are the same in the same order either way, in three passes where a block needs frames of
/// other slices: (1) the first feed-forward and the keys and values; (2) the attention (each
/// slice's queries over the keys of its window) and its residual; (3) the conv module (each
/// slice with the conv's half-kernel of neighbouring frames), the second feed-forward and the
/// output norm. Each stage's results are stacked to full length ([`Rows`]); unsliced, the one
/// slice is the whole tensor. Every frame's values are the same bit for bit either way. Full
/// attention, a chunked mask, a causal conv, a stream, taps or a short input run unsliced.
#[allow(clippy::too_many_arguments)]
fn conformer_layer<'g>(
    g: &mut Graph<'g>,
    hp: &EncoderParams,
    l: &ConformerLayer,
    (x, valid): (Tensor<'g>, usize),
    (pos, window): (LayerPositions<'g>, KeyWindow),
    taps: bool,
    cache: Option<LayerCache<'g>>,
    slice: usize,
) -> (Tensor<'g>, Option<NextCache<'g>>) {
    let (d, t, a) = (hp.d_model, x.ne(1), &l.self_attn);
    let padded = valid < t;
    let local = window.past == 0 && window.chunk.is_none() && window.left + window.right < t;
    let sliced = !padded
        && local
        && !hp.causal_conv()
        && !taps
        && cache.is_none()
        && matches!(pos, LayerPositions::Table(_))
        && slice > 0
        && t > slice;
    let slices: Vec<(usize, usize)> = match sliced {
        true => (0..t)
            .step_by(slice)
            .map(|s| (s, slice.min(t - s)))
            .collect(),
        false => vec![(0, t)],
    };
    let rows = |g: &mut Graph<'g>, x: Tensor<'g>, start: usize, len: usize| match sliced {
        true => g.rows(x, start, len),
        false => x,
    };
    let tap = |g: &mut Graph<'g>, name: &str, t: Tensor<'g>| {
        if taps {
            g.capture(&format!("enc_layer_00_{name}"), t);
        }
    };
    let norm = |g: &mut Graph<'g>, x: Tensor<'g>, (norm, name): (&LayerNorm, &str)| {
        let n = layer_norm(g, x, norm);
        tap(g, name, n);
        n
    };
    // `x + scale * block(n)`, the block's output tapped by NeMo's name. Untapped, the block's
    // last linear adds the residual in its own node.
    let residual =
        |g: &mut Graph<'g>,
         (x, n): (Tensor<'g>, Tensor<'g>),
         block_name: &str,
         scale: f32,
         block: &dyn Fn(&mut Graph<'g>, Tensor<'g>, Residual<'g>) -> Tensor<'g>| {
            if !taps {
                return block(g, n, Some((x, scale)));
            }
            let y = block(g, n, None);
            tap(g, block_name, y);
            let y = if scale == 1.0 { y } else { g.scale(y, scale) };
            g.add(x, y)
        };

    // (1) x1 = x + FF1(x) / 2; the keys and values of every frame. Each slice's results are
    // written into the stacks as soon as they are made, so that its intermediates die then.
    let [mut x1, mut k, mut v] = [(); 3].map(|_| Rows::new(g, d, t, x, sliced));
    let mut attention_input = None;
    for &(start, len) in &slices {
        let xs = rows(g, x, start, len);
        let n = norm(g, xs, (&l.norm_feed_forward1, "norm_feed_forward1"));
        let x1s = residual(g, (xs, n), "feed_forward1", 0.5, &|g, n, r| {
            feed_forward(g, n, &l.feed_forward1, r)
        });
        let n = norm(g, x1s, (&l.norm_self_att, "norm_self_att"));
        let ks = g.linear(n, &a.linear_k.weight, a.linear_k.bias.as_ref());
        let vs = g.linear(n, &a.linear_v.weight, a.linear_v.bias.as_ref());
        x1.push(g, x1s);
        k.push(g, ks);
        v.push(g, vs);
        attention_input = Some(n);
    }
    let (x1, k, v) = (x1.finish(g), k.finish(g), v.finish(g));
    // A stream's chunk writes its keys and values after the cached ones and reads the cache's
    // and its own as one view.
    let mut after = Vec::new();
    let (k, v) = match cache {
        None => (k, v),
        Some(c) => {
            let (start, keep) = (c.kv.start, c.kv.keep);
            let mut append = |g: &mut Graph<'g>, ring: Tensor<'g>, new: Tensor<'g>| {
                let (rows, write) = g.append_rows(ring, (start, keep), new);
                after.push(write);
                rows
            };
            (append(g, c.keys, k), append(g, c.values, v))
        }
    };
    let p = match pos {
        LayerPositions::Projected(p) => p,
        LayerPositions::Table(table) => {
            let p = g.linear(table, &a.linear_pos, None);
            if let Some(dst) = cache.and_then(|c| c.store_positions) {
                g.write(p, dst);
            }
            p
        }
    };

    // (2) x2 = x1 + attention(x1). A slice's norm_self_att is made again rather than kept from
    // (1): a pass over 512 frames against one more full-length stack (184 MB for the 0.6b at
    // 60 min).
    let mut x2 = Rows::new(g, d, t, x1, sliced);
    for &(start, len) in &slices {
        let (x1s, n, kv, w) = match sliced {
            // NeMo's pad mask: the audio's queries see the audio's keys only; the padding's
            // rows are masked whole, so their attention is zero (`linear_out`'s bias).
            false if padded => {
                let n = attention_input.expect("one slice");
                let n = g.rows(n, 0, valid);
                (x1, n, (g.rows(k, 0, valid), g.rows(v, 0, valid)), window)
            }
            false => (x1, attention_input.expect("one slice"), (k, v), window),
            true => {
                let x1s = g.rows(x1, start, len);
                let n = layer_norm(g, x1s, &l.norm_self_att);
                let first = start.saturating_sub(window.left);
                let keys = (start + len + window.right).min(t) - first;
                let kv = (g.rows(k, first, keys), g.rows(v, first, keys));
                let w = KeyWindow {
                    past: start - first,
                    ..window
                };
                (x1s, n, kv, w)
            }
        };
        let x2s = residual(g, (x1s, n), "self_attn", 1.0, &|g, n, r| {
            attend(g, hp, a, (n, x1s.ne(1)), (kv.0, kv.1, p), w, &after, r)
        });
        x2.push(g, x2s);
    }
    let x2 = x2.finish(g);

    // (3) the conv module (with its half-kernel of neighbours), FF2, the output norm.
    let halo = hp.conv_kernel / 2;
    let next_time = std::cell::Cell::new(None);
    let mut out = Rows::new(g, d, t, x2, sliced);
    for &(start, len) in &slices {
        let first = start.saturating_sub(halo);
        let reach = (start + len + halo).min(t) - first;
        let around = rows(g, x2, first, reach);
        let n = norm(g, around, (&l.norm_conv, "norm_conv"));
        let x2s = rows(g, x2, start, len);
        let x3 = residual(g, (x2s, n), "conv", 1.0, &|g, n, r| {
            let (y, next) = conv_module(g, hp, &l.conv, (n, valid), cache);
            next_time.set(next);
            let y = rows(g, y, start - first, len);
            last_linear(g, y, &l.conv.pointwise_conv2, r)
        });
        let n = norm(g, x3, (&l.norm_feed_forward2, "norm_feed_forward2"));
        let x4 = residual(g, (x3, n), "feed_forward2", 0.5, &|g, n, r| {
            feed_forward(g, n, &l.feed_forward2, r)
        });
        let outs = norm(g, x4, (&l.norm_out, "norm_out"));
        out.push(g, outs);
    }
    let next = match (attention_input, next_time.get()) {
        (Some(attention_input), Some(time)) => Some(NextCache {
            attention_input,
            time,
        }),
        _ => None,
    };
    (out.finish(g), next)
}

/// A layer's result over all frames: stacked slice by slice ([`Graph::row_stack`]), or, with
/// one slice, that slice itself.
enum Rows<'g> {
    Stacked(RowStack<'g>),
    Whole(Option<Tensor<'g>>),
}

impl<'g> Rows<'g> {
    /// `[d, t]` rows allocated after `after` when sliced.
    fn new(g: &mut Graph<'g>, d: usize, t: usize, after: Tensor<'g>, sliced: bool) -> Rows<'g> {
        match sliced {
            true => Rows::Stacked(g.row_stack(d, t, after)),
            false => Rows::Whole(None),
        }
    }

    fn push(&mut self, g: &mut Graph<'g>, part: Tensor<'g>) {
        match self {
            Rows::Stacked(stack) => g.push_rows(stack, part),
            Rows::Whole(whole) => *whole = Some(part),
        }
    }

    fn finish(self, g: &mut Graph<'g>) -> Tensor<'g> {
        match self {
            Rows::Stacked(stack) => g.finish_rows(stack),
            Rows::Whole(whole) => whole.expect("one slice"),
        }
    }
}

/// The attention proper and its output projection: the queries of `x` (`[d, T]`, the
/// normalised frames) over the keys and values `k`, `v` (`[d, keys]`) the window gives them,
/// with the projected positional rows `p` (`[d, rows]`), then `linear_out` with the residual
/// over `out_rows` rows (rows past the queries' are masked ones: zero attention).
#[allow(clippy::too_many_arguments)]
fn attend<'g>(
    g: &mut Graph<'g>,
    hp: &EncoderParams,
    a: &RelPositionAttention,
    (x, out_rows): (Tensor<'g>, usize),
    (k, v, p): (Tensor<'g>, Tensor<'g>, Tensor<'g>),
    window: KeyWindow,
    after: &[Tensor<'g>],
    residual: Residual<'g>,
) -> Tensor<'g> {
    let (d, t, h) = (hp.d_model, x.ne(1), hp.n_heads);
    let dk = d / h;
    let q = g.linear(x, &a.linear_q.weight, a.linear_q.bias.as_ref());
    let q = g.reshape(q, &[dk, h, t]);
    let k = g.reshape(k, &[dk, h, k.ne(1)]);
    let v = g.reshape(v, &[dk, h, v.ne(1)]);
    let p = g.reshape(p, &[dk, h, p.ne(1)]);
    let u = g.weight(&a.pos_bias_u);
    let vb = g.weight(&a.pos_bias_v);
    let o = g.rel_pos_attention(q, k, v, p, u, vb, window, after);
    let mut o = g.reshape(o, &[d, t]);
    if out_rows > t {
        o = g.pad_zeros(o, [(0, 0), (0, out_rows - t), (0, 0), (0, 0)]);
    }
    last_linear(g, o, &a.linear_out, residual)
}

/// pointwise_conv1 -> GLU -> depthwise conv (BatchNorm folded) -> Swish, up to pointwise_conv2 (the caller's last linear);
/// with `conv_norm_type: layer_norm`, the LayerNorm between the depthwise conv and the Swish.
/// A causal depthwise conv continues from a stream's last `kernel - 1` conv inputs (zeros
/// otherwise), and with a cache appends this chunk's inputs to it and returns the next
/// `cache_last_time` (for recording). Rows of `x` from `valid` on are padding, whose conv
/// inputs NeMo's pad mask zeroes.
fn conv_module<'g>(
    g: &mut Graph<'g>,
    hp: &EncoderParams,
    c: &ConvModule,
    (x, valid): (Tensor<'g>, usize),
    cache: Option<LayerCache<'g>>,
) -> (Tensor<'g>, Option<Tensor<'g>>) {
    let mut y = per_frame(g, x, None, &|g, x, _| {
        let y = g.linear(
            x,
            &c.pointwise_conv1.weight,
            c.pointwise_conv1.bias.as_ref(),
        );
        g.glu(y)
    });
    let t = y.ne(1);
    if valid < t {
        let audio = g.rows(y, 0, valid);
        y = g.pad_zeros(audio, [(0, 0), (0, t - valid), (0, 0), (0, 0)]);
    }
    let k = g.weight(&c.depthwise_conv_folded);
    let b = g.weight(&c.depthwise_bias_folded);
    let silu_in_conv = c.batch_norm_layer_norm.is_none();
    let conv = |g: &mut Graph<'g>, y| {
        if silu_in_conv {
            g.conv1d_depthwise_same_silu(y, k, Some(b))
        } else {
            g.conv1d_depthwise_same(y, k, Some(b))
        }
    };
    let (mut y, next) = if hp.causal_conv() {
        // A causal conv over T frames is the middle T outputs of a 'same' conv over the
        // kernel - 1 frames before them (zeros, or the stream's cache) and the T frames.
        let (t, before) = (y.ne(1), hp.conv_kernel - 1);
        let z = match cache {
            Some(cache) => {
                // The chunk's inputs go after the cached ones for the next chunk; this one
                // reads the cached rows only (no overlap: any order is right).
                let ring = cache.time;
                let dst = g.rows(cache.conv, ring.start + ring.keep, t);
                g.write(y, dst);
                let cached = g.rows(cache.conv, ring.start, ring.keep);
                g.concat(cached, y, 1)
            }
            None => g.pad_zeros(y, [(0, 0), (before, 0), (0, 0), (0, 0)]),
        };
        let next = cache.map(|_| g.rows(z, t, before));
        let out = conv(g, z);
        let out = g.rows(out, before / 2, t);
        (g.cont(out), next)
    } else {
        (conv(g, y), None)
    };
    if let Some(norm) = &c.batch_norm_layer_norm {
        y = layer_norm(g, y, norm);
        y = g.silu(y);
    }
    (y, next)
}

/// Only `pre_encode` (the subsampling) over `chunk`: `[frames][d_model]`, before xscaling, and
/// the frame count. NeMo's streaming Sortformer pre-encodes each chunk on its own.
pub fn pre_encode_only(
    backend: &mut Backend,
    model: &Model,
    chunk: FeatureImage,
) -> Result<(Vec<f32>, usize)> {
    let hp = &model.hparams().encoder;
    if chunk.n_mels != hp.feat_in || chunk.n_frames == 0 {
        bail!(
            Internal,
            "a chunk of {} frames of {} mels (the model expects {})",
            chunk.n_frames,
            chunk.n_mels,
            hp.feat_in
        );
    }
    let t_feat = chunk.n_frames;
    let frames = model.hparams().geometry().encoded_len(t_feat);
    let computed = backend.compute_sized(graph_nodes(t_feat, frames, 0, LAYER_SLICE), |g| {
        let x = g.input_f32_owned(chunk.data, &[hp.feat_in, t_feat, 1, 1]);
        Ok(pre_encode_sliced(
            g,
            &model.encoder().pre_encode,
            x,
            frames,
            hp,
        ))
    })?;
    Ok((computed.output, frames))
}

/// The conformer layers over embeddings already subsampled (`[frames][d_model]`, as
/// [`pre_encode_only`] gives them): NeMo's `bypass_pre_encode`, xscaling included. Returns
/// the last layer's output, `[frames][d_model]`.
pub fn encode_embeddings(
    backend: &mut Backend,
    model: &Model,
    embeddings: &[f32],
    frames: usize,
    attention: Attention,
) -> Result<Vec<f32>> {
    let hp = &model.hparams().encoder;
    if frames == 0 || embeddings.len() != frames * hp.d_model {
        bail!(
            Internal,
            "embeddings of {} values are not {frames} frames of {}",
            embeddings.len(),
            hp.d_model
        );
    }
    let window = key_window(attention, frames, 0, 0);
    let pos_rows = window.left + window.right + 1;
    let table = positional_rows(attention, frames, hp.d_model);
    let nodes = graph_nodes(8 * frames, frames, hp.n_layers, LAYER_SLICE);
    let computed = backend.compute_sized(nodes, |g| {
        let mut x = g.input_f32(embeddings, &[hp.d_model, frames]);
        if hp.xscaling {
            x = g.scale(x, (hp.d_model as f32).sqrt());
        }
        let table = g.input_f32_owned(table, &[hp.d_model, pos_rows]);
        for layer in &model.encoder().layers {
            let positions = (LayerPositions::Table(table), window);
            x = conformer_layer(
                g,
                hp,
                layer,
                (x, frames),
                positions,
                false,
                None,
                LAYER_SLICE,
            )
            .0;
        }
        Ok(x)
    })?;
    Ok(computed.output)
}
