//! The `silero-vad` package's streaming `VADIterator`: speech start and end events as windows
//! arrive, for end-of-turn detection in live audio. It has no minimum-speech or maximum-speech
//! rule, and its exit threshold is fixed at `threshold - 0.15`.

/// A speech boundary, in samples from the start of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VadEvent {
    Start(usize),
    End(usize),
}

/// The iterator's state over the probabilities of consecutive windows.
#[derive(Clone, Debug)]
pub struct VadIterator {
    threshold: f64,
    min_silence: f64,
    pad: f64,
    triggered: bool,
    temp_end: usize,
    current_sample: usize,
}

impl VadIterator {
    /// `threshold` (0.5), `min_silence_ms` (100) and `speech_pad_ms` (30) as the package takes
    /// them, at `rate` Hz.
    pub fn new(threshold: f64, rate: u32, min_silence_ms: f64, speech_pad_ms: f64) -> Self {
        VadIterator {
            threshold,
            min_silence: rate as f64 * min_silence_ms / 1000.0,
            pad: rate as f64 * speech_pad_ms / 1000.0,
            triggered: false,
            temp_end: 0,
            current_sample: 0,
        }
    }

    /// Back to the start of a stream (the package's `reset_states`; reset the model's
    /// state with it).
    pub fn reset(&mut self) {
        self.triggered = false;
        self.temp_end = 0;
        self.current_sample = 0;
    }

    /// Whether speech is under way.
    pub fn triggered(&self) -> bool {
        self.triggered
    }

    /// Samples fed so far.
    pub fn position(&self) -> usize {
        self.current_sample
    }

    /// While speech is under way, the earliest sample its end can fall on (windows of `len`):
    /// the audio before it belongs to this speech whatever comes next.
    pub fn earliest_end(&self, len: usize) -> usize {
        // The end is `temp_end + pad - len`, and an unset `temp_end` will be set no earlier
        // than the end of the next window.
        let temp_end = if self.temp_end != 0 {
            self.temp_end
        } else {
            self.current_sample + len
        };
        (temp_end as f64 + self.pad - len as f64).max(0.0) as usize
    }

    /// The next window's probability `p` (a window of `len` samples): an event, if one
    /// happens there.
    pub fn push(&mut self, p: f32, len: usize) -> Option<VadEvent> {
        let p = p as f64;
        self.current_sample += len;
        if p >= self.threshold && self.temp_end != 0 {
            self.temp_end = 0;
        }
        if p >= self.threshold && !self.triggered {
            self.triggered = true;
            let start = (self.current_sample as f64 - self.pad - len as f64).max(0.0);
            return Some(VadEvent::Start(start as usize));
        }
        if p < self.threshold - 0.15 && self.triggered {
            if self.temp_end == 0 {
                self.temp_end = self.current_sample;
            }
            if ((self.current_sample - self.temp_end) as f64) < self.min_silence {
                return None;
            }
            let end = self.temp_end as f64 + self.pad - len as f64;
            self.temp_end = 0;
            self.triggered = false;
            return Some(VadEvent::End(end as usize));
        }
        None
    }
}
