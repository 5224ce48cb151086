//! Speech segments from per-window probabilities, as the `silero-vad` package's
//! `get_speech_timestamps` makes them (its `get_speech_timestamps_from_probs`): hysteresis
//! between the threshold and a lower exit threshold, a minimum speech and silence length, a
//! maximum speech length cut at the longest silence seen (or, in the legacy mode, at the last
//! long one), and padding that splits short gaps in the middle.
//!
//! Every quantity is in samples, computed in f64 from the millisecond parameters as the package
//! computes them in Python, so that segments agree sample for sample.

use crate::bail;
use crate::error::Result;

/// The parameters of `get_speech_timestamps`, with the package's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SpeechParams {
    /// A window at or above this probability is speech.
    pub threshold: f64,
    /// Speech ends below this (default `max(threshold - 0.15, 0.01)`).
    pub neg_threshold: Option<f64>,
    /// Shorter speech is dropped.
    pub min_speech_ms: f64,
    /// Longer speech is cut (infinity: never).
    pub max_speech_s: f64,
    /// Silence shorter than this does not end speech.
    pub min_silence_ms: f64,
    /// Added on both sides of every segment.
    pub speech_pad_ms: f64,
    /// A silence this long inside speech is a place to cut at the maximum length.
    pub min_silence_at_max_speech_ms: f64,
    /// Cut at the longest such silence (true, the default) or at the last one (the package's
    /// `use_max_poss_sil_at_max_speech=False`).
    pub use_max_poss_sil_at_max_speech: bool,
}

impl Default for SpeechParams {
    fn default() -> Self {
        SpeechParams {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_ms: 250.0,
            max_speech_s: f64::INFINITY,
            min_silence_ms: 100.0,
            speech_pad_ms: 30.0,
            min_silence_at_max_speech_ms: 98.0,
            use_max_poss_sil_at_max_speech: true,
        }
    }
}

impl SpeechParams {
    /// The exit threshold in effect.
    pub fn neg_threshold_effective(&self) -> f64 {
        self.neg_threshold
            .unwrap_or_else(|| (self.threshold - 0.15).max(0.01))
    }

    /// Checks the values: thresholds in (0, 1), the exit threshold not above the threshold,
    /// durations not negative (nor NaN); the error names the parameter and its value.
    pub fn validate(&self) -> Result<()> {
        let t = self.threshold;
        if !(t > 0.0 && t < 1.0) {
            bail!(
                Options,
                "threshold {t}: must be between 0 and 1 (exclusive)"
            );
        }
        if let Some(n) = self.neg_threshold {
            if !(n > 0.0 && n < 1.0) {
                bail!(
                    Options,
                    "neg-threshold {n}: must be between 0 and 1 (exclusive)"
                );
            }
            if n > t {
                bail!(
                    Options,
                    "neg-threshold {n}: must not be above the threshold {t}"
                );
            }
        }
        if self.max_speech_s.is_nan() || self.max_speech_s < 0.0 {
            bail!(
                Options,
                "max-speech-s {}: must not be negative",
                self.max_speech_s
            );
        }
        for (name, v) in [
            ("min-speech-ms", self.min_speech_ms),
            ("min-silence-ms", self.min_silence_ms),
            ("speech-pad-ms", self.speech_pad_ms),
            (
                "min-silence-at-max-speech-ms",
                self.min_silence_at_max_speech_ms,
            ),
        ] {
            if !(0.0..=MAX_PARAM_MS).contains(&v) {
                bail!(
                    Options,
                    "{name} {v}: must be a number of milliseconds from 0 to {MAX_PARAM_MS} (an hour)"
                );
            }
        }
        if self.max_speech_s == 0.0 {
            bail!(Options, "max-speech-s 0: must be above 0");
        }
        Ok(())
    }
}

/// The largest duration a speech-detection parameter in milliseconds takes: an hour is far
/// beyond any use, and keeps every count of samples derived from it far from overflowing.
pub const MAX_PARAM_MS: f64 = 3_600_000.0;

/// A speech segment, in samples of the signal the probabilities came from: `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeechSegment {
    pub start: usize,
    pub end: usize,
}

/// The package's bookkeeping inside one stretch of speech; 0 means "not set" for the three
/// positions, as in the package, and all four are cleared together whenever speech ends or is cut.
#[derive(Default)]
struct Marks {
    temp_end: i64,
    prev_end: i64,
    next_start: i64,
    /// (silence start, silence length) of every silence long enough for a max-speech cut.
    possible_ends: Vec<(i64, i64)>,
}

