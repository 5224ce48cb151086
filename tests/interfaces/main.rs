//! The command line, the OpenAI-compatible server and the hub resolver, run as a user would.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod commands;
mod device;
mod diarize;
mod grammar;
mod hub;
mod live_double;
mod live_nemo;
mod realtime;
mod serve;
mod serve_auth;
mod serve_diarize;
mod signals;
mod speech;
mod stream;
mod stream_buffered;
mod stream_diarize;
mod transcribe_diarize;
mod vad;
mod vad_turns;
