//! A test double for `LiveTranscriber`: it transcribes nothing. Each word is named after the
//! sample count where it was "heard" (`s1600` after 1600 samples at 16 kHz), so a test knows
//! exactly which events a front end must produce from the audio it fed.

use parakeet::error::Result;
use parakeet::stream::{LiveTranscriber, StreamEvent, Utterance};
use parakeet::tokenizer::Word;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const RATE: u32 = 16_000;

pub struct CountingTranscriber {
    /// A word every this many samples.
    every: u64,
    /// End the utterance (a `Final`, as a model's end-of-utterance token) after this many words.
    eou_after: Option<usize>,
    total: u64,
    utterance_start: u64,
    words: Vec<Word>,
    /// Streams alive, for tests that check a connection's state is freed.
    alive: Option<Arc<AtomicUsize>>,
}

impl CountingTranscriber {
    pub fn new(every: u64, eou_after: Option<usize>) -> Self {
        Self {
            every,
            eou_after,
            total: 0,
            utterance_start: 0,
            words: Vec::new(),
            alive: None,
        }
    }

    /// Counted in `alive` until dropped.
    pub fn counted(mut self, alive: &Arc<AtomicUsize>) -> Self {
        alive.fetch_add(1, Ordering::SeqCst);
        self.alive = Some(alive.clone());
        self
    }

    fn seconds(samples: u64) -> f64 {
        samples as f64 / f64::from(RATE)
    }

    fn add_word(&mut self) {
        let start = self
            .words
            .last()
            .map_or(Self::seconds(self.utterance_start), |w| w.end);
        self.words.push(Word {
            text: format!("s{}", self.total),
            start,
            end: Self::seconds(self.total),
            confidence: None,
            speaker: None,
        });
    }

    fn utterance(&self) -> Utterance {
        Utterance {
            text: self
                .words
                .iter()
                .map(|w| w.text.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            start: Self::seconds(self.utterance_start),
            end: self.words.last().map_or(0.0, |w| w.end),
            words: self.words.clone(),
            tokens: Vec::new(),
        }
    }
}

impl Drop for CountingTranscriber {
    fn drop(&mut self) {
        if let Some(alive) = &self.alive {
            alive.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl LiveTranscriber for CountingTranscriber {
    fn sample_rate(&self) -> u32 {
        RATE
    }

    fn chunk_seconds(&self) -> f64 {
        Self::seconds(self.every)
    }

    fn accept(&mut self, samples: &[f32]) -> Result<Vec<StreamEvent>> {
        let mut events = Vec::new();
        for _ in samples {
            self.total += 1;
            if !self.total.is_multiple_of(self.every) {
                continue;
            }
            self.add_word();
            if self.eou_after == Some(self.words.len()) {
                events.push(StreamEvent::Final(self.utterance()));
                self.words.clear();
                self.utterance_start = self.total;
            } else {
                events.push(StreamEvent::Partial(self.utterance()));
            }
        }
        Ok(events)
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>> {
        // The tail short of a whole step still counts as a word, as a model decodes it.
        if !self.total.is_multiple_of(self.every) {
            self.add_word();
        }
        let events = if self.words.is_empty() {
            Vec::new()
        } else {
            vec![StreamEvent::Final(self.utterance())]
        };
        self.words.clear();
        self.total = 0;
        self.utterance_start = 0;
        Ok(events)
    }
}
