//! Token and word confidence as NeMo 3.0 computes it (`asr_confidence_utils.py`, the decoders'
//! `compute_confidence`): a measure of each decoding step's distribution mapped to [0, 1], then
//! step values gathered into tokens and tokens into words by an aggregation.
//!
//! Which steps make a token follows NeMo per head, quirks included: a TDT token takes its
//! emitting step (with blanks: the blank steps after it); an RNN-T token with blanks takes the
//! first step of each frame it spans after its own; a CTC token its repeated frames (with
//! blanks: every frame up to the next token's first).

use super::ctc::argmax;
use crate::bail;
use crate::error::Result;
use crate::kernels::vmath::exp_in_place;
use crate::tokenizer::Token;
use std::fmt;
use std::ops::{Range, RangeInclusive};
use std::str::FromStr;

/// How a distribution becomes a confidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// The largest probability, rescaled so that a uniform distribution gives 0.
    MaxProb,
    /// One minus a normalised entropy.
    Entropy(EntropyKind, EntropyNorm),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntropyKind {
    Gibbs,
    Tsallis,
    Renyi,
}

/// How an entropy is mapped to [0, 1].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntropyNorm {
    Lin,
    Exp,
}

/// How step confidences become a token's, and token confidences a word's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Aggregation {
    Mean,
    #[default]
    Min,
    Max,
    Prod,
}

impl Aggregation {
    /// Python's `sum / len`, `min`, `max` and `math.prod` over floats, in order.
    pub fn apply(self, values: &[f64]) -> f64 {
        match self {
            Aggregation::Mean => values.iter().sum::<f64>() / values.len() as f64,
            Aggregation::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
            Aggregation::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Aggregation::Prod => values.iter().product(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Aggregation::Mean => "mean",
            Aggregation::Min => "min",
            Aggregation::Max => "max",
            Aggregation::Prod => "prod",
        }
    }
}

impl FromStr for Aggregation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "mean" => Aggregation::Mean,
            "min" => Aggregation::Min,
            "max" => Aggregation::Max,
            "prod" => Aggregation::Prod,
            _ => return Err(format!("unknown aggregation {s:?} (mean, min, max, prod)")),
        })
    }
}

impl FromStr for Measure {
    type Err = String;
    /// NeMo's measure names: `max_prob`, `entropy_<gibbs|tsallis|renyi>_<lin|exp>`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "max_prob" {
            return Ok(Measure::MaxProb);
        }
        let bad = || {
            format!(
                "unknown confidence method {s:?} (max_prob, or entropy_<gibbs|tsallis|renyi>_<lin|exp>)"
            )
        };
        let rest = s.strip_prefix("entropy_").ok_or_else(bad)?;
        let (kind, norm) = rest.split_once('_').ok_or_else(bad)?;
        let kind = match kind {
            "gibbs" => EntropyKind::Gibbs,
            "tsallis" => EntropyKind::Tsallis,
            "renyi" => EntropyKind::Renyi,
            _ => return Err(bad()),
        };
        let norm = match norm {
            "lin" => EntropyNorm::Lin,
            "exp" => EntropyNorm::Exp,
            _ => return Err(bad()),
        };
        Ok(Measure::Entropy(kind, norm))
    }
}

/// The range of α (`--confidence-alpha`) outside Gibbs' bound: NeMo asks only α > 0, but
/// at α below about 1e-2 `V^α - 1` and `1 - α` lose their digits, and above 10 `V^α` and
/// `Σ p^α` leave f64's range for real vocabularies, and the values leave [0, 1].
pub const ALPHA_RANGE: RangeInclusive<f64> = 0.01..=10.0;

