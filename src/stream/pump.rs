//! Moves audio from a source to a transcriber: each piece as it arrives, resampled to the
//! transcriber's rate on the way, the events handed on as they come.

use super::input::AudioSource;
use super::{LiveTranscriber, StreamEvent};
use crate::audio::decode::{check_sample_rate, check_samples};
use crate::audio::resample::StreamResampler;
use crate::bail;
use crate::error::{Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How the audio is fed.
#[derive(Clone, Copy, Debug, Default)]
pub struct PumpOptions {
    /// Feed the audio no faster than it plays (`--realtime`); a live source (a microphone) is
    /// never paced again.
    pub realtime: bool,
    /// Stop after this many seconds of input (`--max-seconds`).
    pub max_seconds: Option<f64>,
    /// Stop reading when this turns true (Ctrl-C): the utterance in progress is finished as at
    /// the end of the input.
    pub stop: Option<&'static AtomicBool>,
}

/// What a pumped stream came to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PumpSummary {
    /// Seconds of input fed to the transcriber.
    pub audio_seconds: f64,
    /// The input went on past `max_seconds`: it was cut there (and its last utterance ended
    /// with a final, as at the end of the input).
    pub cut_at_limit: bool,
    /// `stop` turned true: the input was left there (its last utterance finished).
    pub stopped: bool,
}

/// Feeds `source` to `transcriber` until the source ends (or reaches `max_seconds`), then
/// finishes the stream, handing every event to `on_event` as it comes. A source that fails
/// mid-stream still gets its last utterance finished before the error is returned.
pub fn pump<T: LiveTranscriber + ?Sized>(
    source: &mut dyn AudioSource,
    transcriber: &mut T,
    options: &PumpOptions,
    on_event: &mut dyn FnMut(&StreamEvent) -> Result<()>,
) -> Result<PumpSummary> {
    let rate = source.sample_rate();
    let mut feeder = Feeder::new(rate, &*transcriber)
        .with_context(|| format!("{}: cannot resample its audio", source.name()))?;
    let limit = options
        .max_seconds
        .map(|s| (s.max(0.0) * f64::from(rate)).round() as u64);
    let pace = options.realtime && !source.is_live();
    let started = Instant::now();
    let mut cut_at_limit = false;
    let stop_asked = || options.stop.is_some_and(|s| s.load(Ordering::SeqCst));
    let failure = loop {
        if stop_asked() {
            break None;
        }
        let mut piece = match source.next_piece() {
            Ok(Some(piece)) => piece,
            Ok(None) => break None,
            Err(e) => break Some(e),
        };
        // As `transcribe` refuses such a file, before the resampler sees the sample.
        if let Err(e) = feeder.check(&piece) {
            break Some(e.context(source.name().to_string()));
        }
        let read = feeder.samples_read();
        if let Some(limit) = limit
            && read + piece.len() as u64 > limit
        {
            piece.truncate((limit - read) as usize);
            cut_at_limit = true;
        }
        if pace {
            // The piece is fed once the speaker would have finished saying it.
            let end = read + piece.len() as u64;
            let due = Duration::from_secs_f64(end as f64 / f64::from(rate));
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        for event in feeder.push(transcriber, &piece)? {
            on_event(&event)?;
        }
        if cut_at_limit {
            break None;
        }
    };
    let read = feeder.samples_read();
    // The input's end is where a stream too short to transcribe is refused: say which input.
    let last = feeder
        .finish(transcriber)
        .map_err(|e| e.context(source.name()))?;
    for event in &last {
        on_event(event)?;
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let stopped = stop_asked();
    if read == 0 && !stopped {
        // As for an empty WAV: nothing to transcribe is a mistake, not a silent success.
        bail!(Audio, "{}: no audio (the input is empty)", source.name());
    }
    Ok(PumpSummary {
        audio_seconds: read as f64 / f64::from(rate),
        cut_at_limit,
        stopped,
    })
}

/// Audio at its own rate into a transcriber, a piece at a time: each piece checked as
/// `transcribe` checks a file's samples, then resampled to the transcriber's rate. [`pump`]
/// feeds a source through one; a front end that is handed the pieces (the Python package's
/// streams) holds one itself.
pub struct Feeder {
    resampler: StreamResampler,
    rate: u32,
    /// Samples taken so far, at `rate`.
    read: u64,
    resampled: Vec<f32>,
}

impl Feeder {
    /// A feeder of audio at `rate` Hz (refused outside the rates a file may have) into
    /// `transcriber`.
    pub fn new<T: LiveTranscriber + ?Sized>(rate: u32, transcriber: &T) -> Result<Feeder> {
        check_sample_rate(rate)?;
        Ok(Feeder {
            resampler: StreamResampler::new(rate, transcriber.sample_rate())?,
            rate,
            read: 0,
            resampled: Vec::new(),
        })
    }

    /// The rate of the audio it takes.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// Samples taken so far.
    pub fn samples_read(&self) -> u64 {
        self.read
    }

    /// Refuses a piece holding a sample that is not a number or far out of range; the error
    /// names the sample by its place in the whole stream.
    pub fn check(&self, piece: &[f32]) -> Result<()> {
        check_samples(piece, self.read, self.rate)
    }

    /// Feeds a piece [`check`](Self::check)ed; the events it completed.
    pub fn push<T: LiveTranscriber + ?Sized>(
        &mut self,
        transcriber: &mut T,
        piece: &[f32],
    ) -> Result<Vec<StreamEvent>> {
        self.read += piece.len() as u64;
        self.resampled.clear();
        self.resampler.push(piece, &mut self.resampled)?;
        transcriber.accept(&self.resampled)
    }

    /// The input ended: the resampler's last samples go in, then the transcriber finishes
    /// (the utterance under way ends with a final, and it starts again at time 0).
    pub fn finish<T: LiveTranscriber + ?Sized>(
        &mut self,
        transcriber: &mut T,
    ) -> Result<Vec<StreamEvent>> {
        self.resampled.clear();
        self.resampler.finish(&mut self.resampled)?;
        let mut events = transcriber.accept(&self.resampled)?;
        events.extend(transcriber.finish()?);
        Ok(events)
    }
}
