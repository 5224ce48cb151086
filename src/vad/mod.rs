//! Voice activity detection: Silero VAD (v6.2, MIT, built into the binary) on the ggml runtime,
//! and the `silero-vad` package's algorithms over its probabilities.
//!
//! [`model`] holds the network: one ggml graph computes the convolutional front end of every
//! 32 ms window of a chunk at once (it does not depend on the recurrent state) and the LSTM
//! recurrence over them in one node. [`segments`] turns probabilities into speech segments as
//! `get_speech_timestamps` does, and [`iterator`] is the package's streaming `VADIterator`.

pub mod detect;
pub mod iterator;
pub mod model;
pub mod segments;

pub use iterator::{VadEvent, VadIterator};
pub use model::{SampleRate, Vad, VadModel, VadState};
pub use segments::{SpeechParams, SpeechSegment, speech_segments};
