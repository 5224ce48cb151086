//! Opening a live transcriber over a loaded model: the one place the front ends (the `stream`
//! command, the server's WebSocket endpoint) get their [`LiveTranscriber`] from. A cache-aware
//! model streams with its encoder caches; any other (offline) model with NeMo's buffered
//! pipeline, which encodes each chunk again inside a buffer of left and right context.

use super::{
    BufferedConfig, BufferedStream, CacheAwareConfig, CacheAwareStream,
    DEFAULT_MAX_UTTERANCE_SECONDS, LiveTranscriber,
};
use crate::bail;
use crate::encoder::AttentionChoice;
use crate::error::Result;
use crate::model::Model;
use crate::session::{DecodeOptions, DecoderChoice, Head, Session, Threads};
use std::sync::Arc;

/// The live choices a front end was given, beside its decoding request: as given;
/// [`LiveOptions::new`] checks them.
#[derive(Clone, Debug)]
pub struct LiveRequest {
    /// One of the model's lookaheads, `[left, right]` in encoder frames (`--att-context L,R`);
    /// `None`: NeMo's default for the model. Cache-aware models only.
    pub att_context: Option<[usize; 2]>,
    /// Buffered streaming's chunk, left and right context in seconds (`--chunk-secs`,
    /// `--left-secs`, `--right-secs`); `None`: NeMo's defaults. Offline models only.
    pub chunk_secs: Option<f64>,
    pub left_secs: Option<f64>,
    pub right_secs: Option<f64>,
    /// Compute threads.
    pub threads: Threads,
    /// Utterances longer than this without an end of utterance are cut at a word start
    /// (`--max-utterance-seconds`; 0: never).
    pub max_utterance_seconds: f64,
}

impl Default for LiveRequest {
    fn default() -> Self {
        LiveRequest {
            att_context: None,
            chunk_secs: None,
            left_secs: None,
            right_secs: None,
            threads: Threads::all(),
            max_utterance_seconds: DEFAULT_MAX_UTTERANCE_SECONDS,
        }
    }
}

/// What a live transcriber runs by: a request's decoding, checked against the model by
/// [`DecodeOptions::new`] as for a file (the head, boosting, confidence), and the live
/// choices, checked with it once ([`LiveOptions::new`]) by every front end alike.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    decoding: DecodeOptions,
    live: LiveRequest,
    kind: LiveKind,
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
    /// `decoding` (checked for `model`) with the live choices `live`, checked: what live
    /// transcription cannot do (a beam search, a fixed attention, speech detection as a
    /// decoding option: a stream ends its turns with `VadTurns` instead), the other kind's
    /// settings (naming the model's kind), the utterance limit's range.
    pub fn new(model: &Model, decoding: DecodeOptions, live: LiveRequest) -> Result<LiveOptions> {
        let kind = LiveKind::of(model);
        let shown = model.shown();
        if decoding.beam().is_some() {
            bail!(
                Options,
                "--beam: live transcription decodes greedily (a beam search is for files)"
            );
        }
        if decoding.attention() != AttentionChoice::Auto {
            bail!(
                Options,
                "--att-context: live transcription takes the model's own attention (a \
                 cache-aware model's lookahead is chosen by L,R)"
            );
        }
        if decoding.speech().is_some() {
            bail!(
                Options,
                "speech detection as a decoding option is for files; a stream ends its \
                 utterances with Silero VAD by --vad"
            );
        }
        let cut = live.max_utterance_seconds;
        if !(cut.is_finite() && cut >= 0.0) {
            bail!(
                Options,
                "--max-utterance-seconds {cut}: must be 0 (never cut) or a positive number of \
                 seconds"
            );
        }
        let buffered_flags = [
            ("--chunk-secs", live.chunk_secs),
            ("--left-secs", live.left_secs),
            ("--right-secs", live.right_secs),
        ];
        match kind {
            LiveKind::CacheAware => {
                let decoding_flags = [
                    ("--boost", decoding.boosting().is_some()),
                    ("--confidence", decoding.confidence().is_some()),
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
                if let Some([l, r]) = live.att_context {
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
        Ok(LiveOptions {
            decoding,
            live,
            kind,
        })
    }

    /// The model's own greedy decoding with the default live choices on `threads`.
    pub fn defaults(model: &Model, threads: Threads) -> Result<LiveOptions> {
        let live = LiveRequest {
            threads,
            ..LiveRequest::default()
        };
        LiveOptions::new(model, DecodeOptions::greedy(model)?, live)
    }

    /// The decoding, as checked.
    pub fn decoding(&self) -> &DecodeOptions {
        &self.decoding
    }

    /// The live choices, as checked.
    pub fn live(&self) -> &LiveRequest {
        &self.live
    }

    /// How the model these options were checked for streams.
    pub fn kind(&self) -> LiveKind {
        self.kind
    }

    /// The head that decodes, as the streams' configurations name it.
    fn decoder(&self) -> DecoderChoice {
        match self.decoding.head() {
            Head::Ctc => DecoderChoice::Ctc,
            Head::Tdt | Head::Rnnt => DecoderChoice::Tdt,
        }
    }

    /// The utterance limit (`None`: never cut).
    fn max_utterance_seconds(&self) -> Option<f64> {
        Some(self.live.max_utterance_seconds).filter(|s| *s > 0.0)
    }

    /// The buffered pipeline's settings these options ask for (NeMo's defaults where unset).
    pub fn buffered(&self) -> BufferedConfig {
        let d = BufferedConfig::default();
        BufferedConfig {
            chunk_secs: self.live.chunk_secs.unwrap_or(d.chunk_secs),
            left_secs: self.live.left_secs.unwrap_or(d.left_secs),
            right_secs: self.live.right_secs.unwrap_or(d.right_secs),
            decoder: self.decoder(),
            record_steps: false,
        }
    }
}

/// A live transcriber over `model` (each call a new stream with its own state; the model is
/// shared) by `options`, checked for this model: cache-aware streaming for a cache-aware
/// model, buffered streaming for the others. Fails on bad buffer sizes.
pub fn open_live(
    model: &Arc<Model>,
    options: &LiveOptions,
) -> Result<Box<dyn LiveTranscriber + Send>> {
    if LiveKind::of(model) != options.kind {
        bail!(
            Internal,
            "live options checked for another kind of model than {}",
            model.shown()
        );
    }
    let session = Session::new(model.clone(), options.live.threads)?;
    match options.kind {
        LiveKind::CacheAware => {
            let att_context = options.live.att_context.map(|[l, r]| [l as i64, r as i64]);
            let mut stream = CacheAwareStream::new(
                session,
                CacheAwareConfig {
                    att_context,
                    decoder: options.decoder(),
                    record_chunks: false,
                },
            )?;
            stream.set_max_utterance_seconds(options.max_utterance_seconds());
            Ok(Box::new(stream))
        }
        LiveKind::Buffered => {
            let mut stream = BufferedStream::new(session, options.buffered())?;
            stream.set_max_utterance_seconds(options.max_utterance_seconds());
            stream.set_boost(options.decoding.boosting().cloned())?;
            stream.set_confidence(options.decoding.confidence().copied());
            Ok(Box::new(stream))
        }
    }
}
