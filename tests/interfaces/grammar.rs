//! One command line: every file command takes the same `-f` list, thread default, exit-code
//! rule, per-file lines and summary, and names a failed input once; the help and messages a
//! new user meets say what they mean.

use crate::common::{fixtures, gguf, nemo, run_parakeet, scratch_dir};
use crate::speech::zero_samples;
use parakeet::convert::OutType;
use std::path::{Path, PathBuf};
use std::process::Output;

fn run(args: &[&str], cache: &Path) -> (i32, String, String) {
    let out: Output = run_parakeet(args, cache);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn vad_clip() -> String {
    fixtures()
        .join("vad/audio/jfk.wav")
        .to_string_lossy()
        .into_owned()
}

/// A file that claims to be a WAV and is not one.
fn corrupt_wav(dir: &Path) -> PathBuf {
    let path = dir.join("corrupt.wav");
    let mut bytes = b"RIFF\x24\x00\x00\x00WAVEfmt ".to_vec();
    bytes.extend([0xff; 40]);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn vad_takes_the_format_list_and_reports_like_the_others() {
    let dir = scratch_dir("grammar", "vad-formats");
    let clip = vad_clip();
    // `txt`, as every other command spells it; `text` still works.
    let (code, txt, err) = run(&["vad", "-f", "txt", &clip], &dir);
    assert_eq!(code, 0, "{err}");
    let (_, text, _) = run(&["vad", "-f", "text", &clip], &dir);
    assert_eq!(txt, text);
    assert!(!txt.is_empty());
    // A list: each format after the other on standard output, or a file each under -o.
    let (code, both, err) = run(&["vad", "-f", "txt,json", &clip], &dir);
    assert_eq!(code, 0, "{err}");
    assert!(both.starts_with(&txt), "{both}");
    let json: serde_json::Value = serde_json::from_str(both[txt.len()..].trim()).unwrap();
    assert!(!json["segments"].as_array().unwrap().is_empty());
    let out = dir.join("out");
    let (code, _, err) = run(
        &[
            "vad",
            "-f",
            "json,srt",
            "-o",
            out.to_str().unwrap(),
            &clip,
            &clip,
        ],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    for ext in ["vad.json", "vad.srt"] {
        assert!(out.join(format!("jfk.{ext}")).exists(), "{ext}: {err}");
        // A line per file written, naming it.
        assert!(
            err.lines()
                .any(|l| l.contains("speech segments ->") && l.contains(ext)),
            "{err}"
        );
    }
    // The second naming of the same file is skipped; a batch ends with its summary.
    assert!(err.contains("named more than once"), "{err}");
    let silence = fixtures().join("vad/audio/silence_5s.wav");
    let (code, _, err) = run(&["vad", &clip, silence.to_str().unwrap()], &dir);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("2 done, 0 failed"), "{err}");
    // -q: nothing on standard error.
    let (_, _, err) = run(
        &[
            "vad",
            "-q",
            "-f",
            "json",
            "-o",
            out.to_str().unwrap(),
            &clip,
        ],
        &dir,
    );
    assert!(err.is_empty(), "{err}");
}

#[test]
fn vad_runs_on_every_core_by_default_as_the_others_do() {
    let dir = scratch_dir("grammar", "vad-threads");
    let cores = std::thread::available_parallelism().unwrap().get();
    // More threads than cores warns and caps, as every command does: the default is all.
    let many = (cores + 1).to_string();
    let (code, _, err) = run(&["vad", "-t", &many, &vad_clip()], &dir);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("using {cores}")), "{err}");
    let help = run(&["vad", "--help"], &dir).1;
    assert!(help.contains("default: available cores"), "{help}");
}

#[test]
fn bad_input_exits_2_in_every_command_and_a_batch_with_failures_1() {
    let dir = scratch_dir("grammar", "exit-codes");
    let corrupt = corrupt_wav(&dir);
    let corrupt = corrupt.to_str().unwrap();
    let good = vad_clip();
    let asr = nemo("tiny_tdt");
    let sortformer = nemo("tiny_sortformer");
    let (asr, sortformer) = (asr.to_str().unwrap(), sortformer.to_str().unwrap());
    for (args, command) in [
        (vec!["transcribe", "-m", asr], "transcribe"),
        (vec!["vad"], "vad"),
        (vec!["diarize", "-m", sortformer], "diarize"),
        (vec!["stream", "-m", asr], "stream"),
    ] {
        let one = [&args[..], &[corrupt]].concat();
        let (code, _, err) = run(&one, &dir);
        assert_eq!(code, 2, "{command}: {err}");
        // One line, naming the path once.
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{command}: {err}");
        assert_eq!(lines[0].matches(corrupt).count(), 1, "{command}: {err}");
        if command == "stream" {
            continue; // one input only
        }
        let batch = [&args[..], &[corrupt, &good]].concat();
        let (code, _, err) = run(&batch, &dir);
        assert_eq!(code, 1, "{command} batch: {err}");
        assert!(err.contains("1 done, 1 failed"), "{command} batch: {err}");
    }
}

