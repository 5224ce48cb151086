//! One transducer hypothesis: everything a search needs to extend it, as a plain value that a
//! beam can hold several of and clone when it forks.

use crate::tokenizer::Token;

/// The prediction network's recurrent state: `(h, c)` per LSTM layer, `pred_hidden` values
/// each.
///
/// Kept on the host, not in backend tensors: it is a few KB (2 x 2 x 640 floats on the 0.6b)
/// against a step's megabytes of weights, the graph copies it in and reads it back with the
/// step's other results, and a host value clones for free when a beam forks.
#[derive(Clone, Debug, PartialEq)]
pub struct LstmState {
    pub(super) layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl LstmState {
    /// The state before any token (all zeros), for `layers` layers of `hidden` units.
    pub fn zeros(layers: usize, hidden: usize) -> LstmState {
        LstmState {
            layers: vec![(vec![0.0; hidden], vec![0.0; hidden]); layers],
        }
    }

    /// `(h, c)` of each layer.
    pub fn layers(&self) -> &[(Vec<f32>, Vec<f32>)] {
        &self.layers
    }
}

/// A partial transcript and the decoder state behind it.
#[derive(Clone, Debug)]
pub struct Hypothesis {
    /// The prediction network's state after the last token.
    pub(super) state: LstmState,
    /// `joint.pred` of that state's output: what the joint adds to every frame's projection
    /// until the next emission.
    pub(super) pred_out: Vec<f32>,
    /// The last emitted token (`None` at the start, when the start symbol was fed).
    pub(super) last: Option<usize>,
    /// The search's score of this hypothesis (a beam's log-probability; the greedy search
    /// does not score and leaves it at 0).
    pub(super) score: f32,
    /// The encoder frame the next step looks at.
    pub(super) frame: usize,
    /// Tokens emitted so far, each with its frame and duration (its timestamps).
    pub(super) tokens: Vec<Token>,
}

impl Hypothesis {
    pub fn last(&self) -> Option<usize> {
        self.last
    }

    pub fn score(&self) -> f32 {
        self.score
    }

    pub fn frame(&self) -> usize {
        self.frame
    }

    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    pub fn state(&self) -> &LstmState {
        &self.state
    }

    /// The tokens emitted since the last call (a stream hands them on chunk by chunk).
    pub fn take_tokens(&mut self) -> Vec<Token> {
        std::mem::take(&mut self.tokens)
    }

    /// The emitted tokens, giving up the rest.
    pub fn into_tokens(self) -> Vec<Token> {
        self.tokens
    }
}
