//! parakeet: NVIDIA Parakeet speech recognition (FastConformer + TDT/RNN-T/CTC) on ggml.
//!
//! Pipeline: [`audio`] (decode, resample, log-mel) -> [`encoder`] (one fused ggml graph) ->
//! [`decoder`] (TDT / RNN-T / CTC greedy) -> [`tokenizer`] (ids -> text and words; text -> ids
//! as NeMo's SentencePiece tokenizer gives them). [`backend`] is the only place that touches
//! ggml's FFI; [`model`] loads a GGUF written by [`convert`]; [`hparams`] is the metadata schema
//! they share.

pub mod audio;
pub mod backend;
pub mod convert;
pub mod decoder;
pub mod encoder;
pub mod hparams;
pub mod model;
pub mod model_source;
pub mod output;
pub mod server;
pub mod tokenizer;
pub mod transcribe;
