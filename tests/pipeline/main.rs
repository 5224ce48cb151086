//! Every stage against NeMo's reference outputs: audio, model loading, encoder, decoders, conversion, bad input, output formats.

#[path = "../common/mod.rs"]
mod common;

mod audio;
mod model;
mod encoder;
mod decoder;
mod local_attention;
mod convert;
mod hardening;
mod output;
mod tokenizer;
