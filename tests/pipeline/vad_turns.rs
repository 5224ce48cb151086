//! The VAD's end of turn in live transcription (`stream --vad`), over a cache-aware and an
//! offline (buffered) model: on a clip of two utterances a second apart
//! (tests/fixtures/vad_turns/two_turns.wav, scripts/make_vad_turns_fixture.py), the turns fall
//! exactly on the `VADIterator`'s events (our port, equal to the package's on every shared
//! clip), each turn's final has the text of streaming that turn's audio alone, and nothing is
//! transcribed outside the turns.

use crate::common::gguf;
use crate::common::turns::{RATE, alone, iterator_turns, live, two_turns};
use parakeet::convert::OutType;
use parakeet::model::Model;
use parakeet::stream::StreamEvent;
use parakeet::stream::turns::{TurnEvent, TurnParams, VadTurns};
use parakeet::vad::VadModel;
use std::sync::Arc;

fn check(model_name: &str) {
    let model = Arc::new(Model::load(&gguf(model_name, OutType::F32)).unwrap());
    let samples = two_turns();
    let params = TurnParams::default();
    let want = iterator_turns(&samples, &params);
    assert_eq!(want.len(), 2, "{model_name}: the clip's VAD turns {want:?}");
    let mut turns = VadTurns::new(live(&model), VadModel::builtin().unwrap(), params).unwrap();
    // Pieces that are not whole VAD windows, as a pipe delivers them.
    let mut events = Vec::new();
    for piece in samples.chunks(3001) {
        events.extend(turns.accept_turns(piece).unwrap());
    }
    events.extend(turns.finish_turns().unwrap());

    // Boundaries in order; the transcriber hears only the turns, so every final is a turn's.
    let mut got = Vec::new();
    let mut finals = Vec::new();
    let mut open: Option<usize> = None;
    for e in &events {
        match e {
            TurnEvent::SpeechStarted(s) => {
                assert!(open.is_none(), "{model_name}: a start inside a turn");
                open = Some(*s);
            }
            TurnEvent::SpeechStopped(end) => got.push((open.take().unwrap(), *end)),
            TurnEvent::Transcript(StreamEvent::Final(u)) => finals.push(u.clone()),
            TurnEvent::Transcript(StreamEvent::Partial(_)) => {}
        }
    }
    assert_eq!(
        got, want,
        "{model_name}: turns against the VADIterator's events"
    );
    assert_eq!(finals.len(), 2, "{model_name}: finals {finals:?}");
    for (i, &(s, e)) in want.iter().enumerate() {
        let u = &finals[i];
        // The tiny model ends no utterance itself: one final alone, as in the turn.
        let solo = alone(&model, &samples[s..e]);
        assert_eq!(solo.len(), 1, "{model_name}: turn {i} alone: {solo:?}");
        let solo = &solo[0];
        assert!(!solo.text.is_empty(), "{model_name}: turn {i} has no text");
        assert_eq!(
            u.text, solo.text,
            "{model_name}: turn {i} against streaming it alone"
        );
        assert_eq!(u.start, s as f64 / RATE, "{model_name}: turn {i} start");
        assert_eq!(u.end, e as f64 / RATE, "{model_name}: turn {i} end");
        // Words on the stream's clock: alone's moved by the turn's start.
        assert_eq!(u.words.len(), solo.words.len());
        for (w, a) in u.words.iter().zip(&solo.words) {
            assert_eq!(w.text, a.text);
            let offset = s as f64 / RATE;
            assert!((w.start - (a.start + offset)).abs() < 1e-9, "{w:?} {a:?}");
            assert!((w.end - (a.end + offset)).abs() < 1e-9, "{w:?} {a:?}");
        }
    }
}

#[test]
fn vad_turns_of_a_cache_aware_model_match_the_iterator_and_streaming_alone() {
    check("tiny_stream_tdt_ctc");
}

#[test]
fn vad_turns_of_an_offline_model_match_the_iterator_and_streaming_alone() {
    check("tiny_tdt");
}

/// The padding before a start reaches back across pieces, an end whose padding is longer than
/// the silence (the next start before it) ends the turn where the next one starts, and a
/// finish mid-speech ends the turn at the end of the audio.
#[test]
fn long_padding_and_a_finish_mid_speech_keep_turns_apart() {
    let model = Arc::new(Model::load(&gguf("tiny_tdt", OutType::F32)).unwrap());
    let samples = two_turns();
    let params = TurnParams {
        threshold: 0.5,
        min_silence_ms: 100.0,
        speech_pad_ms: 400.0,
    };
    let mut turns = VadTurns::new(live(&model), VadModel::builtin().unwrap(), params).unwrap();
    let cut = samples.len() - 16000;
    let mut events = turns.accept_turns(&samples[..cut]).unwrap();
    assert!(turns.in_turn(), "speech goes on at the cut");
    events.extend(turns.finish_turns().unwrap());
    let mut last_end = 0;
    let mut starts = 0;
    for e in &events {
        match e {
            TurnEvent::SpeechStarted(s) => {
                assert!(
                    *s >= last_end,
                    "a start at {s} before the last end {last_end}"
                );
                starts += 1;
            }
            TurnEvent::SpeechStopped(e) => last_end = *e,
            TurnEvent::Transcript(_) => {}
        }
    }
    assert!(starts >= 2, "{events:?}");
    assert_eq!(last_end, cut, "the last turn ends at the end of the audio");
    assert!(!turns.in_turn());
}
