//! NeMo's buffered streaming of offline models (`BufferedRNNTPipeline`, `BufferedCTCPipeline`)
//! against NeMo 3.0's step-by-step outputs (`tests/fixtures/buffered/`, copied small from the
//! shared references by `scripts/extract_buffered_fixtures.py`): every model, head, setting and
//! clip, step by step.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::session::{DecoderChoice, Session};
use parakeet::stream::{
    BufferedConfig, BufferedStream, LiveTranscriber, StepRecord, StreamEvent, Utterance,
};
use serde_json::Value;

/// `(model, head)` pairs NeMo ran, with the decoder that picks the head here.
const CASES: [(&str, &str, DecoderChoice); 5] = [
    ("tiny_tdt", "rnnt", DecoderChoice::Auto),
    ("tiny_rnnt", "rnnt", DecoderChoice::Auto),
    ("tiny_ctc", "ctc", DecoderChoice::Auto),
    ("tiny_tdt_ctc", "rnnt", DecoderChoice::Tdt),
    ("tiny_tdt_ctc", "ctc", DecoderChoice::Ctc),
];
const SETTINGS: [&str; 3] = ["c4.8_l1.6_r1.6", "c1.6_l1.6_r1.6", "c0.8_l1.6_r0.8"];

fn secs(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn pairs(v: &Value) -> Vec<(usize, usize)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_u64().unwrap() as usize,
                p[1].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

/// One buffered run of `samples` fed in pieces of `piece` samples.
fn run(
    session: Session,
    config: BufferedConfig,
    samples: &[f32],
    piece: usize,
) -> (Vec<StepRecord>, Vec<StreamEvent>) {
    let mut stream = BufferedStream::new(session, config).unwrap();
    let mut events = Vec::new();
    for p in samples.chunks(piece) {
        events.extend(stream.accept(p).unwrap());
    }
    events.extend(stream.finish().unwrap());
    (stream.take_records(), events)
}

fn finals(events: &[StreamEvent]) -> Vec<&Utterance> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Final(u) => Some(u),
            _ => None,
        })
        .collect()
}

