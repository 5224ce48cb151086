//! Decoding against NeMo: tokens, frames, durations and text for every reference model and
//! clip (end to end from the WAV), and a teacher-forced, step-by-step trace comparison that feeds
//! NeMo's own encoder output into our decoder.

use crate::common::*;
use parakeet::backend::{Backend, Lowering};
use parakeet::convert::OutType;
use parakeet::decoder::ctc::log_softmax_rows;
use parakeet::decoder::greedy::Step;
use parakeet::decoder::nets::{InputGates, JointInput, Nets, PredictInput};
use parakeet::kernels::FusedOps;
use parakeet::session::{DecoderChoice, Session};
use serde_json::Value;

#[test]
fn transcripts_match_nemo_token_for_token() {
    transcripts_match_nemo(Lowering::Kernels);
}

/// Greedy decoding token for token with every graph (encoder, prediction net, joint) in
/// ggml's built-in ops.
#[test]
fn transcripts_match_nemo_token_for_token_on_ggml_ops() {
    transcripts_match_nemo(Lowering::Builtin);
}

fn transcripts_match_nemo(lowering: Lowering) {
    for model in MODELS {
        let mut session = session_on(&gguf(model, OutType::F32), threads(2), lowering);
        for (suffix, clip) in CLIPS {
            let name = format!("{model}{suffix}");
            let result = json(&reference(&name).join("result.json"));
            let samples = clip_samples(clip);
            let mut heads = vec![];
            if let Some(nemo) = result.get("greedy_batch") {
                heads.push((DecoderChoice::Auto, nemo.clone(), "transducer"));
            }
            if let Some(nemo) = result.get("ctc") {
                heads.push((DecoderChoice::Ctc, nemo.clone(), "ctc"));
            }
            assert!(!heads.is_empty(), "{name}: no reference decode");
            for (choice, nemo, what) in heads {
                let ours = session
                    .transcribe(samples.clone(), &greedy(&session, choice))
                    .unwrap();
                let ids: Vec<usize> = ours.tokens.iter().map(|t| t.id).collect();
                assert_eq!(ids, ints(&nemo["tokens"]), "{name} {what}: tokens");
                if let Some(ts) = nemo.get("timestamp") {
                    let frames: Vec<usize> = ours.tokens.iter().map(|t| t.frame).collect();
                    assert_eq!(frames, ints(ts), "{name} {what}: frames");
                }
                let durs = nemo.get("token_duration").map(ints).unwrap_or_default();
                if !durs.is_empty() {
                    let d: Vec<usize> = ours.tokens.iter().map(|t| t.duration).collect();
                    assert_eq!(d, durs, "{name} {what}: durations");
                }
                assert_eq!(
                    ours.text,
                    nemo["text"].as_str().unwrap(),
                    "{name} {what}: text"
                );
                println!(
                    "{name} {what}: {} tokens identical, text {:?}",
                    ids.len(),
                    ours.text
                );
            }
        }
    }
}

