//! parakeet: NVIDIA Parakeet speech recognition (FastConformer + TDT/RNN-T/CTC) on ggml.
//!
//! Pipeline: [`audio`] (decode, resample, log-mel) -> [`encoder`] (one fused ggml graph) ->
//! [`decoder`] (TDT / RNN-T / CTC greedy), run by a [`session`] over a shared [`model`].
//! [`backend`] is the ggml runtime, [`kernels`] our fused CPU ops on it, [`gguf`] the file format
//! and [`layout`] the weight layouts below them all; [`model`] loads a GGUF written by
//! [`convert`]. docs/ARCHITECTURE.md draws the rooms and what may use what.

pub mod audio;
pub mod backend;
pub mod convert;
pub mod decoder;
pub mod encoder;
pub mod gguf;
pub mod kernels;
pub mod layout;
pub mod model;
pub mod model_source;
pub mod output;
pub mod server;
pub mod session;
pub mod transcript;
