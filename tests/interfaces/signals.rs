//! Ctrl-C and SIGTERM as a user or a batch scheduler sends them: `transcribe` stops without
//! leaving a half-written file, `stream` finishes the utterance it was hearing.

use crate::common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

fn scratch(name: &str) -> std::path::PathBuf {
    scratch_dir("signals", name)
}

fn send(child: &Child, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits for `child` to exit, at most `limit`; kills it and fails if it does not.
fn wait_at_most(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("still running {limit:?} after the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// SIGTERM in the middle of a batch: exit 143, every output written so far whole, no hidden
/// temp file left (the one being written is removed).
#[test]
fn sigterm_mid_batch_leaves_whole_outputs_and_no_temp_file() {
    let root = scratch("sigterm-batch");
    let inputs = root.join("in");
    std::fs::create_dir_all(&inputs).unwrap();
    for i in 0..60 {
        std::fs::copy(
            reference("").join("speech_2s.wav"),
            inputs.join(format!("clip{i:02}.wav")),
        )
        .unwrap();
    }
    let out = root.join("out");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let args = [
        "transcribe",
        inputs.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
        "-f",
        "json,txt,srt",
        "-o",
        out.to_str().unwrap(),
        "-q",
    ];
    let mut child = parakeet_command(&args, &root)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_dir(&out).map_or(0, |d| d.count()) < 6 {
        assert!(start.elapsed() < Duration::from_secs(120), "no output");
        std::thread::sleep(Duration::from_millis(5));
    }
    send(&child, "-TERM");
    let status = wait_at_most(&mut child, Duration::from_secs(20));
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert_eq!(temps(&out), Vec::<String>::new());
    let written: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
    assert!(written.len() < 180, "the batch finished before the signal");
    for e in written {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "json") {
            let j = json(&path);
            assert!(j["text"].is_string(), "{}", path.display());
        }
    }
}

/// `--skip-existing` (resuming a batch) removes the temp files of writers that are gone, and
/// leaves a running one's and anything not ours.
#[test]
fn skip_existing_removes_stale_temp_files() {
    let root = scratch("stale-temps");
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // No process has this id (Linux's pid_max is at most 2^22).
    let stale = out.join(".parakeet-999999999-0.tmp");
    let running = out.join(format!(".parakeet-{}-0.tmp", std::process::id()));
    let foreign = out.join(".parakeet-notes.tmp");
    for f in [&stale, &running, &foreign] {
        std::fs::write(f, b"partial").unwrap();
    }
    let clip = reference("").join("speech_2s.wav");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let args = [
        "transcribe",
        clip.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--skip-existing",
    ];
    let run = run_parakeet(&args, &root);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!stale.exists());
    assert!(running.exists() && foreign.exists());
    assert!(out.join("speech_2s.txt").exists());
}

/// Ctrl-C while `stream` waits on a slow pipe: the utterance heard so far comes out as a
/// `final`, then the command exits 130 (before: killed, the utterance lost).
#[test]
fn ctrl_c_finishes_the_streamed_utterance_then_exits_130() {
    let root = scratch("stream-ctrl-c");
    let model = nemo("tiny_tdt");
    let args = [
        "stream",
        "-",
        "-m",
        model.to_str().unwrap(),
        "--raw",
        "s16le",
        "--rate",
        "16000",
        "--format",
        "jsonl",
    ];
    let mut child = parakeet_command(&args, &root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let samples = clip_samples("speech_10s.wav");
    let bytes: Vec<u8> = samples[..16000 * 6]
        .iter()
        .flat_map(|&s| ((s * 32767.0) as i16).to_le_bytes())
        .collect();
    // Six seconds now, then a pipe that stays open and silent.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&bytes).unwrap();
    stdin.flush().unwrap();
    let (tx, lines) = channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(120))
        .expect("no event from six seconds of speech");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["type"], "partial", "{first}");
    send(&child, "-INT");
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    reader.join().unwrap();
    let events: Vec<serde_json::Value> = lines
        .try_iter()
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    let last = events.last().expect("no event after Ctrl-C");
    assert_eq!(last["type"], "final", "{last}");
    assert!(!last["text"].as_str().unwrap().is_empty(), "{last}");
    drop(stdin);
}
