//! Speech turns: Silero VAD ends utterances. [`VadTurns`] wraps any [`LiveTranscriber`] and
//! runs the `silero-vad` package's `VADIterator` over the audio as it arrives; only the audio
//! between a speech start and its end reaches the transcriber, and each end of speech finishes
//! the transcriber's stream, so every turn is transcribed exactly as if it had been streamed
//! alone, and the silence between turns is never decoded.
//!
//! A turn's audio is `[start, end)` as the iterator reports them (its padding included). The
//! transcriber is fed only audio that is sure to be inside the turn (an end, when it comes, is
//! never before [`VadIterator::earliest_end`]), so text arrives while the speaker talks. The
//! turn's utterances are moved onto the stream's clock; the first one starts at the turn's
//! start and the one its end finishes ends at the turn's end (the speech segment, as
//! `transcribe --vad` cuts them). Tokens keep their encoder frames counted from the turn's start.

use super::{LiveTranscriber, StreamEvent, Utterance};
use crate::backend::Threads;
use crate::bail;
use crate::error::Result;
use crate::vad::segments::MAX_PARAM_MS as MAX_MS;
use crate::vad::{SampleRate, Vad, VadEvent, VadIterator, VadModel, VadState};
use std::sync::Arc;

/// The `VADIterator`'s parameters, with the package's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnParams {
    /// A window at or above this speech probability is speech (speech ends below
    /// `threshold - 0.15`).
    pub threshold: f64,
    /// Silence at least this long ends a turn.
    pub min_silence_ms: f64,
    /// Added to both ends of a turn.
    pub speech_pad_ms: f64,
}

impl Default for TurnParams {
    fn default() -> Self {
        TurnParams {
            threshold: 0.5,
            min_silence_ms: 100.0,
            speech_pad_ms: 30.0,
        }
    }
}

impl TurnParams {
    /// Checks the values: the threshold in (0, 1), durations finite and not negative; the error
    /// names the parameter (as `what` names them) and its value.
    pub fn validate(&self, what: [&str; 3]) -> Result<()> {
        let t = self.threshold;
        if !(t > 0.0 && t < 1.0) {
            bail!(
                Options,
                "{} {t}: must be between 0 and 1 (exclusive)",
                what[0]
            );
        }
        for (name, v) in [
            (what[1], self.min_silence_ms),
            (what[2], self.speech_pad_ms),
        ] {
            if !(0.0..=MAX_MS).contains(&v) {
                bail!(
                    Options,
                    "{name} {v}: must be a number of milliseconds from 0 to {MAX_MS} (an hour)"
                );
            }
        }
        Ok(())
    }
}

/// What a [`VadTurns`] reports: the VAD's boundaries and the transcriber's events, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnEvent {
    /// Speech began at this sample of the stream (the iterator's start, padding included).
    SpeechStarted(usize),
    /// The turn that began at the last start ended at this sample (padding included); its
    /// transcriber was finished, and the events that follow in the same batch are its last
    /// (a `Final` when it had words).
    SpeechStopped(usize),
    /// An event of the transcriber, on the stream's clock.
    Transcript(StreamEvent),
}

/// The turn under way.
#[derive(Clone, Copy, Debug)]
struct Turn {
    start: usize,
    /// Samples of the stream fed to the transcriber so far (from `start`).
    fed: usize,
    /// The iterator's end, once it came.
    end: Option<usize>,
    /// The transcriber already finished an utterance of this turn itself.
    had_final: bool,
}

/// A live transcriber whose utterances end where the VAD finds the end of speech.
pub struct VadTurns {
    inner: Box<dyn LiveTranscriber + Send>,
    vad: Vad,
    state: VadState,
    iter: VadIterator,
    params: TurnParams,
    /// Samples of the stream not yet in a whole VAD window.
    pending: Vec<f32>,
    /// The stream's samples from `kept_from` on: the padding before a start may reach back
    /// into them, and a turn's audio waits here until it is sure to be inside the turn.
    kept: Vec<f32>,
    kept_from: usize,
    turn: Option<Turn>,
    /// End of the last turn: the next one starts no earlier.
    last_end: usize,
}

impl VadTurns {
    /// `inner` (a 16 kHz transcriber, as every Parakeet model's) with its turns ended by
    /// `model` (one compute thread: the VAD costs little next to the transcriber).
    pub fn new(
        inner: Box<dyn LiveTranscriber + Send>,
        model: Arc<VadModel>,
        params: TurnParams,
    ) -> Result<VadTurns> {
        let hz = inner.sample_rate();
        let Some(rate) = SampleRate::from_hz(hz) else {
            bail!(
                Internal,
                "internal: the VAD cannot run at the transcriber's {hz} Hz"
            );
        };
        Ok(VadTurns {
            inner,
            vad: Vad::new(model, Threads::ONE)?,
            state: VadState::new(rate),
            iter: Self::iterator(&params, hz),
            params,
            pending: Vec::new(),
            kept: Vec::new(),
            kept_from: 0,
            turn: None,
            last_end: 0,
        })
    }

