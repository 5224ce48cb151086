//! What a transcription produces: the text, its tokens and words with their times, and where
//! the time went.

use crate::hparams::Attention;
use crate::tokenizer::{Token, TokenClock, Word};
use std::time::Duration;

/// Where the time went for one utterance.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    /// Speech detection (zero without it).
    pub vad: Duration,
    pub features: Duration,
    pub encoder: Duration,
    pub decoder: Duration,
    /// The speakers' diarization (zero when the words get no speakers).
    pub diarization: Duration,
    /// Joint evaluations and prediction-net updates (transducers), graphs computed.
    pub decoder_steps: u64,
    pub predictor_steps: u64,
    pub decoder_graphs: u64,
}

impl StageTimes {
    /// Accumulate another utterance's times.
    pub fn add(&mut self, o: &StageTimes) {
        self.vad += o.vad;
        self.features += o.features;
        self.encoder += o.encoder;
        self.decoder += o.decoder;
        self.diarization += o.diarization;
        self.decoder_steps += o.decoder_steps;
        self.predictor_steps += o.predictor_steps;
        self.decoder_graphs += o.decoder_graphs;
    }
}

/// The result for one utterance.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    pub text: String,
    pub tokens: Vec<Token>,
    /// Token pieces, parallel to `tokens`.
    pub pieces: Vec<String>,
    pub words: Vec<Word>,
    /// NeMo's token confidence, parallel to `tokens`, when it was asked for.
    pub token_confidence: Option<Vec<f32>>,
    /// Seconds of audio (16 kHz samples / 16000).
    pub audio_seconds: f64,
    /// Seconds per encoder frame (token frames to times).
    pub frame_seconds: f64,
    /// Whether token durations are the TDT head's predictions ([`TokenClock`]).
    pub tdt_durations: bool,
    /// The encoder's self-attention for this utterance.
    pub attention: Attention,
    /// How the decoder searched, for the output's metadata.
    pub decoding: DecodingSummary,
    /// A beam search's N best, best first (the first is this transcript); empty for greedy.
    pub alternatives: Vec<Alternative>,
    pub times: StageTimes,
    /// With speech detection, the speech segments transcribed, in order (none found: empty);
    /// `None`: the whole input was one utterance.
    pub speech: Option<Vec<SpeechSpan>>,
}

/// A speech segment a transcript was made of: where it lies in the input and where its
/// tokens and words begin. Its tokens' frames count from its start.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeechSpan {
    /// Seconds of the input.
    pub start: f64,
    pub end: f64,
    /// Index of its first token in [`Transcript::tokens`] (of the next segment's when it has
    /// none), and of its first word in [`Transcript::words`].
    pub first_token: usize,
    pub first_word: usize,
}

impl Transcript {
    /// Token `i`'s start and end in seconds of the input ([`TokenClock::span`], within its
    /// speech segment when there are segments).
    pub fn token_times(&self, i: usize) -> (f64, f64) {
        // The last segment starting at or before the token: segments without tokens share
        // their first token with the next one, which comes later.
        let segment = self.speech.as_deref().and_then(|spans| {
            let k = spans.partition_point(|s| s.first_token <= i);
            k.checked_sub(1).map(|k| &spans[k])
        });
        let (offset, audio_seconds) =
            segment.map_or((0.0, self.audio_seconds), |s| (s.start, s.end - s.start));
        let clock = TokenClock {
            frame_seconds: self.frame_seconds,
            tdt_durations: self.tdt_durations,
            audio_seconds,
        };
        let (start, end) = clock.span(&self.tokens[i]);
        (start + offset, end + offset)
    }
}

/// Which decoding ran: what a JSON output reports beside the text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodingSummary {
    /// The head: `tdt`, `rnnt` or `ctc`.
    pub head: &'static str,
    /// NeMo's strategy name (`greedy_batch`, `malsd_batch`, `beam`, `beam_batch`, ...).
    pub strategy: String,
    /// Beam size (1 for greedy).
    pub beam_size: usize,
    /// Phrases boosted (0: none) and the boosting weight.
    pub boosted_phrases: usize,
    pub boosting_alpha: f32,
    /// Confidence method (NeMo's measure name, alpha, aggregation), when computed.
    pub confidence: Option<(String, f64, &'static str)>,
}

/// Another hypothesis of a beam search.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    pub text: String,
    pub tokens: Vec<Token>,
    /// The search's score (sum of log-probabilities, boosting included).
    pub score: f32,
}
