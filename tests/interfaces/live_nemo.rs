//! The live front ends over a real cache-aware model: `parakeet stream` (a file, a raw pipe)
//! and the WebSocket endpoint give the partial and final texts of NeMo's streaming loop
//! (tests/fixtures/reference/tiny_stream_tdt_ctc_stream, lookahead [70,13], the 10 s clip).

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::model::Model;
use parakeet::server::realtime::TranscriberFactory;
use parakeet::stream::open::{LiveOptions, open_live};
use serde_json::Value;
use std::sync::Arc;

pub(crate) const MODEL: &str = "tiny_stream_tdt_ctc";

/// NeMo's streaming texts for `head` ("rnnt" or "ctc"): the partial text after every chunk
/// that emitted tokens, and the final text.
pub(crate) fn nemo_texts(head: &str) -> (Vec<String>, String) {
    let result = read_json(&reference("tiny_stream_tdt_ctc_stream").join("result.json"));
    let streaming = &result["lookaheads"]["att_70_13"][head]["streaming"];
    let partials = streaming["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["new_tokens"].as_array().unwrap().is_empty())
        .map(|c| c["text"].as_str().unwrap().to_owned())
        .collect();
    (
        partials,
        streaming["final"]["text"].as_str().unwrap().to_owned(),
    )
}

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The partial and final texts of `parakeet stream ... --format jsonl` output.
fn texts_of(jsonl: &str) -> (Vec<String>, Vec<String>) {
    let (mut partials, mut finals) = (Vec::new(), Vec::new());
    for line in jsonl.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        let text = event["text"].as_str().unwrap().to_owned();
        match event["type"].as_str().unwrap() {
            "partial" => partials.push(text),
            "final" => finals.push(text),
            other => panic!("event type {other}"),
        }
    }
    (partials, finals)
}

fn run_stream(args: &[&str], stdin: Option<&[u8]>) -> (Vec<String>, Vec<String>) {
    let out = crate::stream_buffered::stream_cmd(MODEL, args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    texts_of(&String::from_utf8(out.stdout).unwrap())
}

pub(crate) fn clip_s16le() -> Vec<u8> {
    let mut reader = hound::WavReader::open(fixtures().join("audio/speech_10s.wav")).unwrap();
    reader
        .samples::<i16>()
        .flat_map(|s| s.unwrap().to_le_bytes())
        .collect()
}

#[test]
fn the_stream_command_gives_nemos_streaming_texts() {
    let wav = fixtures().join("audio/speech_10s.wav");
    for (head, extra) in [("rnnt", None), ("ctc", Some("ctc"))] {
        let (nemo_partials, nemo_final) = nemo_texts(head);
        let mut args = vec![wav.to_str().unwrap()];
        if let Some(d) = extra {
            args.extend(["--decoder", d]);
        }
        let (partials, finals) = run_stream(&args, None);
        assert_eq!(finals, [nemo_final], "{head}: finals");
        if head == "rnnt" {
            // CTC partials are re-folded across chunk borders; the pipeline tests check them.
            assert_eq!(partials, nemo_partials, "{head}: partials");
        }
    }
    // The same audio as a raw pipe.
    let (partials, finals) = run_stream(
        &["-", "--raw", "s16le", "--rate", "16000"],
        Some(&clip_s16le()),
    );
    let (nemo_partials, nemo_final) = nemo_texts("rnnt");
    assert_eq!((partials, finals), (nemo_partials, vec![nemo_final]));
}

#[test]
fn a_long_utterance_is_cut_at_word_starts_into_finals_that_join_to_nemos_text() {
    let wav = fixtures().join("audio/speech_10s.wav");
    let (_, nemo_final) = nemo_texts("rnnt");
    let (partials, finals) = run_stream(
        &[wav.to_str().unwrap(), "--max-utterance-seconds", "2"],
        None,
    );
    assert!(
        finals.len() >= 3,
        "a 10 s clip in utterances of about 2 s: {finals:?}"
    );
    assert_eq!(
        finals.join(" "),
        nemo_final,
        "the cut loses or moves no text"
    );
    assert!(finals.iter().all(|f| !f.is_empty() && !f.starts_with(' ')));
    // Each partial is its utterance so far: a prefix of the final it grows into.
    let mut next_final = finals.iter();
    let mut current = next_final.next().unwrap();
    for p in &partials {
        while !current.starts_with(p.as_str()) {
            current = next_final.next().expect("a partial of no final");
        }
    }
    let (_, uncut) = run_stream(
        &[wav.to_str().unwrap(), "--max-utterance-seconds", "0"],
        None,
    );
    assert_eq!(uncut, [nemo_final]);
}

#[test]
fn the_websocket_gives_nemos_streaming_text() {
    let model = Arc::new(Model::load(&gguf(MODEL, OutType::F32)).unwrap());
    let options = LiveOptions::defaults(&model, threads(1)).unwrap();
    let factory: TranscriberFactory = Arc::new(move || open_live(&model, &options));
    let (deltas, completed) = crate::realtime::transcribe_clip(MODEL, factory);
    let (_, nemo_final) = nemo_texts("rnnt");
    assert_eq!(completed, nemo_final);
    assert_eq!(deltas, nemo_final);
}
