//! The FastConformer encoder as ONE ggml graph per utterance.
//!
//! features -> `pre_encode` (dw_striding, x8) -> [xscaling] -> N conformer layers -> and, in the
//! same graph, the joint's encoder projection (`joint.enc`) for every frame and the CTC head.
//! Per-layer outputs are captures of that one graph (no extra computes).
//!
//! Layout: ggml tensors here are `[d, T]` (`ne0` = channels, fastest), i.e. torch's `[T, d]`.

use crate::audio::mel::Features;
use crate::backend::gguf::Weight;
use crate::backend::{Backend, Graph, Tensor};
use crate::model::{
    ConformerLayer, ConvModule, EncoderParams, FeedForward, LayerNorm, Model, PreEncode,
    RelPositionAttention, subsampled_len,
};
use anyhow::{Result, bail};

/// NeMo's LayerNorm epsilon throughout the conformer.
const LN_EPS: f32 = 1e-5;

/// What one encoder pass produced. Matrices are row-major `[frames][width]`.
#[derive(Debug, Default)]
pub struct Encoded {
    /// Encoder frames T' (80 ms each).
    pub frames: usize,
    pub d_model: usize,
    /// `[T'][d_model]`: the last conformer layer's output.
    pub output: Vec<f32>,
    /// `[T'][joint_hidden]`: `joint.enc(output)` (transducer models).
    pub joint_enc: Option<Vec<f32>>,
    /// `[T'][V + 1]`: CTC logits (CTC and hybrid models).
    pub ctc_logits: Option<Vec<f32>>,
    /// Named intermediate results, named like NeMo's reference dumps (`enc_layer_00`, ...),
    /// each `[T'][d_model]`, when asked for.
    pub layers: Vec<(String, Vec<f32>)>,
}

/// Encoder frames for `feature_frames` feature frames.
pub fn encoded_len(feature_frames: usize) -> usize {
    subsampled_len(subsampled_len(subsampled_len(feature_frames)))
}

/// Run the encoder over `features` (valid frames only). `capture_layers` also returns every
/// layer's output (and layer 0's sub-blocks) from the same graph.
pub fn encode(
    backend: &mut Backend,
    model: &Model,
    features: &Features,
    capture_layers: bool,
) -> Result<Encoded> {
    let hp = &model.hparams.encoder;
    if features.n_mels != hp.feat_in {
        bail!(
            "features have {} mel bins, the model expects {}",
            features.n_mels,
            hp.feat_in
        );
    }
    if features.n_frames == 0 {
        bail!("audio too short: no complete feature frame");
    }
    let t_feat = features.n_frames;
    // ggml wants mels fastest: [T][n_mels].
    let mut image = vec![0f32; t_feat * hp.feat_in];
    for m in 0..hp.feat_in {
        for (t, &v) in features.band(m).iter().enumerate() {
            image[t * hp.feat_in + m] = v;
        }
    }
    let frames = encoded_len(t_feat);
    check_attention_memory(frames, hp.n_heads)?;
    let pos = relative_positions(frames, hp.d_model);

    let computed = backend.compute(|g| {
        let x = g.input_f32(&image, &[hp.feat_in, t_feat, 1, 1]);
        let mut x = pre_encode(g, &model.encoder.pre_encode, x);
        if capture_layers {
            g.capture("enc_pre_encode", x);
        }
        if hp.xscaling {
            x = g.scale(x, (hp.d_model as f32).sqrt());
        }
        let pos = g.input_f32(&pos, &[hp.d_model, 2 * frames - 1]);
        for (i, layer) in model.encoder.layers.iter().enumerate() {
            let taps = capture_layers && i == 0;
            x = conformer_layer(g, hp, layer, x, pos, taps);
            if capture_layers {
                g.capture(&format!("enc_layer_{i:02}"), x);
            }
        }
        heads(g, model, x);
        Ok(x)
    })?;
    Ok(collect(frames, hp.d_model, computed))
}

