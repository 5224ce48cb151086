//! The decoding flags `transcribe` and `serve` share (confidence, phrase boosting, beam
//! search), checked and resolved against a model into the options a
//! `Session` decodes with. Every check happens here, before any audio is
//! read: a bad flag is one clear error and nothing is written.

use crate::decoder::confidence::{Aggregation, ConfidenceConfig, Measure};
use anyhow::{Result, bail};

/// Confidence flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfidenceArgs {
    /// Token and word confidence (JSON `tokens[].confidence` / `words[].confidence`, the TSV's
    /// fourth column, the server's verbose_json `words[].probability`), as NeMo computes it:
    /// `max_prob`, `entropy_<gibbs|tsallis|renyi>_<lin|exp>`, or `none`. Default: NeMo's
    /// `entropy_tsallis_exp`, computed when an output shows it.
    #[arg(long, value_name = "METHOD")]
    pub confidence: Option<String>,
    /// The confidence method's alpha (> 0; NeMo's default 0.33).
    #[arg(long, value_name = "A", default_value_t = 0.33)]
    pub confidence_alpha: f64,
    /// How token confidences make a word's: mean, min (NeMo's default), max, prod.
    #[arg(long, value_name = "HOW", default_value = "min")]
    pub confidence_aggregation: String,
    /// Count blank steps into token confidence (NeMo's `exclude_blank: false`).
    #[arg(long)]
    pub confidence_with_blanks: bool,
    /// TDT: aggregate each step's duration confidence with its label's (NeMo's
    /// `tdt_include_duration`).
    #[arg(long)]
    pub confidence_with_durations: bool,
}

impl ConfidenceArgs {
    /// The confidence to compute, given whether an output shows it (`wanted`): `None` when
    /// off. Errors name the flag.
    pub fn resolve(&self, wanted: bool) -> Result<Option<ConfidenceConfig>> {
        let measure = match self.confidence.as_deref() {
            Some("none") => None,
            Some(name) => Some(
                name.parse::<Measure>()
                    .map_err(|e| anyhow::anyhow!("--confidence: {e}"))?,
            ),
            None => wanted.then(|| ConfidenceConfig::default().measure),
        };
        let aggregation: Aggregation = self
            .confidence_aggregation
            .parse()
            .map_err(|e| anyhow::anyhow!("--confidence-aggregation: {e}"))?;
        if !(self.confidence_alpha > 0.0 && self.confidence_alpha.is_finite()) {
            bail!(
                "--confidence-alpha must be a number > 0, got {}",
                self.confidence_alpha
            );
        }
        Ok(measure.map(|measure| ConfidenceConfig {
            measure,
            alpha: self.confidence_alpha,
            aggregation,
            exclude_blank: !self.confidence_with_blanks,
            tdt_include_duration: self.confidence_with_durations,
        }))
    }
}
