//! Opening a live transcriber over a loaded model: the one place the front ends (the `stream`
//! command, the server's WebSocket endpoint) get their [`LiveTranscriber`] from.

use super::{CacheAwareConfig, CacheAwareStream, DEFAULT_MAX_UTTERANCE_SECONDS, LiveTranscriber};
use crate::model::Model;
use crate::session::{DecoderChoice, Session, Threads};
use anyhow::Result;
use std::sync::Arc;

/// What a front end asks of a live transcriber.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LiveOptions {
    /// One of the model's lookaheads, `[left, right]` in encoder frames (`--att-context L,R`);
    /// `None`: NeMo's default for the model.
    pub att_context: Option<[usize; 2]>,
    /// Which head decodes (`--decoder`).
    pub decoder: DecoderChoice,
    /// Compute threads.
    pub threads: Threads,
    /// Utterances longer than this without an end-of-utterance token are cut at a word start
    /// (`--max-utterance-seconds`; `None`: never).
    pub max_utterance_seconds: Option<f64>,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            att_context: None,
            decoder: DecoderChoice::default(),
            threads: Threads::all(),
            max_utterance_seconds: Some(DEFAULT_MAX_UTTERANCE_SECONDS),
        }
    }
}

/// A live transcriber over `model` (each call a new stream with its own state; the model is
/// shared). Fails, naming the model, when the model cannot stream.
pub fn open_live(
    model: &Arc<Model>,
    options: &LiveOptions,
) -> Result<Box<dyn LiveTranscriber + Send>> {
    let att_context = options.att_context.map(|[l, r]| [l as i64, r as i64]);
    let session = Session::new(model.clone(), options.threads)?;
    let mut stream = CacheAwareStream::new(
        session,
        CacheAwareConfig {
            att_context,
            decoder: options.decoder,
            record_chunks: false,
        },
    )?;
    stream.set_max_utterance_seconds(options.max_utterance_seconds);
    Ok(Box::new(stream))
}