/// The decoder-side heads over an encoder output computed elsewhere (e.g. NeMo's
/// `encoder_out`, for teacher-forced decoder tests): `output` is `[frames][d_model]`.
pub fn encode_heads(
    backend: &mut Backend,
    model: &Model,
    output: &[f32],
    frames: usize,
) -> Result<Encoded> {
    let d = model.hparams.encoder.d_model;
    if frames == 0 || output.len() != frames * d {
        bail!(
            "encoder output of {} values is not {frames} x {d}",
            output.len()
        );
    }
    let computed = backend.compute(|g| {
        let x = g.input_f32(output, &[d, frames]);
        heads(g, model, x);
        Ok(x)
    })?;
    Ok(collect(frames, d, computed))
}

/// `joint.enc` for every frame and the CTC head, as captures of the encoder's graph.
fn heads<'g>(g: &mut Graph<'g>, model: &Model, x: Tensor<'g>) {
    if let Some(j) = &model.joint {
        let e = g.linear(x, &j.enc.weight, j.enc.bias.as_ref());
        g.capture("joint_enc", e);
    }
    if let Some(c) = &model.ctc {
        let l = g.linear(x, &c.weight, c.bias.as_ref());
        g.capture("ctc_logits", l);
    }
}

fn collect(frames: usize, d_model: usize, computed: crate::backend::Computed) -> Encoded {
    let mut out = Encoded {
        frames,
        d_model,
        output: computed.output,
        ..Default::default()
    };
    for c in computed.captures {
        match c.name.as_str() {
            "joint_enc" => out.joint_enc = Some(c.data),
            "ctc_logits" => out.ctc_logits = Some(c.data),
            _ => out.layers.push((c.name, c.data)),
        }
    }
    out
}

/// Full attention holds a few `[T', T', heads]` f32 tensors at once (scores, the positional
/// term before and after its shift, probabilities): refuse, with a clear message, an utterance
/// whose attention alone would not fit in the memory available now, instead of being killed.
fn check_attention_memory(frames: usize, heads: usize) -> Result<()> {
    let need = 5.0 * (frames as f64).powi(2) * heads as f64 * 4.0;
    let Some(available) = available_memory_bytes() else {
        return Ok(());
    };
    if need > available as f64 {
        let gib = |b: f64| b / (1u64 << 30) as f64;
        bail!(
            "a {:.0} s piece of audio needs about {:.1} GiB for full attention, {:.1} GiB is \
             available; encode shorter pieces (--max-chunk-seconds)",
            frames as f64 * crate::decoder::FRAME_SECONDS,
            gib(need),
            gib(available as f64)
        );
    }
    Ok(())
}

fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The relative positional table for `t` frames: positions `t-1 .. -(t-1)`, rows of `d`.
/// Computed in f32 as NeMo/torch does (the f32 rounding of `p * div_term` is visible at long
/// positions, so f64 here would drift from NeMo, not towards it).
pub fn relative_positions(t: usize, d: usize) -> Vec<f32> {
    let div: Vec<f32> = (0..d / 2)
        .map(|i| ((2 * i) as f32 * -(10000f32.ln() / d as f32)).exp())
        .collect();
    let rows = 2 * t - 1;
    let mut pe = vec![0f32; rows * d];
    for r in 0..rows {
        let p = (t as i64 - 1 - r as i64) as f32;
        let row = &mut pe[r * d..(r + 1) * d];
        for (i, &dv) in div.iter().enumerate() {
            let a = p * dv;
            row[2 * i] = (a as f64).sin() as f32;
            row[2 * i + 1] = (a as f64).cos() as f32;
        }
    }
    pe
}

/// dw_striding subsampling. `x` is the feature image [n_mels, T] (W = mels, H = time).
fn pre_encode<'g>(g: &mut Graph<'g>, p: &PreEncode, x: Tensor<'g>) -> Tensor<'g> {
    // conv.0: full 3x3 conv, 1 -> C channels, in f32 (f32 kernel -> f32 im2col).
    let k0 = g.weight(&p.conv0.0);
    // Channels fastest ([C, F, T]) from here: the depthwise convs read that layout directly
    // and the pointwise convs are plain matmuls.
    let x = g.conv2d(k0, x, 2, 1); // [C, F1, T1]
    let c = x.ne(0);
    let b0 = g.weight(&p.conv0.1);
    let x = g.add(x, b0);
    let x = g.relu(x);
    let x = dw_pw_block(g, x, &p.conv2, &p.conv3);
    let x = dw_pw_block(g, x, &p.conv5, &p.conv6);
    // torch flattens (C, F) per frame with F fastest.
    let (f, t) = (x.ne(1), x.ne(2));
    let x = g.permute(x, [1, 0, 2, 3]); // [F, C, T]
    let x = g.cont(x);
    let x = g.reshape(x, &[f * c, t]);
    g.linear(x, &p.out.weight, p.out.bias.as_ref())
}

