//! `Model.stream()`: live transcription from Python, through the library's one way of opening
//! a live transcriber ([`open_live`]: cache-aware streaming for a cache-aware model, NeMo's
//! buffered pipeline for an offline one) and its [`Feeder`] (each piece checked and resampled
//! as `parakeet stream` does it). Events are the dicts of `parakeet stream --format jsonl`.

use crate::{array_frames, py_error};
use numpy::PyUntypedArray;
use parakeet::error::Error;
use parakeet::stream::open::{LiveKind, LiveOptions, open_live};
use parakeet::stream::pump::Feeder;
use parakeet::stream::turns::{TurnParams, VadTurns};
use parakeet::stream::{LiveTranscriber, StreamEvent, Utterance};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList};
use std::sync::{Arc, Mutex};

/// A live transcription: audio in pieces of any size (``feed``), events back as soon as the
/// audio completes them, ``finish`` at the end of the input.
///
/// Made by ``Model.stream()``. Each event is a dict, as ``parakeet stream --format jsonl``
/// prints them: ``{"type": "partial" | "final", "text", "start", "end", "words"}``, a word
/// ``{"word", "start", "end"}`` (and ``"confidence"`` with ``confidence=``), times in seconds
/// from the start of the stream. A ``partial`` is the utterance so far; a ``final`` ends it
/// and the next event starts a new one. A stream is used by one thread at a time (calls from
/// several wait their turn); the GIL is released while it decodes.
#[pyclass(frozen, module = "parakeet")]
pub(crate) struct Stream {
    state: Mutex<State>,
    /// ``"cache_aware"`` (the model's encoder caches) or ``"buffered"`` (an offline model,
    /// each chunk encoded again with left and right context).
    #[pyo3(get)]
    kind: &'static str,
    /// Seconds of audio one step of the model takes: events come at most this often.
    #[pyo3(get)]
    chunk_seconds: f64,
}

struct State {
    transcriber: Box<dyn LiveTranscriber + Send>,
    /// Set by the first ``feed`` of a stream (its rate), dropped by ``finish``.
    feeder: Option<Feeder>,
}

/// How much of a long array is fed between two looks for Ctrl-C, in seconds of its audio.
const FEED_SECONDS_BETWEEN_SIGNAL_CHECKS: u32 = 1;

/// What `Model.stream` was asked for, checked and ready to open.
pub(crate) struct StreamRequest {
    pub options: LiveOptions,
    pub turns: Option<TurnParams>,
}

impl StreamRequest {
    /// Opens the stream (its own session over `model`): fails on the other kind's settings
    /// or bad buffer sizes, naming the model's kind, before any audio is taken.
    pub fn open(self, py: Python<'_>, model: &Arc<parakeet::model::Model>) -> PyResult<Stream> {
        let kind = LiveKind::of(model);
        let transcriber = py
            .detach(|| -> Result<_, anyhow::Error> {
                let mut transcriber = open_live(model, &self.options)?;
                if let Some(params) = self.turns {
                    let vad = parakeet::vad::VadModel::load(None)?;
                    transcriber = Box::new(VadTurns::new(transcriber, vad, params)?);
                }
                Ok(transcriber)
            })
            .map_err(live_error)?;
        Ok(Stream {
            chunk_seconds: transcriber.chunk_seconds(),
            state: Mutex::new(State {
                transcriber,
                feeder: None,
            }),
            kind: match kind {
                LiveKind::CacheAware => "cache_aware",
                LiveKind::Buffered => "buffered",
            },
        })
    }
}

/// An error of opening a stream: a kind the library gave it is kept; an unclassified one is a
/// refused setting (as the command line counts it: exit 2), so a ValueError.
fn live_error(e: anyhow::Error) -> PyErr {
    if e.chain().any(|c| c.is::<Error>()) {
        py_error(Error::from(e))
    } else {
        PyValueError::new_err(format!("{e:#}"))
    }
}

/// An error while decoding fed audio: ours (the audio was checked before).
fn decode_error(e: anyhow::Error) -> PyErr {
    py_error(Error::from(e))
}

