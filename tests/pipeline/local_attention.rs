//! NeMo's local attention (`rel_pos_local_attn`) against NeMo's own dumps: every encoder layer
//! and the decoded tokens, frames and durations, for the four tiny models switched to
//! `[16, 16]` with `change_attention_model`, the model whose own config has `[12, 12]`, and the
//! window's edge cases (references made by scripts/make_local_refs.sh).

use crate::common::*;
use parakeet::backend::Lowering;
use parakeet::convert::OutType;
use parakeet::encoder::{AUTO_FULL_MAX_SECONDS, AttentionChoice};
use parakeet::hparams::Attention;
use parakeet::session::{DecodeOptions, DecodeRequest, DecoderChoice, Session};
use std::path::Path;

/// Worst relative error allowed per layer (‖ours − NeMo‖ / ‖NeMo‖).
const TOL: f64 = 1e-4;

/// Every dumped layer of `dir` against ours, then the decoded heads against `result.json`.
pub(crate) fn check_against_nemo(
    session: &mut Session,
    attention: AttentionChoice,
    samples: &[f32],
    dir: &Path,
    name: &str,
) {
    check_sliced_against_nemo(session, attention, None, samples, dir, name)
}

/// [`check_against_nemo`] with the layers in time slices of `slice` frames.
fn check_sliced_against_nemo(
    session: &mut Session,
    attention: AttentionChoice,
    slice: Option<usize>,
    samples: &[f32],
    dir: &Path,
    name: &str,
) {
    let result = json(&dir.join("result.json"));
    let features = session.features(samples);
    let enc = session
        .encode_sliced(&features, true, attention, slice)
        .unwrap();
    let (frames, d) = (enc.frames, enc.d_model);
    assert_eq!(frames as u64, result["enc_len"].as_u64().unwrap(), "{name}");
    let mut checked = 0;
    for (layer, ours) in &enc.layers {
        let path = dir.join(format!("{layer}.npy"));
        if !path.exists() {
            continue;
        }
        let (_, nemo) = npy(&path);
        let err = rel_err(ours, &nemo[..frames * d]);
        println!("{name} {layer}: rel err {err:.2e}");
        assert!(err <= TOL, "{name} {layer}: rel err {err:.3e}");
        checked += 1;
    }
    let (shape, nemo) = npy(&dir.join("encoder_out.npy")); // [d, T'+1]
    let t_all = shape[1];
    let nemo_t: Vec<f32> = (0..frames)
        .flat_map(|t| (0..d).map(move |c| (t, c)))
        .map(|(t, c)| nemo[c * t_all + t])
        .collect();
    let err = rel_err(&enc.output, &nemo_t);
    println!("{name} encoder_out: rel err {err:.2e}");
    assert!(err <= TOL, "{name} encoder_out: rel err {err:.3e}");
    assert!(checked >= 2, "{name}: only {checked} layers compared");

    let mut heads = vec![];
    if let Some(nemo) = result.get("greedy_batch") {
        heads.push((DecoderChoice::Auto, nemo.clone(), "transducer"));
    }
    if let Some(nemo) = result.get("ctc") {
        heads.push((DecoderChoice::Ctc, nemo.clone(), "ctc"));
    }
    assert!(!heads.is_empty(), "{name}: no reference decode");
    for (choice, nemo, what) in heads {
        let request = DecodeRequest {
            decoder: choice,
            attention,
            ..DecodeRequest::default()
        };
        let opts = DecodeOptions::new(session.model(), &request).unwrap();
        let opts = match slice {
            Some(frames) => opts.with_layer_slice(frames),
            None => opts,
        };
        let ours = session.transcribe(samples.to_vec(), &opts).unwrap();
        let ids: Vec<usize> = ours.tokens.iter().map(|t| t.id).collect();
        assert_eq!(ids, ints(&nemo["tokens"]), "{name} {what}: tokens");
        if let Some(ts) = nemo.get("timestamp") {
            let f: Vec<usize> = ours.tokens.iter().map(|t| t.frame).collect();
            assert_eq!(f, ints(ts), "{name} {what}: frames");
        }
        // RNN-T references list no durations.
        if let Some(ds) = nemo
            .get("token_duration")
            .filter(|d| d.as_array().is_some_and(|a| !a.is_empty()))
        {
            let f: Vec<usize> = ours.tokens.iter().map(|t| t.duration).collect();
            assert_eq!(f, ints(ds), "{name} {what}: durations");
        }
        println!("{name} {what}: {} tokens identical", ids.len());
    }
}

fn local(left: usize, right: usize) -> AttentionChoice {
    AttentionChoice::Local { left, right }
}

#[test]
fn four_models_switched_to_local_16_16_match_nemo() {
    four_models_local(Lowering::Kernels);
}

/// Local attention's window as ggml's built-in ops lower it (a mask per block of queries).
#[test]
fn four_models_switched_to_local_16_16_match_nemo_on_ggml_ops() {
    four_models_local(Lowering::Builtin);
}

fn four_models_local(lowering: Lowering) {
    for model in MODELS {
        let mut session = session_on(&gguf(model, OutType::F32), threads(2), lowering);
        let name = format!("{model}_local16");
        check_against_nemo(
            &mut session,
            local(16, 16),
            &clip_samples("speech_10s.wav"),
            &reference(&name),
            &name,
        );
    }
}

#[test]
fn model_configured_with_local_attention_matches_nemo() {
    configured_local(Lowering::Kernels);
}