impl Measure {
    /// The α this measure is defined for over `classes` (vocabulary + blank): NeMo's
    /// documented bound for the Gibbs entropy, `(ln V + 2 - sqrt(ln² V + 4)) / (2 ln V) <= α
    /// <= (1 + ln(V - 1)) / ln(V - 1)` (outside it the value leaves [0, 1]), [`ALPHA_RANGE`]
    /// for the others.
    pub fn alpha_range(self, classes: usize) -> RangeInclusive<f64> {
        match self {
            Measure::Entropy(EntropyKind::Gibbs, _) if classes > 2 => {
                let ln_v = (classes as f64).ln();
                let ln_v1 = (classes as f64 - 1.0).ln();
                let low = (ln_v + 2.0 - (ln_v * ln_v + 4.0).sqrt()) / (2.0 * ln_v);
                let high = (1.0 + ln_v1) / ln_v1;
                low.max(*ALPHA_RANGE.start())..=high.min(*ALPHA_RANGE.end())
            }
            _ => ALPHA_RANGE,
        }
    }
}

impl fmt::Display for Measure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Measure::MaxProb => f.write_str("max_prob"),
            Measure::Entropy(kind, norm) => {
                let kind = match kind {
                    EntropyKind::Gibbs => "gibbs",
                    EntropyKind::Tsallis => "tsallis",
                    EntropyKind::Renyi => "renyi",
                };
                let norm = match norm {
                    EntropyNorm::Lin => "lin",
                    EntropyNorm::Exp => "exp",
                };
                write!(f, "entropy_{kind}_{norm}")
            }
        }
    }
}

/// NeMo's `ConfidenceConfig` with its method: what is measured and how it is gathered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConfidenceConfig {
    pub measure: Measure,
    /// The power applied to probabilities (entropies' α); must be > 0.
    pub alpha: f64,
    /// Step values into a token's (when blanks count), tokens into a word's.
    pub aggregation: Aggregation,
    /// Leave blank steps out of token confidence.
    pub exclude_blank: bool,
    /// TDT: a step's value aggregates the label's and the duration's confidence.
    pub tdt_include_duration: bool,
}

impl Default for ConfidenceConfig {
    /// NeMo's defaults: Tsallis entropy, α 0.33, exponential normalisation; words by min;
    /// blanks excluded.
    fn default() -> Self {
        ConfidenceConfig {
            measure: Measure::Entropy(EntropyKind::Tsallis, EntropyNorm::Exp),
            alpha: 0.33,
            aggregation: Aggregation::Min,
            exclude_blank: true,
            tdt_include_duration: false,
        }
    }
}

/// One transducer decoding step (a joint evaluation) with the confidence of its outputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoredStep {
    pub frame: usize,
    /// The label chosen (blank = vocab size).
    pub label: usize,
    /// Confidence of the label distribution (vocabulary + blank).
    pub label_confidence: f32,
    /// TDT: confidence of the duration distribution.
    pub duration_confidence: Option<f32>,
}

impl ConfidenceConfig {
    pub fn validate(&self) -> Result<()> {
        if !(self.alpha > 0.0 && self.alpha.is_finite()) {
            bail!(
                Options,
                "confidence alpha must be a number > 0, got {}",
                self.alpha
            );
        }
        Ok(())
    }

    /// The confidence of a distribution given by its `logits`, normalised over `classes`
    /// (NeMo uses the vocabulary size + 1 here even for the TDT duration head).
    ///
    /// A step's decoder work is one small joint graph, so the measure must cost little beside
    /// it: the exponentials are the vectorised f32 ones (2e-7 relative, as good as torch's f32
    /// that NeMo uses), the sums f64, and only the sums the measure reads are taken.
    pub fn of_logits(&self, logits: &[f32], classes: usize) -> f32 {
        let stats = DistStats::of(logits, self.needs_powers().then_some(self.alpha));
        self.of_stats(&stats, classes)
    }

    /// Whether the measure reads `Σ p^α` (entropies at α != 1).
    fn needs_powers(&self) -> bool {
        matches!(self.measure, Measure::Entropy(..)) && self.alpha != 1.0
    }

