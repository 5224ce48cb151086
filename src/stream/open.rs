//! Opening a live transcriber over a loaded model: the one place the front ends (the `stream`
//! command, the server's WebSocket endpoint) get their [`LiveTranscriber`] from. A cache-aware
//! model streams with its encoder caches; any other (offline) model with NeMo's buffered
//! pipeline, which encodes each chunk again inside a buffer of left and right context.

use super::{
    BufferedConfig, BufferedStream, CacheAwareConfig, CacheAwareStream,
    DEFAULT_MAX_UTTERANCE_SECONDS, LiveTranscriber,
};
use crate::bail;
use crate::decoder::boosting::BoostingTree;
use crate::decoder::confidence::ConfidenceConfig;
use crate::error::Result;
use crate::model::Model;
use crate::session::{DecoderChoice, Session, Threads};
use std::sync::Arc;

/// What a front end asks of a live transcriber.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    /// One of the model's lookaheads, `[left, right]` in encoder frames (`--att-context L,R`);
    /// `None`: NeMo's default for the model. Cache-aware models only.
    pub att_context: Option<[usize; 2]>,
    /// Buffered streaming's chunk, left and right context in seconds (`--chunk-secs`,
    /// `--left-secs`, `--right-secs`); `None`: NeMo's defaults. Offline models only.
    pub chunk_secs: Option<f64>,
    pub left_secs: Option<f64>,
    pub right_secs: Option<f64>,
    /// Which head decodes (`--decoder`).
    pub decoder: DecoderChoice,
    /// Compute threads.
    pub threads: Threads,
    /// Utterances longer than this without an end of utterance are cut at a word start
    /// (`--max-utterance-seconds`; `None`: never).
    pub max_utterance_seconds: Option<f64>,
    /// Phrases this stream prefers (`--boost`), and each word's confidence (`--confidence`):
    /// buffered streaming's transducer.
    pub boost: Option<Arc<BoostingTree>>,
    pub confidence: Option<ConfidenceConfig>,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            att_context: None,
            chunk_secs: None,
            left_secs: None,
            right_secs: None,
            decoder: DecoderChoice::default(),
            threads: Threads::all(),
            max_utterance_seconds: Some(DEFAULT_MAX_UTTERANCE_SECONDS),
            boost: None,
            confidence: None,
        }
    }
}

/// How a model streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveKind {
    /// NeMo's cache-aware streaming (`conformer_stream_step`): a cache-aware model.
    CacheAware,
    /// NeMo's buffered streaming (`BufferedRNNTPipeline` / `BufferedCTCPipeline`): an offline
    /// model.
    Buffered,
}

impl LiveKind {
    /// How `model` streams: cache-aware when it has a cache-aware lookahead.
    pub fn of(model: &Model) -> LiveKind {
        let e = &model.hparams().encoder;
        match e.att_context_sizes.first().and_then(|&c| e.streaming(c)) {
            Some(_) => LiveKind::CacheAware,
            None => LiveKind::Buffered,
        }
    }

    /// A line for `--verbose` and `info`.
    pub fn describe(self) -> &'static str {
        match self {
            LiveKind::CacheAware => {
                "cache-aware streaming (NeMo's conformer_stream_step: encoder caches, --att-context)"
            }
            LiveKind::Buffered => {
                "buffered streaming of an offline model (NeMo's BufferedRNNTPipeline / \
                 BufferedCTCPipeline: each chunk encoded again with left and right context; \
                 --chunk-secs, --left-secs, --right-secs)"
            }
        }
    }
}

impl LiveOptions {
    /// The buffered pipeline's settings these options ask for (NeMo's defaults where unset).
    pub fn buffered(&self) -> BufferedConfig {
        let d = BufferedConfig::default();
        BufferedConfig {
            chunk_secs: self.chunk_secs.unwrap_or(d.chunk_secs),
            left_secs: self.left_secs.unwrap_or(d.left_secs),
            right_secs: self.right_secs.unwrap_or(d.right_secs),
            decoder: self.decoder,
            record_steps: false,
        }
    }

    /// Refuses the other kind's settings, naming the model's kind.
    fn check(&self, model: &Model, kind: LiveKind) -> Result<()> {
        let shown = model.shown();
        let buffered_flags = [
            ("--chunk-secs", self.chunk_secs),
            ("--left-secs", self.left_secs),
            ("--right-secs", self.right_secs),
        ];
        match kind {
            LiveKind::CacheAware => {
                let decoding_flags = [
                    ("--boost", self.boost.is_some()),
                    ("--confidence", self.confidence.is_some()),
                ];
                if let Some((flag, _)) = decoding_flags.iter().find(|(_, on)| *on) {
                    bail!(
                        Options,
                        "{shown} is a cache-aware streaming model: {flag} in live transcription \
                         is for offline models (buffered streaming)"
                    );
                }
                if let Some((flag, _)) = buffered_flags.iter().find(|(_, v)| v.is_some()) {
                    bail!(
                        Options,
                        "{shown} is a cache-aware streaming model: {flag} sets buffered \
                         streaming of offline models; a cache-aware model's chunk is its \
                         lookahead (--att-context)"
                    );
                }
            }
            LiveKind::Buffered => {
                if let Some([l, r]) = self.att_context {
                    bail!(
                        Options,
                        "{shown} is an offline model (attention {}), not a cache-aware one: \
                         --att-context {l},{r} picks a cache-aware model's lookahead; an offline \
                         model streams by buffers (--chunk-secs, --left-secs, --right-secs)",
                        model.hparams().encoder.attention
                    );
                }
            }
        }
        Ok(())
    }
}

/// A live transcriber over `model` (each call a new stream with its own state; the model is
/// shared): cache-aware streaming for a cache-aware model, buffered streaming for the others.
/// Fails, naming the model and its kind, on the other kind's settings or bad sizes.
pub fn open_live(
    model: &Arc<Model>,
    options: &LiveOptions,
) -> Result<Box<dyn LiveTranscriber + Send>> {
    let kind = LiveKind::of(model);
    options.check(model, kind)?;
    let session = Session::new(model.clone(), options.threads)?;
    match kind {
        LiveKind::CacheAware => {
            let att_context = options.att_context.map(|[l, r]| [l as i64, r as i64]);
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
        LiveKind::Buffered => {
            let mut stream = BufferedStream::new(session, options.buffered())?;
            stream.set_max_utterance_seconds(options.max_utterance_seconds);
            stream.set_boost(options.boost.clone())?;
            stream.set_confidence(options.confidence);
            Ok(Box::new(stream))
        }
    }
}
