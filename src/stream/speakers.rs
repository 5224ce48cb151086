//! Speakers in a live transcript: [`Diarized`] wraps any [`LiveTranscriber`] and runs a
//! streaming Sortformer over the same audio as it arrives (NeMo's streaming loop, chunk by
//! chunk, [`crate::diar::stream::DiarStream`]). Each final's words get their speakers as
//! `transcribe --diarize` gives them ([`speaker_over`] their spans), from probabilities equal
//! to the whole recording's streamed ones. The diarizer runs behind the transcriber by its
//! chunk and right context, so a final waits until the frames under its words are in (events
//! keep their order: what follows a waiting final waits with it).

use super::{LiveTranscriber, StreamEvent, Utterance};
use crate::diar::stream::DiarStream;
use crate::diar::words::speaker_over;
use crate::diar::{Activity, Diarizer};
use crate::hparams::SortformerStreaming;
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::path::Path;

/// A live transcriber whose finals carry speakers.
pub struct Diarized {
    inner: Box<dyn LiveTranscriber + Send>,
    diarizer: Diarizer,
    settings: SortformerStreaming,
    stream: DiarStream,
    /// Every frame's probabilities since the stream began.
    activity: Activity,
    /// Samples of this stream fed to the diarizer.
    samples: usize,
    /// Events not yet handed on: a final whose frames are not all in, and what came after it.
    held: VecDeque<StreamEvent>,
}

impl Diarized {
    /// Wraps `inner`; `diarizer` must be a streaming Sortformer (it refuses an offline one).
    pub fn new(
        inner: Box<dyn LiveTranscriber + Send>,
        diarizer: Diarizer,
        settings: SortformerStreaming,
    ) -> Result<Diarized> {
        let stream = diarizer.start_stream(&settings)?;
        let activity = Activity {
            n_spks: diarizer.params().n_spks,
            frame_seconds: diarizer.frame_seconds(),
            ..Activity::default()
        };
        Ok(Diarized {
            inner,
            diarizer,
            settings,
            stream,
            activity,
            samples: 0,
            held: VecDeque::new(),
        })
    }

    fn add_frames(&mut self, probs: Vec<f32>) {
        self.activity.probs.extend(probs);
        self.activity.frames = self.activity.probs.len() / self.activity.n_spks.max(1);
    }

    /// Whether every frame a speaker of `u`'s words reads is in.
    fn covered(&self, u: &Utterance) -> bool {
        let fs = self.activity.frame_seconds;
        let last = u.words.iter().map(|w| w.end).fold(0.0, f64::max);
        u.words.is_empty() || ((last.max(0.0) / fs).floor() as usize) < self.activity.frames
    }

    /// Hands on the events from the front while the first is not a final still waiting for
    /// frames (`all`: the stream ended, every frame is in).
    fn release(&mut self, all: bool) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        while let Some(event) = self.held.front() {
            if let StreamEvent::Final(u) = event
                && !all
                && !self.covered(u)
            {
                break;
            }
            let Some(mut event) = self.held.pop_front() else {
                break;
            };
            if let StreamEvent::Final(u) = &mut event {
                for w in &mut u.words {
                    w.speaker = speaker_over(&self.activity, w.start, w.end);
                }
            }
            out.push(event);
        }
        out
    }
}

impl LiveTranscriber for Diarized {
    fn sample_rate(&self) -> u32 {
        self.inner.sample_rate()
    }

    fn chunk_seconds(&self) -> f64 {
        self.inner.chunk_seconds()
    }

    fn accept(&mut self, samples: &[f32]) -> Result<Vec<StreamEvent>> {
        let probs = self.diarizer.stream_accept(&mut self.stream, samples)?;
        self.samples += samples.len();
        self.add_frames(probs);
        let events = self.inner.accept(samples)?;
        self.held.extend(events);
        Ok(self.release(false))
    }

    fn finish(&mut self) -> Result<Vec<StreamEvent>> {
        let events = self.inner.finish()?;
        self.held.extend(events);
        // A stream too short for one frame has no speakers to give.
        if self.diarizer.frames_of(self.samples) > 0 {
            let probs = self.diarizer.stream_finish(&mut self.stream)?;
            self.add_frames(probs);
        }
        let out = self.release(true);
        // The next accept starts a new stream at time 0, as the transcriber's.
        self.stream = self.diarizer.start_stream(&self.settings)?;
        self.activity.probs.clear();
        self.activity.frames = 0;
        self.samples = 0;
        Ok(out)
    }
}

/// `transcriber` with speakers from `diarizer` streaming with NeMo's inference sizes; the error
/// of a Sortformer that cannot stream names it as the user gave it (`spec`, else its path).
pub fn diarized(
    transcriber: Box<dyn LiveTranscriber + Send>,
    diarizer: Diarizer,
    spec: Option<&Path>,
) -> Result<Box<dyn LiveTranscriber + Send>> {
    let settings = diarizer.params().streaming.inference_defaults();
    let shown = spec
        .unwrap_or(diarizer.model().path())
        .display()
        .to_string();
    let wrapped = Diarized::new(transcriber, diarizer, settings)
        .with_context(|| format!("--diar-model {shown}"))?;
    Ok(Box::new(wrapped))
}
