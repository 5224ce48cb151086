//! Speaker diarization for Python: `parakeet.diarize` (who speaks when, NeMo's segments and the
//! per-frame probabilities) and the diarizers that give `Model.transcribe(diarize=True)`'s words
//! their speakers.

use numpy::ndarray::Array2;
use numpy::{PyArray2, PyUntypedArrayMethods};
use parakeet::diar::Diarizer;
use parakeet::diar::postprocess::{Generation, PostProcessing, segments};
use parakeet::error::Error;
use parakeet::session::Threads;
use parakeet::session::pipeline::{self, Limits};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::{Input, input, py_error};

/// A Sortformer loaded for diarization (a `.gguf`, a `.nemo` or a hub id, resolved as the
/// command line's `--diar-model`); a speech recognition model is a ValueError.
pub fn load_sortformer(spec: &Path) -> Result<Arc<parakeet::model::Model>, PyErr> {
    let model =
        parakeet::model_source::load(spec, &mut |line| eprintln!("{line}")).map_err(py_error)?;
    Diarizer::check(&model).map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
    model.file().populate();
    Ok(Arc::new(model))
}

/// The Sortformer a `Model` diarizes with, loaded on first use and kept (per model argument).
#[derive(Default)]
pub struct SharedSortformer(Mutex<Option<(PathBuf, Arc<parakeet::model::Model>)>>);

impl SharedSortformer {
    /// The model named `spec` (the default one when None), loading it unless it is the one kept.
    pub fn get(&self, spec: Option<PathBuf>) -> PyResult<Arc<parakeet::model::Model>> {
        let spec = spec.unwrap_or_else(|| PathBuf::from(parakeet::diar::DEFAULT_MODEL));
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, m)) = kept.as_ref()
            && *s == spec
        {
            return Ok(m.clone());
        }
        let model = load_sortformer(&spec)?;
        *kept = Some((spec, model.clone()));
        Ok(model)
    }
}

/// A worker's diarizer over `model`: the one it has when that is over the same model, else a
/// new one (with `threads` compute threads).
pub fn worker_diarizer<'a>(
    slot: &'a mut Option<Diarizer>,
    model: &Arc<parakeet::model::Model>,
    threads: Threads,
) -> Result<&'a mut Diarizer, Error> {
    if !slot.as_ref().is_some_and(|d| Arc::ptr_eq(d.model(), model)) {
        *slot = Some(Diarizer::new(model.clone(), threads).map_err(Error::model)?);
    }
    slot.as_mut()
        .ok_or_else(|| Error::internal("no diarizer after making one"))
}

/// One speaker's turn.
#[pyclass(frozen, get_all, module = "parakeet")]
pub struct SpeakerTurn {
    /// The Sortformer's speaker index (``speaker_<k>`` in the command line's outputs).
    speaker: usize,
    /// Start and end, in seconds (NeMo's, rounded to 10 ms).
    start: f64,
    end: f64,
}

#[pymethods]
impl SpeakerTurn {
    fn __repr__(&self) -> String {
        format!(
            "SpeakerTurn(speaker={}, start={:.3}, end={:.3})",
            self.speaker, self.start, self.end
        )
    }
}

/// Who speaks when in one recording.
#[pyclass(frozen, module = "parakeet")]
pub struct Diarization {
    /// list[SpeakerTurn]: NeMo's segments, speaker by speaker, each speaker's in time order.
    #[pyo3(get)]
    segments: Py<PyList>,
    /// numpy float32 array [frames, speakers]: each speaker's probability in each frame.
    #[pyo3(get)]
    probabilities: Py<PyArray2<f32>>,
    /// Seconds per frame (0.08).
    #[pyo3(get)]
    frame_seconds: f64,
}

#[pymethods]
impl Diarization {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Diarization(segments={}, frames={})",
            self.segments.bind(py).len(),
            self.probabilities.bind(py).shape()[0]
        )
    }
}

