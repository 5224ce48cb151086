//! Live transcription: audio arrives a piece at a time and text comes back while it does.
//!
//! A [`LiveTranscriber`] takes 16 kHz mono samples in pieces of any size and answers with
//! [`StreamEvent`]s: a `Partial` whenever the utterance being spoken gained text, a `Final` when
//! it ended (the model's end-of-utterance token, or the end of the input). Front ends (the
//! `stream` command, the server's WebSocket endpoint) speak only this trait, so they neither
//! know nor care how the chunks are scheduled or which head decodes.

pub mod input;
#[cfg(feature = "mic")]
pub mod mic;
pub mod open;
pub mod pump;
pub mod render;
pub mod speakers;
pub mod turns;

use crate::error::Result;
use crate::tokenizer::{Token, Word};

/// The text of one utterance, so far or finished. Times are seconds from the start of the
/// stream (not of the utterance), so consecutive utterances line up on one clock.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Utterance {
    pub text: String,
    /// Start of the utterance's first token (or of the utterance when it has none).
    pub start: f64,
    /// End of its last token so far.
    pub end: f64,
    pub words: Vec<Word>,
    /// Tokens with encoder frames counted from the start of the stream.
    pub tokens: Vec<Token>,
}

impl Utterance {
    /// The utterance with no time past `seconds`, the length of the audio heard: a stream's
    /// last buffer decodes the padding after the audio (NeMo's buffered pipelines decode it,
    /// and their timestamp rewriting can move tokens later), whose words keep their text but
    /// end where the audio does.
    pub fn within(mut self, seconds: f64) -> Utterance {
        let clamp = |t: &mut f64| *t = t.min(seconds);
        clamp(&mut self.start);
        clamp(&mut self.end);
        for w in &mut self.words {
            clamp(&mut w.start);
            clamp(&mut w.end);
        }
        self
    }
}

/// What a live transcriber reports after a piece of audio.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// The utterance so far; it only grows (a cache-aware model never revises an emitted token).
    Partial(Utterance),
    /// A finished utterance; the next event starts a new one.
    Final(Utterance),
}

/// Anything that turns a stream of samples into [`StreamEvent`]s.
pub trait LiveTranscriber {
    /// The sample rate `accept` expects (16 kHz for every Parakeet model).
    fn sample_rate(&self) -> u32;

    /// Seconds of audio one step of the model consumes (a front end may batch its reads to it).
    fn chunk_seconds(&self) -> f64;

    /// Feeds mono samples at [`Self::sample_rate`], as few or as many as there are; returns the
    /// events the audio completed (none until a whole chunk has arrived).
    fn accept(&mut self, samples: &[f32]) -> Result<Vec<StreamEvent>>;

    /// The input ended: decodes what is left, ends the current utterance with a `Final` (when it
    /// has text) and resets, so the next `accept` starts a new stream at time 0.
    fn finish(&mut self) -> Result<Vec<StreamEvent>>;
}

mod buffered;
mod cache_aware;

pub use buffered::{
    BufferSizes, BufferedConfig, BufferedStream, DEFAULT_CHUNK_SECS, DEFAULT_LEFT_SECS,
    DEFAULT_RIGHT_SECS, OFFLINE_MODELS, StepRecord, StepTimes,
};
pub use cache_aware::{
    CacheAwareConfig, CacheAwareStream, ChunkRecord, DEFAULT_MAX_UTTERANCE_SECONDS,
    STREAMING_MODELS,
};
