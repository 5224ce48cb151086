//! Speakers of a transcript's words: each word gets the speaker most active over its span, by
//! the Sortformer's per-frame probabilities (each 80 ms frame weighted by how much of it the
//! word covers), so that overlapping speech goes to whoever dominates the word.

use crate::error::Result;

use super::stream::StreamSettings;
use super::{Activity, Diarizer};
use crate::tokenizer::Word;

impl Diarizer {
    /// The activity of a whole recording as the model is meant to run: a streaming model
    /// streams with NeMo's inference sizes, an offline one sees the recording in one pass.
    pub fn diarize(&mut self, samples: &[f32]) -> Result<Activity> {
        let params = self.params().clone();
        match params.streaming_mode {
            true => {
                let settings = StreamSettings::default().resolve(params.streaming);
                self.diarize_streaming(samples, &settings)
            }
            false => self.diarize_offline(samples),
        }
    }
}

/// The speaker most active over `[start, end]` seconds: the largest sum of probabilities over
/// the frames the span touches, each weighted by the seconds of it inside the span (the lowest
/// index on a tie). A span of no length, or one past the last frame, takes the frame it lies
/// in (the last one). `None` only for an activity without frames or speakers.
pub fn speaker_over(activity: &Activity, start: f64, end: f64) -> Option<usize> {
    let (n, fs) = (activity.n_spks, activity.frame_seconds);
    if activity.frames == 0 || n == 0 || fs <= 0.0 || activity.probs.len() < activity.frames * n {
        return None;
    }
    let last = activity.frames - 1;
    let frame_of = |t: f64| ((t.max(0.0) / fs).floor() as usize).min(last);
    let mut score = vec![0.0f64; n];
    let (first, final_) = (frame_of(start), frame_of(end));
    for f in first..=final_ {
        let (lo, hi) = (f as f64 * fs, (f + 1) as f64 * fs);
        // The last frame also stands for any time after it.
        let hi = if f == last { hi.max(end) } else { hi };
        let weight = (end.min(hi) - start.max(lo)).max(0.0);
        let row = &activity.probs[f * n..(f + 1) * n];
        for (s, &p) in score.iter_mut().zip(row) {
            *s += weight * p as f64;
        }
    }
    if score.iter().all(|&s| s == 0.0) {
        // No length inside any frame: the frame the span starts in decides.
        let row = &activity.probs[first * n..(first + 1) * n];
        score = row.iter().map(|&p| p as f64).collect();
    }
    let mut best = 0;
    for (k, &s) in score.iter().enumerate() {
        if s > score[best] {
            best = k;
        }
    }
    Some(best)
}

/// Sets every word's speaker by [`speaker_over`] its span.
pub fn assign_speakers(words: &mut [Word], activity: &Activity) {
    for w in words {
        w.speaker = speaker_over(activity, w.start, w.end);
    }
}

/// How outputs name a speaker: NeMo's `speaker_<index>`.
pub fn speaker_name(speaker: usize) -> String {
    format!("speaker_{speaker}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity(rows: &[[f32; 2]]) -> Activity {
        Activity {
            frames: rows.len(),
            n_spks: 2,
            probs: rows.iter().flatten().copied().collect(),
            frame_seconds: 0.08,
        }
    }

    #[test]
    fn the_frame_covered_most_decides() {
        // Frame 0: speaker 0 at 0.9; frame 1: speaker 1 at 0.9.
        let a = activity(&[[0.9, 0.1], [0.1, 0.9]]);
        // 0.07 s in frame 0, 0.01 s in frame 1.
        assert_eq!(speaker_over(&a, 0.01, 0.09), Some(0));
        // 0.01 s in frame 0, 0.07 s in frame 1.
        assert_eq!(speaker_over(&a, 0.07, 0.15), Some(1));
        // Past the end: the last frame.
        assert_eq!(speaker_over(&a, 0.5, 0.7), Some(1));
        // No length: the frame it lies in.
        assert_eq!(speaker_over(&a, 0.04, 0.04), Some(0));
        assert_eq!(speaker_over(&activity(&[]), 0.0, 1.0), None);
    }

    #[test]
    fn a_tie_goes_to_the_lower_index() {
        let a = activity(&[[0.5, 0.5]]);
        assert_eq!(speaker_over(&a, 0.0, 0.08), Some(0));
    }
}
