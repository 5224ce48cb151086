//! parakeet: NVIDIA Parakeet speech recognition (FastConformer + TDT/RNN-T/CTC) on ggml.
//!
//! Pipeline: [`audio`] (decode, resample, log-mel) -> [`encoder`] (one fused ggml graph) ->
//! [`decoder`] (TDT / RNN-T / CTC greedy) -> [`tokenizer`] (ids -> text and words; text -> ids
//! as NeMo's SentencePiece tokenizer gives them), run by a [`session`] over a shared [`model`].
//! [`backend`] is the ggml runtime, [`kernels`] our fused CPU ops on it, [`gguf`] the file format
//! and [`layout`] the weight layouts below them all; [`hparams`] is the metadata schema that
//! [`model`] reads and [`convert`] writes; [`vad`] is voice activity detection (Silero VAD). docs/ARCHITECTURE.md draws the rooms and what may use
//! what.

pub mod audio;
pub mod backend;
pub mod cli;
pub mod convert;
pub mod decoder;
pub mod decoding_flags;
pub mod diar;
pub mod encoder;
pub mod error;
pub mod gguf;
pub mod hparams;
pub mod kernels;
pub mod layout;
pub mod model;
pub mod model_source;
pub mod output;
pub mod server;
pub mod session;
pub mod stream;
pub mod tokenizer;
pub mod transcript;
pub mod vad;