    /// The confidence of a distribution given by its log-probabilities (f64; the reference
    /// formulas, for tests).
    pub fn of_log_probs(&self, x: &[f64], classes: usize) -> f32 {
        let t = self.alpha;
        let stats = DistStats {
            max_log_prob: x.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            neg_gibbs: x.iter().map(|&l| l.exp() * l).sum(),
            sum_pow: x.iter().map(|&l| (l * t).exp()).sum(),
            neg_pow_gibbs: x.iter().map(|&l| (l * t).exp() * l).sum(),
        };
        self.of_stats(&stats, classes)
    }

    /// NeMo's measure bank over a distribution's sums, rounded to f32 as NeMo returns it.
    fn of_stats(&self, x: &DistStats, classes: usize) -> f32 {
        let v = classes as f64;
        let t = self.alpha;
        let gibbs_lin = || 1.0 + x.neg_gibbs / v.ln();
        let gibbs_exp = || (x.neg_gibbs.exp() * v - 1.0) / (v - 1.0);
        let value = match self.measure {
            Measure::MaxProb => {
                let max = x.max_log_prob;
                if t == 1.0 {
                    (max.exp() * v - 1.0) / (v - 1.0)
                } else {
                    ((max * t).exp() * v.powf(t) - 1.0) / (v.powf(t) - 1.0)
                }
            }
            // Every entropy is Gibbs' at α = 1.
            Measure::Entropy(_, EntropyNorm::Lin) if t == 1.0 => gibbs_lin(),
            Measure::Entropy(_, EntropyNorm::Exp) if t == 1.0 => gibbs_exp(),
            Measure::Entropy(EntropyKind::Gibbs, EntropyNorm::Lin) => {
                1.0 + x.neg_pow_gibbs / v.ln() / v.powf(1.0 - t)
            }
            Measure::Entropy(EntropyKind::Gibbs, EntropyNorm::Exp) => {
                let floor = v.powf(-t * v.powf(1.0 - t));
                ((x.neg_pow_gibbs * t).exp() - floor) / (1.0 - floor)
            }
            Measure::Entropy(EntropyKind::Tsallis, EntropyNorm::Lin) => {
                1.0 + (1.0 - x.sum_pow) / (v.powf(1.0 - t) - 1.0)
            }
            Measure::Entropy(EntropyKind::Tsallis, EntropyNorm::Exp) => {
                let floor = ((1.0 - v.powf(1.0 - t)) / (1.0 - t)).exp();
                (((1.0 - x.sum_pow) / (1.0 - t)).exp() - floor) / (1.0 - floor)
            }
            Measure::Entropy(EntropyKind::Renyi, EntropyNorm::Lin) => {
                1.0 + x.sum_pow.log2() / (t - 1.0) / v.log2()
            }
            Measure::Entropy(EntropyKind::Renyi, EntropyNorm::Exp) => {
                (x.sum_pow.powf(1.0 / (t - 1.0)) * v - 1.0) / (v - 1.0)
            }
        };
        value as f32
    }

    /// The value a TDT step contributes: its label's confidence, or with
    /// `tdt_include_duration` the aggregation of the label's and the duration's.
    fn step_value(&self, step: &ScoredStep) -> f64 {
        match (self.tdt_include_duration, step.duration_confidence) {
            (true, Some(d)) => self
                .aggregation
                .apply(&[step.label_confidence as f64, d as f64]),
            _ => step.label_confidence as f64,
        }
    }