    fn iterator(params: &TurnParams, hz: u32) -> VadIterator {
        VadIterator::new(
            params.threshold,
            hz,
            params.min_silence_ms,
            params.speech_pad_ms,
        )
    }

    pub fn params(&self) -> TurnParams {
        self.params
    }

    /// New parameters, from a fresh stream on (what was accepted and not finished is dropped).
    pub fn set_params(&mut self, params: TurnParams) {
        self.params = params;
        self.reset();
    }

    /// The transcriber (finished after the last turn; a turn under way is dropped).
    pub fn into_inner(mut self) -> Box<dyn LiveTranscriber + Send> {
        if self.turn.is_some() {
            let _ = self.inner.finish();
        }
        self.inner
    }

    /// Whether a turn is under way (speech started and its transcriber not finished).
    pub fn in_turn(&self) -> bool {
        self.turn.is_some()
    }

    /// Samples accepted since the stream started.
    pub fn samples(&self) -> usize {
        self.kept_from + self.kept.len()
    }

    /// Feeds samples; returns the boundaries and the transcriber's events they completed.
    pub fn accept_turns(&mut self, samples: &[f32]) -> Result<Vec<TurnEvent>> {
        let mut out = Vec::new();
        self.kept.extend_from_slice(samples);
        self.pending.extend_from_slice(samples);
        let w = self.state.rate().window();
        let whole = self.pending.len() / w * w;
        if whole > 0 {
            let probs = self.vad.process(&mut self.state, &self.pending[..whole])?;
            self.pending.drain(..whole);
            for p in probs {
                match self.iter.push(p, w) {
                    Some(VadEvent::Start(start)) => {
                        // An end still waiting for its audio (padding longer than the
                        // silence) ends with the audio there is.
                        if self.turn.is_some() {
                            self.end_turn(&mut out)?;
                        }
                        let start = start.max(self.last_end).max(self.kept_from);
                        self.turn = Some(Turn {
                            start,
                            fed: start,
                            end: None,
                            had_final: false,
                        });
                        out.push(TurnEvent::SpeechStarted(start));
                    }
                    Some(VadEvent::End(end)) => {
                        if let Some(turn) = &mut self.turn {
                            turn.end = Some(end.max(turn.fed));
                        }
                    }
                    None => continue,
                }
                self.advance(&mut out)?;
            }
        }
        self.advance(&mut out)?;
        self.trim(w);
        Ok(out)
    }

    /// The input ended: a turn under way is transcribed to the end of the audio (an end of
    /// speech the iterator had found ends it there), then everything resets to time 0.
    pub fn finish_turns(&mut self) -> Result<Vec<TurnEvent>> {
        let mut out = Vec::new();
        if let Some(turn) = &mut self.turn {
            let available = self.kept_from + self.kept.len();
            turn.end = Some(turn.end.unwrap_or(available).min(available));
            self.end_turn(&mut out)?;
        }
        self.reset();
        Ok(out)
    }

    fn reset(&mut self) {
        self.state.reset();
        self.iter = Self::iterator(&self.params, self.inner.sample_rate());
        self.pending.clear();
        self.kept.clear();
        self.kept_from = 0;
        self.turn = None;
        self.last_end = 0;
    }

    /// Feeds the turn's transcriber the audio sure to be inside the turn; finishes the turn
    /// once its end has arrived.
    fn advance(&mut self, out: &mut Vec<TurnEvent>) -> Result<()> {
        let Some(turn) = self.turn else {
            return Ok(());
        };
        let available = self.kept_from + self.kept.len();
        let w = self.state.rate().window();
        let sure = turn.end.unwrap_or_else(|| self.iter.earliest_end(w));
        self.feed(sure.min(available), out)?;
        if turn.end.is_some_and(|end| end <= available) {
            self.end_turn(out)?;
        }
        Ok(())
    }

    /// Feeds the turn's audio up to sample `to`.
    fn feed(&mut self, to: usize, out: &mut Vec<TurnEvent>) -> Result<()> {
        let Some(turn) = &mut self.turn else {
            return Ok(());
        };
        if to <= turn.fed {
            return Ok(());
        }
        let piece = &self.kept[turn.fed - self.kept_from..to - self.kept_from];
        turn.fed = to;
        let events = self.inner.accept(piece)?;
        self.forward(events, None, out);
        Ok(())
    }

    /// Ends the turn at its end (or at what was fed, when its audio never came): feeds the rest,
    /// finishes the transcriber.
    fn end_turn(&mut self, out: &mut Vec<TurnEvent>) -> Result<()> {
        let Some(turn) = self.turn else {
            return Ok(());
        };
        let available = self.kept_from + self.kept.len();
        let end = turn.end.unwrap_or(turn.fed).min(available);
        self.feed(end, out)?;
        out.push(TurnEvent::SpeechStopped(end));
        let events = match self.inner.finish() {
            // A turn cut short by the input's end can be shorter than a feature frame: the
            // transcriber refuses it (and resets), and it has no words to give.
            Err(_) if under_a_frame(end - turn.start, self.inner.sample_rate()) => Vec::new(),
            r => r?,
        };
        self.forward(events, Some(end), out);
        self.turn = None;
        self.last_end = end;
        Ok(())
    }

