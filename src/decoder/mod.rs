//! Decoding: the transducer's networks ([`nets`]) stepping [`hypothesis`] values for a search
//! (greedy TDT and RNN-T in [`greedy`]; beam searches with N-best lists in [`beam`], over
//! the same nets) and greedy CTC ([`ctc`]), each optionally steered towards given phrases by
//! NeMo's boosting tree ([`boosting`]). Tokens become text and words in the tokenizer.
//!
//! The prediction network and the joint run as small graphs on the same persistent backend as
//! the encoder; the joint's encoder projection comes precomputed from the encoder graph.

pub mod beam;
pub mod boosting;
pub mod confidence;
pub mod ctc;
pub mod greedy;
pub mod hypothesis;
pub mod nets;
