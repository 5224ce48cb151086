//! The one path from an input to a [`Transcript`] that every front end takes (the command line,
//! the server, Python): decode, check the length, resample, transcribe (and, given a
//! diarizer, the speaker of every word), each failure classified once by whose it is.

use super::{DecodeOptions, Session};
use crate::audio::{self, Audio};
use crate::diar::Diarizer;
use crate::diar::words::assign_speakers;
use crate::error::{Error, Result};
use crate::transcript::Transcript;
use std::path::Path;

/// Something to transcribe.
pub enum Input<'a> {
    /// An audio file.
    Path(&'a Path),
    /// A whole audio file in memory (an upload, standard input); `name` names it in errors and
    /// its extension hints the format.
    Bytes { data: &'a [u8], name: &'a str },
    /// Samples already decoded, at their own rate; `name` names them in errors.
    Samples { audio: Audio, name: &'a str },
    /// Standard input, read whole (a WAV or FLAC stream); named `<stdin>` in errors.
    Stdin,
}

impl<'a> Input<'a> {
    /// A command-line argument: `-` is standard input, anything else a file.
    pub fn arg(path: &'a Path) -> Input<'a> {
        match path.as_os_str() == "-" {
            true => Input::Stdin,
            false => Input::Path(path),
        }
    }

    /// How errors name this input.
    pub fn name(&self) -> String {
        match self {
            Input::Stdin => "<stdin>".to_string(),
            Input::Path(p) => p.display().to_string(),
            Input::Bytes { name, .. } | Input::Samples { name, .. } => name.to_string(),
        }
    }
}

/// Limits a front end puts on its inputs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Longest audio accepted, in seconds (the server's `--max-audio-seconds`).
    pub max_seconds: Option<f64>,
}

/// An input's samples at the model's rate (16 kHz mono), checked: undecodable audio is
/// [`Error::Audio`], audio with no samples [`Error::NoSamples`] (with or without speech
/// detection: a file that holds nothing is a broken input either way), audio over `limits`
/// [`Error::AudioTooLong`], a missing file [`Error::Io`].
pub fn load_samples(input: Input<'_>, limits: Limits) -> Result<Vec<f32>> {
    let shown = input.name();
    let decoded = match input {
        Input::Path(path) => audio::load_audio(path),
        Input::Bytes { data, name } => audio::decode_bytes(data, name),
        Input::Samples { audio, .. } => Ok(audio),
        Input::Stdin => audio::read_stdin(),
    };
    let decoded = decoded?;
    if let Some(max) = limits.max_seconds
        && decoded.duration_s > max
    {
        return Err(Error::AudioTooLong(format!(
            "{shown}: {:.1} s of audio is longer than the limit of {max} s",
            decoded.duration_s
        )));
    }
    audio::resample_to_16k(decoded).map_err(|e| Error::Audio(format!("{shown}: resampling: {e:#}")))
}

/// Transcribes one input by `opts`: [`load_samples`], then [`transcribe_samples`]. Every
/// error names the input.
pub fn transcribe_input(
    session: &mut Session,
    diarizer: Option<&mut Diarizer>,
    input: Input<'_>,
    opts: &DecodeOptions,
    limits: Limits,
) -> Result<Transcript> {
    let shown = input.name();
    let samples = load_samples(input, limits)?;
    transcribe_samples(session, diarizer, samples, opts, &shown)
}

/// Transcribes 16 kHz samples by `opts` ([`Session::transcribe`]); with a diarizer, each word
/// also gets the speaker most active over its span ([`assign_speakers`]). `shown` names the
/// input in errors.
pub fn transcribe_samples(
    session: &mut Session,
    diarizer: Option<&mut Diarizer>,
    samples: Vec<f32>,
    opts: &DecodeOptions,
    shown: &str,
) -> Result<Transcript> {
    let started = std::time::Instant::now();
    // Audio too short for one frame has no words to give speakers to.
    let activity = match diarizer {
        Some(d) if d.frames_of(samples.len()) > 0 => Some(
            d.diarize(&samples)
                .map_err(|e| Error::internal(format!("{shown}: diarizing: {e:#}")))?,
        ),
        _ => None,
    };
    let diarization = started.elapsed();
    let mut t = session
        .transcribe(samples, opts)
        .map_err(|e| e.context(shown))?;
    if let Some(activity) = &activity {
        assign_speakers(&mut t.words, activity);
        t.times.diarization = diarization;
    }
    Ok(t)
}
