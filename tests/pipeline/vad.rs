//! Silero VAD against the `silero-vad` package's reference outputs (tests/fixtures/vad, copied
//! from ../shared/reference/vad by scripts/copy_vad_fixtures.sh): per-window probabilities
//! within 2e-5 of the ONNX model's, the LSTM state after every window, the segments of
//! `get_speech_timestamps` for four parameter sets sample for sample, and `VADIterator`'s events.

use crate::common::{fixtures, json, max_abs_err, npy};
use parakeet::vad::{
    SampleRate, SpeechParams, SpeechSegment, Vad, VadEvent, VadIterator, VadModel, VadState,
    speech_segments,
};
use std::path::PathBuf;

/// Within this of the ONNX model's probabilities (the float32 rounding noise of the model is
/// about 1e-5; ONNX and TorchScript differ by up to 2.4e-5).
const PROB_TOL: f64 = 2e-5;

fn vad_dir() -> PathBuf {
    fixtures().join("vad")
}

fn wav(name: &str) -> Vec<f32> {
    parakeet::audio::load_audio(&vad_dir().join("audio").join(name))
        .unwrap()
        .samples
}

/// The samples the reference model saw for `clip`.
fn clip_samples(clip: &str) -> Vec<f32> {
    match clip {
        "one_two_three_44k1" => npy(&vad_dir().join(clip).join("input.npy")).1,
        "speech_10s" | "speech_2s" => {
            parakeet::audio::load_audio(&fixtures().join("audio").join(format!("{clip}.wav")))
                .unwrap()
                .samples
        }
        _ => wav(&format!("{clip}.wav")),
    }
}

fn clips() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(vad_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "audio")
        .collect();
    v.sort();
    v
}

/// The package's parameters as a reference file lists them.
pub(crate) fn params(p: &serde_json::Value) -> SpeechParams {
    SpeechParams {
        threshold: p["threshold"].as_f64().unwrap(),
        neg_threshold: p["neg_threshold"].as_f64(),
        min_speech_ms: p["min_speech_duration_ms"].as_f64().unwrap(),
        max_speech_s: p["max_speech_duration_s"].as_f64().unwrap_or(f64::INFINITY),
        min_silence_ms: p["min_silence_duration_ms"].as_f64().unwrap(),
        speech_pad_ms: p["speech_pad_ms"].as_f64().unwrap(),
        min_silence_at_max_speech_ms: p["min_silence_at_max_speech"].as_f64().unwrap(),
        use_max_poss_sil_at_max_speech: p["use_max_poss_sil_at_max_speech"].as_bool().unwrap(),
    }
}

fn segments(v: &serde_json::Value) -> Vec<SpeechSegment> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| SpeechSegment {
            start: s["start"].as_u64().unwrap() as usize,
            end: s["end"].as_u64().unwrap() as usize,
        })
        .collect()
}

fn vad() -> Vad {
    Vad::new(VadModel::builtin().unwrap(), crate::common::threads(1)).unwrap()
}

#[test]
fn probabilities_match_onnx_on_every_clip() {
    let mut vad = vad();
    let mut worst = (0.0, String::new());
    for clip in clips() {
        let meta = json(&vad_dir().join(&clip).join("segments.json"));
        let rate = SampleRate::from_hz(meta["sample_rate"].as_u64().unwrap() as u32).unwrap();
        let samples = clip_samples(&clip);
        assert_eq!(
            samples.len() as u64,
            meta["n_samples"].as_u64().unwrap(),
            "{clip}: samples"
        );
        let (_, want) = npy(&vad_dir().join(&clip).join("probs_onnx.npy"));
        let got = vad.probabilities(&samples, rate).unwrap();
        assert_eq!(got.len(), want.len(), "{clip}: windows");
        let err = max_abs_err(&got, &want);
        assert!(err <= PROB_TOL, "{clip}: max |Δp| {err:.2e} against ONNX");
        if err > worst.0 {
            worst = (err, clip.clone());
        }
    }
    eprintln!("worst max |Δp| against ONNX: {:.2e} ({})", worst.0, worst.1);
}

