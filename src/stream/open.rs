//! Opening a live transcriber over a loaded model: the one place the front ends (the `stream`
//! command, the server's WebSocket endpoint) get their [`LiveTranscriber`] from.

use super::LiveTranscriber;
use crate::model::Model;
use crate::session::DecoderChoice;
use anyhow::{Result, bail};
use std::sync::Arc;

/// What a front end asks of a live transcriber.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveOptions {
    /// One of the model's lookaheads, `[left, right]` in encoder frames (`--att-context L,R`);
    /// `None`: NeMo's default for the model.
    pub att_context: Option<[usize; 2]>,
    /// Which head decodes (`--decoder`).
    pub decoder: DecoderChoice,
    /// Compute threads.
    pub threads: usize,
}

/// The models that stream, for the error a whole-file model gets.
pub const STREAMING_MODELS: &str = "cache-aware streaming FastConformer models such as \
    nvidia/nemotron-speech-streaming-en-0.6b, nvidia/parakeet_realtime_eou_120m-v1 or NeMo's \
    cache-aware hybrid models";

/// A live transcriber over `model` (each call a new stream with its own state; the model is
/// shared). Fails, naming the model, when the model cannot stream.
pub fn open_live(
    model: &Arc<Model>,
    options: &LiveOptions,
) -> Result<Box<dyn LiveTranscriber + Send>> {
    // The cache-aware streaming encoder is not part of this build yet: no model streams.
    let _ = options;
    bail!(
        "the model {} cannot stream: live transcription needs one of the {STREAMING_MODELS}",
        model.name
    )
}
