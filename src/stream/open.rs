//! Opening a live transcriber over a loaded model: the one place the front ends (the `stream`
//! command, the server's WebSocket endpoint) get their [`LiveTranscriber`] from.

use super::{CacheAwareConfig, CacheAwareStream, LiveTranscriber};
use crate::model::Model;
use crate::session::{DecoderChoice, Session};
use anyhow::Result;
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

/// A live transcriber over `model` (each call a new stream with its own state; the model is
/// shared). Fails, naming the model, when the model cannot stream.
pub fn open_live(
    model: &Arc<Model>,
    options: &LiveOptions,
) -> Result<Box<dyn LiveTranscriber + Send>> {
    let att_context = options.att_context.map(|[l, r]| [l as i64, r as i64]);
    let session = Session::new(model.clone(), options.threads)?;
    let stream = CacheAwareStream::new(
        session,
        CacheAwareConfig {
            att_context,
            decoder: options.decoder,
            record_chunks: false,
        },
    )?;
    Ok(Box::new(stream))
}
