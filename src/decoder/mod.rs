//! Greedy decoding: TDT and RNN-T (label looping, as NeMo) and CTC.
//!
//! The prediction network and the joint run as small graphs on the same persistent backend as
//! the encoder; the joint's encoder projection comes precomputed from the encoder graph.

mod ctc;
mod transducer;

pub use ctc::{ctc_greedy, log_softmax_rows};
pub use transducer::{Step, TransducerDecoder};
