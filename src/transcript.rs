//! What a transcription produces: the text, its tokens and words with their times, and where
//! the time went.

use crate::hparams::Attention;
use crate::tokenizer::{Token, Word};
use std::time::Duration;

/// Where the time went for one utterance.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    pub features: Duration,
    pub encoder: Duration,
    pub decoder: Duration,
    /// Joint evaluations and prediction-net updates (transducers), graphs computed.
    pub decoder_steps: u64,
    pub predictor_steps: u64,
    pub decoder_graphs: u64,
}

impl StageTimes {
    /// Accumulate another utterance's times.
    pub fn add(&mut self, o: &StageTimes) {
        self.features += o.features;
        self.encoder += o.encoder;
        self.decoder += o.decoder;
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
    /// The encoder's self-attention for this utterance.
    pub attention: Attention,
    pub times: StageTimes,
}