    /// Moves the transcriber's events onto the stream's clock; `end`: the turn ends with them.
    fn forward(&mut self, events: Vec<StreamEvent>, end: Option<usize>, out: &mut Vec<TurnEvent>) {
        let Some(turn) = &mut self.turn else {
            return;
        };
        let hz = f64::from(self.inner.sample_rate());
        let offset = turn.start as f64 / hz;
        for event in events {
            let (StreamEvent::Partial(mut u) | StreamEvent::Final(mut u)) = event.clone();
            shift(&mut u, offset);
            if !turn.had_final {
                u.start = offset;
            }
            let event = match event {
                StreamEvent::Partial(_) => StreamEvent::Partial(u),
                StreamEvent::Final(_) => {
                    if let Some(end) = end {
                        u.end = end as f64 / hz;
                    }
                    turn.had_final = true;
                    StreamEvent::Final(u)
                }
            };
            out.push(TurnEvent::Transcript(event));
        }
    }

    /// Drops audio no start or turn can reach back to any more.
    fn trim(&mut self, w: usize) {
        let keep_from = match self.turn {
            Some(turn) => turn.fed,
            None => {
                let pad = (f64::from(self.inner.sample_rate()) * self.params.speech_pad_ms / 1000.0)
                    .ceil() as usize;
                self.iter.position().saturating_sub(pad + 2 * w)
            }
        };
        if keep_from > self.kept_from {
            self.kept.drain(..keep_from - self.kept_from);
            self.kept_from = keep_from;
        }
    }
}

/// `u`'s times moved `offset` seconds later.
fn shift(u: &mut Utterance, offset: f64) {
    u.start += offset;
    u.end += offset;
    for w in &mut u.words {
        w.start += offset;
        w.end += offset;
    }
}

impl LiveTranscriber for VadTurns {
    fn sample_rate(&self) -> u32 {
        self.inner.sample_rate()
    }

    fn chunk_seconds(&self) -> f64 {
        self.inner.chunk_seconds()
    }

    fn accept(&mut self, samples: &[f32]) -> Result<Vec<StreamEvent>> {
        Ok(transcripts(self.accept_turns(samples)?))
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>> {
        Ok(transcripts(self.finish_turns()?))
    }
}

/// Whether `samples` at `rate` are shorter than one 10 ms feature frame, which a transcriber
/// refuses as too short ([`crate::session::Session::check_long_enough`]).
pub fn under_a_frame(samples: usize, rate: u32) -> bool {
    samples * 100 < rate as usize
}

fn transcripts(events: Vec<TurnEvent>) -> Vec<StreamEvent> {
    events
        .into_iter()
        .filter_map(|e| match e {
            TurnEvent::Transcript(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// A live transcriber whose turns end when its client says so (`Manual`: at
/// [`Turns::finish`]) or where the VAD hears the speech end; the realtime server's sessions
/// switch between the two (`turn_detection`).
pub enum Turns {
    Manual(Box<dyn LiveTranscriber + Send>),
    Vad(Box<VadTurns>),
}

impl Turns {
    pub fn sample_rate(&self) -> u32 {
        match self {
            Turns::Manual(t) => t.sample_rate(),
            Turns::Vad(t) => t.sample_rate(),
        }
    }

    /// The VAD's parameters, `None` when turns end by hand.
    pub fn params(&self) -> Option<TurnParams> {
        match self {
            Turns::Manual(_) => None,
            Turns::Vad(t) => Some(t.params()),
        }
    }

    /// Whether the VAD has a turn under way.
    pub fn in_turn(&self) -> bool {
        matches!(self, Turns::Vad(t) if t.in_turn())
    }

    pub fn accept(&mut self, samples: &[f32]) -> Result<Vec<TurnEvent>> {
        match self {
            Turns::Manual(t) => Ok(t
                .accept(samples)?
                .into_iter()
                .map(TurnEvent::Transcript)
                .collect()),
            Turns::Vad(t) => t.accept_turns(samples),
        }
    }

    /// Ends the stream (the turn under way, by hand); the next audio starts a new one at 0.
    pub fn finish(&mut self) -> Result<Vec<TurnEvent>> {
        match self {
            Turns::Manual(t) => Ok(t.finish()?.into_iter().map(TurnEvent::Transcript).collect()),
            Turns::Vad(t) => t.finish_turns(),
        }
    }

    /// Turns ended by `params` (`None`: by hand) from a fresh stream on; `model` gives the VAD
    /// when one is needed. Audio accepted and not finished is dropped.
    pub fn with_params(
        self,
        params: Option<TurnParams>,
        model: impl FnOnce() -> Result<Arc<VadModel>>,
    ) -> Result<Turns> {
        Ok(match (self, params) {
            (Turns::Manual(t), None) => Turns::Manual(t),
            (Turns::Manual(t), Some(p)) => Turns::Vad(Box::new(VadTurns::new(t, model()?, p)?)),
            (Turns::Vad(mut t), Some(p)) => {
                t.set_params(p);
                Turns::Vad(t)
            }
            (Turns::Vad(t), None) => Turns::Manual(t.into_inner()),
        })
    }
}
