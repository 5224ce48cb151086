//! `vad` and `diarize` keep `transcribe`'s rules: exit codes, inputs with no audio, the thread
//! cap; `info` on a diarization model; model-free flags refused before a model is touched.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(args: &[&str], cache: &Path) -> (Option<i32>, String, String) {
    let out: Output = run_parakeet(args, cache);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn clip() -> PathBuf {
    reference("").join("speech_2s.wav")
}

fn jfk() -> PathBuf {
    fixtures().join("vad/audio/jfk.wav")
}

#[test]
fn failed_inputs_exit_1_in_every_command() {
    let cache = scratch_dir("commands", "failed");
    let missing = cache.join("missing.wav");
    let missing = missing.to_str().unwrap();
    let sortformer = nemo("tiny_sortformer");
    // Every input failing is still "inputs failed" (1), as transcribe and vad say it; 2 is
    // for usage and model errors.
    let (code, out, err) = run(
        &["diarize", missing, "-m", sortformer.to_str().unwrap()],
        &cache,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("missing.wav"), "{err}");
    let (code, _, err) = run(&["vad", missing], &cache);
    assert_eq!(code, Some(1), "{err}");
}

#[test]
fn inputs_without_audio_are_refused_by_every_command() {
    let cache = scratch_dir("commands", "no-audio");
    let dir = cache.join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("readme.txt"), "no audio here").unwrap();
    let dir = dir.to_str().unwrap();
    let sortformer = nemo("tiny_sortformer");
    for args in [
        vec!["vad", dir],
        vec!["diarize", dir, "-m", sortformer.to_str().unwrap()],
        vec!["transcribe", dir, "-m", "unused.gguf"],
    ] {
        let (code, out, err) = run(&args, &cache);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(
            err.trim_end(),
            "error: no audio files found in the given inputs (1 non-audio files skipped)",
            "{args:?}"
        );
    }
}

#[test]
fn threads_beyond_the_cores_are_capped_with_a_warning() {
    let cache = scratch_dir("commands", "threads");
    let cores = std::thread::available_parallelism().unwrap().get();
    let warning =
        format!("warning: --threads 10000 is more than the {cores} available cores; using {cores}");
    let (code, out, err) = run(
        &["vad", jfk().to_str().unwrap(), "--threads", "10000"],
        &cache,
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 4, "{out}");
    assert_eq!(err.trim_end(), warning);
    let sortformer = nemo("tiny_sortformer");
    let (code, _, err) = run(
        &[
            "diarize",
            clip().to_str().unwrap(),
            "-m",
            sortformer.to_str().unwrap(),
            "--threads",
            "10000",
        ],
        &cache,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.lines().any(|l| l == warning), "{err}");
    let clip = clip();
    let clip = clip.to_str().unwrap();
    for args in [
        vec!["vad", clip, "--threads", "0"],
        vec![
            "diarize",
            clip,
            "-m",
            sortformer.to_str().unwrap(),
            "-t",
            "0",
        ],
    ] {
        let (code, _, err) = run(&args, &cache);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim_end(),
            "error: --threads 0: at least 1 thread is needed",
            "{args:?}"
        );
    }
}

#[test]
fn info_of_a_diarization_model_has_no_live_line() {
    let cache = scratch_dir("commands", "info");
    let (code, out, err) = run(&["info", nemo("tiny_sortformer").to_str().unwrap()], &cache);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("type:         sortformer"), "{out}");
    assert!(!out.contains("live:"), "{out}");
    let (code, out, err) = run(&["info", nemo("tiny_tdt").to_str().unwrap()], &cache);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("live:         buffered streaming"), "{out}");
}

#[test]
fn beam_bounds_are_refused_before_the_model_is_loaded() {
    let cache = scratch_dir("commands", "beam");
    // A model that is not there: the flags' error must come before any look at it (a real
    // .nemo would first be converted, which takes minutes for a full-size model).
    let model = cache.join("not-converted-yet.nemo");
    let clip = clip();
    for (flags, says) in [
        (
            vec!["--beam", "0"],
            "--beam 0: a beam search keeps at least one hypothesis",
        ),
        (
            vec!["--beam", "300"],
            "--beam 300: at most 256 hypotheses (NeMo's configurations use 2 to 16)",
        ),
        (
            vec!["--beam", "2", "--nbest", "5"],
            "--nbest 5 must be between 1 and the beam size (2)",
        ),
    ] {
        let args = [
            &[
                "transcribe",
                clip.to_str().unwrap(),
                "-m",
                model.to_str().unwrap(),
            ][..],
            &flags,
        ]
        .concat();
        let (code, out, err) = run(&args, &cache);
        assert_eq!(code, Some(2), "{flags:?}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.trim_end(), format!("error: {says}"), "{flags:?}");
    }
}
