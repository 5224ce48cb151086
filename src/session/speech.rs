//! Transcribing only speech: Silero VAD finds the speech segments of the input (as the
//! `silero-vad` package's `get_speech_timestamps` makes them: padded, short gaps split, long
//! speech cut), each segment is transcribed on its own as an utterance, and the pieces are
//! joined in the input's time. Silence is never encoded.

use super::{DecodeOptions, Head, Session, SpeechPlan, Threads};
use crate::error::{Error, Result};
use crate::transcript::{Alternative, SpeechSpan, StageTimes, Transcript};
use crate::vad::{SampleRate, SpeechSegment, Vad, speech_segments};
use std::sync::Arc;
use std::time::Instant;

impl Session {
    /// [`Session::transcribe`] with speech detection: each speech segment of `samples` is
    /// transcribed exactly as if it were a file of its own, then shifted to where it lies.
    pub(super) fn transcribe_speech(
        &mut self,
        samples: Vec<f32>,
        opts: &DecodeOptions,
        speech: &SpeechPlan,
    ) -> Result<Transcript> {
        let t0 = Instant::now();
        super::report(opts, "vad", 0.0);
        let segments = self.find_speech(&samples, speech)?;
        let vad_time = t0.elapsed();
        let hop = self.mel_config().hop_length.max(1);
        let total: usize = segments.iter().map(|s| s.end - s.start).sum();
        let outer = opts.progress().cloned();
        let mut parts = Vec::with_capacity(segments.len());
        let mut done = 0usize;
        for seg in &segments {
            let len = seg.end - seg.start;
            // Less than one feature frame holds nothing to transcribe.
            if len < hop {
                parts.push((*seg, None));
                continue;
            }
            // Each segment's progress as a part of all the speech's.
            let segment_opts = outer.as_ref().map(|p| {
                let p = p.clone();
                let (before, len, total) = (done as f64, len as f64, total.max(1) as f64);
                let progress: super::Progress =
                    Arc::new(move |stage, f| p(stage, (before + f * len) / total));
                opts.with_progress(Some(progress))
            });
            let piece = self.transcribe_whole(
                samples[seg.start..seg.end].to_vec(),
                segment_opts.as_ref().unwrap_or(opts),
            );
            parts.push((*seg, Some(piece?)));
            done += len;
        }
        let mut t = self.join(parts, samples.len(), opts);
        t.times.vad = vad_time;
        Ok(t)
    }

    /// The speech segments of 16 kHz `samples` by `speech`'s parameters.
    fn find_speech(&mut self, samples: &[f32], speech: &SpeechPlan) -> Result<Vec<SpeechSegment>> {
        let rate = SampleRate::from_hz(self.sample_rate()).ok_or_else(|| {
            Error::Internal(format!(
                "speech detection at {} Hz: the VAD model takes 8 or 16 kHz",
                self.sample_rate()
            ))
        })?;
        // The session's VAD runner, made anew only for another model.
        let mut vad = match self.vad.take() {
            Some(v) if Arc::ptr_eq(v.model(), speech.model()) => v,
            _ => Vad::new(speech.model().clone(), Threads::new(self.threads())?)?,
        };
        let probs = vad.probabilities(samples, rate);
        self.vad = Some(vad);
        Ok(speech_segments(
            &probs?,
            samples.len(),
            rate.hz(),
            rate.window(),
            speech.params(),
        ))
    }

    /// One transcript of the segments' (`None`: too short to transcribe), in the time of an
    /// input of `n_samples`.
    fn join(
        &self,
        parts: Vec<(SpeechSegment, Option<Transcript>)>,
        n_samples: usize,
        opts: &DecodeOptions,
    ) -> Transcript {
        let rate = self.sample_rate() as f64;
        let frame_seconds = self.model.hparams().geometry().frame_seconds();
        let mut t = Transcript {
            audio_seconds: n_samples as f64 / rate,
            frame_seconds,
            tdt_durations: opts.head() == Head::Tdt,
            decoding: self.summary(opts),
            // The longest segment's (or, with none, what the whole input would have had).
            attention: parts
                .iter()
                .filter_map(|(s, p)| p.as_ref().map(|p| (s.end - s.start, p.attention)))
                .max_by_key(|(len, _)| *len)
                .map_or_else(
                    || {
                        let frames = self.mel_config().n_frames(n_samples);
                        self.attention_for(frames, opts.attention())
                    },
                    |(_, a)| a,
                ),
            token_confidence: opts.confidence().map(|_| Vec::new()),
            ..Transcript::default()
        };
        let beam = opts.beam().is_some();
        let mut best = Alternative {
            text: String::new(),
            tokens: Vec::new(),
            score: 0.0,
        };
        let mut texts = Vec::new();
        let mut spans = Vec::with_capacity(parts.len());
        let mut times = StageTimes::default();
        for (seg, part) in parts {
            let start = seg.start as f64 / rate;
            spans.push(SpeechSpan {
                start,
                end: seg.end as f64 / rate,
                first_token: t.tokens.len(),
                first_word: t.words.len(),
            });
            let Some(p) = part else { continue };
            times.add(&p.times);
            let text = p.text.trim();
            if !text.is_empty() {
                texts.push(text.to_owned());
            }
            t.words.extend(p.words.into_iter().map(|mut w| {
                w.start += start;
                w.end += start;
                w
            }));
            if let (Some(all), Some(c)) = (&mut t.token_confidence, p.token_confidence) {
                all.extend(c);
            }
            if let Some(a) = p.alternatives.into_iter().next() {
                best.tokens.extend(a.tokens);
                best.score += a.score;
            }
            t.tokens.extend(p.tokens);
            t.pieces.extend(p.pieces);
        }
        t.text = texts.join(" ");
        if beam {
            best.text = t.text.clone();
            t.alternatives = vec![best];
        }
        t.times = times;
        t.speech = Some(spans);
        t
    }
}