#[test]
fn model_configured_with_local_attention_matches_nemo_on_ggml_ops() {
    configured_local(Lowering::Builtin);
}

fn configured_local(lowering: Lowering) {
    let path = gguf("tiny_tdt_ctc_local", OutType::F32);
    let mut session = session_on(&path, threads(2), lowering);
    assert_eq!(
        session.model().hparams().encoder.attention,
        Attention::Local {
            left: 12,
            right: 12
        }
    );
    let samples = clip_samples("speech_10s.wav");
    // `auto` keeps the model's own window, at any length.
    let features = session.features(&samples);
    assert_eq!(
        session.attention_for(features.n_frames, AttentionChoice::Auto),
        Attention::Local {
            left: 12,
            right: 12
        }
    );
    let dir = reference("tiny_tdt_ctc_local");
    check_against_nemo(
        &mut session,
        AttentionChoice::Auto,
        &samples,
        &dir,
        "tiny_tdt_ctc_local",
    );
}

/// 16, 32, 33 and 34 encoder frames with the [16, 16] window (33 frames wide; NeMo pads to
/// multiples of 32): shorter than the window, NeMo's chunk, exactly the window, one frame
/// longer; and NeMo's asymmetric windows [8, 4] / [4, 8] on 33 frames
/// (`scripts/make_local_refs.sh`).
#[test]
fn window_edges_match_nemo() {
    let mut session = Session::load(&gguf("tiny_tdt_ctc", OutType::F32), threads(2)).unwrap();
    for (name, wav, (l, r)) in [
        ("tiny_tdt_ctc_local16_t16", "edge_16.wav", (16, 16)),
        ("tiny_tdt_ctc_local16_t32", "edge_32.wav", (16, 16)),
        ("tiny_tdt_ctc_local16_t33", "edge_33.wav", (16, 16)),
        ("tiny_tdt_ctc_local16_t34", "edge_34.wav", (16, 16)),
        ("tiny_tdt_ctc_local8x4_t33", "edge_33.wav", (8, 4)),
        ("tiny_tdt_ctc_local4x8_t33", "edge_33.wav", (4, 8)),
    ] {
        check_against_nemo(
            &mut session,
            local(l, r),
            &clip_samples(wav),
            &reference(name),
            name,
        );
    }
}

/// Long files run each layer in time slices (attention over each slice's window of keys, the
/// conv with its neighbouring frames): forced on a short clip (32-frame slices of 125 frames,
/// the last one partial), every layer and the decode still match NeMo, and the encoder output
/// is the unsliced one bit for bit.
#[test]
fn layers_in_time_slices_match_nemo_and_the_whole_layer() {
    for (model, (l, r)) in [("tiny_tdt_ctc", (16, 16)), ("tiny_rnnt", (16, 16))] {
        let name = format!("{model}_local16");
        let samples = clip_samples("speech_10s.wav");
        let mut whole = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let mut sliced = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let window = local(l, r);
        let dir = reference(&name);
        check_sliced_against_nemo(&mut sliced, window, Some(32), &samples, &dir, &name);
        let features = whole.features(&samples);
        let a = whole.encode_with(&features, false, window).unwrap();
        let b = sliced
            .encode_sliced(&features, false, window, Some(32))
            .unwrap();
        assert!(
            a.frames > 96,
            "{name}: {} frames make no partial fourth slice",
            a.frames
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&a.output),
            bits(&b.output),
            "{name}: sliced vs whole layers"
        );
    }
}

/// A window covering the whole utterance is full attention: the full-attention references.
#[test]
fn window_wider_than_the_utterance_is_full_attention() {
    for model in ["tiny_tdt", "tiny_ctc"] {
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        check_against_nemo(
            &mut session,
            local(200, 200),
            &clip_samples("speech_10s.wav"),
            &reference(model),
            &format!("{model} [200, 200]"),
        );
    }
}

#[test]
fn auto_picks_full_attention_up_to_the_threshold_then_long_form() {
    let session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    // Feature frames of 10 ms; encoder frames of 80 ms.
    let feature_frames = |seconds: f64| (seconds * 100.0).round() as usize;
    assert_eq!(
        session.attention_for(feature_frames(10.0), AttentionChoice::Auto),
        Attention::Full,
        "10 s"
    );
    assert_eq!(
        session.attention_for(feature_frames(AUTO_FULL_MAX_SECONDS), AttentionChoice::Auto),
        Attention::Full,
        "at the threshold"
    );
    assert_eq!(
        session.attention_for(
            feature_frames(AUTO_FULL_MAX_SECONDS) + 8,
            AttentionChoice::Auto
        ),
        Attention::LONG_FORM,
        "one encoder frame past the threshold"
    );
    assert_eq!(
        session.attention_for(feature_frames(3600.0), AttentionChoice::Auto),
        Attention::Local {
            left: 128,
            right: 128
        }
    );
    for (choice, want) in [
        ("full", Attention::Full),
        (
            "128,128",
            Attention::Local {
                left: 128,
                right: 128,
            },
        ),
    ] {
        let c: AttentionChoice = choice.parse().unwrap();
        assert_eq!(c.resolve(Attention::Full, 100_000, 0.08), want, "{choice}");
    }
    for bad in ["0,0", "12", "a,b", "-1,4", ""] {
        assert!(bad.parse::<AttentionChoice>().is_err(), "{bad:?} accepted");
    }
}