    /// Per-token confidence of a transducer hypothesis from its decoding `steps` (in order).
    /// `tokens` are the emitted tokens; `frames` the encoder frames decoded.
    pub fn transducer_tokens(
        &self,
        steps: &[ScoredStep],
        tokens: &[Token],
        blank: usize,
        frames: usize,
        tdt: bool,
    ) -> Vec<f64> {
        let emitting = steps.iter().filter(|s| s.label != blank);
        if self.exclude_blank {
            return emitting.map(|s| self.step_value(s)).collect();
        }
        if tdt {
            // NeMo walks the steps backwards: blanks after a token join it; blanks before the
            // first token belong to none.
            let mut out = Vec::with_capacity(tokens.len());
            let mut blanks_after: Vec<f64> = Vec::new();
            for step in steps.iter().rev() {
                let value = self.step_value(step);
                if step.label == blank {
                    blanks_after.push(value);
                } else if blanks_after.is_empty() {
                    out.push(value);
                } else {
                    let mut group = Vec::with_capacity(blanks_after.len() + 1);
                    group.push(value);
                    group.append(&mut blanks_after);
                    out.push(self.aggregation.apply(&group));
                }
            }
            out.reverse();
            return out;
        }
        // RNN-T: the steps of each frame, in order.
        let mut per_frame: Vec<Vec<f64>> = vec![Vec::new(); frames];
        for step in steps {
            if let Some(f) = per_frame.get_mut(step.frame) {
                f.push(step.label_confidence as f64);
            }
        }
        let first_of = |f: usize| per_frame.get(f).and_then(|v| v.first()).copied();
        let mut out = Vec::with_capacity(tokens.len());
        let mut offset = 0;
        for (i, tok) in tokens.iter().enumerate() {
            let start = tok.frame;
            let end = tokens.get(i + 1).map_or(frames, |t| t.frame);
            let own = per_frame
                .get(start)
                .and_then(|v| v.get(offset))
                .copied()
                .unwrap_or(f64::NAN);
            if start != end {
                // The token's own step, then the first step of each later frame up to the
                // next token's (NeMo leaves out the blank that closes the token's frame).
                let mut group = vec![own];
                group.extend((start + 1..end).filter_map(first_of));
                out.push(self.aggregation.apply(&group));
                offset = 0;
            } else {
                out.push(own);
                offset += 1;
            }
        }
        out
    }

    /// Per-token confidence of a CTC decoding: `frame_confidence` and `frame_labels` per
    /// encoder frame, `tokens` the collapsed tokens (their frame is their first).
    pub fn ctc_tokens(
        &self,
        frame_confidence: &[f32],
        frame_labels: &[usize],
        tokens: &[Token],
        blank: usize,
    ) -> Vec<f64> {
        let frames = frame_confidence.len();
        tokens
            .iter()
            .enumerate()
            .map(|(i, tok)| {
                let end = if self.exclude_blank {
                    // The token's repeats: the run of its label from its first frame.
                    let run = frame_labels[tok.frame..]
                        .iter()
                        .take_while(|&&l| l == tok.id && l != blank)
                        .count();
                    tok.frame + run.max(1)
                } else {
                    tokens.get(i + 1).map_or(frames, |t| t.frame)
                };
                let group: Vec<f64> = frame_confidence[tok.frame..end.min(frames)]
                    .iter()
                    .map(|&c| c as f64)
                    .collect();
                self.aggregation.apply(&group)
            })
            .collect()
    }

    /// Word confidences: tokens aggregated over NeMo's word groups
    /// ([`word_groups`](crate::tokenizer::word_groups)).
    pub fn words(&self, groups: &[Range<usize>], token_confidence: &[f64]) -> Vec<f64> {
        groups
            .iter()
            .map(|g| self.aggregation.apply(&token_confidence[g.clone()]))
            .collect()
    }
}

/// Per-frame CTC confidence and labels (greedy argmax) from `logits` rows of `classes`. With
/// blanks excluded only non-blank frames are measured (the others read as NaN: no token
/// takes them).
pub fn ctc_frames(
    cfg: &ConfidenceConfig,
    logits: &[f32],
    classes: usize,
) -> (Vec<f32>, Vec<usize>) {
    let blank = classes - 1;
    logits
        .chunks_exact(classes)
        .map(|row| {
            let label = argmax(row);
            let needed = label != blank || !cfg.exclude_blank;
            let confidence = if needed {
                cfg.of_logits(row, classes)
            } else {
                f32::NAN
            };
            (confidence, label)
        })
        .unzip()
}

/// What NeMo's measures read of a distribution with log-probabilities `l`: `max l`,
/// `Σ p·l`, and for a power `α`: `Σ p^α`, `Σ p^α·l`.
struct DistStats {
    max_log_prob: f64,
    neg_gibbs: f64,
    sum_pow: f64,
    neg_pow_gibbs: f64,
}

