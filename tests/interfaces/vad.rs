//! `parakeet vad` as a user runs it: segments equal to the silero-vad package's (the shared
//! reference in tests/fixtures/vad), every format, files, directories and standard input, and
//! the bad-input rules (exit 2, one clear error, nothing written).

use crate::common::{fixtures, json, run_parakeet, scratch_dir};
use std::io::Write;
use std::process::{Command, Stdio};

/// A clip of the VAD fixtures.
pub(crate) fn audio(name: &str) -> String {
    fixtures()
        .join("vad/audio")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The package's segments of `clip` for parameter set `set`, in samples.
fn reference(clip: &str, set: &str) -> Vec<(u64, u64)> {
    let meta = json(&fixtures().join("vad").join(clip).join("segments.json"));
    meta["segments"][set]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap()))
        .collect()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let cache = scratch_dir("vad-cli", "cache");
    let out = run_parakeet(args, &cache);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn text_gives_the_package_segments_in_seconds() {
    let (code, out, err) = run(&["vad", &audio("jfk.wav")]);
    assert_eq!(code, 0, "{err}");
    let want: Vec<String> = reference("jfk", "default")
        .iter()
        .map(|&(s, e)| format!("{:.3} {:.3}", s as f64 / 16000.0, e as f64 / 16000.0))
        .collect();
    assert_eq!(out.lines().collect::<Vec<_>>(), want);
}

#[test]
fn json_carries_samples_and_every_flag_reaches_the_algorithm() {
    // The `split_max` set: threshold 0.6, min speech 500, min silence 300, pad 100, max 2 s.
    let (code, out, err) = run(&[
        "vad",
        "-f",
        "json",
        "--probabilities",
        "--threshold",
        "0.6",
        "--min-speech-ms",
        "500",
        "--min-silence-ms",
        "300",
        "--speech-pad-ms",
        "100",
        "--max-speech-s",
        "2",
        &audio("sonnet1_librivox_16k.wav"),
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        sample_spans(&v),
        reference("sonnet1_librivox_16k", "split_max")
    );
    assert_eq!(v["sample_rate"], 16000);
    assert_eq!(v["probabilities"].as_array().unwrap().len(), 1665);
    // The legacy cut.
    let (code, out, _) = run(&[
        "vad",
        "-f",
        "json",
        "--min-silence-ms",
        "500",
        "--max-speech-s",
        "2",
        "--legacy-max-speech-split",
        &audio("sonnet1_librivox_16k.wav"),
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        sample_spans(&v),
        reference("sonnet1_librivox_16k", "split_legacy")
    );
}

/// The `(start_sample, end_sample)` of every segment of `parakeet vad -f json`'s output.
fn sample_spans(v: &serde_json::Value) -> Vec<(u64, u64)> {
    let sample = |s: &serde_json::Value, key: &str| s[key].as_u64().unwrap();
    v["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (sample(s, "start_sample"), sample(s, "end_sample")))
        .collect()
}

#[test]
fn eight_khz_runs_the_8k_net() {
    let (code, out, err) = run(&["vad", "-f", "json", &audio("ldc93s1_8k_s16.wav")]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["sample_rate"], 8000);
    assert_eq!(sample_spans(&v), reference("ldc93s1_8k_s16", "default"));
}

#[test]
fn rttm_srt_stdin_and_directories() {
    let (code, out, _) = run(&["vad", "-f", "rttm", &audio("jfk.wav")]);
    assert_eq!(code, 0);
    let first = out.lines().next().unwrap();
    assert_eq!(
        first,
        "SPEAKER jfk 1 0.322 1.948 <NA> <NA> speech <NA> <NA>"
    );
    assert_eq!(out.lines().count(), 4);

    let bytes = std::fs::read(audio("jfk.wav")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_parakeet"))
        .args(["vad", "-f", "srt", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let srt = String::from_utf8(out.stdout).unwrap();
    assert!(
        srt.starts_with("1\n00:00:00,322 --> 00:00:02,270\nspeech\n\n2\n"),
        "{srt}"
    );

    let dir = scratch_dir("vad-cli", "tree");
    std::fs::create_dir_all(dir.join("in/sub")).unwrap();
    std::fs::copy(audio("jfk.wav"), dir.join("in/sub/jfk.wav")).unwrap();
    std::fs::copy(audio("goforward.wav"), dir.join("in/goforward.wav")).unwrap();
    let (code, _, err) = run(&[
        "vad",
        "-f",
        "json",
        "-o",
        dir.join("out").to_str().unwrap(),
        dir.join("in").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&dir.join("out/sub/jfk.vad.json"));
    assert_eq!(v["segments"].as_array().unwrap().len(), 4);
    assert!(dir.join("out/goforward.vad.json").is_file());
}

#[test]
fn silence_gives_no_segments() {
    let (code, out, err) = run(&["vad", &audio("silence_5s.wav")]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
}

#[test]
fn bad_input_is_one_clear_error_and_exit_2() {
    let jfk = audio("jfk.wav");
    let dir = scratch_dir("vad-cli", "bad");
    let corrupt = dir.join("corrupt.gguf");
    let mut bytes = std::fs::read(fixtures().join("vad/audio/jfk.wav")).unwrap();
    bytes.truncate(4000);
    std::fs::write(&corrupt, bytes).unwrap();
    for (args, says) in [
        (vec!["--threshold", "1.5"], "--threshold 1.5"),
        (vec!["--threshold", "0"], "--threshold 0"),
        (
            vec!["--neg-threshold", "0.7"],
            "--neg-threshold 0.7: must not be above",
        ),
        (vec!["--min-speech-ms", "-3"], "--min-speech-ms -3"),
        (vec!["--speech-pad-ms", "-1"], "--speech-pad-ms -1"),
        (vec!["--max-speech-s", "-2"], "--max-speech-s -2"),
        (
            vec!["--vad-model", corrupt.to_str().unwrap()],
            "corrupt.gguf: not a Silero VAD model",
        ),
    ] {
        let mut all = vec!["vad"];
        all.extend(&args);
        all.push(&jfk);
        let (code, out, err) = run(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: wrote {out}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}
