//! Audio front end: decode any supported file to mono, resample to 16 kHz, compute NeMo's
//! normalised log-mel features.
//!
//! ```no_run
//! # fn main() -> parakeet::error::Result<()> {
//! use parakeet::audio::{self, mel};
//! let audio = audio::load_audio("speech.flac".as_ref())?;
//! let samples = audio::resample_to_16k(audio)?;
//! # let (window, fb) = (vec![0.0; 400], vec![0.0; 128 * 257]);
//! let features = mel::log_mel(&samples, &window, &fb, &mel::MelConfig::parakeet(128));
//! # Ok(()) }
//! ```

pub mod decode;
pub mod mel;
pub mod resample;

use std::path::Path;

use crate::error::{Context, Result};

pub use decode::{Audio, NoSamples, decode_bytes};
pub use resample::TARGET_RATE;

/// File extensions (lower case) recognised as audio when walking a directory.
pub const AUDIO_EXTENSIONS: &[&str] = &[
    "wav", "wave", "flac", "mp3", "ogg", "oga", "aif", "aiff", "aifc", "caf", "m4a", "aac",
];

/// Whether `path` has one of [`AUDIO_EXTENSIONS`] (case-insensitive).
pub fn is_audio_path(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| AUDIO_EXTENSIONS.iter().any(|a| a.eq_ignore_ascii_case(e)))
}

/// The Windows device that a path's file name stands for (`CON`, `nul`, `aux.wav`: Windows
/// takes the name before the first dot, whatever the folder and extension), upper-cased; None
/// for an ordinary name. Only Windows reads paths so, so only there does it matter
/// ([`windows_device`]).
pub fn device_name(path: &Path) -> Option<String> {
    const FIXED: &[&str] = &["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"];
    let name = path.file_name()?.to_str()?;
    // Windows also drops trailing spaces before the extension and a stream suffix (`:x`).
    let stem = name
        .split(['.', ':'])
        .next()?
        .trim_end_matches(' ')
        .to_ascii_uppercase();
    let numbered = |prefix: &str| {
        stem.strip_prefix(prefix).is_some_and(|n| {
            matches!(
                n,
                "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "¹" | "²" | "³"
            )
        })
    };
    (FIXED.contains(&stem.as_str()) || numbered("COM") || numbered("LPT")).then_some(stem)
}

/// [`device_name`] where the system is Windows; None elsewhere (`aux.wav` is a file on Linux).
pub fn windows_device(path: &Path) -> Option<String> {
    if cfg!(windows) {
        device_name(path)
    } else {
        None
    }
}

/// Decodes an audio file and mixes it down to mono (at its own sample rate).
pub fn load_audio(path: &Path) -> Result<Audio> {
    decode::decode_file(path)
}

pub use decode::declared_seconds;

/// Reads a whole audio file (WAV, FLAC, ...) from standard input.
pub fn read_stdin() -> Result<Audio> {
    let bytes = decode::read_recognised(&mut std::io::stdin().lock(), None)
        .context("cannot read audio from <stdin>")
        .map_err(decode::audio_unless_users_io)?;
    decode_bytes(&bytes, "<stdin>")
}

/// The audio's samples at 16 kHz (moved through unchanged when already at 16 kHz).
pub fn resample_to_16k(audio: Audio) -> Result<Vec<f32>> {
    resample::resample(audio.samples, audio.sample_rate, TARGET_RATE)
}

#[cfg(test)]
mod tests {
    use super::device_name;
    use std::path::Path;

    #[test]
    fn windows_device_names_are_told_from_files() {
        let dev = |p: &str| device_name(Path::new(p));
        for (path, device) in [
            ("CON", "CON"),
            ("nul", "NUL"),
            ("aux.wav", "AUX"),
            ("talks/Aux.WAV", "AUX"),
            ("talks/com1.txt", "COM1"),
            ("lpt9.srt", "LPT9"),
            ("prn .flac", "PRN"),
            ("con.tar.gz", "CON"),
            ("conout$", "CONOUT$"),
        ] {
            assert_eq!(dev(path).as_deref(), Some(device), "{path}");
        }
        for path in [
            "console.wav",
            "auxiliary.wav",
            "com0.wav",
            "com10.wav",
            "lpt.wav",
            "my aux.wav",
            "nul/talk.wav",
            "",
        ] {
            assert_eq!(dev(path), None, "{path}");
        }
    }
}