impl DistStats {
    /// From logits (log-softmax taken here); the power sums only for `Some(alpha)`.
    ///
    /// With `y = x - max x` and `e = exp(y)`, `S = Σ e`: `l = y - ln S`, so
    /// `Σ p·l = Σ e·y / S - ln S`, and with `r = exp(α y)`: `p^α = r / S^α`,
    /// `Σ p^α = Σ r / S^α`, `Σ p^α·l = (Σ r·y - ln S·Σ r) / S^α`. Every sum is then a
    /// vectorisable f32 dot product (accumulated in 16 lanes).
    fn of(logits: &[f32], alpha: Option<f64>) -> DistStats {
        SCRATCH.with_borrow_mut(|(y, e)| Self::of_in(logits, alpha, y, e))
    }

    fn of_in(logits: &[f32], alpha: Option<f64>, y: &mut Vec<f32>, e: &mut Vec<f32>) -> DistStats {
        let max = lane_max(logits);
        y.clear();
        y.extend(logits.iter().map(|&x| x - max));
        e.clear();
        e.extend_from_slice(y);
        exp_in_place(e);
        let (sum, sum_ey) = lane_sums(e, y);
        let ln_sum = sum.ln();
        let (mut sum_pow, mut neg_pow_gibbs) = (f64::NAN, f64::NAN);
        if let Some(t) = alpha {
            let tf = t as f32;
            for (r, &v) in e.iter_mut().zip(y.iter()) {
                *r = tf * v;
            }
            exp_in_place(e);
            let (sum_r, sum_ry) = lane_sums(e, y);
            let scale = (-t * ln_sum).exp();
            sum_pow = sum_r * scale;
            neg_pow_gibbs = (sum_ry - ln_sum * sum_r) * scale;
        }
        DistStats {
            max_log_prob: -ln_sum,
            neg_gibbs: sum_ey / sum - ln_sum,
            sum_pow,
            neg_pow_gibbs,
        }
    }
}