/// Token and word times from NeMo's decode, by NeMo's rule: a TDT token starts at its frame and
/// ends after its predicted duration (0 frames for some: they end where they start), an RNN-T
/// token covers its frame; a word runs from its first token's start to its last token's end.
/// No time lies past the audio, though NeMo's last TDT token (frame 124 of 125, 4 frames) would.
#[test]
fn token_and_word_times_follow_nemo_durations() {
    let (mut zero_durations, mut clamped) = (0, 0);
    for model in ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt"] {
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let fs = session.model().hparams().geometry().frame_seconds();
        for (suffix, clip) in CLIPS {
            let name = format!("{model}{suffix}");
            let nemo = &json(&reference(&name).join("result.json"))["greedy_batch"];
            let opts = greedy(&session, DecoderChoice::Auto);
            let ours = session.transcribe(clip_samples(clip), &opts).unwrap();
            let audio = ours.audio_seconds;
            let starts = ints(&nemo["timestamp"]);
            // RNN-T: no durations (an empty list), each token covers its frame.
            let durations = match nemo.get("token_duration").map(ints) {
                Some(d) if !d.is_empty() => d,
                _ => vec![1; starts.len()],
            };
            assert_eq!(starts.len(), ours.tokens.len(), "{name}: tokens");
            let nemo_times: Vec<(f64, f64)> = starts
                .iter()
                .zip(&durations)
                .map(|(&s, &d)| {
                    zero_durations += usize::from(d == 0);
                    clamped += usize::from((s + d) as f64 * fs > audio);
                    (s as f64 * fs, ((s + d) as f64 * fs).min(audio))
                })
                .collect();
            for (i, want) in nemo_times.iter().enumerate() {
                let got = ours.token_times(i);
                assert!(
                    (got.0 - want.0).abs() < 1e-9 && (got.1 - want.1).abs() < 1e-9,
                    "{name}: token {i} at {got:?}, NeMo's {want:?}"
                );
            }
            let groups = session.model().tokenizer().word_groups(&ours.tokens);
            assert_eq!(groups.len(), ours.words.len(), "{name}: words");
            for (w, g) in ours.words.iter().zip(groups) {
                let want = (nemo_times[g.start].0, nemo_times[g.end - 1].1);
                assert!(
                    (w.start - want.0).abs() < 1e-9 && (w.end - want.1).abs() < 1e-9,
                    "{name}: {w:?}, NeMo's {want:?}"
                );
                assert!(
                    w.end <= audio,
                    "{name}: {w:?} ends after the audio ({audio} s)"
                );
            }
        }
    }
    assert!(zero_durations > 0, "no zero-duration token was compared");
    assert!(clamped > 0, "no token reached past the audio");
}

/// A session whose compute buffer was readied at load for the clip's length: the clip then
/// runs in that buffer (it does not grow), and the transcript is still NeMo's.
#[test]
fn a_prepared_compute_buffer_serves_the_utterance() {
    for (suffix, clip) in CLIPS {
        let samples = clip_samples(clip);
        let seconds = parakeet::audio::declared_seconds(&reference("").join(clip)).unwrap();
        assert!((seconds - samples.len() as f64 / 16000.0).abs() < 1e-9);
        let mut session =
            Session::load_for(&gguf("tiny_tdt", OutType::F32), threads(2), Some(seconds)).unwrap();
        let prepared = session.compute_buffer_bytes();
        assert!(prepared > 0, "{clip}: nothing prepared");
        assert_eq!(
            session.stats().graphs_computed,
            0,
            "{clip}: prepare computed"
        );
        let ours = session
            .transcribe(samples, &greedy(&session, DecoderChoice::Auto))
            .unwrap();
        assert_eq!(
            session.compute_buffer_bytes(),
            prepared,
            "{clip}: buffer grew"
        );
        let nemo = json(&reference(&format!("tiny_tdt{suffix}")).join("result.json"));
        assert_eq!(ours.text, nemo["greedy_batch"]["text"].as_str().unwrap());
    }
}

/// NeMo's encoder output fed to our decoder: every step (frame, input, label, duration) of
/// NeMo's greedy trace must be ours.
#[test]
fn teacher_forced_decode_follows_nemo_trace() {
    for model in ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt"] {
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        for (suffix, _) in CLIPS {
            let name = format!("{model}{suffix}");
            let dir = reference(&name);
            let frames = json(&dir.join("result.json"))["enc_len"].as_u64().unwrap() as usize;
            let (shape, enc_out) = npy(&dir.join("encoder_out.npy")); // [d, T'+1]
            let (d, t_all) = (shape[0], shape[1]);
            let rows: Vec<f32> = (0..frames)
                .flat_map(|t| (0..d).map(move |c| (t, c)))
                .map(|(t, c)| enc_out[c * t_all + t])
                .collect();
            let enc = session.encode_heads(&rows, frames).unwrap();
            let mut trace = Vec::new();
            session.decode_traced(&enc, &mut trace).unwrap();
            let nemo: Vec<Step> = json(&dir.join("decode_trace.json"))
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Step {
                    t: s["t"].as_u64().unwrap() as usize,
                    input: s["in"].as_i64().filter(|&v| v >= 0).map(|v| v as usize),
                    token: s["k"].as_u64().unwrap() as usize,
                    duration: s.get("dur").and_then(Value::as_u64).unwrap_or(0) as usize,
                })
                .collect();
            for (i, (a, b)) in trace.iter().zip(&nemo).enumerate() {
                assert_eq!(a, b, "{name}: step {i} differs");
            }
            assert_eq!(trace.len(), nemo.len(), "{name}: step count");
            println!("{name}: {} steps identical", trace.len());
        }
    }
}

