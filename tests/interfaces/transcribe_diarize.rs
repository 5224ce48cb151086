//! `transcribe --diarize`: every word's speaker against the speaker NeMo's own probabilities
//! give it (the tiny Sortformers' reference dumps), cues split where the speaker changes, and
//! the speaker in JSON, SRT, VTT and TSV alike; bad model pairings refused.

use crate::common::*;
use std::path::{Path, PathBuf};

/// The ASR model beside the Sortformer (CTC: the fastest decoder of the tiny models).
const ASR: &str = "tiny_ctc";
/// The clip (one of the Sortformer references').
pub(crate) const CLIP: &str = "jfk";
/// Two speakers' scores closer than this (relative) are a tie our 1e-4 probabilities could
/// break either way: such words are not compared.
const TIE_MARGIN: f64 = 1e-3;

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(crate) fn clip() -> PathBuf {
    fixtures().join(format!("diar/audio/{CLIP}.wav"))
}

/// The speaker NeMo's probabilities (`[frames][n_spks]`, 80 ms frames) make most active over
/// `[start, end]`: every millisecond of the span counts the probabilities of the frame it falls
/// in (the last frame also covers what follows it). Returns the best speaker and whether the
/// runner-up is within [`TIE_MARGIN`].
pub(crate) fn nemo_speaker(preds: &[f32], n: usize, start: f64, end: f64) -> (usize, bool) {
    let frames = preds.len() / n;
    let (a, b) = (
        (start * 1000.0).round() as usize,
        (end * 1000.0).round() as usize,
    );
    let mut score = vec![0.0f64; n];
    let ms: Vec<usize> = if b > a { (a..b).collect() } else { vec![a] };
    for t in ms {
        let f = (t / 80).min(frames - 1);
        for (k, s) in score.iter_mut().enumerate() {
            *s += preds[f * n + k] as f64;
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| score[y].total_cmp(&score[x]).then(x.cmp(&y)));
    let (best, second) = (score[order[0]], score[order[1]]);
    (order[0], best - second <= TIE_MARGIN * best.abs().max(1e-9))
}

fn speaker(v: &serde_json::Value) -> String {
    v["speaker"].as_str().unwrap().to_string()
}

/// Transcribes the clip with `sortformer` into every format and checks them against NeMo's
/// probabilities in `preds_file`.
fn check(sortformer: &str, preds_file: &str, cache: &Path) {
    let dir = scratch_dir("transcribe-diarize", sortformer);
    let (asr, sf) = (nemo(ASR), nemo(sortformer));
    let out = run_parakeet(
        &[
            "transcribe",
            clip().to_str().unwrap(),
            "-m",
            asr.to_str().unwrap(),
            "--diarize",
            "--diar-model",
            sf.to_str().unwrap(),
            "-f",
            "json,srt,vtt,tsv",
            "-o",
            dir.to_str().unwrap(),
            "-q",
        ],
        cache,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result = json(&dir.join(format!("{CLIP}.json")));
    let (shape, preds) =
        npy(&fixtures().join(format!("diar/{sortformer}_diar/{CLIP}/{preds_file}")));
    let n = shape[1];

    // Every word's speaker is the one NeMo's probabilities make most active over it.
    let words = result["words"].as_array().unwrap();
    assert!(words.len() >= 10, "{} words", words.len());
    let (mut compared, mut speakers) = (0, std::collections::BTreeSet::new());
    for w in words {
        let (start, end) = (w["start"].as_f64().unwrap(), w["end"].as_f64().unwrap());
        let (want, tie) = nemo_speaker(&preds, n, start, end);
        speakers.insert(speaker(w));
        if tie {
            continue;
        }
        compared += 1;
        assert_eq!(
            speaker(w),
            format!("speaker_{want}"),
            "{sortformer}: word {w}"
        );
    }
    println!(
        "{sortformer}: {compared} of {} words compared, speakers {speakers:?}",
        words.len()
    );
    assert!(
        compared * 10 >= words.len() * 9,
        "{compared} words compared"
    );
    assert!(speakers.len() >= 2, "{sortformer}: speakers {speakers:?}");

    // Cues: each holds consecutive words of one speaker, and a change of speaker starts one.
    let segments = result["segments"].as_array().unwrap();
    let mut next = 0;
    for (i, s) in segments.iter().enumerate() {
        let n_words = s["text"].as_str().unwrap().split(' ').count();
        let cue = &words[next..next + n_words];
        assert!(cue.iter().all(|w| speaker(w) == speaker(s)), "cue {s}");
        if i > 0 && speaker(&segments[i - 1]) != speaker(s) {
            assert_ne!(speaker(&words[next - 1]), speaker(&words[next]));
        }
        if next > 0 && speaker(&words[next - 1]) != speaker(&words[next]) {
            assert_ne!(speaker(&segments[i - 1]), speaker(s), "cue {i} not split");
        }
        next += n_words;
    }
    assert_eq!(next, words.len());
    assert!(segments.len() >= 3);

    // The same speakers in the subtitles and the TSV, cue by cue.
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{CLIP}.{ext}"))).unwrap();
    let srt = read("srt");
    let srt_speakers: Vec<&str> = srt
        .split("\n\n")
        .map(|cue| {
            let line = cue.lines().nth(2).unwrap();
            line.strip_prefix('[').unwrap().split(']').next().unwrap()
        })
        .collect();
    let vtt = read("vtt");
    let vtt_speakers: Vec<&str> = vtt
        .split("\n\n")
        .skip(1)
        .map(|cue| {
            let line = cue.lines().nth(1).unwrap();
            line.strip_prefix("<v ").unwrap().split('>').next().unwrap()
        })
        .collect();
    let tsv = read("tsv");
    let mut rows = tsv.lines();
    // Confidence (computed for JSON and TSV) comes before the speaker.
    assert_eq!(rows.next(), Some("start\tend\ttext\tconfidence\tspeaker"));
    let tsv_speakers: Vec<&str> = rows.map(|r| r.rsplit('\t').next().unwrap()).collect();
    let json_speakers: Vec<String> = segments.iter().map(speaker).collect();
    assert_eq!(srt_speakers, json_speakers);
    assert_eq!(vtt_speakers, json_speakers);
    assert_eq!(tsv_speakers, json_speakers);
    assert!(result["timings"]["diarization"].as_f64().unwrap() > 0.0);
}

#[test]
fn words_get_the_speaker_nemos_probabilities_give_them() {
    let cache = scratch_dir("transcribe-diarize", "cache");
    // The offline model sees the whole clip; the streaming one streams with NeMo's
    // inference sizes.
    check("tiny_sortformer", "preds.npy", &cache);
    check(
        "tiny_sortformer_stream",
        "stream_published_preds.npy",
        &cache,
    );
}

#[test]
fn model_pairings_the_wrong_way_round_are_refused() {
    let cache = scratch_dir("transcribe-diarize", "bad-cache");
    let dir = scratch_dir("transcribe-diarize", "bad");
    let (asr, sf) = (nemo(ASR), nemo("tiny_sortformer"));
    let (asr, sf) = (asr.to_str().unwrap(), sf.to_str().unwrap());
    let clip = clip();
    let clip = clip.to_str().unwrap();
    let o = dir.to_str().unwrap();
    let named = format!("--diar-model {asr}: ");
    for (model, diar_model, says) in [
        (asr, asr, "not a Sortformer diarization model"),
        (asr, asr, named.as_str()),
        (sf, sf, "not a speech recognition model"),
    ] {
        let out = run_parakeet(
            &[
                "transcribe",
                clip,
                "-m",
                model,
                "--diar-model",
                diar_model,
                "-f",
                "json",
                "-o",
                o,
            ],
            &cache,
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
    }
}