/// Depthwise 3x3 stride-2 conv + pointwise 1x1 conv + ReLU on a channels-fastest [C, F, T].
fn dw_pw_block<'g>(
    g: &mut Graph<'g>,
    x: Tensor<'g>,
    dw: &(Weight, Weight),
    pw: &(Weight, Weight),
) -> Tensor<'g> {
    let c = x.ne(0);
    let whcn = g.permute(x, [2, 0, 1, 3]); // logical [F, T, C], channels contiguous
    let k = g.weight(&dw.0); // [C, 1, KW, KH] in memory
    let k = g.permute(k, [3, 2, 0, 1]); // logical [KW, KH, 1, C], channels contiguous
    let y = g.conv2d_depthwise(k, whcn, 2, 1); // same channels-fastest layout
    let y = g.permute(y, [1, 2, 0, 3]); // back to [C, F', T'] (contiguous)
    let (f, t) = (y.ne(1), y.ne(2));
    let b = g.weight(&dw.1);
    let y = g.add(y, b);
    let y = g.reshape(y, &[c, f * t]);
    let w = g.weight(&pw.0);
    let w = g.reshape(w, &[c, c]);
    let y = g.matmul(w, y);
    let b = g.weight(&pw.1);
    let y = g.add(y, b);
    let y = g.relu(y);
    g.reshape(y, &[c, f, t])
}

fn layer_norm<'g>(g: &mut Graph<'g>, x: Tensor<'g>, n: &LayerNorm) -> Tensor<'g> {
    g.layer_norm(x, &n.weight, &n.bias, LN_EPS)
}

fn feed_forward<'g>(g: &mut Graph<'g>, x: Tensor<'g>, ff: &FeedForward) -> Tensor<'g> {
    let h = g.linear(x, &ff.linear1.weight, ff.linear1.bias.as_ref());
    let h = g.silu(h);
    g.linear(h, &ff.linear2.weight, ff.linear2.bias.as_ref())
}

/// One conformer layer (macaron FF, rel-pos MHSA, conv module, FF, LayerNorm).
fn conformer_layer<'g>(
    g: &mut Graph<'g>,
    hp: &EncoderParams,
    l: &ConformerLayer,
    x: Tensor<'g>,
    pos: Tensor<'g>,
    taps: bool,
) -> Tensor<'g> {
    let tap = |g: &mut Graph<'g>, name: &str, t: Tensor<'g>| {
        if taps {
            g.capture(&format!("enc_layer_00_{name}"), t);
        }
    };
    // `x + scale * block(norm(x))`, with the norm and block outputs tapped by NeMo's names.
    let residual = |g: &mut Graph<'g>,
                    x: Tensor<'g>,
                    (norm, norm_name): (&LayerNorm, &str),
                    block_name: &str,
                    scale: f32,
                    block: &dyn Fn(&mut Graph<'g>, Tensor<'g>) -> Tensor<'g>| {
        let n = layer_norm(g, x, norm);
        tap(g, norm_name, n);
        let y = block(g, n);
        tap(g, block_name, y);
        let y = if scale == 1.0 { y } else { g.scale(y, scale) };
        g.add(x, y)
    };
    let x = residual(
        g,
        x,
        (&l.norm_feed_forward1, "norm_feed_forward1"),
        "feed_forward1",
        0.5,
        &|g, n| feed_forward(g, n, &l.feed_forward1),
    );
    let x = residual(
        g,
        x,
        (&l.norm_self_att, "norm_self_att"),
        "self_attn",
        1.0,
        &|g, n| self_attention(g, hp, &l.self_attn, n, pos),
    );
    let x = residual(g, x, (&l.norm_conv, "norm_conv"), "conv", 1.0, &|g, n| {
        conv_module(g, &l.conv, n)
    });
    let x = residual(
        g,
        x,
        (&l.norm_feed_forward2, "norm_feed_forward2"),
        "feed_forward2",
        0.5,
        &|g, n| feed_forward(g, n, &l.feed_forward2),
    );

    let out = layer_norm(g, x, &l.norm_out);
    tap(g, "norm_out", out);
    out
}

