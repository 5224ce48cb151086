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
        let with = |m: String| format!("{prefix}: {m}");
        match self {
            Error::Audio(m) => Error::Audio(with(m)),
            Error::AudioTooLong(m) => Error::AudioTooLong(with(m)),
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

/// Whether `e` is a write to a closed pipe (`parakeet ... | head -1`): a front end ends quietly
/// then, since nobody is left to read what it would say.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The engine below the library's boundary still reports with `anyhow`: what reaches a caller
/// unclassified is ours, unless an I/O error in its chain says otherwise.
impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Error {
        let io = e.chain().find_map(|c| c.downcast_ref::<std::io::Error>());
        match (e.downcast_ref::<Error>(), io) {
            (Some(inner), _) => inner.clone_kind(format!("{e:#}")),
            (None, Some(io)) => Error::Io {
                message: format!("{e:#}"),
                kind: io.kind(),
            },
            (None, None) => Error::Internal(format!("{e:#}")),
        }
    }
}

impl Error {
    /// This error's kind with another message (an `anyhow` chain around it adds context).
    fn clone_kind(&self, message: String) -> Error {
        match self {
            Error::Audio(_) => Error::Audio(message),
            Error::AudioTooLong(_) => Error::AudioTooLong(message),
            Error::Options(_) => Error::Options(message),
            Error::Model(_) => Error::Model(message),
            Error::Io { kind, .. } => Error::Io {
                message,
                kind: *kind,
            },
            Error::Internal(_) => Error::Internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn a_kind_survives_anyhow_context_and_prefixes() {
        let inner: anyhow::Result<()> = Err(Error::Audio("sample 5 is NaN".into()).into());
        let e = Error::from(inner.context("a.wav").unwrap_err());
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
    fn io_errors_keep_their_kind_and_the_rest_is_ours() {
        let missing = std::fs::read("/nonexistent/parakeet").unwrap_err();
        let e = Error::from(anyhow::Error::new(missing).context("x.wav"));
        assert!(e.is_not_found(), "{e:?}");
        assert_eq!(e.blame(), Blame::User);
        let e = Error::from(anyhow::anyhow!("a graph exceeds its capacity"));
        assert_eq!(e.blame(), Blame::Ours);
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
