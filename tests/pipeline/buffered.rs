//! NeMo's buffered streaming of offline models (`BufferedRNNTPipeline`, `BufferedCTCPipeline`)
//! against NeMo 3.0's step-by-step outputs (`tests/fixtures/buffered/`, copied small from the
//! shared references by `scripts/extract_buffered_fixtures.py`): every model, head, setting and
//! clip, step by step.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::decoder::boosting::{BoostingConfig, BoostingTree};
use parakeet::decoder::confidence::ConfidenceConfig;
use parakeet::encoder::Encoded;
use parakeet::session::{DecodeOptions, DecodeRequest, DecoderChoice, Session};
use parakeet::stream::{
    BufferSizes, BufferedConfig, BufferedStream, LiveTranscriber, StepRecord, StreamEvent,
    Utterance,
};
use serde_json::Value;
use std::sync::Arc;

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

/// One buffered run of `samples` fed in pieces of `piece` samples: the steps, the events and,
/// for each event, the seconds of audio its step had decoded (through the step's chunk, or to
/// the end of the input for the last), past which no time may lie.
fn run(
    session: Session,
    config: BufferedConfig,
    samples: &[f32],
    piece: usize,
) -> (Vec<StepRecord>, Vec<StreamEvent>, Vec<f64>) {
    let mut stream = BufferedStream::new(session, config).unwrap();
    let chunk = stream.sizes().chunk_samples;
    let (mut records, mut events, mut heard) = (Vec::new(), Vec::new(), Vec::new());
    let mut given = 0;
    for p in samples.chunks(piece) {
        given += p.len();
        let got = stream.accept(p).unwrap();
        records.extend(stream.take_records());
        let decoded = (records.len() * chunk).min(given);
        heard.extend(got.iter().map(|_| seconds(&samples[..decoded])));
        events.extend(got);
    }
    let got = stream.finish().unwrap();
    records.extend(stream.take_records());
    heard.extend(got.iter().map(|_| seconds(samples)));
    events.extend(got);
    (records, events, heard)
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
/// the chunk and right-context passes; CTC: every frame's label, the last buffer's frames past
/// the audio included), the end of utterance, the committed window, the overlap check, the
/// committed tokens and their rewritten timestamps; then the finals' texts and times (within
/// one encoder frame) and their words. NeMo's times past the audio its step had decoded
/// (`heard`, per event: its last buffer decodes the padding, its word ends snap forward, and
/// its timestamp rewriting can move tokens later) are ours clamped to it, and no time of any
/// event (partials too) lies past it.
fn compare(
    name: &str,
    nemo: &Value,
    records: &[StepRecord],
    events: &[StreamEvent],
    heard: &[f64],
) {
    let ctc = !nemo["steps"][0]["labels"].is_null();
    let steps = nemo["steps"].as_array().unwrap();
    assert_eq!(records.len(), steps.len(), "{name}: steps");
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
            assert_eq!(ours.labels, ints(&theirs["labels"]), "{at}: labels");
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
        let committed = ints(&theirs["committed"]);
        let ts = secs(&theirs["committed_ts"]);
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
        assert_eq!(ours.final_text, final_text, "{at}: final text");
    }
    let near = |what: &str, a: f64, b: &Value, heard: f64| {
        let b = b.as_f64().unwrap().min(heard);
        assert!(
            (a - b).abs() <= 0.08 + 1e-9,
            "{name}: {what} time {a} against NeMo's {b} (clamped to the {heard} s heard)"
        );
    };
    let ours: Vec<(&Utterance, f64)> = events
        .iter()
        .zip(heard)
        .filter_map(|(e, &h)| match e {
            StreamEvent::Final(u) => Some((u, h)),
            _ => None,
        })
        .collect();
    let theirs = nemo["final"]["segments"].as_array().unwrap();
    assert_eq!(ours.len(), theirs.len(), "{name}: finals");
    for ((u, h), g) in ours.iter().zip(theirs) {
        assert_eq!(
            u.text,
            g["text"].as_str().unwrap().trim(),
            "{name}: final text"
        );
        near("final", u.start, &g["start"], *h);
        near("final", u.end, &g["end"], *h);
    }
    let words: Vec<_> = ours
        .iter()
        .flat_map(|(u, h)| u.words.iter().map(move |w| (w, *h)))
        .collect();
    let nemo_words = nemo["words"].as_array().unwrap();
    assert_eq!(words.len(), nemo_words.len(), "{name}: words");
    for (u, _) in &ours {
        let squeezed = |s: &str| s.split_whitespace().collect::<String>();
        let joined: String = u.words.iter().map(|w| squeezed(&w.text)).collect();
        assert_eq!(
            joined,
            squeezed(&u.text),
            "{name}: a final's words and its text"
        );
    }
    for ((w, h), n) in words.iter().zip(nemo_words) {
        // NeMo's word offsets keep a run of marks its printed text cuts to the last; ours
        // follow the text.
        let nemo_word = cut_mark_runs(n["text"].as_str().unwrap().trim());
        assert_eq!(w.text, nemo_word, "{name}: word");
        near(&w.text, w.start, &n["start"], *h);
        near(&w.text, w.end, &n["end"], *h);
    }
    assert_within(name, events, heard);
}

