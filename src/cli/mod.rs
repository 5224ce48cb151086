//! The CLI's subcommands that have code of their own beyond dispatch (`src/main.rs` parses the
//! command line and calls them).

pub mod diarize;
pub mod profile;
pub mod signals;
pub mod vad;

use crate::error::{Blame, Error, Result};
use std::path::Path;

/// How messages name an input argument (`-` is standard input).
pub fn shown(input: &Path) -> String {
    match input.as_os_str() == "-" {
        true => "<stdin>".to_string(),
        false => input.display().to_string(),
    }
}

/// A batch of several inputs where some failed (each failure reported on its own line).
pub const EXIT_FAILED_INPUTS: u8 = 1;
/// The user's error: flags, options, the model, or the one input they gave.
pub const EXIT_USAGE: u8 = 2;

/// The exit code of a failure, by whose it is: the user's (bad audio, a missing file, a bad
/// option) 2, ours 1.
pub fn exit_code(e: &Error) -> u8 {
    match e.blame() {
        Blame::User => EXIT_USAGE,
        Blame::Ours => EXIT_FAILED_INPUTS,
    }
}

/// The one rule every file command ends by: 0 when nothing failed; one input that failed,
/// its failure's code ([`exit_code`]: the same as any other error of the user's); a batch of
/// several where some failed, [`EXIT_FAILED_INPUTS`], whatever the failures were.
#[derive(Debug, Default)]
pub struct Outcome {
    pub done: usize,
    pub failed: usize,
    pub skipped: usize,
    /// The exit code of the first failure.
    first_failure: Option<u8>,
}

impl Outcome {
    /// Counts a failed input, whose failure has exit code `code` ([`exit_code`]).
    pub fn fail(&mut self, code: u8) {
        self.failed += 1;
        self.first_failure.get_or_insert(code);
    }

    /// Counts one input's result: done, or failed with its error line on standard error. A
    /// closed standard output ends the run instead: that error comes back.
    pub fn record(&mut self, input: &Path, result: Result<()>) -> Result<()> {
        match result {
            Ok(()) => self.done += 1,
            Err(e) if e.is_broken_pipe() => return Err(e),
            Err(e) => {
                eprintln!("{}", input_error(&shown(input), &e));
                self.fail(exit_code(&e));
            }
        }
        Ok(())
    }

    /// The exit code of a run over `inputs` inputs.
    pub fn code(&self, inputs: usize) -> u8 {
        match (self.failed, self.first_failure) {
            (0, _) => 0,
            (_, Some(code)) if inputs == 1 => code,
            _ => EXIT_FAILED_INPUTS,
        }
    }

    /// The closing line of a batch (several inputs, or any skipped): what was done, and the
    /// speed when there was audio. A batch that had nothing to do says so instead of a speed.
    pub fn summary(&self, non_audio: usize, audio_seconds: f64, wall_seconds: f64) -> String {
        let counts = format!(
            "{} done, {} failed, {} skipped, {non_audio} non-audio files ignored",
            self.done, self.failed, self.skipped
        );
        if self.done == 0 && self.failed == 0 {
            return format!(
                "nothing to do: {} skipped, {non_audio} non-audio files ignored",
                self.skipped
            );
        }
        format!(
            "{counts}; {audio_seconds:.1} s of audio in {wall_seconds:.1} s ({:.1}x real time)",
            audio_seconds / wall_seconds.max(1e-9)
        )
    }
}

/// A failed input's error line: the error names the input once (most errors already begin
/// with it; those from later stages get it put in front).
pub fn input_error(shown: &str, e: &Error) -> String {
    let message = format!("{e:#}");
    match message.contains(shown) {
        true => format!("error: {message}"),
        false => format!("error: {shown}: {message}"),
    }
}