#[test]
fn segments_equal_the_package_for_every_parameter_set() {
    let mut vad = vad();
    for clip in clips() {
        let meta = json(&vad_dir().join(&clip).join("segments.json"));
        let hz = meta["sample_rate"].as_u64().unwrap() as u32;
        let rate = SampleRate::from_hz(hz).unwrap();
        let samples = clip_samples(&clip);
        let probs = vad.probabilities(&samples, rate).unwrap();
        let sets = meta["segments"].as_object().unwrap();
        assert_eq!(sets.len(), 4, "{clip}: parameter sets");
        for (name, set) in sets {
            let p = params(&set["params"]);
            let eff = set["params"]["neg_threshold_effective"].as_f64().unwrap();
            let ours = p.neg_threshold_effective();
            assert!(
                (ours - eff).abs() < 1e-12,
                "{clip}/{name}: neg threshold {ours} vs {eff}"
            );
            let got = speech_segments(&probs, samples.len(), hz, rate.window(), &p);
            assert_eq!(got, segments(&set["segments"]), "{clip}/{name}");
            // The algorithm alone, on the reference probabilities.
            let (_, onnx) = npy(&vad_dir().join(&clip).join("probs_onnx.npy"));
            let from_ref = speech_segments(&onnx, samples.len(), hz, rate.window(), &p);
            assert_eq!(from_ref, got, "{clip}/{name} from the ONNX probabilities");
        }
    }
}

#[test]
fn vad_iterator_events_equal_the_package() {
    let mut model = vad();
    for clip in clips() {
        let meta = json(&vad_dir().join(&clip).join("segments.json"));
        let hz = meta["sample_rate"].as_u64().unwrap() as u32;
        let rate = SampleRate::from_hz(hz).unwrap();
        let samples = clip_samples(&clip);
        let it = &meta["vad_iterator"];
        let p = &it["params"];
        let mut iter = VadIterator::new(
            p["threshold"].as_f64().unwrap(),
            hz,
            p["min_silence_duration_ms"].as_f64().unwrap(),
            p["speech_pad_ms"].as_f64().unwrap(),
        );
        // Window by window, as a live stream feeds it (the package feeds full windows only).
        let mut state = VadState::new(rate);
        let w = rate.window();
        let mut events = Vec::new();
        for (i, win) in samples.chunks_exact(w).enumerate() {
            let prob = model.process(&mut state, win).unwrap()[0];
            if let Some(e) = iter.push(prob, w) {
                events.push((e, i));
            }
        }
        let want: Vec<(VadEvent, usize)> = it["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let window = e["window"].as_u64().unwrap() as usize;
                match (e.get("start"), e.get("end")) {
                    (Some(s), _) => (VadEvent::Start(s.as_u64().unwrap() as usize), window),
                    (_, Some(s)) => (VadEvent::End(s.as_u64().unwrap() as usize), window),
                    _ => panic!("{clip}: event {e}"),
                }
            })
            .collect();
        assert_eq!(events, want, "{clip}: VADIterator events");
        assert_eq!(
            iter.triggered(),
            it["open_at_end"].as_bool().unwrap(),
            "{clip}: open at the end"
        );
    }
}

