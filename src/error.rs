//! The library's error: whose fault a failure is decides how every front end reports it, so
//! the kind is fixed where the failure is found and each front end maps it once (the CLI to
//! its exit code, the server to an HTTP status, Python to an exception class).

use std::fmt;

/// A failure of a library call, by whose it is.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The user's audio cannot be transcribed: undecodable, empty, too short, samples that are
    /// not numbers, a rate or layout out of range.
    #[error("{0}")]
    Audio(String),
    /// The user's audio holds no samples at all (a WAV with an empty `data` chunk): an error
    /// for transcription, no speech for speech detection. `sample_rate` is its header's.
    #[error("{message}")]
    NoSamples { message: String, sample_rate: u32 },
    /// The user's audio is longer than the front end's limit (the server's
    /// `--max-audio-seconds`).
    #[error("{0}")]
    AudioTooLong(String),
    /// A decoding option the user gave is out of its range or does not fit the model.
    #[error("{0}")]
    Options(String),
    /// The model the user named is missing, broken or not a model this program runs.
    #[error("{0}")]
    Model(String),
    /// Reading or writing a file failed (`kind` says why: a missing file, no permission, a
    /// full disk, a closed pipe).
    #[error("{message}")]
    Io {
        message: String,
        kind: std::io::ErrorKind,
    },
    /// A failure of ours: a bug, or a resource the machine could not give.
    #[error("{0}")]
    Internal(String),
}

/// Whose a failure is: what a front end answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// The user's input or request (CLI exit 2, HTTP 4xx, Python `ValueError` or
    /// `FileNotFoundError`).
    User,
    /// Ours (CLI exit 1, HTTP 500, Python `ParakeetError`).
    Ours,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An audio error from any error (its whole chain in one line).
    pub fn audio(e: impl fmt::Display) -> Error {
        Error::Audio(format!("{e:#}"))
    }

    /// An options error.
    pub fn options(e: impl fmt::Display) -> Error {
        Error::Options(format!("{e:#}"))
    }

    /// A model error.
    pub fn model(e: impl fmt::Display) -> Error {
        Error::Model(format!("{e:#}"))
    }

    /// An internal error.
    pub fn internal(e: impl fmt::Display) -> Error {
        Error::Internal(format!("{e:#}"))
    }

    /// An I/O error with what was being done (`context`, e.g. the file's name).
    pub fn io(context: impl fmt::Display, e: &std::io::Error) -> Error {
        Error::Io {
            message: format!("{context}: {e}"),
            kind: e.kind(),
        }
    }

    /// Whose this failure is. An I/O failure is the user's when the path they gave is wrong
    /// (not there, not permitted, a directory); any other (a full disk, a closed pipe, a
    /// device error) is the machine's, reported as ours.
    pub fn blame(&self) -> Blame {
        match self {
            Error::Internal(_) => Blame::Ours,
            Error::Io { kind, .. } if !is_users_io(*kind) => Blame::Ours,
            _ => Blame::User,
        }
    }

    /// The same failure with `prefix` before its message ("a.wav: ..."), of the same kind.
    pub fn context(self, prefix: impl fmt::Display) -> Error {
        self.map_message(|m| format!("{prefix}: {m}"))
    }

    /// The same failure, of the same kind, with its message rewritten by `with`.
    pub fn map_message(self, with: impl FnOnce(String) -> String) -> Error {
        match self {
            Error::Audio(m) => Error::Audio(with(m)),
            Error::AudioTooLong(m) => Error::AudioTooLong(with(m)),
            Error::NoSamples {
                message,
                sample_rate,
            } => Error::NoSamples {
                message: with(message),
                sample_rate,
            },
            Error::Options(m) => Error::Options(with(m)),
            Error::Model(m) => Error::Model(with(m)),
            Error::Io { message, kind } => Error::Io {
                message: with(message),
                kind,
            },
            Error::Internal(m) => Error::Internal(with(m)),
        }
    }

    /// Whether this is a file that is not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Io { kind, .. } if *kind == std::io::ErrorKind::NotFound)
    }
}

/// I/O failures that mean the path the user gave is wrong.
pub fn is_users_io(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        kind,
        K::NotFound | K::PermissionDenied | K::IsADirectory | K::NotADirectory | K::InvalidFilename
    )
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io {
            message: e.to_string(),
            kind: e.kind(),
        }
    }
}

impl Error {
    /// Whether this is a write to a closed pipe (`parakeet ... | head -1`): a front end ends
    /// quietly then, since nobody is left to read what it would say.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Io { kind, .. } if *kind == std::io::ErrorKind::BrokenPipe)
    }
}

/// What was being done, put before a failure's message, its kind kept: a library error stays
/// the kind it was found as, an I/O error becomes [`Error::Io`] with its `ErrorKind`.
pub trait Context<T> {
    /// The failure with `context` before its message ("a.wav: ...").
    fn context(self, context: impl fmt::Display) -> Result<T>;

