//! The CLI's subcommands that have code of their own beyond dispatch (`src/main.rs` parses the
//! command line and calls them).

pub mod diarize;
pub mod profile;
pub mod signals;
pub mod vad;