impl Marks {
    fn clear(&mut self) {
        self.temp_end = 0;
        self.prev_end = 0;
        self.next_start = 0;
        self.possible_ends.clear();
    }
}

/// Speech segments from `probs` (one per window of `window` samples, the last window
/// zero-padded) of a signal of `n_samples` samples at `rate` Hz.
pub fn speech_segments(
    probs: &[f32],
    n_samples: usize,
    rate: u32,
    window: usize,
    params: &SpeechParams,
) -> Vec<SpeechSegment> {
    let sr = rate as f64;
    let threshold = params.threshold;
    let neg = params.neg_threshold_effective();
    let min_speech = sr * params.min_speech_ms / 1000.0;
    let pad = sr * params.speech_pad_ms / 1000.0;
    let max_speech = sr * params.max_speech_s - window as f64 - 2.0 * pad;
    let min_silence = sr * params.min_silence_ms / 1000.0;
    let min_sil_max = sr * params.min_silence_at_max_speech_ms / 1000.0;
    let best_cut = params.use_max_poss_sil_at_max_speech;

    let mut triggered = false;
    let mut m = Marks::default();
    let mut start: Option<i64> = None;
    let mut segs: Vec<(i64, i64)> = Vec::new();

    for (i, &p) in probs.iter().enumerate() {
        let p = p as f64;
        let s = (window * i) as i64;
        if p >= threshold && m.temp_end != 0 {
            let sil = s - m.temp_end;
            if sil as f64 > min_sil_max {
                m.possible_ends.push((m.temp_end, sil));
            }
            m.temp_end = 0;
            if m.next_start < m.prev_end {
                m.next_start = s;
            }
        }
        if p >= threshold && !triggered {
            triggered = true;
            start = Some(s);
            continue;
        }
        if let Some(st) = start.filter(|_| triggered)
            && (s - st) as f64 > max_speech
        {
            if best_cut && !m.possible_ends.is_empty() {
                // The longest silence, the first of equals.
                let mut best = m.possible_ends[0];
                for &e in &m.possible_ends[1..] {
                    if e.1 > best.1 {
                        best = e;
                    }
                }
                let (end, dur) = best;
                segs.push((st, end));
                m.next_start = end + dur;
                if m.next_start < end + s {
                    start = Some(m.next_start);
                } else {
                    start = None;
                    triggered = false;
                }
                m.clear();
            } else if m.prev_end != 0 {
                segs.push((st, m.prev_end));
                start = None;
                if m.next_start < m.prev_end {
                    triggered = false;
                } else {
                    start = Some(m.next_start);
                }
                m.clear();
            } else {
                segs.push((st, s));
                start = None;
                m.clear();
                triggered = false;
                continue;
            }
        }
        if p < neg && triggered {
            if m.temp_end == 0 {
                m.temp_end = s;
            }
            let sil_now = s - m.temp_end;
            if !best_cut && sil_now as f64 > min_sil_max {
                m.prev_end = m.temp_end;
            }
            if (sil_now as f64) < min_silence {
                continue;
            }
            if let Some(st) = start
                && (m.temp_end - st) as f64 > min_speech
            {
                segs.push((st, m.temp_end));
            }
            start = None;
            m.clear();
            triggered = false;
        }
    }
    let n = n_samples as i64;
    if let Some(st) = start
        && (n - st) as f64 > min_speech
    {
        segs.push((st, n));
    }

    // Padding. `int()` of the package truncates toward zero; the values are never negative.
    let count = segs.len();
    for i in 0..count {
        if i == 0 {
            segs[0].0 = (segs[0].0 as f64 - pad).max(0.0) as i64;
        }
        if i + 1 < count {
            let gap = segs[i + 1].0 - segs[i].1;
            if (gap as f64) < 2.0 * pad {
                let half = gap.div_euclid(2);
                segs[i].1 += half;
                segs[i + 1].0 = (segs[i + 1].0 - half).max(0);
            } else {
                segs[i].1 = (n as f64).min(segs[i].1 as f64 + pad) as i64;
                segs[i + 1].0 = (segs[i + 1].0 as f64 - pad).max(0.0) as i64;
            }
        } else {
            segs[i].1 = (n as f64).min(segs[i].1 as f64 + pad) as i64;
        }
    }
    segs.into_iter()
        .map(|(s, e)| SpeechSegment {
            start: s.max(0) as usize,
            end: e.max(0) as usize,
        })
        .collect()
}