#[test]
fn ctc_log_probs_match_nemo() {
    for model in ["tiny_ctc", "tiny_tdt_ctc"] {
        let mut session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        for (suffix, clip) in CLIPS {
            let name = format!("{model}{suffix}");
            let features = session.features(&clip_samples(clip));
            let enc = session.encode(&features, false).unwrap();
            let classes = session.model().hparams().vocab_size + 1;
            let ours = log_softmax_rows(enc.ctc_logits.as_ref().unwrap(), classes);
            let (_, nemo) = npy(&reference(&name).join("ctc_logprobs.npy"));
            let err = max_abs_err(&ours, &nemo[..ours.len()]);
            println!("{name}: CTC log-prob max abs err {err:.2e}");
            assert!(err < 1e-4, "{name}: CTC log-probs differ by {err:.3e}");
        }
    }
}

/// The first LSTM layer's input gates the session keeps per token (`InputGates`) are bit
/// for bit what the graph computes for that token, and a decode on the warm cache takes the
/// same tokens as the cold one did (NeMo's).
#[test]
fn kept_input_gates_are_the_graphs_product() {
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    let (suffix, clip) = CLIPS[0];
    let samples = clip_samples(clip);
    let cold = session
        .transcribe(samples.clone(), &greedy(&session, DecoderChoice::Auto))
        .unwrap();
    let model = session.model().clone();
    let pred = &model.transducer().unwrap().prediction;
    let tokens = model.hparams().vocab_size + 1;
    let kept: Vec<usize> = (0..tokens)
        .filter(|&t| session.input_gates().get(t).is_some())
        .collect();
    // The start symbol (the blank) and every emitted token.
    let mut expected: Vec<usize> = cold.tokens.iter().map(|t| t.id).collect();
    expected.push(model.hparams().vocab_size);
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(kept, expected, "tokens kept");
    // The same product on a backend of the same threads as the session's.
    let mut backend = Backend::cpu(2).unwrap();
    for &token in &kept {
        let fresh = backend
            .compute(|g| {
                let id = g.input_i32(&[token as i32], &[1]);
                let embed = g.weight(&pred.embed);
                let e = g.get_rows(embed, id);
                Ok(g.linear(e, &pred.lstm[0].weight_ih, None))
            })
            .unwrap()
            .output;
        let kept = session.input_gates().get(token).unwrap();
        assert!(
            fresh
                .iter()
                .zip(kept)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {token}: kept gates differ from the graph's"
        );
    }
    let warm = session
        .transcribe(samples, &greedy(&session, DecoderChoice::Auto))
        .unwrap();
    assert_eq!(warm.tokens, cold.tokens, "warm cache changed the decode");
    let nemo = json(&reference(&format!("tiny_tdt{suffix}")).join("result.json"));
    assert_eq!(warm.text, nemo["greedy_batch"]["text"].as_str().unwrap());
}