/// No time of any event (utterances and their words, partials and finals) past the seconds
/// of audio heard when it came.
fn assert_within(name: &str, events: &[StreamEvent], heard: &[f64]) {
    assert_eq!(events.len(), heard.len());
    for (e, &seconds) in events.iter().zip(heard) {
        let (StreamEvent::Partial(u) | StreamEvent::Final(u)) = e;
        let times = [u.start, u.end]
            .into_iter()
            .chain(u.words.iter().flat_map(|w| [w.start, w.end]));
        for t in times {
            assert!(
                (0.0..=seconds).contains(&t),
                "{name}: a time at {t} s after {seconds} s of audio: {u:?}"
            );
        }
    }
}

/// `text` with each run of punctuation marks (the apostrophe is none) cut to its last, as
/// NeMo prints a final segment.
fn cut_mark_runs(text: &str) -> String {
    let is_mark = |c: char| c.is_ascii_punctuation() && c != '\'';
    let chars: Vec<char> = text.chars().collect();
    chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| !(is_mark(c) && chars.get(i + 1).is_some_and(|&n| is_mark(n))))
        .map(|(_, &c)| c)
        .collect()
}

/// NeMo's run `name` and the config that repeats it with `decoder`, recording every step.
fn reference(name: &str, decoder: DecoderChoice) -> (Value, BufferedConfig) {
    let nemo = json(&fixtures().join("buffered").join(format!("{name}.json")));
    let clr = secs(&nemo["chunk_left_right_secs"]);
    let config = BufferedConfig {
        chunk_secs: clr[0],
        left_secs: clr[1],
        right_secs: clr[2],
        decoder,
        record_steps: true,
    };
    (nemo, config)
}

fn check_case(model: &str, head: &str, decoder: DecoderChoice, suffix: &str, clip: &str) {
    let samples = clip_samples(clip);
    let path = gguf(model, OutType::F32);
    for setting in SETTINGS {
        let name = format!("{model}_buffered{suffix}_{head}_{setting}");
        let (nemo, config) = reference(&name, decoder);
        let session = Session::load(&path, threads(2)).unwrap();
        // Pieces of an odd size, so that chunks are cut across pieces.
        let (records, events, heard) = run(session, config, &samples, 3331);
        compare(&name, &nemo, &records, &events, &heard);
    }
}

fn seconds(samples: &[f32]) -> f64 {
    samples.len() as f64 / 16000.0
}