/// Who speaks when: a Sortformer's speaker turns in ``audio`` (a path, or a numpy array of
/// samples with ``sample_rate``, as for ``Model.transcribe``).
///
/// ``model`` is a Sortformer diarization model (``.gguf``, ``.nemo`` or hub id; default
/// ``nvidia/diar_streaming_sortformer_4spk-v2``). A streaming model streams with NeMo's
/// inference sizes; an offline one sees the whole recording. The segments are NeMo's
/// post-processing with its defaults, or ``params`` (``"dihard3"`` or ``"callhome"``, NeMo's
/// published sets for the model's generation), then any of ``onset``, ``offset``,
/// ``pad_onset``, ``pad_offset``, ``min_duration_on``, ``min_duration_off`` (seconds).
///
/// Raises ValueError for bad audio, a bad parameter or a model that is not a Sortformer.
#[pyfunction]
#[pyo3(signature = (
    audio,
    model=None,
    sample_rate=None,
    *,
    threads=None,
    params=None,
    onset=None,
    offset=None,
    pad_onset=None,
    pad_offset=None,
    min_duration_on=None,
    min_duration_off=None,
))]
#[allow(clippy::too_many_arguments)]
pub fn diarize(
    py: Python<'_>,
    audio: &Bound<'_, PyAny>,
    model: Option<PathBuf>,
    sample_rate: Option<u32>,
    threads: Option<usize>,
    params: Option<String>,
    onset: Option<f64>,
    offset: Option<f64>,
    pad_onset: Option<f64>,
    pad_offset: Option<f64>,
    min_duration_on: Option<f64>,
    min_duration_off: Option<f64>,
) -> PyResult<Diarization> {
    // The command line's thread rule (0 refused, more than the cores capped with a warning).
    let threads = match threads {
        Some(n) => crate::resolve_threads(py, n)?,
        None => Threads::all(),
    };
    let input = input(audio, sample_rate, "array".to_string(), false)?;
    let spec = model.unwrap_or_else(|| PathBuf::from(parakeet::diar::DEFAULT_MODEL));
    let (activity, post, units) = py.detach(|| -> PyResult<_> {
        let sortformer = load_sortformer(&spec)?;
        let generation = Generation::of(
            sortformer
                .hparams()
                .sortformer
                .as_ref()
                .is_some_and(|p| p.streaming_mode),
        );
        let bad = |e: parakeet::error::Error| PyValueError::new_err(format!("{e:#}"));
        let mut post = match &params {
            Some(name) => PostProcessing::published(name, generation).map_err(bad)?,
            None => PostProcessing::default(),
        };
        for (v, given) in [
            (&mut post.onset, onset),
            (&mut post.offset, offset),
            (&mut post.pad_onset, pad_onset),
            (&mut post.pad_offset, pad_offset),
            (&mut post.min_duration_on, min_duration_on),
            (&mut post.min_duration_off, min_duration_off),
        ] {
            if let Some(x) = given {
                *v = x;
            }
        }
        post.check().map_err(bad)?;
        let units = sortformer.hparams().encoder.subsampling_factor;
        let mut diarizer = Diarizer::new(sortformer, threads).map_err(bad)?;
        let (samples, shown) = match input {
            Input::File(path) => {
                let shown = path.display().to_string();
                let samples =
                    pipeline::load_samples(pipeline::Input::Path(&path), Limits::default());
                (samples.map_err(py_error)?, shown)
            }
            Input::Samples { audio, name } => {
                let input = pipeline::Input::Samples { audio, name: &name };
                let samples = pipeline::load_samples(input, Limits::default());
                (samples.map_err(py_error)?, name)
            }
        };
        let activity = diarizer
            .diarize(&samples)
            .map_err(|e| PyValueError::new_err(format!("{shown}: {e:#}")))?;
        Ok((activity, post, units))
    })?;
    let turns = segments(&activity, &post, units)
        .into_iter()
        .map(|s| SpeakerTurn {
            speaker: s.speaker,
            start: s.start,
            end: s.end,
        });
    let probs = Array2::from_shape_vec((activity.frames, activity.n_spks), activity.probs)
        .map_err(|e| PyValueError::new_err(format!("internal: {e}")))?;
    Ok(Diarization {
        segments: PyList::new(py, turns)?.unbind(),
        probabilities: PyArray2::from_owned_array(py, probs).unbind(),
        frame_seconds: activity.frame_seconds,
    })
}
