//! The VAD's end of turn at the front ends: `parakeet stream --vad` on a clip of two utterances
//! a second apart gives one final per `VADIterator` turn, on its boundaries, with the text of
//! streaming that turn alone (a cache-aware and an offline model); its flags are checked.

use crate::common::turns::{alone, iterator_turns, two_turns};
use crate::common::*;
use parakeet::convert::OutType;
use parakeet::model::Model;
use parakeet::stream::turns::TurnParams;
use serde_json::Value;
use std::sync::Arc;

fn stream_vad(model: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let clip = fixtures().join("vad_turns/two_turns.wav");
    let mut args = vec![
        "stream",
        clip.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
        "--format",
        "jsonl",
        "-t",
        "1",
    ];
    args.extend_from_slice(extra);
    run_parakeet(&args, &scratch_dir("vad_turns", "cache"))
}

#[test]
fn stream_vad_gives_a_final_per_turn_on_the_iterator_s_boundaries() {
    let samples = two_turns();
    let turns = iterator_turns(&samples, &TurnParams::default());
    assert_eq!(turns.len(), 2, "{turns:?}");
    for name in ["tiny_stream_tdt_ctc", "tiny_tdt"] {
        let path = gguf(name, OutType::F32);
        let model = Arc::new(Model::load(&path).unwrap());
        let out = stream_vad(&path, &["--vad"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        let finals: Vec<Value> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["type"] == "final")
            .collect();
        assert_eq!(finals.len(), 2, "{name}: {finals:?}");
        for (f, &(s, e)) in finals.iter().zip(&turns) {
            let solo = alone(&model, &samples[s..e]);
            assert_eq!(solo.len(), 1, "{name}: {solo:?}");
            assert_eq!(f["text"], solo[0].text.as_str(), "{name}: {f}");
            // Milliseconds, as the lines carry them (the boundaries are whole milliseconds).
            assert_eq!(
                f["start"].as_f64().unwrap() * 16000.0,
                s as f64,
                "{name}: {f}"
            );
            assert_eq!(
                f["end"].as_f64().unwrap() * 16000.0,
                e as f64,
                "{name}: {f}"
            );
        }
    }
}

#[test]
fn stream_vad_flags_are_checked() {
    let path = gguf("tiny_tdt", OutType::F32);
    for (args, said) in [
        (&["--vad", "--threshold", "1.5"][..], "--threshold 1.5"),
        (&["--vad", "--threshold", "0"][..], "--threshold 0"),
        (
            &["--vad", "--min-silence-ms", "-5"][..],
            "--min-silence-ms -5",
        ),
        (
            &["--vad", "--speech-pad-ms", "nan"][..],
            "--speech-pad-ms NaN",
        ),
        (&["--threshold", "0.6"][..], "needs --vad"),
    ] {
        let out = stream_vad(&path, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = stream_vad(&path, &["--vad-model", "/nonexistent.gguf"]);
    assert_eq!(out.status.code(), Some(2));
    let out = stream_vad(&path, &["--vad", "--vad-model", "/nonexistent.gguf"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent.gguf"), "{stderr}");
}
