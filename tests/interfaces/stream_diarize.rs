//! `stream --diarize`: a streaming Sortformer beside the ASR model, chunk by chunk as the audio
//! arrives; every final word's speaker against the one NeMo's streamed probabilities (the tiny
//! streaming Sortformer's reference, NeMo's inference sizes) give it over the word's span, for
//! a cache-aware and a buffered ASR stream; Sortformers that cannot stream refused.

use crate::common::*;
use crate::transcribe_diarize::{CLIP, clip, nemo_speaker, text};
use std::process::Output;

const SORTFORMER: &str = "tiny_sortformer_stream";

/// `parakeet stream CLIP -m ASR --diar-model DIAR_MODEL EXTRA...` (tiny models by name).
fn stream(asr: &str, diar_model: &str, extra: &[&str], cache: &std::path::Path) -> Output {
    let (clip, model, sf) = (clip(), nemo(asr), nemo(diar_model));
    let args = [
        "stream",
        clip.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
        "--diar-model",
        sf.to_str().unwrap(),
    ];
    run_parakeet(&[&args[..], extra].concat(), cache)
}

/// Streams the clip through `asr` with speakers as JSON lines; checks every final's words
/// against NeMo's probabilities and returns how many words were compared.
fn check(asr: &str) -> usize {
    let cache = scratch_dir("stream-diarize", asr);
    let out = stream(asr, SORTFORMER, &["--format", "jsonl"], &cache);
    assert!(out.status.success(), "{asr}: {}", text(&out.stderr));
    let (shape, preds) = npy(&fixtures().join(format!(
        "diar/{SORTFORMER}_diar/{CLIP}/stream_published_preds.npy"
    )));
    let n = shape[1];
    let (mut words, mut compared, mut finals) = (0, 0, 0);
    let mut speakers = std::collections::BTreeSet::new();
    for line in text(&out.stdout).lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        let is_final = event["type"] == "final";
        finals += is_final as usize;
        for w in event["words"].as_array().unwrap() {
            if !is_final {
                assert!(w.get("speaker").is_none(), "{asr}: a partial's word {w}");
                continue;
            }
            words += 1;
            let got = w["speaker"].as_str().unwrap();
            speakers.insert(got.to_string());
            let (start, end) = (w["start"].as_f64().unwrap(), w["end"].as_f64().unwrap());
            let (want, tie) = nemo_speaker(&preds, n, start, end);
            if tie {
                continue;
            }
            compared += 1;
            assert_eq!(got, format!("speaker_{want}"), "{asr}: word {w}");
        }
    }
    println!("{asr}: {finals} finals, {compared} of {words} words compared, {speakers:?}");
    assert!(
        finals >= 1 && words >= 5,
        "{asr}: {finals} finals, {words} words"
    );
    assert!(compared * 10 >= words * 9, "{asr}: {compared} of {words}");
    compared
}

#[test]
fn finals_carry_the_speakers_nemos_streamed_probabilities_give() {
    // A cache-aware model and an offline one streamed by buffers.
    let compared = check("tiny_stream_rnnt") + check("tiny_ctc");
    assert!(compared >= 10, "{compared} words compared");
}

#[test]
fn text_lines_name_each_speaker_before_their_words() {
    let cache = scratch_dir("stream-diarize", "text");
    let out = stream("tiny_ctc", SORTFORMER, &[], &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(!lines.is_empty());
    for line in lines {
        assert!(line.starts_with("[speaker_"), "{line}");
    }
}

#[test]
fn sortformers_that_cannot_stream_are_refused() {
    let cache = scratch_dir("stream-diarize", "bad");
    for (diar_model, says) in [
        ("tiny_sortformer", "offline Sortformer"),
        ("tiny_ctc", "not a Sortformer diarization model"),
    ] {
        let out = stream("tiny_ctc", diar_model, &[], &cache);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(err.contains("--diar-model"), "{err}");
        assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    }
}