#[pymethods]
impl Stream {
    /// Feeds samples: a numpy array as for ``Model.transcribe`` (float32 / float64 in [-1, 1]
    /// or int16; 1-D, or 2-D with the channels on the shorter axis, mixed down to mono) at
    /// ``sample_rate`` Hz, resampled to the model's rate as ``parakeet stream`` does. Every
    /// ``feed`` of one stream (until ``finish``) gives the same rate. Returns the events this
    /// audio completed (none until a whole step of audio has come).
    ///
    /// Raises ValueError for a bad array, a sample that is not a number, or a rate other than
    /// the stream's; nothing of such a piece is fed. A KeyboardInterrupt stops a long array
    /// between two seconds of its audio; what was fed before stays fed.
    #[pyo3(signature = (samples, sample_rate=16000))]
    fn feed<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        sample_rate: u32,
    ) -> PyResult<Bound<'py, PyList>> {
        let array = samples.cast::<PyUntypedArray>().map_err(|_| {
            PyTypeError::new_err(format!(
                "feed() takes a numpy array of samples, got {}",
                samples
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let (interleaved, channels) =
            array_frames(array).map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        let mono: Vec<f32> = interleaved
            .chunks_exact(channels)
            .map(|frame| frame.iter().sum::<f32>() / frame.len() as f32)
            .collect();
        let events = self.detached(py, |transcriber, feeder| {
            let feeder = match feeder {
                Some(f) if f.rate() != sample_rate => {
                    return Err(PyValueError::new_err(format!(
                        "sample_rate={sample_rate}: this stream's audio is at {} Hz (its first \
                         feed's rate); finish() it to start one at another rate",
                        f.rate()
                    )));
                }
                Some(f) => f,
                None => feeder.insert(
                    Feeder::new(sample_rate, &*transcriber)
                        .map_err(|e| PyValueError::new_err(format!("{e:#}")))?,
                ),
            };
            feeder
                .check(&mono)
                .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
            let mut events = Vec::new();
            let piece = (sample_rate * FEED_SECONDS_BETWEEN_SIGNAL_CHECKS) as usize;
            for (i, part) in mono.chunks(piece).enumerate() {
                if i > 0 {
                    Python::attach(|py| py.check_signals())?;
                }
                let got = feeder.push(&mut *transcriber, part);
                events.extend(got.map_err(decode_error)?);
            }
            Ok(events)
        })?;
        events_list(py, &events)
    }

    /// The input ended: decodes what is left and ends the utterance under way with a
    /// ``final`` (when it has text). The stream can then be fed again, as a new stream from
    /// time 0 (at any rate).
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.detached(py, |transcriber, feeder| {
            let events = match feeder.take() {
                Some(mut f) => f.finish(transcriber),
                None => transcriber.finish(),
            };
            events.map_err(decode_error)
        })?;
        events_list(py, &events)
    }

    fn __repr__(&self) -> String {
        format!(
            "Stream(kind='{}', chunk_seconds={})",
            self.kind, self.chunk_seconds
        )
    }
}

impl Stream {
    /// Runs `f` on the stream's transcriber and feeder with the GIL released (a call from
    /// another thread waits for the stream without holding the GIL). A panic in an earlier call
    /// leaves the state as that call left it.
    fn detached<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut (dyn LiveTranscriber + Send), &mut Option<Feeder>) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let State {
                transcriber,
                feeder,
            } = &mut *state;
            f(transcriber.as_mut(), feeder)
        })
    }
}

/// Events as the dicts of `parakeet stream --format jsonl`.
fn events_list<'py>(py: Python<'py>, events: &[StreamEvent]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for event in events {
        let (kind, u) = match event {
            StreamEvent::Partial(u) => ("partial", u),
            StreamEvent::Final(u) => ("final", u),
        };
        list.append(event_dict(py, kind, u)?)?;
    }
    Ok(list)
}

fn event_dict<'py>(py: Python<'py>, kind: &str, u: &Utterance) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("type", kind)?;
    d.set_item("text", &u.text)?;
    d.set_item("start", u.start)?;
    d.set_item("end", u.end)?;
    let words = PyList::empty(py);
    for w in &u.words {
        let item = PyDict::new(py);
        item.set_item("word", &w.text)?;
        item.set_item("start", w.start)?;
        item.set_item("end", w.end)?;
        if let Some(c) = w.confidence {
            item.set_item("confidence", c)?;
        }
        words.append(item)?;
    }
    d.set_item("words", words)?;
    Ok(d)
}

/// `Model.stream`'s ``att_context``: None (the model's default lookahead), ``"L,R"`` (the
/// command line's grammar) or a pair of ints.
pub(crate) fn lookahead(given: Option<&Bound<'_, PyAny>>) -> PyResult<Option<[usize; 2]>> {
    let Some(v) = given else {
        return Ok(None);
    };
    let pair = match v.extract::<String>() {
        Ok(s) => match s.parse::<parakeet::encoder::AttentionChoice>() {
            Ok(parakeet::encoder::AttentionChoice::Local { left, right }) => Some([left, right]),
            _ => None,
        },
        Err(_) => v.extract::<(usize, usize)>().ok().map(|(l, r)| [l, r]),
    };
    pair.map(Some).ok_or_else(|| {
        let shown = v.repr().map(|r| r.to_string()).unwrap_or_default();
        PyValueError::new_err(format!(
            "att_context={shown}: a stream takes a lookahead \"L,R\" or (L, R) in encoder frames \
             (e.g. \"70,1\")"
        ))
    })
}

/// `Model.stream`'s ``vad``: None or False, the model ends utterances; True, Silero VAD with
/// the VADIterator's defaults; a dict of ``threshold``, ``min_silence_ms``, ``speech_pad_ms``.
pub(crate) fn turn_params(vad: Option<&Bound<'_, PyAny>>) -> PyResult<Option<TurnParams>> {
    let Some(v) = vad else {
        return Ok(None);
    };
    if v.is_instance_of::<PyBool>() {
        return Ok(v.extract::<bool>()?.then(TurnParams::default));
    }
    let Ok(d) = v.cast::<PyDict>() else {
        return Err(PyTypeError::new_err(format!(
            "vad= takes True, False or a dict of threshold, min_silence_ms, speech_pad_ms, got {}",
            v.get_type().name()?
        )));
    };
    let mut p = TurnParams::default();
    for (key, value) in d.iter() {
        let key: String = key.extract()?;
        match key.as_str() {
            "threshold" => p.threshold = value.extract()?,
            "min_silence_ms" => p.min_silence_ms = value.extract()?,
            "speech_pad_ms" => p.speech_pad_ms = value.extract()?,
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected end-of-turn keyword {other:?}: expected threshold, \
                     min_silence_ms or speech_pad_ms"
                )));
            }
        }
    }
    p.validate(["threshold", "min_silence_ms", "speech_pad_ms"])
        .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
    Ok(Some(p))
}