/// The state after every window, fed one window at a time (the context and the LSTM state
/// carried between calls), against ONNX's: `h` to 2e-5, `c` (unbounded, up to ~50) to 2e-5
/// relative to its magnitude.
#[test]
fn lstm_state_after_every_window_matches_onnx() {
    let mut vad = vad();
    for (clip, hz) in [("jfk", 16000), ("ldc93s1_8k_s16", 8000)] {
        let rate = SampleRate::from_hz(hz).unwrap();
        let samples = clip_samples(clip);
        let (shape, want) = npy(&vad_dir().join(clip).join("state_onnx.npy"));
        assert_eq!(shape[1..], [2, 128]);
        let mut state = VadState::new(rate);
        let w = rate.window();
        let mut padded = samples.clone();
        padded.resize(samples.len().div_ceil(w) * w, 0.0);
        let (mut worst_h, mut worst_c) = (0f64, 0f64);
        for (i, win) in padded.chunks_exact(w).enumerate() {
            vad.process(&mut state, win).unwrap();
            let (h, c) = (
                &want[i * 256..i * 256 + 128],
                &want[i * 256 + 128..i * 256 + 256],
            );
            worst_h = worst_h.max(max_abs_err(state.h(), h));
            let scale = c.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
            worst_c = worst_c.max(max_abs_err(state.c(), c) / scale);
        }
        assert!(worst_h <= 2e-5, "{clip}: h max |Δ| {worst_h:.2e}");
        assert!(worst_c <= 2e-5, "{clip}: c max |Δ|/max|c| {worst_c:.2e}");
        eprintln!("{clip}: h {worst_h:.2e}, c {worst_c:.2e} (relative)");
    }
}

/// The state runs across calls: a signal fed in uneven pieces of whole windows gives the
/// probabilities of one call; a reset starts over.
#[test]
fn state_carries_across_calls_and_resets() {
    let mut vad = vad();
    let samples = clip_samples("jfk");
    let rate = SampleRate::Hz16000;
    let w = rate.window();
    let whole = &samples[..samples.len() / w * w];
    let mut state = VadState::new(rate);
    let once = vad.process(&mut state, whole).unwrap();
    let mut state = VadState::new(rate);
    let mut pieces = Vec::new();
    for part in [&whole[..3 * w], &whole[3 * w..100 * w], &whole[100 * w..]] {
        pieces.extend(vad.process(&mut state, part).unwrap());
    }
    // Products of a few columns and of many run on different kernels: rounding differs.
    let err = max_abs_err(&pieces, &once);
    assert!(err <= 2e-5, "pieces vs one call: {err:.2e}");
    state.reset();
    let again = vad.process(&mut state, &whole[..10 * w]).unwrap();
    let err = max_abs_err(&again, &once[..10]);
    assert!(err <= 2e-5, "after a reset: {err:.2e}");
}

#[test]
fn a_corrupt_model_is_a_clear_error() {
    let mut bytes = parakeet::vad::model::BUILTIN_GGUF.to_vec();
    bytes.truncate(bytes.len() / 2);
    let e = VadModel::from_gguf_bytes(&bytes, "half.gguf")
        .err()
        .unwrap();
    assert!(
        format!("{e:#}").contains("half.gguf: not a Silero VAD model"),
        "{e:#}"
    );
    let e = VadModel::from_gguf_bytes(b"not a model at all", "x.bin")
        .err()
        .unwrap();
    assert!(
        format!("{e:#}").contains("x.bin: not a Silero VAD model"),
        "{e:#}"
    );
}

#[test]
fn bad_parameters_are_rejected() {
    let ok = SpeechParams::default();
    assert!(ok.validate().is_ok());
    for (p, what) in [
        (
            SpeechParams {
                threshold: 0.0,
                ..ok.clone()
            },
            "threshold 0",
        ),
        (
            SpeechParams {
                threshold: 1.0,
                ..ok.clone()
            },
            "threshold 1",
        ),
        (
            SpeechParams {
                neg_threshold: Some(0.7),
                ..ok.clone()
            },
            "neg-threshold 0.7",
        ),
        (
            SpeechParams {
                min_speech_ms: -1.0,
                ..ok.clone()
            },
            "min-speech-ms -1",
        ),
        (
            SpeechParams {
                speech_pad_ms: -5.0,
                ..ok.clone()
            },
            "speech-pad-ms -5",
        ),
    ] {
        let e = p.validate().err().unwrap().to_string();
        assert!(e.contains(what), "{e}");
    }
}