/// Compares a run with NeMo's: every step's decoder passes (transducer: tokens and frames of
/// the chunk and right-context passes; CTC: every frame's label), the end of utterance, the
/// committed window, the overlap check, the committed tokens and their rewritten timestamps;
/// then the finals' texts and times (within one encoder frame) and their words.
fn compare(
    name: &str,
    nemo: &Value,
    records: &[StepRecord],
    events: &[StreamEvent],
    pieces: &[String],
) {
    let ctc = !nemo["steps"][0]["labels"].is_null();
    let steps = nemo["steps"].as_array().unwrap();
    assert_eq!(records.len(), steps.len(), "{name}: steps");
    // CTC's last request: NeMo's window runs past the valid frames into frames its masked
    // encoder computed from zeroed features; those are not computed here, so the tokens NeMo
    // takes from them are missing from ours (only there).
    let mut tail: Vec<usize> = Vec::new();
    for (i, (ours, theirs)) in records.iter().zip(steps).enumerate() {
        let at = format!("{name} step {i}");
        assert_eq!(ours.is_last, theirs["is_last"].as_bool().unwrap(), "{at}");
        assert_eq!(
            ours.valid_samples as u64,
            theirs["valid_samples"].as_u64().unwrap(),
            "{at}: valid samples"
        );
        assert_eq!(
            ours.encoded_len as u64,
            theirs["encoded_len"].as_u64().unwrap(),
            "{at}: encoded length"
        );
        if ctc {
            let labels = ints(&theirs["labels"]);
            assert_eq!(ours.labels[..], labels[..ours.labels.len()], "{at}: labels");
            if ours.is_last {
                let mut previous = usize::MAX;
                let end = ours.start_end.1 as usize;
                for (t, &l) in labels.iter().enumerate().take(end) {
                    if t >= ours.labels.len() && l != previous && l != pieces.len() {
                        tail.push(l);
                    }
                    previous = l;
                }
            }
        } else {
            assert_eq!(
                ours.chunk_tokens,
                pairs(&theirs["chunk"]),
                "{at}: chunk pass"
            );
            assert_eq!(
                ours.right_tokens,
                pairs(&theirs["right_context"]),
                "{at}: right-context pass"
            );
        }
        assert_eq!(ours.eou, theirs["eou"].as_bool().unwrap(), "{at}: eou");
        let se = secs(&theirs["start_end"]);
        assert_eq!(
            (ours.start_end.0 as f64, ours.start_end.1 as f64),
            (se[0], se[1]),
            "{at}: committed window"
        );
        assert_eq!(
            ours.overlap_skipped as u64,
            theirs["overlap_skipped"].as_u64().unwrap(),
            "{at}: overlap"
        );
        let mut committed = ints(&theirs["committed"]);
        let mut ts = secs(&theirs["committed_ts"]);
        let missing = if ours.is_last { tail.len() } else { 0 };
        committed.truncate(committed.len() - missing);
        ts.truncate(ts.len() - missing);
        assert_eq!(ours.committed, committed, "{at}: committed");
        assert_eq!(ours.committed_timesteps.len(), ts.len(), "{at}: timestamps");
        for (a, b) in ours.committed_timesteps.iter().zip(&ts) {
            assert!((a - b).abs() < 1e-9, "{at}: timestamps {a} against {b}");
        }
        // NeMo's step output puts a word separator before the text.
        let final_text = theirs["final"]
            .as_array()
            .unwrap()
            .first()
            .map(|g| g["text"].as_str().unwrap().trim().to_owned());
        if missing == 0 {
            assert_eq!(ours.final_text, final_text, "{at}: final text");
        }
    }
    let tail_text: String = tail.iter().map(|&id| pieces[id].as_str()).collect();
    let tail_text = tail_text.replace('\u{2581}', " ");
    let ours = finals(events);
    let theirs = nemo["final"]["segments"].as_array().unwrap();
    assert_eq!(ours.len(), theirs.len(), "{name}: finals");
    for (i, (u, g)) in ours.iter().zip(theirs).enumerate() {
        let text = g["text"].as_str().unwrap().trim();
        if i + 1 == ours.len() && !tail.is_empty() {
            assert_eq!(format!("{}{tail_text}", u.text), text, "{name}: last final");
            continue;
        }
        assert_eq!(u.text, text, "{name}: final text");
        for (a, b) in [(u.start, &g["start"]), (u.end, &g["end"])] {
            let b = b.as_f64().unwrap();
            assert!(
                (a - b).abs() <= 0.08 + 1e-9,
                "{name}: final time {a} against {b}"
            );
        }
    }
    let words: Vec<_> = ours.iter().flat_map(|u| u.words.iter()).collect();
    let nemo_words = nemo["words"].as_array().unwrap();
    // The tail's tokens change the last word (or add words).
    let comparable = if tail.is_empty() {
        assert_eq!(words.len(), nemo_words.len(), "{name}: words");
        words.len()
    } else {
        words.len().saturating_sub(1)
    };
    for (w, n) in words.iter().zip(nemo_words).take(comparable) {
        assert_eq!(w.text, n["text"].as_str().unwrap().trim(), "{name}: word");
        for (a, b) in [(w.start, &n["start"]), (w.end, &n["end"])] {
            let b = b.as_f64().unwrap();
            assert!(
                (a - b).abs() <= 0.08 + 1e-9,
                "{name}: word {} time {a} against {b}",
                w.text
            );
        }
    }
}