/// The clips of the end-of-stream references (`scripts/buffered_end_references.py` cuts the
/// same samples from the same file): a stream that ends inside a word, in digital silence,
/// before one chunk is full, and exactly at a chunk's end; with the settings each was run at.
fn end_clips() -> Vec<(&'static str, Vec<f32>, &'static [&'static str])> {
    let clip = clip_samples("speech_10s.wav");
    let both: &[&str] = &["c4.8_l1.6_r1.6", "c0.8_l1.6_r0.8"];
    let mut silence = clip[..47360].to_vec();
    silence.resize(47360 + 24000, 0.0);
    vec![
        ("cut_word", clip[..88000].to_vec(), both),
        ("cut_silence", silence, both),
        ("cut_short", clip[..9920].to_vec(), both),
        ("cut_chunk4.8", clip[..76800].to_vec(), &["c4.8_l1.6_r1.6"]),
        ("cut_chunk0.8", clip[..12800].to_vec(), &["c0.8_l1.6_r0.8"]),
    ]
}

/// The end of a stream as NeMo 3.0's pipelines end it, step by step, for every model and head
/// (CTC's last buffer decoded to its end, over the frames NeMo's masked encoder computes past
/// the audio), with no time past the end of the audio.
#[test]
fn buffered_stream_ends_match_nemo_step_by_step() {
    let mut compared = 0;
    for (model, head, decoder) in CASES {
        let path = gguf(model, OutType::F32);
        for (clip, samples, settings) in end_clips() {
            for setting in settings {
                let name = format!("{model}_buffered_{clip}_{head}_{setting}");
                let (nemo, config) = reference(&name, decoder);
                assert_eq!(
                    nemo["audio_samples"].as_u64(),
                    Some(samples.len() as u64),
                    "{name}: the clip NeMo ran"
                );
                let session = Session::load(&path, threads(2)).unwrap();
                let (records, events, heard) = run(session, config, &samples, 3331);
                compare(&name, &nemo, &records, &events, &heard);
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 5 * 8);
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
    for setting in PUNCTUATION_SETTINGS {
        let name = format!("tiny_tdt_punct_buffered_rnnt_{setting}.json");
        assert!(dir.join(&name).exists(), "{name}");
        covered += 1;
    }
    for (model, head, _) in CASES {
        for (clip, _, settings) in end_clips() {
            for setting in settings {
                let name = format!("{model}_buffered_{clip}_{head}_{setting}.json");
                assert!(dir.join(&name).exists(), "{name}");
                covered += 1;
            }
        }
    }
    let references = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(covered, references);
}

/// NeMo's runs of a model whose vocabulary has punctuation (`tiny_tdt_punct`, made as
/// `tests/fixtures/buffered/README.md` says).
const PUNCTUATION_SETTINGS: [&str; 2] = ["c4.8_l1.6_r1.6", "c0.8_l1.6_r0.8"];

/// With punctuation in the vocabulary, NeMo's transducer pipeline moves a mark's time onto
/// the piece before it (which changes what a step commits and where an utterance ends), and
/// its texts lose the space before a mark (finals also cut a run of marks to its last): every
/// step, final, word and time as NeMo's, and each partial text the step's.
#[test]
fn buffered_punctuation_matches_nemo_step_by_step() {
    let samples = clip_samples(CLIPS[0].1);
    let path = gguf("tiny_tdt_punct", OutType::F32);
    for setting in PUNCTUATION_SETTINGS {
        let name = format!("tiny_tdt_punct_buffered_rnnt_{setting}");
        let (nemo, config) = reference(&name, DecoderChoice::Auto);
        // The reference is one with punctuation: words with each mark.
        let words: Vec<&str> = nemo["words"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["text"].as_str().unwrap())
            .collect();
        for mark in [".", ",", "?"] {
            assert!(words.iter().any(|w| w.contains(mark)), "{name}: no {mark}");
        }
        let session = Session::load(&path, threads(2)).unwrap();
        let (records, events, heard) = run(session, config, &samples, 3331);
        compare(&name, &nemo, &records, &events, &heard);
        let steps = nemo["steps"].as_array().unwrap();
        let mut before = "";
        let mut partials = 0;
        for (i, (ours, theirs)) in records.iter().zip(steps).enumerate() {
            let partial = theirs["partial"].as_str().unwrap();
            if let Some(text) = &ours.partial_text {
                assert_eq!(text, partial.trim(), "{name} step {i}: partial");
                partials += 1;
            } else if !partial.is_empty() {
                assert_eq!(partial, before, "{name} step {i}: a partial NeMo changed");
            }
            before = partial;
        }
        assert!(partials > 0, "{name}: no partial");
    }
}

/// The chunk passes of one stream's steps, in order, as one encoder projection.
#[derive(Default)]
struct ChunkPasses {
    /// `[frames][width]`.
    rows: Vec<f32>,
    frames: usize,
    /// Each chunk token's stream-wide `(id, frame)` and confidence.
    tokens: Vec<(usize, usize)>,
    confidences: Vec<f64>,
}

fn chunk_passes(records: &[StepRecord], sizes: &BufferSizes) -> ChunkPasses {
    let ChunkPasses {
        mut rows,
        mut frames,
        mut tokens,
        mut confidences,
    } = ChunkPasses::default();
    for r in records {
        let w = r.rows.len() / r.encoded_len;
        let decodable = r.encoded_len - sizes.left_frames;
        let n_c = if r.is_last {
            decodable
        } else {
            decodable.min(sizes.chunk_frames)
        };
        let from = sizes.left_frames;
        rows.extend_from_slice(&r.rows[from * w..(from + n_c) * w]);
        tokens.extend(r.chunk_tokens.iter().map(|&(id, t)| (id, frames + t)));
        confidences.extend_from_slice(&r.chunk_confidences);
        frames += n_c;
    }
    ChunkPasses {
        rows,
        frames,
        tokens,
        confidences,
    }
}

/// With phrases and confidence, a buffered stream's chunk passes are one greedy search over
/// the chunks' frames: the tree state carried from chunk to chunk (and copied into each right
/// context's pass) gives the tokens and confidences of our offline boosted decode of the same
/// frames, which boosting changes.
#[test]
fn buffered_boosting_and_confidence_carry_across_chunks() {
    let boost = BoostingConfig {
        phrases: ["data", "date", "dinner", "the cat"]
            .map(String::from)
            .to_vec(),
        alpha: 1.0,
        ..BoostingConfig::default()
    };
    let confidence = ConfidenceConfig::default();
    let samples = clip_samples(CLIPS[0].1);
    for model in ["tiny_tdt", "tiny_rnnt"] {
        let path = gguf(model, OutType::F32);
        for (chunk_secs, left_secs, right_secs) in [(1.6, 1.6, 1.6), (0.8, 1.6, 0.8)] {
            let name = format!("{model} {chunk_secs},{left_secs},{right_secs}");
            let config = BufferedConfig {
                chunk_secs,
                left_secs,
                right_secs,
                record_steps: true,
                ..BufferedConfig::default()
            };
            let session = Session::load(&path, threads(2)).unwrap();
            let tree = BoostingTree::new(session.model().tokenizer(), &boost).unwrap();
            let mut stream = BufferedStream::new(session, config).unwrap();
            stream.set_boost(Some(Arc::new(tree))).unwrap();
            stream.set_confidence(Some(confidence));
            let mut events = Vec::new();
            for p in samples.chunks(3331) {
                events.extend(stream.accept(p).unwrap());
            }
            events.extend(stream.finish().unwrap());
            let sizes = *stream.sizes();
            let ChunkPasses {
                rows,
                frames,
                tokens,
                confidences,
            } = chunk_passes(&stream.take_records(), &sizes);
            let enc = Encoded {
                frames,
                d_model: 0,
                output: Vec::new(),
                joint_enc: Some(rows),
                ctc_logits: None,
                layers: Vec::new(),
            };
            let mut session = Session::load(&path, threads(2)).unwrap();
            let request = DecodeRequest {
                boost: Some(boost.clone()),
                confidence: Some(confidence),
                ..DecodeRequest::default()
            };
            let opts = DecodeOptions::new(session.model(), &request).unwrap();
            let offline = session.decode(&enc, &opts).unwrap();
            let offline_tokens: Vec<(usize, usize)> =
                offline.tokens.iter().map(|t| (t.id, t.frame)).collect();
            assert_eq!(tokens, offline_tokens, "{name}: boosted tokens");
            let offline_confidence = offline.token_confidence.unwrap();
            assert_eq!(confidences.len(), offline_confidence.len(), "{name}");
            for (a, b) in confidences.iter().zip(&offline_confidence) {
                assert!((a - b).abs() < 1e-6, "{name}: confidence {a} against {b}");
            }
            let plain = session
                .decode(&enc, &DecodeOptions::greedy(session.model()).unwrap())
                .unwrap();
            let plain: Vec<(usize, usize)> = plain.tokens.iter().map(|t| (t.id, t.frame)).collect();
            assert_ne!(tokens, plain, "{name}: the phrases changed nothing");
            // Every word of a final carries its tokens' confidence.
            let words: Vec<_> = finals(&events).into_iter().flat_map(|u| &u.words).collect();
            assert!(!words.is_empty(), "{name}");
            for w in words {
                let c = w.confidence.unwrap();
                assert!((0.0..=1.0).contains(&c), "{name}: {} {c}", w.text);
            }
        }
    }
}

/// CTC token confidence as NeMo's buffered CTC pipeline measures it (each token on the frame it
/// starts at; `confidence:` entropy, Tsallis, alpha 0.5, exp, averaged over a segment): every
/// final's `conf`, the last one's tokens from frames past the audio included.
#[test]
fn buffered_ctc_confidence_matches_nemos_segments() {
    let confidence = ConfidenceConfig {
        measure: "entropy_tsallis_exp".parse().unwrap(),
        alpha: 0.5,
        aggregation: "mean".parse().unwrap(),
        ..ConfidenceConfig::default()
    };
    let samples = clip_samples(CLIPS[0].1);
    let mut compared = 0;
    for (model, decoder) in [
        ("tiny_ctc", DecoderChoice::Auto),
        ("tiny_tdt_ctc", DecoderChoice::Ctc),
    ] {
        let path = gguf(model, OutType::F32);
        for setting in SETTINGS {
            let name = format!("{model}_buffered_ctc_{setting}");
            let (nemo, config) = reference(&name, decoder);
            let session = Session::load(&path, threads(2)).unwrap();
            let mut stream = BufferedStream::new(session, config).unwrap();
            stream.set_confidence(Some(confidence));
            for p in samples.chunks(3331) {
                stream.accept(p).unwrap();
            }
            stream.finish().unwrap();
            // Each final's tokens: committed since the last end of utterance.
            let mut segments: Vec<Vec<f64>> = Vec::new();
            let mut open: Vec<f64> = Vec::new();
            for r in stream.take_records() {
                open.extend_from_slice(&r.committed_confidences);
                if r.eou {
                    if !open.is_empty() {
                        segments.push(std::mem::take(&mut open));
                    }
                    open.clear();
                }
            }
            let theirs = nemo["final"]["segments"].as_array().unwrap();
            assert_eq!(segments.len(), theirs.len(), "{name}: segments");
            for (ours, g) in segments.iter().zip(theirs) {
                let mean = ours.iter().sum::<f64>() / ours.len() as f64;
                let conf = g["conf"].as_f64().unwrap();
                assert!(
                    (mean - conf).abs() < 1e-7 + 1e-4 * conf.abs(),
                    "{name}: segment confidence {mean} against NeMo's {conf}"
                );
                compared += 1;
            }
        }
    }
    assert!(compared >= 2, "{compared} segments compared");
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
        let (nemo, config) = reference(&name, decoder);
        let session = Session::load(&gguf(model, OutType::F32), threads(2)).unwrap();
        let (records, events, _) = run(session, config, cut, 3331);
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

/// One stream over `samples` in pieces smaller than a chunk (so a step's events come from one
/// `accept`), with `limit` seconds before an utterance is cut. Returns the step records and,
/// per step, the events it gave; checks on the way that the events report every committed
/// token once: each final the committed tokens after the ones reported before, each partial
/// all the rest.
fn long_run(
    path: &std::path::Path,
    decoder: DecoderChoice,
    samples: &[f32],
    limit: Option<f64>,
) -> (Vec<StepRecord>, Vec<StreamEvent>) {
    let config = BufferedConfig {
        chunk_secs: 1.6,
        decoder,
        record_steps: true,
        ..BufferedConfig::default()
    };
    let mut stream = BufferedStream::new(Session::load(path, threads(2)).unwrap(), config).unwrap();
    stream.set_max_utterance_seconds(limit);
    let (mut records, mut events) = (Vec::new(), Vec::new());
    let (mut committed, mut reported) = (Vec::new(), Vec::new());
    let ids = |u: &Utterance| u.tokens.iter().map(|t| t.id).collect::<Vec<_>>();
    let pieces = samples.chunks(3331).map(Some).chain([None]);
    for piece in pieces {
        let got = match piece {
            Some(p) => stream.accept(p).unwrap(),
            None => stream.finish().unwrap(),
        };
        let steps = stream.take_records();
        assert!(steps.len() <= 1, "one step an accept");
        for r in &steps {
            committed.extend_from_slice(&r.committed);
        }
        records.extend(steps);
        for e in &got {
            match e {
                StreamEvent::Final(u) => {
                    reported.extend(ids(u));
                    assert_eq!(
                        reported[..],
                        committed[..reported.len()],
                        "a final repeats or skips tokens"
                    );
                }
                StreamEvent::Partial(u) => {
                    assert_eq!(ids(u), committed[reported.len()..], "a partial");
                }
            }
        }
        events.extend(got);
    }
    assert_eq!(reported, committed, "the finals report every token once");
    (records, events)
}

/// A minute of speech with no end of utterance NeMo's endpointer hears: with utterances cut
/// every few seconds the stream keeps a bounded number of tokens (the unreported ones and the
/// last three the duplicate-token check compares), and NeMo's decoding is the same as with the
/// whole utterance kept (every step's tokens, timestamps and overlap check); the cut finals and
/// the partials between them report each token once.
#[test]
fn a_long_utterance_keeps_a_bounded_token_list() {
    // The clip repeated, with noise in its pauses.
    let clip = clip_samples("speech_10s.wav");
    let mut seed = 1u32;
    let samples: Vec<f32> = (0..6 * clip.len())
        .map(|i| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            clip[i % clip.len()] + 0.05 * ((seed >> 8) as f32 / (1 << 24) as f32 - 0.5)
        })
        .collect();
    for (model, decoder) in [
        ("tiny_tdt", DecoderChoice::Auto),
        ("tiny_ctc", DecoderChoice::Auto),
    ] {
        let path = gguf(model, OutType::F32);
        let (whole, whole_events) = long_run(&path, decoder, &samples, None);
        let (cut, cut_events) = long_run(&path, decoder, &samples, Some(2.0));
        assert_eq!(whole.len(), cut.len(), "{model}: steps");
        for (i, (a, b)) in whole.iter().zip(&cut).enumerate() {
            let at = format!("{model} step {i}");
            assert_eq!(a.committed, b.committed, "{at}: committed");
            assert_eq!(
                a.committed_timesteps, b.committed_timesteps,
                "{at}: timesteps"
            );
            assert_eq!(a.overlap_skipped, b.overlap_skipped, "{at}: overlap");
            assert_eq!((a.eou, a.start_end), (b.eou, b.start_end), "{at}: window");
        }
        let most = |r: &[StepRecord]| r.iter().map(|r| r.kept_tokens).max().unwrap();
        let (grown, bounded) = (most(&whole), most(&cut));
        // 2 s of this model's tokens, the three compared, and one step's commit past the limit.
        assert!(bounded <= 60, "{model}: {bounded} tokens kept with cuts");
        assert!(
            grown > 4 * bounded,
            "{model}: the utterance grew to only {grown} tokens"
        );
        let finals = |e: &[StreamEvent]| {
            e.iter()
                .filter(|e| matches!(e, StreamEvent::Final(_)))
                .count()
        };
        assert!(
            finals(&cut_events) > 3 * finals(&whole_events).max(1),
            "{model}: the limit cut nothing"
        );
    }
}

/// The events of one live stream (both kinds, through `open_live`) over `samples` in pieces
/// of 3331 samples, each with the seconds of audio given when it came.
fn live_events(
    stream: &mut dyn LiveTranscriber,
    samples: &[f32],
) -> parakeet::error::Result<Vec<(StreamEvent, f64)>> {
    let mut out = Vec::new();
    let mut given = 0;
    for p in samples.chunks(3331) {
        given += p.len();
        let at = seconds(&samples[..given]);
        out.extend(stream.accept(p)?.into_iter().map(|e| (e, at)));
    }
    let at = seconds(samples);
    out.extend(stream.finish()?.into_iter().map(|e| (e, at)));
    Ok(out)
}

/// No time of a live stream's events lies past the audio given: the cases where NeMo's
/// buffered pipeline (decoding the last buffer's padding, rewriting timestamps) and the
/// cache-aware stream's last chunk put words after it: 1.0 s of speech and of silence, 10 s,
/// 62.1 s and 3.12 s, on buffered streaming's transducer and CTC and on a cache-aware model.
/// Audio too short for one feature frame is refused with `transcribe`'s error, and the stream
/// goes on as a new one.
#[test]
fn live_times_stay_inside_the_audio_and_too_short_is_refused() {
    use parakeet::model::Model;
    use parakeet::stream::open::{LiveOptions, open_live};
    let clip = clip_samples("speech_10s.wav");
    let speech = |n: usize| -> Vec<f32> { clip.iter().cycle().take(n).copied().collect() };
    for model in [
        "tiny_tdt",
        "tiny_ctc",
        "tiny_stream_rnnt",
        "tiny_stream_tdt_ctc",
    ] {
        let path = gguf(model, OutType::F32);
        let m = Arc::new(Model::load(&path).unwrap());
        let options = LiveOptions::defaults(&m, threads(2)).unwrap();
        let mut stream = open_live(&m, &options).unwrap();
        let mut cases = vec![
            ("speech 1.0 s", speech(16000)),
            ("silence 1.0 s", vec![0.0; 16000]),
            ("speech 10 s", speech(160_000)),
            ("speech 3.12 s", speech(49920)),
        ];
        if model == "tiny_tdt" || model == "tiny_stream_rnnt" {
            cases.push(("speech 62.1 s", speech(993_600)));
        }
        let mut events = 0;
        for (what, samples) in &cases {
            for (e, heard) in live_events(stream.as_mut(), samples).unwrap() {
                let (StreamEvent::Partial(u) | StreamEvent::Final(u)) = &e;
                let times = [u.start, u.end]
                    .into_iter()
                    .chain(u.words.iter().flat_map(|w| [w.start, w.end]));
                for t in times {
                    assert!(
                        (0.0..=heard).contains(&t),
                        "{model} {what}: {t} s after {heard} s: {u:?}"
                    );
                }
                events += 1;
            }
        }
        assert!(events > 0, "{model}: no event");
        // One sample: transcribe's error, then the stream starts afresh.
        let mut session = Session::load(&path, threads(1)).unwrap();
        let greedy = DecodeOptions::greedy(session.model()).unwrap();
        let offline = session.transcribe(vec![0.25], &greedy).unwrap_err();
        let live = live_events(stream.as_mut(), &[0.25]).unwrap_err();
        assert_eq!(live.to_string(), offline.to_string(), "{model}");
        assert!(live.to_string().contains("too short"), "{live}");
        let again = live_events(stream.as_mut(), &speech(16000)).unwrap();
        for (e, heard) in again {
            let (StreamEvent::Partial(u) | StreamEvent::Final(u)) = &e;
            assert!(u.end <= heard, "{model}: after the refusal: {u:?}");
        }
    }
}