/// Multi-head self-attention with relative positions (Transformer-XL style, untied biases):
/// `softmax(((q + u) k^T + rel_shift((q + v) p^T)) / sqrt(d_k)) v`.
fn self_attention<'g>(
    g: &mut Graph<'g>,
    hp: &EncoderParams,
    a: &RelPositionAttention,
    x: Tensor<'g>,
    pos: Tensor<'g>,
) -> Tensor<'g> {
    let (d, t, h) = (hp.d_model, x.ne(1), hp.n_heads);
    let dk = d / h;
    let heads = |g: &mut Graph<'g>, y: Tensor<'g>, len: usize| {
        // [d, len] -> [dk, h, len] -> [dk, len, h]
        let y = g.reshape(y, &[dk, h, len]);
        g.permute(y, [0, 2, 1, 3])
    };
    let q = g.linear(x, &a.linear_q.weight, a.linear_q.bias.as_ref());
    let q = g.reshape(q, &[dk, h, t]);
    let k = g.linear(x, &a.linear_k.weight, a.linear_k.bias.as_ref());
    let k = heads(g, k, t);
    let v = g.linear(x, &a.linear_v.weight, a.linear_v.bias.as_ref());
    let p_len = 2 * t - 1;
    let p = g.linear(pos, &a.linear_pos, None);
    let p = heads(g, p, p_len);

    let u = g.weight(&a.pos_bias_u);
    let q_u = g.add(q, u);
    let q_u = g.permute(q_u, [0, 2, 1, 3]);
    let vb = g.weight(&a.pos_bias_v);
    let q_v = g.add(q, vb);
    let q_v = g.permute(q_v, [0, 2, 1, 3]);

    let ac = g.matmul(k, q_u); // [t_k, t_q, h]
    let bd = g.matmul(p, q_v); // [2t-1, t_q, h]
    // rel_shift: bd'[i][j] = bd[i][(t - 1) - i + j]; a strided view that steps one element
    // back per row.
    let elem = 4;
    let bd = g.view(
        bd,
        &[t, t, h],
        &[(p_len - 1) * elem, p_len * t * elem],
        (t - 1) * elem,
    );
    let scores = g.add(ac, bd);
    let probs = g.softmax(scores, 1.0 / (dk as f32).sqrt());
    // out[dk, t_q, h] = v^T probs
    let v = g.reshape(v, &[dk, h, t]);
    let v = g.permute(v, [1, 2, 0, 3]); // [t, dk, h]
    let v = g.cont(v);
    let o = g.matmul(v, probs); // [dk, t_q, h]
    let o = g.permute(o, [0, 2, 1, 3]); // [dk, h, t]
    let o = g.cont(o);
    let o = g.reshape(o, &[d, t]);
    g.linear(o, &a.linear_out.weight, a.linear_out.bias.as_ref())
}

/// pointwise_conv1 -> GLU -> depthwise conv (BatchNorm folded) -> Swish -> pointwise_conv2.
fn conv_module<'g>(g: &mut Graph<'g>, c: &ConvModule, x: Tensor<'g>) -> Tensor<'g> {
    let d = x.ne(0);
    let y = g.linear(
        x,
        &c.pointwise_conv1.weight,
        c.pointwise_conv1.bias.as_ref(),
    );
    let a = g.cols(y, 0, d);
    let gate = g.cols(y, d, d);
    let gate = g.sigmoid(gate);
    let a = g.cont(a);
    let y = g.mul(a, gate);
    let k = g.weight(&c.depthwise_conv_folded);
    let y = g.conv1d_depthwise_same(y, k);
    let b = g.weight(&c.depthwise_bias_folded);
    let y = g.add(y, b);
    let y = g.silu(y);
    g.linear(
        y,
        &c.pointwise_conv2.weight,
        c.pointwise_conv2.bias.as_ref(),
    )
}