fn check_case(model: &str, head: &str, decoder: DecoderChoice, suffix: &str, clip: &str) {
    let samples = clip_samples(clip);
    let path = gguf(model, OutType::F32);
    for setting in SETTINGS {
        let name = format!("{model}_buffered{suffix}_{head}_{setting}");
        let nemo = json(&fixtures().join("buffered").join(format!("{name}.json")));
        let clr = secs(&nemo["chunk_left_right_secs"]);
        let config = BufferedConfig {
            chunk_secs: clr[0],
            left_secs: clr[1],
            right_secs: clr[2],
            decoder,
            record_steps: true,
        };
        let session = Session::load(&path, threads(2)).unwrap();
        let pieces = session.model().tokenizer.pieces().to_vec();
        // Pieces of an odd size, so that chunks are cut across pieces.
        let (records, events) = run(session, config, &samples, 3331);
        compare(&name, &nemo, &records, &events, &pieces);
    }
}

#[test]
fn buffered_tdt_matches_nemo_step_by_step() {
    for (suffix, clip) in CLIPS {
        check_case("tiny_tdt", "rnnt", DecoderChoice::Auto, suffix, clip);
    }
}

#[test]
fn buffered_rnnt_matches_nemo_step_by_step() {
    for (suffix, clip) in CLIPS {
        check_case("tiny_rnnt", "rnnt", DecoderChoice::Auto, suffix, clip);
    }
}

#[test]
fn buffered_ctc_matches_nemo_step_by_step() {
    for (suffix, clip) in CLIPS {
        check_case("tiny_ctc", "ctc", DecoderChoice::Auto, suffix, clip);
    }
}

#[test]
fn buffered_hybrid_heads_match_nemo_step_by_step() {
    for (suffix, clip) in CLIPS {
        check_case("tiny_tdt_ctc", "rnnt", DecoderChoice::Tdt, suffix, clip);
        check_case("tiny_tdt_ctc", "ctc", DecoderChoice::Ctc, suffix, clip);
    }
}

#[test]
fn buffered_cases_cover_every_reference() {
    let dir = fixtures().join("buffered");
    let mut covered = 0;
    for (model, head, _) in CASES {
        for (suffix, _) in CLIPS {
            for setting in SETTINGS {
                let name = format!("{model}_buffered{suffix}_{head}_{setting}.json");
                assert!(dir.join(&name).exists(), "{name}");
                covered += 1;
            }
        }
    }
    assert_eq!(covered, std::fs::read_dir(&dir).unwrap().count());
}

/// Audio that ends exactly on a chunk's border ends on a full request, which NeMo decodes as
/// the last one (through its right context to the end of the audio); the requests before it are
/// NeMo's own, as in the full clip.
#[test]
fn audio_ending_on_a_chunk_border_is_decoded_to_its_end() {
    let samples = clip_samples("speech_10s.wav");
    // Two 4.8 s requests at NeMo's default sizes.
    let cut = &samples[..2 * 76800];
    for (model, head, decoder) in [
        ("tiny_tdt", "rnnt", DecoderChoice::Auto),
        ("tiny_ctc", "ctc", DecoderChoice::Auto),
    ] {
        let name = format!("{model}_buffered_{head}_c4.8_l1.6_r1.6");
        let nemo = json(&fixtures().join("buffered").join(format!("{name}.json")));
        let config = BufferedConfig {
            chunk_secs: 4.8,
            left_secs: 1.6,
            right_secs: 1.6,
            decoder,
            record_steps: true,
        };
        let session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let (records, events) = run(session, config, cut, 3331);
        assert_eq!(records.len(), 2, "{name}");
        assert!(!records[0].is_last && records[1].is_last, "{name}");
        assert_eq!(records[1].valid_samples, 8 * 16000, "{name}");
        let first = &nemo["steps"][0];
        assert_eq!(
            records[0].committed,
            ints(&first["committed"]),
            "{name}: the first request is NeMo's"
        );
        // The right context of the last request (8.0-9.6 s) is decoded, not dropped.
        let last = finals(&events).last().copied().cloned().unwrap();
        assert!(last.end > 8.0, "{name}: the last word ends at {}", last.end);
    }
}
