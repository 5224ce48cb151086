//! Every stage against NeMo's reference outputs: audio, model loading, encoder, decoders, conversion, bad input, output formats.

#[path = "../common/mod.rs"]
mod common;

mod audio;
mod beam;
mod boosting;
mod buffered;
mod confidence;
mod convert;
mod decoder;
mod diar;
mod encoder;
mod hardening;
mod local_attention;
mod model;
mod output;
mod speech;
mod speech_context_free;
mod streaming;
mod tokenizer;
mod vad;
mod vad_turns;
