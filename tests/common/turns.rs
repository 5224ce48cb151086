//! The end-of-turn tests' clip and what they compare with: two utterances a second apart
//! (tests/fixtures/vad_turns/two_turns.wav, made by scripts/make_vad_turns_fixture.py), the
//! `VADIterator`'s turns over it, and each turn streamed alone.

use super::{fixtures, threads};
use parakeet::model::Model;
use parakeet::stream::open::{LiveOptions, open_live};
use parakeet::stream::turns::TurnParams;
use parakeet::stream::{LiveTranscriber, StreamEvent, Utterance};
use parakeet::vad::{SampleRate, Vad, VadEvent, VadIterator, VadModel, VadState};
use std::sync::Arc;

pub const RATE: f64 = 16000.0;

pub fn two_turns() -> Vec<f32> {
    let path = fixtures().join("vad_turns/two_turns.wav");
    parakeet::audio::load_audio(&path).unwrap().samples
}

/// The `VADIterator`'s events over the whole clip, window by window, as `(start, end)` pairs.
pub fn iterator_turns(samples: &[f32], params: &TurnParams) -> Vec<(usize, usize)> {
    let rate = SampleRate::Hz16000;
    let w = rate.window();
    let mut vad = Vad::new(VadModel::builtin().unwrap(), threads(1)).unwrap();
    let mut state = VadState::new(rate);
    let whole = samples.len() / w * w;
    let probs = vad.process(&mut state, &samples[..whole]).unwrap();
    let mut iter = VadIterator::new(
        params.threshold,
        16000,
        params.min_silence_ms,
        params.speech_pad_ms,
    );
    let mut turns = Vec::new();
    let mut start = None;
    for p in probs {
        match iter.push(p, w) {
            Some(VadEvent::Start(s)) => start = Some(s),
            Some(VadEvent::End(e)) => turns.push((start.take().unwrap(), e)),
            None => {}
        }
    }
    assert!(start.is_none(), "speech open at the end of the clip");
    turns
}

pub fn live(model: &Arc<Model>) -> Box<dyn LiveTranscriber + Send> {
    let options = LiveOptions::defaults(model, threads(1)).unwrap();
    open_live(model, &options).unwrap()
}

/// The finals of streaming `samples` alone through a fresh transcriber.
pub fn alone(model: &Arc<Model>, samples: &[f32]) -> Vec<Utterance> {
    let mut t = live(model);
    let mut events = t.accept(samples).unwrap();
    events.extend(t.finish().unwrap());
    events
        .into_iter()
        .filter_map(|e| match e {
            StreamEvent::Final(u) => Some(u),
            _ => None,
        })
        .collect()
}
