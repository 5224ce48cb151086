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
fn a_single_missing_input_exits_2_in_every_command() {
    let cache = scratch_dir("commands", "failed");
    let missing = cache.join("missing.wav");
    let missing = missing.to_str().unwrap();
    let sortformer = nemo("tiny_sortformer");
    // The one input given is the user's error (2), as a flag or a model is; a batch where
    // some inputs failed exits 1 (tests/interfaces/grammar.rs).
    let (code, out, err) = run(
        &["diarize", missing, "-m", sortformer.to_str().unwrap()],
        &cache,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("missing.wav"), "{err}");
    let (code, _, err) = run(&["vad", missing], &cache);
    assert_eq!(code, Some(2), "{err}");
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

/// Copies `from` to each of `names` under `dir` (made first).
fn copies(from: &Path, dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    names
        .iter()
        .map(|n| {
            let to = dir.join(n);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(from, &to).unwrap();
            to
        })
        .collect()
}

#[test]
fn vad_and_diarize_name_their_files_by_transcribe_rule() {
    let cache = scratch_dir("commands", "names");
    let dir = cache.join("in");
    let sortformer = nemo("tiny_sortformer");
    let sortformer = sortformer.to_str().unwrap();
    // Dots in a name: only the audio extension is replaced.
    copies(&clip(), &dir, &["rec.part1.wav", "rec.part2.wav"]);
    // A transcript already beside the audio is not replaced by speaker turns.
    let talk = &copies(&clip(), &dir, &["talk.wav"])[0];
    std::fs::write(dir.join("talk.txt"), "a transcript\n").unwrap();
    let (code, out, err) = run(
        &[
            "diarize",
            "-f",
            "txt,rttm",
            dir.to_str().unwrap(),
            "-m",
            sortformer,
        ],
        &cache,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.is_empty(), "{out}");
    for stem in ["rec.part1", "rec.part2", "talk"] {
        let rttm = std::fs::read_to_string(dir.join(format!("{stem}.diar.rttm"))).unwrap();
        let first = rttm.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("SPEAKER {stem} 1 ")),
            "{stem}: {rttm}"
        );
        assert!(dir.join(format!("{stem}.diar.txt")).is_file(), "{stem}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("talk.txt")).unwrap(),
        "a transcript\n"
    );
    assert!(!dir.join("rec.rttm").exists());
    // vad into a directory: `.vad.` names, the tree mirrored, nothing beside the inputs.
    let out_dir = cache.join("vad-out");
    let (code, _, err) = run(
        &[
            "vad",
            "-f",
            "srt",
            "-o",
            out_dir.to_str().unwrap(),
            dir.to_str().unwrap(),
            talk.to_str().unwrap(),
        ],
        &cache,
    );
    assert_eq!(code, Some(0), "{err}");
    let mut written: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    // `talk.wav` named twice (the folder and the file) is done once.
    assert_eq!(
        written,
        ["rec.part1.vad.srt", "rec.part2.vad.srt", "talk.vad.srt"]
    );
}

#[test]
fn outputs_that_would_clash_are_refused_before_any_work() {
    let cache = scratch_dir("commands", "clash");
    let inputs = copies(&clip(), &cache, &["a/x.wav", "b/x.wav"]);
    let (a, b) = (inputs[0].to_str().unwrap(), inputs[1].to_str().unwrap());
    let out_dir = cache.join("out");
    let out = out_dir.to_str().unwrap();
    let sortformer = nemo("tiny_sortformer");
    for args in [
        vec!["vad", "-o", out, a, b],
        vec![
            "diarize",
            "-o",
            out,
            a,
            b,
            "-m",
            sortformer.to_str().unwrap(),
        ],
    ] {
        let (code, stdout, err) = run(&args, &cache);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(stdout.is_empty());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("{a} and {b} would both be written to")),
            "{err}"
        );
        assert!(!out_dir.exists(), "{args:?} wrote into {out}");
    }
}

#[test]
fn standard_input_goes_to_stdin_files_under_the_output_directory() {
    let cache = scratch_dir("commands", "stdin");
    let bytes = std::fs::read(clip()).unwrap();
    let out_dir = cache.join("out");
    let sortformer = nemo("tiny_sortformer");
    let out = run_parakeet_stdin(
        &[
            "diarize",
            "-",
            "-m",
            sortformer.to_str().unwrap(),
            "-f",
            "rttm",
            "-o",
            out_dir.to_str().unwrap(),
        ],
        &cache,
        &bytes,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let rttm = std::fs::read_to_string(out_dir.join("stdin.diar.rttm")).unwrap();
    assert!(rttm.starts_with("SPEAKER stdin 1 "), "{rttm}");
    let out = run_parakeet_stdin(
        &["vad", "-", "-o", out_dir.to_str().unwrap()],
        &cache,
        &bytes,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out_dir.join("stdin.vad.txt").is_file());
}

#[test]
fn diarize_flags_that_would_do_nothing_are_refused() {
    let cache = scratch_dir("commands", "ignored");
    let clip = clip();
    let clip = clip.to_str().unwrap();
    // Refused before the model is touched: a model that is not there is never reached.
    let missing = cache.join("diar-not-converted.nemo");
    let missing = missing.to_str().unwrap();
    for (args, says) in [
        (
            vec!["--full-context", "--chunk-len", "6", "--fifo-len", "16"],
            "--chunk-len 6 --fifo-len 16: streaming sizes, but --full-context runs the whole \
             file at once",
        ),
        (vec!["--probabilities"], "--probabilities needs -f json"),
        (
            vec!["--probabilities", "-f", "rttm"],
            "--probabilities needs -f json",
        ),
    ] {
        let all = [&["diarize", clip, "-m", missing][..], &args].concat();
        let (code, out, err) = run(&all, &cache);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.trim_end(), format!("error: {says}"), "{args:?}");
    }
    // Streaming sizes given to an offline model.
    let offline = nemo("tiny_sortformer");
    let (code, out, err) = run(
        &[
            "diarize",
            clip,
            "-m",
            offline.to_str().unwrap(),
            "--spkcache-len",
            "24",
        ],
        &cache,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty());
    let error = err.lines().last().unwrap_or_default();
    assert!(
        error.starts_with("error: --spkcache-len 24: ")
            && error.ends_with("is an offline Sortformer, which does not stream; these sizes are for a streaming one"),
        "{err}"
    );
    // A speaker cache too small for the model's speakers: once, before any file.
    let streaming = nemo("tiny_sortformer_stream");
    let (code, out, err) = run(
        &[
            "diarize",
            clip,
            clip,
            "-m",
            streaming.to_str().unwrap(),
            "--spkcache-len",
            "3",
        ],
        &cache,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty());
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("error:"))
            .collect::<Vec<_>>(),
        ["error: a speaker cache of 3 frames is too small for 4 speakers (at least 16)"],
        "{err}"
    );
}
