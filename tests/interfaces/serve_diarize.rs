//! `parakeet serve --diar-model`: `response_format=diarized_json` as OpenAI lays it out and
//! speakers in verbose_json's words, each the CLI's `transcribe --diarize` (whose speakers are
//! tested against NeMo's probabilities) under OpenAI's labels; a server without a diarizer and
//! an ASR model as the diarizer refused.

use crate::common::*;
use crate::serve::{Server, upload};
use parakeet::convert::OutType;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ASR: &str = "tiny_ctc";
const SORTFORMER: &str = "tiny_sortformer";

fn clip() -> PathBuf {
    fixtures().join("diar/audio/jfk.wav")
}

/// The CLI's diarized JSON for the clip.
fn cli_json(dir: &Path) -> Value {
    let out = run_parakeet(
        &[
            "transcribe",
            clip().to_str().unwrap(),
            "-m",
            gguf(ASR, OutType::F32).to_str().unwrap(),
            "--diar-model",
            gguf(SORTFORMER, OutType::F32).to_str().unwrap(),
            "-f",
            "json",
            "-q",
            "-o",
            dir.to_str().unwrap(),
        ],
        dir,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&dir.join("jfk.json"))
}

/// Validates `body` with the `openai` package's model `class` (from `openai.types.audio`);
/// false when no Python with the package is at hand.
fn openai_validates(class: &str, body: &str) -> bool {
    let python = std::env::var("PARAKEET_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = format!(
        "import sys, json\ntry:\n    from openai.types.audio import {class}\nexcept ImportError:\n    sys.exit(77)\n\
         {class}.model_validate(json.load(sys.stdin))\n"
    );
    let Ok(mut child) = Command::new(&python)
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("skipped: cannot run {python}");
        return false;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.code() == Some(77) {
        eprintln!("skipped: {python} lacks the openai package");
        return false;
    }
    assert!(
        out.status.success(),
        "{class}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

#[test]
fn diarized_json_and_verbose_words_carry_the_cli_s_speakers() {
    let dir = scratch_dir("serve-diarize", "formats");
    let cli = cli_json(&dir);
    let server = Server::start_with(
        &gguf(ASR, OutType::F32),
        &[
            "--workers",
            "1",
            "--threads",
            "2",
            "--diar-model",
            gguf(SORTFORMER, OutType::F32).to_str().unwrap(),
        ],
    );
    let r = upload(&server, &clip(), &[("response_format", "diarized_json")]);
    assert_eq!(r.status, 200, "{r:?}");
    let v = r.json();
    assert_eq!(v["task"], "transcribe");
    assert_eq!(v["duration"], cli["duration"]);
    assert_eq!(v["text"], cli["text"]);
    assert_eq!(v["usage"]["type"], "duration");

    // OpenAI's labels: letters in the order the speakers are first heard, one per speaker.
    let mut labels: HashMap<String, String> = HashMap::new();
    let segs = v["segments"].as_array().unwrap();
    let cli_segs = cli["segments"].as_array().unwrap();
    assert_eq!(segs.len(), cli_segs.len());
    for (i, (s, c)) in segs.iter().zip(cli_segs).enumerate() {
        assert_eq!(s["type"], "transcript.text.segment");
        assert_eq!(s["id"], format!("seg_{i}"));
        for key in ["start", "end", "text"] {
            assert_eq!(s[key], c[key], "segment {i} {key}");
        }
        let ours = c["speaker"].as_str().unwrap().to_string();
        let next = char::from(b'A' + labels.len() as u8).to_string();
        let label = labels.entry(ours).or_insert(next);
        assert_eq!(s["speaker"].as_str().unwrap(), label, "segment {i}");
    }
    assert!(labels.len() >= 2, "{labels:?}");
    openai_validates("TranscriptionDiarized", &r.body);

    let r = upload(
        &server,
        &clip(),
        &[
            ("response_format", "verbose_json"),
            ("timestamp_granularities[]", "word"),
        ],
    );
    assert_eq!(r.status, 200, "{r:?}");
    let words = r.json()["words"].as_array().unwrap().clone();
    let cli_words = cli["words"].as_array().unwrap();
    assert_eq!(words.len(), cli_words.len());
    for (w, c) in words.iter().zip(cli_words) {
        assert_eq!(w["word"], c["word"]);
        let label = &labels[c["speaker"].as_str().unwrap()];
        assert_eq!(w["speaker"].as_str().unwrap(), label, "{w}");
    }

    // Formats that show no speakers are not diarized.
    let r = upload(&server, &clip(), &[("response_format", "json")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["text"], cli["text"]);
}

#[test]
fn diarization_needs_a_sortformer_given_to_the_server() {
    let server = Server::start_with(
        &gguf(ASR, OutType::F32),
        &["--workers", "1", "--threads", "1"],
    );
    let r = upload(&server, &clip(), &[("response_format", "diarized_json")]);
    r.assert_error(400, Some("response_format"), "invalid_value");
    assert!(r.body.contains("--diar-model"), "{}", r.body);

    let asr = gguf(ASR, OutType::F32);
    let asr = asr.to_str().unwrap();
    let args = ["serve", "-m", asr, "--port", "0", "--diar-model", asr];
    let out = run_parakeet(&args, std::path::Path::new(env!("CARGO_TARGET_TMPDIR")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("--diar-model {asr}")), "{err}");
    assert!(err.contains("not a Sortformer diarization model"), "{err}");
}
