//! Decoding against NeMo: tokens, frames, durations and text for every reference model and
//! clip (end to end from the WAV), and a teacher-forced, step-by-step trace comparison that feeds
//! NeMo's own encoder output into our decoder.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::{Step, TransducerDecoder, log_softmax_rows};
use parakeet::encoder::encode_heads;
use parakeet::kernels::FusedOps;
use parakeet::transcribe::{DecoderChoice, Transcriber};
use serde_json::Value;

fn ints(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

#[test]
fn transcripts_match_nemo_token_for_token() {
    for model in MODELS {
        let mut tr = Transcriber::load(&gguf(model, OutType::F32), 2).unwrap();
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
                let ours = tr.transcribe(samples.clone(), choice).unwrap();
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

/// A transcriber whose compute buffer was readied at load for the clip's length: the clip then
/// runs in that buffer (it does not grow), and the transcript is still NeMo's.
#[test]
fn a_prepared_compute_buffer_serves_the_utterance() {
    for (suffix, clip) in CLIPS {
        let samples = clip_samples(clip);
        let seconds = parakeet::audio::declared_seconds(&reference("").join(clip)).unwrap();
        assert!((seconds - samples.len() as f64 / 16000.0).abs() < 1e-9);
        let mut tr =
            Transcriber::load_for(&gguf("tiny_tdt", OutType::F32), 2, Some(seconds)).unwrap();
        let prepared = tr.backend.compute_buffer_bytes();
        assert!(prepared > 0, "{clip}: nothing prepared");
        assert_eq!(
            tr.backend.stats().graphs_computed,
            0,
            "{clip}: prepare computed"
        );
        let ours = tr.transcribe(samples, DecoderChoice::Auto).unwrap();
        assert_eq!(
            tr.backend.compute_buffer_bytes(),
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
        let mut tr = Transcriber::load(&gguf(model, OutType::F32), 2).unwrap();
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
            let enc = encode_heads(&mut tr.backend, &tr.model, &rows, frames).unwrap();
            let mut trace = Vec::new();
            let mut dec = TransducerDecoder::new(&tr.model).unwrap();
            dec.decode(
                &mut tr.backend,
                enc.joint_enc.as_ref().unwrap(),
                frames,
                Some(&mut trace),
            )
            .unwrap();
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
        let mut tr = Transcriber::load(&gguf(model, OutType::F32), 2).unwrap();
        for (suffix, clip) in CLIPS {
            let name = format!("{model}{suffix}");
            let features = tr.features(&clip_samples(clip));
            let enc = tr.encode(&features, false).unwrap();
            let classes = tr.model.hparams.vocab_size + 1;
            let ours = log_softmax_rows(enc.ctc_logits.as_ref().unwrap(), classes);
            let (_, nemo) = npy(&reference(&name).join("ctc_logprobs.npy"));
            let err = max_abs_err(&ours, &nemo[..ours.len()]);
            println!("{name}: CTC log-prob max abs err {err:.2e}");
            assert!(err < 1e-4, "{name}: CTC log-probs differ by {err:.3e}");
        }
    }
}

/// The first LSTM layer's input gates kept per token (`PredictionNetwork::input_gates`) are bit
/// for bit what the graph computes for that token, and a decode on the warm cache takes the
/// same tokens as the cold one did (NeMo's).
#[test]
fn kept_input_gates_are_the_graphs_product() {
    let mut tr = Transcriber::load(&gguf("tiny_tdt", OutType::F32), 2).unwrap();
    let (suffix, clip) = CLIPS[0];
    let samples = clip_samples(clip);
    let cold = tr.transcribe(samples.clone(), DecoderChoice::Auto).unwrap();
    let model = tr.model.clone();
    let pred = model.prediction.as_ref().unwrap();
    let tokens = model.hparams.vocab_size + 1;
    let kept: Vec<usize> = (0..tokens)
        .filter(|&t| pred.input_gates.get(t).is_some())
        .collect();
    // The start symbol (the blank) and every emitted token.
    let mut expected: Vec<usize> = cold.tokens.iter().map(|t| t.id).collect();
    expected.push(model.hparams.vocab_size);
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(kept, expected, "tokens kept");
    for &token in &kept {
        let fresh = tr
            .backend
            .compute(|g| {
                let id = g.input_i32(&[token as i32], &[1]);
                let embed = g.weight(&pred.embed);
                let e = g.get_rows(embed, id);
                Ok(g.linear(e, &pred.lstm[0].weight_ih, None))
            })
            .unwrap()
            .output;
        let kept = pred.input_gates.get(token).unwrap();
        assert!(
            fresh
                .iter()
                .zip(kept)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "token {token}: kept gates differ from the graph's"
        );
    }
    let warm = tr.transcribe(samples, DecoderChoice::Auto).unwrap();
    assert_eq!(warm.tokens, cold.tokens, "warm cache changed the decode");
    let nemo = json(&reference(&format!("tiny_tdt{suffix}")).join("result.json"));
    assert_eq!(warm.text, nemo["greedy_batch"]["text"].as_str().unwrap());
}