thread_local! {
    /// Per-thread buffers of [`DistStats::of`]: a decode measures thousands of steps.
    static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The largest value, in 16 lanes (a plain fold is one long dependency chain).
fn lane_max(a: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut m = [f32::NEG_INFINITY; LANES];
    for c in a.chunks_exact(LANES) {
        for k in 0..LANES {
            m[k] = if c[k] > m[k] { c[k] } else { m[k] };
        }
    }
    let tail = a[a.len() / LANES * LANES..].iter().copied();
    m.into_iter().chain(tail).fold(f32::NEG_INFINITY, f32::max)
}

/// `(Σ a, Σ a·b)` in 16 f32 lanes, added up in f64.
fn lane_sums(a: &[f32], b: &[f32]) -> (f64, f64) {
    const LANES: usize = 16;
    let (mut s, mut sb) = ([0f32; LANES], [0f32; LANES]);
    let chunks = a.chunks_exact(LANES).zip(b.chunks_exact(LANES));
    for (ca, cb) in chunks {
        for k in 0..LANES {
            s[k] += ca[k];
            sb[k] += ca[k] * cb[k];
        }
    }
    let tail = a.len() / LANES * LANES;
    let mut total: f64 = s.iter().map(|&v| v as f64).sum();
    let mut total_b: f64 = sb.iter().map(|&v| v as f64).sum();
    for (&va, &vb) in a[tail..].iter().zip(&b[tail..]) {
        total += va as f64;
        total_b += va as f64 * vb as f64;
    }
    (total, total_b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(measure: &str, alpha: f64) -> ConfidenceConfig {
        ConfidenceConfig {
            measure: measure.parse().unwrap(),
            alpha,
            ..ConfidenceConfig::default()
        }
    }

    const MEASURES: [&str; 7] = [
        "max_prob",
        "entropy_gibbs_lin",
        "entropy_gibbs_exp",
        "entropy_tsallis_lin",
        "entropy_tsallis_exp",
        "entropy_renyi_lin",
        "entropy_renyi_exp",
    ];

    #[test]
    fn certain_is_one_and_uniform_is_zero() {
        for name in MEASURES {
            for alpha in [0.33, 0.5, 1.0] {
                let c = cfg(name, alpha);
                let uniform = c.of_logits(&[0.0; 8], 8);
                let certain = c.of_logits(&[0.0, 0.0, 200.0, 0.0, 0.0, 0.0, 0.0, 0.0], 8);
                assert!(uniform.abs() < 1e-6, "{name} {alpha}: uniform {uniform}");
                assert!(
                    (certain - 1.0).abs() < 1e-6,
                    "{name} {alpha}: certain {certain}"
                );
            }
        }
    }

    /// The fast path (f32 vector exponentials) agrees with the f64 formulas far inside the
    /// 1e-5 the NeMo comparison allows.
    #[test]
    fn fast_measure_equals_the_f64_formulas() {
        let mut seed = 7u32;
        let logits: Vec<f32> = (0..1025)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1u32 << 24) as f32 * 12.0 - 6.0
            })
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + logits
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        let log_probs: Vec<f64> = logits.iter().map(|&x| x as f64 - lse).collect();
        for name in MEASURES {
            for alpha in [0.33, 1.0] {
                let c = cfg(name, alpha);
                let (fast, exact) = (c.of_logits(&logits, 1025), c.of_log_probs(&log_probs, 1025));
                assert!(
                    (fast - exact).abs() < 1e-6,
                    "{name} {alpha}: {fast} vs {exact}"
                );
            }
        }
    }

    /// Across each measure's whole alpha range (edges included) and vocabularies from a tiny
    /// model's to a large one's, every value stays in [0, 1]: uniform, certain, peaked and
    /// random distributions, by the fast path and by the f64 formulas.
    #[test]
    fn values_stay_in_zero_one_over_the_alpha_range() {
        let mut seed = 11u32;
        let mut random = |n: usize, spread: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * spread
                })
                .collect()
        };
        for classes in [9, 129, 1025, 8193] {
            let mut dists = vec![
                vec![0.0; classes],
                random(classes, 4.0),
                random(classes, 60.0),
            ];
            let mut certain = vec![0.0; classes];
            certain[classes / 2] = 200.0;
            dists.push(certain);
            let mut peaked = random(classes, 2.0);
            peaked[1] = 12.0;
            dists.push(peaked);
            for name in MEASURES {
                let range = name.parse::<Measure>().unwrap().alpha_range(classes);
                let (lo, hi) = (*range.start(), *range.end());
                let steps = 40;
                for k in 0..=steps {
                    // Geometric steps: the range spans three orders of magnitude.
                    let alpha = lo * (hi / lo).powf(k as f64 / steps as f64);
                    let alpha = if k == steps { hi } else { alpha };
                    let c = cfg(name, alpha);
                    for logits in &dists {
                        let v = c.of_logits(logits, classes);
                        assert!(
                            (0.0..=1.0 + 1e-6).contains(&v) || v.abs() < 1e-6,
                            "{name} alpha {alpha} V {classes}: {v}"
                        );
                    }
                }
            }
        }
        // Outside: NeMo's Gibbs bound for V = 1025 is about [0.124, 1.144].
        let gibbs = "entropy_gibbs_lin"
            .parse::<Measure>()
            .unwrap()
            .alpha_range(1025);
        assert!((gibbs.start() - 0.1239).abs() < 1e-3 && (gibbs.end() - 1.1443).abs() < 1e-3);
        assert!(!gibbs.contains(&2.0));
    }

    #[test]
    fn names_round_trip() {
        for name in MEASURES {
            assert_eq!(name.parse::<Measure>().unwrap().to_string(), name);
        }
        assert!("entropy_shannon_lin".parse::<Measure>().is_err());
        assert!("median".parse::<Aggregation>().is_err());
    }
}
