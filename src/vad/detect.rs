//! Speech segments of decoded audio, as `parakeet vad` and Python's `parakeet.vad` find them:
//! at the rate recorded when the model takes it (16 or 8 kHz), any other rate resampled to
//! 16 kHz first; audio with no samples has no speech.

use super::{SampleRate, SpeechParams, SpeechSegment, Vad, speech_segments};
use crate::audio::{self, Audio};
use crate::error::Result;

/// What [`detect`] found in one signal.
#[derive(Clone, Debug)]
pub struct Detection {
    /// In samples of the signal the model ran on (at `rate`).
    pub segments: Vec<SpeechSegment>,
    /// One per 32 ms window.
    pub probabilities: Vec<f32>,
    pub rate: SampleRate,
    pub n_samples: usize,
    /// The recorded rate, when it was resampled to 16 kHz for the model.
    pub resampled_from: Option<u32>,
}

impl Detection {
    /// A segment's start and end in seconds.
    pub fn seconds(&self, s: &SpeechSegment) -> (f64, f64) {
        let hz = self.rate.hz() as f64;
        (s.start as f64 / hz, s.end as f64 / hz)
    }
}

/// Decoded audio, or the rate of a file with no samples (the error [`audio::NoSamples`]
/// reports); any other failure passes through.
pub fn audio_or_empty(decoded: Result<Audio>) -> Result<Audio> {
    match decoded {
        Err(e) => match audio::NoSamples::find(&e) {
            Some(empty) => Ok(Audio {
                samples: Vec::new(),
                sample_rate: empty.sample_rate,
                channels_in: 1,
                duration_s: 0.0,
            }),
            None => Err(e),
        },
        ok => ok,
    }
}

/// The speech of `audio` by `params`.
pub fn detect(vad: &mut Vad, audio: Audio, params: &SpeechParams) -> Result<Detection> {
    let (samples, rate, resampled_from) = match SampleRate::from_hz(audio.sample_rate) {
        Some(rate) => (audio.samples, rate, None),
        None => {
            let from = audio.sample_rate;
            (
                audio::resample_to_16k(audio)?,
                SampleRate::Hz16000,
                Some(from),
            )
        }
    };
    let probabilities = vad.probabilities(&samples, rate)?;
    let segments = speech_segments(
        &probabilities,
        samples.len(),
        rate.hz(),
        rate.window(),
        params,
    );
    Ok(Detection {
        segments,
        probabilities,
        rate,
        n_samples: samples.len(),
        resampled_from,
    })
}