#[test]
fn empty_audio_is_the_same_error_with_vad_or_without() {
    let dir = scratch_dir("grammar", "empty");
    let zero = zero_samples(&dir);
    let asr = nemo("tiny_tdt");
    for vad in [&[][..], &["--vad"][..]] {
        let args = [
            &["transcribe", "-m", asr.to_str().unwrap()][..],
            vad,
            &[zero.to_str().unwrap()],
        ]
        .concat();
        let (code, out, err) = run(&args, &dir);
        assert_eq!((code, out.as_str()), (2, ""), "{vad:?}: {err}");
        assert!(err.contains("contains no audio samples"), "{vad:?}: {err}");
    }
}

#[cfg(unix)]
#[test]
fn vad_refuses_an_endless_device_after_a_bounded_read() {
    let dir = scratch_dir("grammar", "dev-zero");
    let started = std::time::Instant::now();
    let (code, _, err) = run(&["vad", "/dev/zero"], &dir);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a recognised audio format"), "{err}");
    assert!(
        started.elapsed().as_secs() < 60,
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn stream_takes_f_and_says_which_head_decodes() {
    let dir = scratch_dir("grammar", "stream");
    let clip = fixtures().join("reference/speech_2s.wav");
    let model = gguf("tiny_tdt", OutType::F32);
    let (code, out, err) = run(
        &[
            "stream",
            "-f",
            "jsonl",
            "-v",
            "-m",
            model.to_str().unwrap(),
            clip.to_str().unwrap(),
        ],
        &dir,
    );
    assert_eq!(code, 0, "{err}");
    let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(first["type"].is_string(), "{out}");
    assert!(err.contains("head tdt"), "{err}");
    assert!(!err.contains("Auto"), "{err}");
    // Its own help for the padding, not the file command's.
    let help = run(&["stream", "--help"], &dir).1;
    let pad = help
        .split("--speech-pad-ms")
        .nth(1)
        .unwrap()
        .split("\n      --")
        .next()
        .unwrap();
    assert!(pad.contains("utterance"), "{pad}");
    assert!(!pad.contains("segment"), "{pad}");
}

#[test]
fn help_and_flag_errors_say_what_they_mean() {
    let dir = scratch_dir("grammar", "help");
    let convert = run(&["convert", "--help"], &dir).1;
    assert!(convert.contains("--type <TYPE>"), "{convert}");
    // `serve --help` in the long layout of the others: each flag's help under it.
    let serve = run(&["serve", "--help"], &dir).1;
    let transcribe = run(&["transcribe", "--help"], &dir).1;
    for help in [&serve, &transcribe] {
        assert!(help.contains("  -m, --model <MODEL>\n"), "{help}");
    }
    let (code, _, err) = run(&["serve", "-m", "x.gguf", "--workers", "0"], &dir);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("must be a whole number from 1 to 256"),
        "{err}"
    );
    assert!(!err.contains("\"0\""), "{err}");
}

#[test]
fn a_fully_skipped_batch_says_there_was_nothing_to_do() {
    let dir = scratch_dir("grammar", "skipped");
    let clip = fixtures().join("reference/speech_2s.wav");
    let model = gguf("tiny_tdt", OutType::F32);
    let args = [
        "transcribe",
        "-m",
        model.to_str().unwrap(),
        "-f",
        "json",
        "-o",
        dir.to_str().unwrap(),
        "--skip-existing",
        clip.to_str().unwrap(),
    ];
    let (code, _, err) = run(&args, &dir);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&args, &dir);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("nothing to do: 1 skipped"), "{err}");
    assert!(!err.contains("real time"), "{err}");
}

#[test]
fn the_cache_lists_a_model_once_and_removes_it() {
    let dir = scratch_dir("grammar", "cache");
    let cache = dir.join("cache");
    // One checkpoint from two places: two cache files of the same bytes.
    let copy = dir.join("clone");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::copy(nemo("tiny_tdt"), copy.join("tiny_tdt.nemo")).unwrap();
    let clip = fixtures().join("reference/speech_2s.wav");
    for model in [nemo("tiny_tdt"), copy.join("tiny_tdt.nemo")] {
        let (code, _, err) = run(
            &[
                "transcribe",
                "-q",
                "-m",
                model.to_str().unwrap(),
                clip.to_str().unwrap(),
            ],
            &cache,
        );
        assert_eq!(code, 0, "{err}");
    }
    let files = || std::fs::read_dir(&cache).unwrap().count();
    assert_eq!(files(), 2);
    let (code, list, err) = run(&["models"], &cache);
    assert_eq!(code, 0, "{err}");
    assert_eq!(list.lines().count(), 1, "{list}");
    assert!(
        list.contains("tiny_tdt") && list.contains("1 more copy"),
        "{list}"
    );
    let (code, _, err) = run(&["models", "--prune"], &cache);
    assert_eq!(code, 0, "{err}");
    assert_eq!(files(), 1, "{err}");
    let (code, _, err) = run(&["models", "--remove", "no_such"], &cache);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no_such") && err.contains("tiny_tdt"), "{err}");
    let (code, _, err) = run(&["models", "--remove", "tiny_tdt"], &cache);
    assert_eq!(code, 0, "{err}");
    assert_eq!(files(), 0, "{err}");
    let (_, list, _) = run(&["models"], &cache);
    assert!(list.starts_with("no converted models"), "{list}");
}