    /// [`Context::context`] with the context built only on failure.
    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T> Context<T> for Result<T> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| e.context(context))
    }

    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}

impl<T> Context<T> for Result<T, std::io::Error> {
    fn context(self, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error::io(context, &e))
    }

    fn with_context<C: fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| Error::io(context(), &e))
    }
}

/// A failure of another library (or a missing value) as an [`Error`] of the kind whose fault it
/// is, with what was being done before its message: `.fault(Error::Model, "tokenizer")`.
pub trait Fault<T> {
    /// The failure as `kind`, `context` before its message (and its causes').
    fn fault(self, kind: fn(String) -> Error, context: impl fmt::Display) -> Result<T>;

    /// [`Fault::fault`] with the context built only on failure.
    fn with_fault<C: fmt::Display>(
        self,
        kind: fn(String) -> Error,
        context: impl FnOnce() -> C,
    ) -> Result<T>;
}

impl<T, E: std::error::Error> Fault<T> for Result<T, E> {
    fn fault(self, kind: fn(String) -> Error, context: impl fmt::Display) -> Result<T> {
        self.map_err(|e| kind(format!("{context}: {}", chain(&e))))
    }

    fn with_fault<C: fmt::Display>(
        self,
        kind: fn(String) -> Error,
        context: impl FnOnce() -> C,
    ) -> Result<T> {
        self.map_err(|e| kind(format!("{}: {}", context(), chain(&e))))
    }
}

/// A missing value is a failure of `kind` that `context` describes.
impl<T> Fault<T> for Option<T> {
    fn fault(self, kind: fn(String) -> Error, context: impl fmt::Display) -> Result<T> {
        self.ok_or_else(|| kind(context.to_string()))
    }

    fn with_fault<C: fmt::Display>(
        self,
        kind: fn(String) -> Error,
        context: impl FnOnce() -> C,
    ) -> Result<T> {
        self.ok_or_else(|| kind(context().to_string()))
    }
}

/// An error and its causes in one line ("outer: inner").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// An [`Error`] of a kind (`Audio`, `Options`, `Model`, `Internal`, `AudioTooLong`) with a
/// `format!` message: `err!(Model, "{path}: not a model")`.
#[macro_export]
macro_rules! err {
    ($kind:ident, $($arg:tt)+) => {
        $crate::error::Error::$kind(format!($($arg)+))
    };
}

/// Returns an [`err!`] from the function: `bail!(Options, "--beam {n} is out of range")`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)+) => {
        return Err($crate::err!($kind, $($arg)+))
    };
}

/// Returns an [`err!`] from the function unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $kind:ident, $($arg:tt)+) => {
        if !$cond {
            $crate::bail!($kind, $($arg)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_survives_context_and_prefixes() {
        let inner: Result<()> = Err(Error::Audio("sample 5 is NaN".into()));
        let e = inner.context("a.wav").unwrap_err();
        assert!(
            matches!(&e, Error::Audio(m) if m == "a.wav: sample 5 is NaN"),
            "{e:?}"
        );
        assert_eq!(e.blame(), Blame::User);
        let e = Error::Options("--beam 0".into()).context("request");
        assert_eq!(e.to_string(), "request: --beam 0");
        assert!(matches!(e, Error::Options(_)));
    }

    #[test]
    fn io_errors_keep_their_kind_and_faults_take_theirs() {
        let missing = std::fs::read("/nonexistent/parakeet").context("x.wav");
        let e = missing.unwrap_err();
        assert!(e.is_not_found(), "{e:?}");
        assert!(e.to_string().starts_with("x.wav: "), "{e}");
        assert_eq!(e.blame(), Blame::User);
        let bad: Result<u8, _> = u8::try_from(300i32).fault(Error::Model, "n_layers");
        let e = bad.unwrap_err();
        assert!(
            matches!(&e, Error::Model(m) if m.starts_with("n_layers: ")),
            "{e:?}"
        );
        let none: Result<u8> = None.fault(Error::Internal, "a graph lost its state");
        assert_eq!(none.unwrap_err().blame(), Blame::Ours);
        let e = err!(Options, "--beam {}", 0);
        assert!(matches!(e, Error::Options(m) if m == "--beam 0"));
    }

    #[test]
    fn io_blame_follows_the_kind() {
        use std::io::{Error as IoError, ErrorKind as K};
        for (kind, blame) in [
            (K::NotFound, Blame::User),
            (K::PermissionDenied, Blame::User),
            (K::IsADirectory, Blame::User),
            (K::NotADirectory, Blame::User),
            (K::StorageFull, Blame::Ours),
            (K::BrokenPipe, Blame::Ours),
            (K::Other, Blame::Ours),
        ] {
            let e = Error::io("out.txt", &IoError::from(kind));
            assert_eq!(e.blame(), blame, "{kind:?}");
        }
    }
}