/// One prediction step and one joint step over three hypotheses give each hypothesis what a
/// step of its own gives: states, `joint.pred` and logits (the batched products take the
/// columns together and may round their sums differently, hence a tolerance), the fused
/// joint only where a frame was given, and one input product made for a token fed twice.
#[test]
fn batched_steps_match_single_steps() {
    let session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    let model = session.model().clone();
    let mut backend = Backend::cpu(2).unwrap();
    let mut gates = InputGates::for_model(&model);
    let mut nets = Nets::new(&model, &mut gates).unwrap();
    let start = nets.start(&mut backend).unwrap();
    let mut fed = |nets: &mut Nets, token: usize| {
        let input = PredictInput {
            token,
            state: start.state(),
            next_enc: None,
        };
        nets.predict(&mut backend, &[input]).unwrap().pop().unwrap()
    };
    let states = [
        start.state().clone(),
        fed(&mut nets, 1).state,
        fed(&mut nets, 2).state,
    ];
    let width = nets.enc_width();
    let enc: Vec<f32> = (0..2 * width).map(|i| (i as f32 * 0.37).sin()).collect();
    let inputs = [
        PredictInput {
            token: 3,
            state: &states[0],
            next_enc: Some(&enc[..width]),
        },
        PredictInput {
            token: 1,
            state: &states[1],
            next_enc: None,
        },
        PredictInput {
            token: 3,
            state: &states[2],
            next_enc: Some(&enc[width..]),
        },
    ];
    let before = nets.counts();
    let batched = nets.predict(&mut backend, &inputs).unwrap();
    let after = nets.counts();
    assert_eq!(after.predictor_steps - before.predictor_steps, 3);
    assert_eq!(after.joint_steps - before.joint_steps, 2);
    assert_eq!(batched.len(), 3);
    let close = |a: &[f32], b: &[f32], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let err = max_abs_err(a, b);
        assert!(err < 1e-5, "{what}: batched and single differ by {err:.3e}");
    };
    for (i, (input, ours)) in inputs.iter().zip(&batched).enumerate() {
        let single = nets
            .predict(&mut backend, &[*input])
            .unwrap()
            .pop()
            .unwrap();
        for (l, (a, b)) in ours
            .state
            .layers()
            .iter()
            .zip(single.state.layers())
            .enumerate()
        {
            close(&a.0, &b.0, &format!("hypothesis {i} layer {l} h"));
            close(&a.1, &b.1, &format!("hypothesis {i} layer {l} c"));
        }
        close(
            &ours.pred_out,
            &single.pred_out,
            &format!("hypothesis {i} pred"),
        );
        assert_eq!(ours.logits.is_some(), input.next_enc.is_some(), "{i}");
        if let (Some(a), Some(b)) = (&ours.logits, &single.logits) {
            close(a, b, &format!("hypothesis {i} fused joint"));
        }
    }
    let joint_inputs: Vec<JointInput> = batched
        .iter()
        .zip([&enc[..width], &enc[width..], &enc[..width]])
        .map(|(p, enc)| JointInput {
            enc,
            pred_out: &p.pred_out,
        })
        .collect();
    let logits = nets.joint(&mut backend, &joint_inputs).unwrap();
    assert_eq!(logits.len(), 3);
    for (i, (input, ours)) in joint_inputs.iter().zip(&logits).enumerate() {
        let single = nets.joint(&mut backend, &[*input]).unwrap().pop().unwrap();
        close(ours, &single, &format!("hypothesis {i} joint"));
    }
    // The fused joint of a prediction step is the joint step's.
    close(
        batched[0].logits.as_ref().unwrap(),
        &logits[0],
        "fused vs joint step",
    );
}

/// A call's progress is its own (whisper.cpp's per-call params): each stage in order, the
/// decoder's fraction advancing over the frames to the end (a long file's bar must move), and
/// the transcript the same as without it. Node timing is per call too.
#[test]
fn progress_is_told_per_call_and_the_decoder_advances() {
    use parakeet::session::DecodeOptions;
    use std::sync::{Arc, Mutex};
    let mut session = Session::load(&gguf("tiny_tdt", OutType::F32), threads(2)).unwrap();
    let plain = DecodeOptions::greedy(session.model()).unwrap();
    let samples = clip_samples("speech_10s.wav");
    let want = session.transcribe(samples.clone(), &plain).unwrap();
    let told: Arc<Mutex<Vec<(&'static str, f64)>>> = Arc::default();
    let sink = told.clone();
    let opts = plain.with_progress(Some(Arc::new(move |stage, done| {
        sink.lock().unwrap().push((stage, done))
    })));
    let got = session
        .transcribe(samples, &opts.with_op_timing(true))
        .unwrap();
    assert_eq!(got.tokens, want.tokens);
    assert!(!session.stats().op_times.is_empty(), "no node timed");
    let told = told.lock().unwrap();
    let stages: Vec<&str> = told.iter().map(|s| s.0).fold(Vec::new(), |mut v, s| {
        if v.last() != Some(&s) {
            v.push(s);
        }
        v
    });
    assert_eq!(stages, ["features", "encoder", "decoder"], "{told:?}");
    let decoder: Vec<f64> = told
        .iter()
        .filter(|s| s.0 == "decoder")
        .map(|s| s.1)
        .collect();
    assert!(decoder.windows(2).all(|w| w[0] <= w[1]), "{decoder:?}");
    assert!(decoder.len() > 10, "{decoder:?}");
    assert!(*decoder.last().unwrap() > 0.9, "{decoder:?}");
}
