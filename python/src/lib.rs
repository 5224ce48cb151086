//! The `parakeet` Python package's native module: a [`Model`] is one loaded model shared by a
//! pool of sessions (the server's worker pool: each worker a `Session` with its own backend),
//! so that calls from several Python threads, and the inputs of one call, run at once. Every
//! transcription runs with the GIL released; errors become Python exceptions carrying the
//! command line's messages.

use clap::ValueEnum as _;
use numpy::ndarray::ArrayViewD;
use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use parakeet::audio::Audio;
use parakeet::decoding_flags::{
    BeamArgs, BoostArgs, ConfidenceArgs, DEFAULT_BOOST_ALPHA, read_phrase_file,
};
use parakeet::encoder::AttentionChoice;
use parakeet::error::Error;
use parakeet::server::plan_workers;
use parakeet::server::pool::{JobFailure, Pool};
use parakeet::session::pipeline::{self, Limits};
use parakeet::session::{
    DecodeOptions, DecodeRequest, DecoderChoice, Session, SpeechRequest, Threads,
};
use parakeet::stream::DEFAULT_MAX_UTTERANCE_SECONDS;
use parakeet::stream::open::{LiveOptions, LiveRequest};
use parakeet::vad::SpeechParams;
use parakeet::vad::detect::{audio_or_empty, detect};
use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyOSError, PyTypeError, PyUserWarning, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

mod diar;
mod stream;

create_exception!(
    parakeet,
    ParakeetError,
    PyException,
    "A model that cannot be loaded (a broken or unsupported file), or a failure of ours while \
     transcribing. The message is the command line's."
);

/// The library's error as Python's, by whose it is: the caller's audio and options are
/// ValueError, a missing file FileNotFoundError (other file errors OSError), a model that
/// cannot be loaded and our own failures ParakeetError.
pub(crate) fn py_error(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Audio(_) | Error::NoSamples { .. } | Error::AudioTooLong(_) | Error::Options(_) => {
            PyValueError::new_err(msg)
        }
        Error::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        } => PyFileNotFoundError::new_err(msg),
        Error::Io { .. } => PyOSError::new_err(msg),
        Error::Model(_) | Error::Internal(_) => ParakeetError::new_err(msg),
    }
}

/// One thing to transcribe.
pub(crate) enum Input {
    File(PathBuf),
    /// An array's samples, mixed to mono and checked, at their own rate; `name` names it in
    /// errors.
    Samples {
        audio: Audio,
        name: String,
    },
}

/// A worker's state: its session, and its diarizer once a call has asked for speakers.
struct Worker {
    session: Session,
    diarizer: Option<parakeet::diar::Diarizer>,
}

/// One input through the one pipeline every front end takes; with a Sortformer, the words get
/// their speakers (by the worker's diarizer over it).
fn run_job(
    worker: &mut Worker,
    input: Input,
    options: &DecodeOptions,
    sortformer: Option<&Arc<parakeet::model::Model>>,
) -> Result<parakeet::transcript::Transcript, Error> {
    let limits = Limits::default();
    let threads = Threads::new(worker.session.threads())?;
    let diarizer = match sortformer {
        Some(m) => Some(diar::worker_diarizer(&mut worker.diarizer, m, threads)?),
        None => None,
    };
    let session = &mut worker.session;
    match input {
        Input::File(path) => {
            let input = pipeline::Input::Path(&path);
            pipeline::transcribe_input(session, diarizer, input, options, limits)
        }
        Input::Samples { audio, name } => {
            let input = pipeline::Input::Samples { audio, name: &name };
            pipeline::transcribe_input(session, diarizer, input, options, limits)
        }
    }
}

/// A speech recognition model, loaded once and shared by a pool of workers.
///
/// ``Model(model, threads=None, workers=None, kernels="auto", device="auto")``
///
/// ``model`` is a ``.gguf`` file, a ``.nemo`` checkpoint (converted once into the cache,
/// ``$PARAKEET_CACHE`` or ``~/.cache/parakeet``) or a Hugging Face hub id such as
/// ``nvidia/parakeet-tdt-0.6b-v2`` (downloaded, converted and cached once), as for the
/// command line's ``--model``.
///
/// ``workers`` inputs are transcribed at once (the inputs of one call, or the calls of several
/// Python threads), each with ``threads`` compute threads. Defaults, as ``parakeet serve``:
/// one worker per 4 cores, and the cores divided among the workers. A ``Model`` is safe to
/// share between threads.
#[pyclass(frozen, module = "parakeet")]
struct Model {
    model: Arc<parakeet::model::Model>,
    pool: Pool<Worker>,
    /// The Sortformer of `transcribe(diarize=True)`, loaded on first use.
    sortformer: diar::SharedSortformer,
    /// The GGUF file loaded (the cached conversion for a .nemo or hub id).
    path: PathBuf,
    /// Transcriptions run at once.
    #[pyo3(get)]
    workers: usize,
    /// Compute threads of each.
    #[pyo3(get)]
    threads: usize,
}

/// Calls waiting for a worker beyond the running ones: unbounded in practice (a Python caller
/// waits its turn; the server's 503 has no meaning here).
const QUEUE: usize = usize::MAX / 4;

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (model, threads=None, workers=None, kernels="auto", device="auto"))]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        threads: Option<usize>,
        workers: Option<usize>,
        kernels: &str,
        device: &str,
    ) -> PyResult<Model> {
        if workers == Some(0) {
            return Err(PyValueError::new_err("workers must be at least 1"));
        }
        // As the command line's `--kernels`: `auto` (our CPU kernels) or `ggml` (ggml's
        // built-in ops only).
        let kernels: parakeet::backend::KernelChoice = kernels
            .parse()
            .map_err(|e: String| PyValueError::new_err(format!("kernels: {e}")))?;
        // As the command line's `--device`: auto, cpu, vulkan[:N], cuda[:N], metal.
        let device = device
            .parse::<parakeet::session::DeviceRequest>()
            .and_then(|r| r.resolve())
            .map_err(py_error)?;
        let load = parakeet::model::LoadOptions {
            lowering: kernels.resolve(),
            device: Some(device),
        };
        let threads = threads
            .map(|n| resolve_threads(py, n))
            .transpose()?
            .map(Threads::get);
        py.detach(|| -> Result<Model, Error> {
            let loaded = Arc::new(parakeet::model_source::load_with(
                &model,
                &mut |line| eprintln!("{line}"),
                &load,
            )?);
            loaded.file().populate();
            let path = loaded.path().to_path_buf();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let (workers, threads) = plan_workers(cores, workers, threads);
            let threads = Threads::new(threads)?;
            let shared = loaded.clone();
            let pool = Pool::new(
                workers,
                QUEUE,
                move |_| {
                    Ok(Worker {
                        session: Session::new(shared.clone(), threads)?,
                        diarizer: None,
                    })
                },
                // A session already trims its compute buffer after each encoder pass.
                |_, _| false,
            )?;
            Ok(Model {
                model: loaded,
                pool,
                sortformer: diar::SharedSortformer::default(),
                path,
                workers,
                threads: threads.get(),
            })
        })
        .map_err(py_error)
    }

    /// The device its workers compute on (ggml's name and description).
    #[getter]
    fn device(&self) -> String {
        self.model.device().describe()
    }

    /// The model's name (from its GGUF metadata).
    #[getter]
    fn name(&self) -> &str {
        self.model.name()
    }

    /// The GGUF file loaded.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The sample rate the model runs at (16000); other rates are resampled to it.
    #[getter]
    fn sample_rate(&self) -> u32 {
        self.model.hparams().preprocessor.sample_rate
    }

    fn __repr__(&self) -> String {
        format!(
            "Model(name={:?}, path={:?}, workers={}, threads={})",
            self.model.name(),
            self.path.display().to_string(),
            self.workers,
            self.threads
        )
    }

    /// Transcribe audio: a file path, a numpy array of samples, or a list of them (transcribed
    /// in parallel by the model's workers; returns a list, in input order).
    ///
    /// Arrays: float32 or float64 in [-1, 1], or int16; 1-D (mono) or 2-D with the channels
    /// on the shorter axis (``(channels, samples)`` or ``(samples, channels)``, at most 32
    /// channels), mixed down to mono as for files. ``sample_rate`` is the arrays' rate in Hz
    /// (required for arrays, ignored by nothing: files take theirs from their header);
    /// other rates than the model's are resampled as files are.
    ///
    /// Decoding options mirror the command line's flags: ``decoder`` (``auto``, ``tdt``,
    /// ``ctc``), ``confidence`` (a NeMo method name such as ``max_prob`` or
    /// ``entropy_tsallis_exp``: token and word confidence), ``boost`` (phrases to boost) and
    /// ``boost_file`` (a path or a list of them: UTF-8 text, one phrase a line, read as
    /// ``--boost-file`` reads it) with ``boost_alpha``, ``beam`` (beam size) with ``beam_strategy`` and ``nbest``,
    /// ``att_context`` (``auto``, ``full`` or ``L,R``), ``vad`` (True, or a dict of ``vad()``'s
    /// keywords: transcribe only the speech Silero VAD finds, each segment on its own, times in
    /// the input's; ``Transcript.speech`` lists the segments, and empty or silent audio gives
    /// an empty transcript). ``diarize=True`` gives every word the
    /// speaker most active over it (``Word.speaker``), by the Sortformer ``diar_model``
    /// (``.gguf``, ``.nemo`` or hub id; default ``nvidia/diar_streaming_sortformer_4spk-v2``,
    /// loaded on first use and kept); naming ``diar_model`` implies ``diarize``.
    ///
    /// Raises FileNotFoundError for a missing file, ValueError for a bad array or option, and
    /// ParakeetError for audio that cannot be transcribed. The GIL is released meanwhile.
    #[pyo3(signature = (
        audio,
        sample_rate=None,
        *,
        decoder="auto",
        confidence=None,
        boost=None,
        boost_file=None,
        boost_alpha=DEFAULT_BOOST_ALPHA,
        beam=None,
        beam_strategy=None,
        nbest=1,
        att_context="auto",
        vad=None,
        diarize=false,
        diar_model=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn transcribe<'py>(
        &self,
        py: Python<'py>,
        audio: &Bound<'py, PyAny>,
        sample_rate: Option<u32>,
        decoder: &str,
        confidence: Option<String>,
        boost: Option<&Bound<'py, PyAny>>,
        boost_file: Option<&Bound<'py, PyAny>>,
        boost_alpha: f32,
        beam: Option<usize>,
        beam_strategy: Option<String>,
        nbest: usize,
        att_context: &str,
        vad: Option<&Bound<'py, PyAny>>,
        diarize: bool,
        diar_model: Option<PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let speech = speech_request(vad)?;
        let request = self.request(
            decoder,
            confidence,
            Boost {
                phrases: boost,
                files: boost_file,
                alpha: boost_alpha,
            },
            BeamArgs {
                beam,
                beam_strategy,
                nbest,
            },
            att_context,
        )?;
        let request = DecodeRequest { speech, ..request };
        let options = DecodeOptions::new(&self.model, &request).map_err(py_error)?;
        let many = audio.is_instance_of::<PyList>() || audio.is_instance_of::<PyTuple>();
        let items: Vec<Bound<'py, PyAny>> = if many {
            audio.try_iter()?.collect::<PyResult<_>>()?
        } else {
            vec![audio.clone()]
        };
        let mut arrays = 0;
        let inputs = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let name = if many {
                    format!("array #{i}")
                } else {
                    "array".to_string()
                };
                let input = input(item, sample_rate, name, false)?;
                arrays += matches!(input, Input::Samples { .. }) as usize;
                Ok(input)
            })
            .collect::<PyResult<Vec<Input>>>()?;
        if sample_rate.is_some() && arrays == 0 && !inputs.is_empty() {
            return Err(PyValueError::new_err(
                "sample_rate= is for arrays: a file's rate comes from its header",
            ));
        }
        let sortformer = match diarize || diar_model.is_some() {
            true => Some(py.detach(|| self.sortformer.get(diar_model))?),
            false => None,
        };
        let results = py.detach(|| self.run(inputs, options, sortformer))?;
        let transcripts = results
            .into_iter()
            .map(|t| Transcript::new(py, t, &self.model))
            .collect::<PyResult<Vec<_>>>()?;
        if many {
            Ok(PyList::new(py, transcripts)?.into_any())
        } else {
            let one = transcripts.into_iter().next();
            Ok(Bound::new(py, one.expect("one input, one transcript"))?.into_any())
        }
    }

    /// Live transcription: a ``Stream`` that takes audio in pieces (``feed``) and answers with
    /// partial and final events while it comes, as ``parakeet stream`` does, with this
    /// model's weights (the stream has its own state and compute buffers).
    ///
    /// A cache-aware model (such as nemotron-speech-streaming) streams with its encoder
    /// caches: ``att_context`` picks one of its lookaheads, ``"L,R"`` or ``(L, R)`` in encoder
    /// frames (default: NeMo's for the model). Any other (offline) model streams by NeMo's
    /// buffered pipeline, which encodes each chunk again with context on both sides:
    /// ``chunk_secs``, ``left_secs``, ``right_secs`` (NeMo's 4.8, 1.6 and 1.6; multiples of
    /// the 80 ms encoder frame); ``boost`` / ``boost_file`` / ``boost_alpha`` and
    /// ``confidence`` as for ``transcribe`` (transducer heads). ``decoder`` picks a hybrid
    /// model's head. An utterance running ``max_utterance_seconds`` without the model ending
    /// it is finished at a word start (0: never). ``vad`` (True, or a dict of
    /// ``threshold``, ``min_silence_ms``, ``speech_pad_ms``) ends utterances where Silero VAD
    /// finds the end of speech; the silence between them is not decoded. ``threads``: compute
    /// threads (default: the model's ``threads``).
    ///
    /// Raises ValueError for a setting the model cannot take (the other kind's, a size that
    /// is not a whole number of frames, naming what it rounds to), before any audio is taken.
    #[pyo3(signature = (
        *,
        chunk_secs=None,
        left_secs=None,
        right_secs=None,
        att_context=None,
        decoder="auto",
        confidence=None,
        boost=None,
        boost_file=None,
        boost_alpha=DEFAULT_BOOST_ALPHA,
        max_utterance_seconds=DEFAULT_MAX_UTTERANCE_SECONDS,
        vad=None,
        threads=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn stream<'py>(
        &self,
        py: Python<'py>,
        chunk_secs: Option<f64>,
        left_secs: Option<f64>,
        right_secs: Option<f64>,
        att_context: Option<&Bound<'py, PyAny>>,
        decoder: &str,
        confidence: Option<String>,
        boost: Option<&Bound<'py, PyAny>>,
        boost_file: Option<&Bound<'py, PyAny>>,
        boost_alpha: f32,
        max_utterance_seconds: f64,
        vad: Option<&Bound<'py, PyAny>>,
        threads: Option<usize>,
    ) -> PyResult<stream::Stream> {
        let att_context = stream::lookahead(att_context)?;
        let turns = stream::turn_params(vad)?;
        let threads = match threads {
            Some(n) => resolve_threads(py, n)?,
            None => Threads::new(self.threads).map_err(py_error)?,
        };
        let boost = Boost {
            phrases: boost,
            files: boost_file,
            alpha: boost_alpha,
        };
        let beam = BeamArgs {
            beam: None,
            beam_strategy: None,
            nbest: 1,
        };
        let request = self.request(decoder, confidence, boost, beam, "auto")?;
        // The one check of decoding options against the model (boosting settings and
        // phrases, confidence), as for transcribe, then of the live choices, as for the
        // command line's stream.
        let decode = DecodeOptions::new(&self.model, &request).map_err(py_error)?;
        let live = LiveRequest {
            att_context,
            chunk_secs,
            left_secs,
            right_secs,
            threads,
            max_utterance_seconds,
        };
        let options = LiveOptions::new(&self.model, decode, live).map_err(py_error)?;
        stream::StreamRequest { options, turns }.open(py, &self.model)
    }
}

/// A path or an array (checked here, with the GIL held: a bad one is a ValueError before any
/// work starts); `empty_ok`: an empty array is no samples (speech detection finds none) rather
/// than an error.
pub(crate) fn input(
    item: &Bound<'_, PyAny>,
    sample_rate: Option<u32>,
    name: String,
    empty_ok: bool,
) -> PyResult<Input> {
    if let Ok(array) = item.cast::<PyUntypedArray>() {
        let Some(rate) = sample_rate else {
            return Err(PyValueError::new_err(format!(
                "{name}: an array needs sample_rate= (its rate in Hz)"
            )));
        };
        let audio = array_audio(array, rate);
        let audio = if empty_ok {
            audio_or_empty(audio)
        } else {
            audio
        }
        .map_err(|e| PyValueError::new_err(format!("{name}: {e:#}")))?;
        return Ok(Input::Samples { audio, name });
    }
    if item.is_instance_of::<PyString>() || item.hasattr("__fspath__")? {
        return Ok(Input::File(item.extract()?));
    }
    Err(PyTypeError::new_err(format!(
        "expected a path, a numpy array or a list of them, got {}",
        item.get_type().name()?
    )))
}

/// Most channels an array may have (a WAV file's limit).
const MAX_CHANNELS: usize = 32;

/// An array's samples as mono audio: float32 / float64 as they are, int16 scaled by 1/32768
/// (as 16-bit files are); 1-D, or 2-D with the channels on the shorter axis.
fn array_audio(array: &Bound<'_, PyUntypedArray>, rate: u32) -> Result<Audio, Error> {
    let (interleaved, channels) = array_frames(array)?;
    Audio::from_interleaved(&interleaved, channels, rate)
}

/// An array's samples frame by frame, each frame's channels together, as f32 (see
/// [`array_audio`]), and the channel count.
pub(crate) fn array_frames(array: &Bound<'_, PyUntypedArray>) -> Result<(Vec<f32>, usize), Error> {
    let py = array.py();
    let dtype = array.dtype();
    let shape = array.shape().to_vec();
    let (channels, channels_first) = match shape[..] {
        [_] => (1, false),
        [a, b] if a.min(b) <= MAX_CHANNELS => (a.min(b), a <= b),
        _ => parakeet::bail!(
            Audio,
            "expected a 1-D array (mono samples) or a 2-D one with at most {MAX_CHANNELS} \
             channels on its shorter axis, got shape {shape:?}"
        ),
    };
    let interleaved = if dtype.is_equiv_to(&numpy::dtype::<f32>(py)) {
        let a = array
            .cast::<PyArrayDyn<f32>>()
            .map_err(|e| parakeet::err!(Audio, "{e}"))?;
        interleave(a.readonly().as_array(), channels_first, |x| x)
    } else if dtype.is_equiv_to(&numpy::dtype::<f64>(py)) {
        let a = array
            .cast::<PyArrayDyn<f64>>()
            .map_err(|e| parakeet::err!(Audio, "{e}"))?;
        interleave(a.readonly().as_array(), channels_first, |x| x as f32)
    } else if dtype.is_equiv_to(&numpy::dtype::<i16>(py)) {
        let a = array
            .cast::<PyArrayDyn<i16>>()
            .map_err(|e| parakeet::err!(Audio, "{e}"))?;
        interleave(a.readonly().as_array(), channels_first, |x| {
            f32::from(x) / 32768.0
        })
    } else {
        parakeet::bail!(
            Audio,
            "unsupported dtype {dtype}: pass float32 or float64 samples in [-1, 1], or int16"
        );
    };
    Ok((interleaved, channels))
}

/// The samples frame by frame (each frame's channels together), whatever the array's layout
/// in memory.
fn interleave<T: Copy>(
    view: ArrayViewD<'_, T>,
    channels_first: bool,
    to_f32: impl Fn(T) -> f32,
) -> Vec<f32> {
    let frames_first = if channels_first {
        view.reversed_axes()
    } else {
        view
    };
    frames_first.iter().map(|&x| to_f32(x)).collect()
}

impl Model {
    /// The call's decoding request (checked against the model by [`DecodeOptions::new`], the
    /// function the command line and the server use, before any audio is read).
    fn request(
        &self,
        decoder: &str,
        confidence: Option<String>,
        boost: Boost<'_, '_>,
        beam: BeamArgs,
        att_context: &str,
    ) -> PyResult<DecodeRequest> {
        let decoder = decoder_choice(decoder)?;
        let attention: AttentionChoice = att_context
            .parse()
            .map_err(|e| PyValueError::new_err(format!("att_context={att_context:?}: {e}")))?;
        let (boost, phrases) = boost.phrases()?;
        let request = DecodeRequest {
            decoder,
            attention,
            confidence: ConfidenceArgs {
                confidence,
                ..ConfidenceArgs::default()
            }
            .resolve(false)
            .map_err(py_error)?,
            boost: boost.config(phrases),
            beam: beam.request().map_err(py_error)?,
            speech: None,
        };
        Ok(request)
    }

    /// Every input on the pool, in parallel; the transcripts in input order, or the first
    /// input's error (in input order). Runs without the GIL; a KeyboardInterrupt stops the
    /// waiting and cancels the inputs not started yet (those running finish, their results
    /// dropped), so that the next call does not wait behind them.
    fn run(
        &self,
        inputs: Vec<Input>,
        options: DecodeOptions,
        sortformer: Option<Arc<parakeet::model::Model>>,
    ) -> PyResult<Vec<parakeet::transcript::Transcript>> {
        let options = Arc::new(options);
        let cancelled = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let mut panics = Vec::new();
        let n = inputs.len();
        for (i, input) in inputs.into_iter().enumerate() {
            let (tx, options, sortformer) = (tx.clone(), options.clone(), sortformer.clone());
            let cancelled = cancelled.clone();
            let submitted = self.pool.submit(move |worker: &mut Worker| {
                if !cancelled.load(Ordering::SeqCst) {
                    let t = run_job(worker, input, &options, sortformer.as_ref());
                    let _ = tx.send((i, t));
                }
            });
            match submitted {
                Ok(reply) => panics.push(reply),
                Err(_) => return Err(ParakeetError::new_err("the model's workers have stopped")),
            }
        }
        drop(tx);
        let mut results: Vec<Option<Result<_, Error>>> = (0..n).map(|_| None).collect();
        let mut received = 0;
        // Signals are checked every 100 ms, also while results keep arriving (short inputs
        // never let the wait time out).
        let check_signals = || {
            Python::attach(|py| py.check_signals()).inspect_err(|_| {
                cancelled.store(true, Ordering::SeqCst);
            })
        };
        let mut checked = std::time::Instant::now();
        while received < n {
            let got = rx.recv_timeout(Duration::from_millis(100));
            if checked.elapsed() >= Duration::from_millis(100) || got.is_err() {
                checked = std::time::Instant::now();
                check_signals()?;
            }
            match got {
                Ok((i, result)) => {
                    results[i] = Some(result);
                    received += 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Every job is done and some sent nothing: they panicked.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // An interrupt that came after the last check still belongs to this call: raised here,
        // not at whatever Python line runs next.
        check_signals()?;
        let mut out = Vec::with_capacity(n);
        for (result, reply) in results.into_iter().zip(panics) {
            match result {
                Some(Ok(t)) => out.push(t),
                Some(Err(e)) => return Err(py_error(e)),
                None => {
                    let why = match reply.blocking_recv() {
                        Ok(Err(JobFailure::Panicked(msg))) => msg,
                        _ => "the worker stopped".to_string(),
                    };
                    return Err(ParakeetError::new_err(format!(
                        "internal error while transcribing: {why}"
                    )));
                }
            }
        }
        Ok(out)
    }
}

/// The command line's thread policy: 0 refused, more than the cores warned (a UserWarning)
/// and capped.
pub(crate) fn resolve_threads(py: Python<'_>, n: usize) -> PyResult<Threads> {
    let (t, warning) = Threads::resolve(Some(n)).map_err(py_error)?;
    if let Some(w) = warning {
        PyErr::warn(
            py,
            &py.get_type::<PyUserWarning>(),
            &std::ffi::CString::new(w).unwrap_or_default(),
            1,
        )?;
    }
    Ok(t)
}

/// ``decoder=``: one of the command line's `--decoder` names.
fn decoder_choice(decoder: &str) -> PyResult<DecoderChoice> {
    DecoderChoice::from_str(decoder, true).map_err(|_| {
        let names: Vec<String> = DecoderChoice::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_owned()))
            .collect();
        PyValueError::new_err(format!(
            "decoder={decoder:?}: expected one of {}",
            names.join(", ")
        ))
    })
}

/// The boosting keywords of a call: ``boost`` (a phrase or a list of them), ``boost_file`` (a
/// path or a list of them: UTF-8 text, one phrase a line) and ``boost_alpha``.
struct Boost<'a, 'py> {
    phrases: Option<&'a Bound<'py, PyAny>>,
    files: Option<&'a Bound<'py, PyAny>>,
    alpha: f32,
}

impl Boost<'_, '_> {
    /// The boosting settings and every phrase, ``boost``'s then each file's, the files read by
    /// the command line's reader (a missing one is FileNotFoundError, a bad one ValueError,
    /// each naming it).
    fn phrases(&self) -> PyResult<(BoostArgs, Vec<String>)> {
        let mut phrases: Vec<String> = match self.phrases {
            None => Vec::new(),
            Some(b) if b.is_instance_of::<PyString>() => vec![b.extract()?],
            Some(b) => b.extract()?,
        };
        let files: Vec<PathBuf> = match self.files {
            None => Vec::new(),
            Some(f) if f.is_instance_of::<PyString>() || f.hasattr("__fspath__")? => {
                vec![f.extract()?]
            }
            Some(f) => f.extract()?,
        };
        for path in &files {
            phrases.extend(read_phrase_file(path, "boost_file").map_err(py_error)?);
        }
        let args = BoostArgs {
            boost_alpha: self.alpha,
            ..BoostArgs::default()
        };
        Ok((args, phrases))
    }
}

/// A word with its time span in seconds.
#[pyclass(frozen, get_all, module = "parakeet")]
struct Word {
    /// The word, as written in the text (named as in the command line's JSON outputs).
    word: String,
    /// Start, in seconds from the start of the audio.
    start: f64,
    /// End, in seconds.
    end: f64,
    /// NeMo's word confidence in [0, 1], when ``confidence=`` was asked for; else None.
    confidence: Option<f32>,
    /// Who spoke it, with ``diarize=True``: the Sortformer's speaker index (``speaker_<k>``
    /// in the command line's outputs); else None.
    speaker: Option<usize>,
}

#[pymethods]
impl Word {
    fn __repr__(&self) -> String {
        format!(
            "Word(word={:?}, start={:.3}, end={:.3})",
            self.word, self.start, self.end
        )
    }
}

/// One emitted token.
#[pyclass(frozen, get_all, module = "parakeet")]
struct Token {
    /// Vocabulary id.
    id: usize,
    /// The SentencePiece piece (``▁`` marks a word start).
    piece: String,
    /// Encoder frame where it was emitted.
    frame: usize,
    /// TDT duration in frames (0 for RNN-T and CTC).
    duration: usize,
    /// The token's span in seconds: from its frame to ``frame + duration`` frames for TDT
    /// (0 frames allowed), ``frame + 1`` for RNN-T and CTC; never past the end of the audio.
    start: f64,
    end: f64,
    /// NeMo's token confidence in [0, 1], when ``confidence=`` was asked for; else None.
    confidence: Option<f32>,
}

#[pymethods]
impl Token {
    fn __repr__(&self) -> String {
        format!(
            "Token(id={}, piece={:?}, frame={}, duration={})",
            self.id, self.piece, self.frame, self.duration
        )
    }
}

/// Another hypothesis of a beam search.
#[pyclass(frozen, get_all, module = "parakeet")]
struct Alternative {
    text: String,
    /// Token ids.
    tokens: Vec<usize>,
    /// The search's score (sum of log-probabilities, boosting included).
    score: f32,
}

#[pymethods]
impl Alternative {
    fn __repr__(&self) -> String {
        format!("Alternative(text={:?}, score={})", self.text, self.score)
    }
}

/// The result of one input: text, words and tokens with their times.
#[pyclass(frozen, module = "parakeet")]
struct Transcript {
    /// The text.
    #[pyo3(get)]
    text: String,
    /// list[Word]
    #[pyo3(get)]
    words: Py<PyList>,
    /// list[Token]
    #[pyo3(get)]
    tokens: Py<PyList>,
    /// Seconds of audio.
    #[pyo3(get)]
    audio_seconds: f64,
    /// Seconds per encoder frame (token frames to seconds).
    #[pyo3(get)]
    frame_seconds: f64,
    /// A beam search's N best, best first (``nbest=``); empty for greedy decoding.
    #[pyo3(get)]
    alternatives: Py<PyList>,
    /// Seconds spent in each stage: features, encoder, decoder (and vad, with ``vad=``).
    #[pyo3(get)]
    timings: Py<PyDict>,
    /// With ``vad=``, the speech segments transcribed as ``(start, end)`` seconds; else None.
    #[pyo3(get)]
    speech: Option<Vec<(f64, f64)>>,
}

impl Transcript {
    fn new(
        py: Python<'_>,
        t: parakeet::transcript::Transcript,
        model: &parakeet::model::Model,
    ) -> PyResult<Transcript> {
        let tokens: Vec<Token> = t
            .tokens
            .iter()
            .enumerate()
            .map(|(i, tok)| {
                let (start, end) = t.token_times(i);
                Token {
                    id: tok.id,
                    piece: model
                        .tokenizer()
                        .piece(tok.id)
                        .unwrap_or_default()
                        .to_owned(),
                    frame: tok.frame,
                    duration: tok.duration,
                    start,
                    end,
                    confidence: t.token_confidence.as_ref().and_then(|c| c.get(i).copied()),
                }
            })
            .collect();
        let words = t.words.into_iter().map(|w| Word {
            word: w.text,
            start: w.start,
            end: w.end,
            confidence: w.confidence,
            speaker: w.speaker,
        });
        let alternatives = t.alternatives.into_iter().map(|a| Alternative {
            text: a.text,
            tokens: a.tokens.iter().map(|tok| tok.id).collect(),
            score: a.score,
        });
        let timings = PyDict::new(py);
        if t.speech.is_some() {
            timings.set_item("vad", t.times.vad.as_secs_f64())?;
        }
        timings.set_item("features", t.times.features.as_secs_f64())?;
        timings.set_item("encoder", t.times.encoder.as_secs_f64())?;
        timings.set_item("decoder", t.times.decoder.as_secs_f64())?;
        Ok(Transcript {
            text: t.text,
            words: PyList::new(py, words)?.unbind(),
            tokens: PyList::new(py, tokens)?.unbind(),
            audio_seconds: t.audio_seconds,
            frame_seconds: t.frame_seconds,
            alternatives: PyList::new(py, alternatives)?.unbind(),
            timings: timings.unbind(),
            speech: t
                .speech
                .map(|spans| spans.iter().map(|s| (s.start, s.end)).collect()),
        })
    }
}

#[pymethods]
impl Transcript {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Transcript(text={:?}, words={}, audio_seconds={:.2})",
            self.text,
            self.words.bind(py).len(),
            self.audio_seconds
        )
    }

    /// Plain data (text, words and tokens as dicts, audio_seconds): for JSON, a DataFrame or a
    /// Ray dataset.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("text", &self.text)?;
        d.set_item("audio_seconds", self.audio_seconds)?;
        if let Some(speech) = &self.speech {
            d.set_item("speech", speech)?;
        }
        let words = PyList::empty(py);
        for w in self.words.bind(py) {
            let w = w.cast::<Word>()?.get();
            let item = PyDict::new(py);
            item.set_item("word", &w.word)?;
            item.set_item("start", w.start)?;
            item.set_item("end", w.end)?;
            item.set_item("confidence", w.confidence)?;
            item.set_item("speaker", w.speaker)?;
            words.append(item)?;
        }
        d.set_item("words", words)?;
        let tokens = PyList::empty(py);
        for t in self.tokens.bind(py) {
            let t = t.cast::<Token>()?.get();
            let item = PyDict::new(py);
            item.set_item("id", t.id)?;
            item.set_item("piece", &t.piece)?;
            item.set_item("frame", t.frame)?;
            item.set_item("duration", t.duration)?;
            item.set_item("start", t.start)?;
            item.set_item("end", t.end)?;
            item.set_item("confidence", t.confidence)?;
            tokens.append(item)?;
        }
        d.set_item("tokens", tokens)?;
        Ok(d)
    }
}

/// Speech segments of audio with Silero VAD (v6.2, built in), as the silero-vad package's
/// ``get_speech_timestamps`` makes them.
///
/// ``vad(audio, sample_rate=None, *, threads=1, model=None, **params)``
///
/// ``audio`` is a file path or a numpy array as for ``Model.transcribe`` (``sample_rate``
/// required for arrays). Audio at 16 or 8 kHz runs at its rate, any other rate is resampled
/// to 16 kHz. ``params`` are the package's, with its defaults: ``threshold`` (0.5),
/// ``neg_threshold`` (threshold - 0.15), ``min_speech_ms`` (250), ``max_speech_s`` (None: no
/// limit), ``min_silence_ms`` (100), ``speech_pad_ms`` (30), ``min_silence_at_max_speech_ms``
/// (98), ``legacy_max_speech_split`` (False; the package's
/// ``use_max_poss_sil_at_max_speech=False``). ``model`` is a Silero VAD GGUF to use instead of
/// the built-in one.
///
/// Returns a list of dicts ``{"start", "end"}`` in seconds and ``{"start_sample",
/// "end_sample"}`` at the rate the model ran at; empty or silent audio gives an empty list.
/// Raises ValueError for a bad parameter or array, FileNotFoundError for a missing file,
/// ParakeetError for a model file that cannot be loaded.
#[pyfunction]
#[pyo3(signature = (audio, sample_rate=None, *, threads=1, model=None, **params))]
fn vad<'py>(
    py: Python<'py>,
    audio: &Bound<'py, PyAny>,
    sample_rate: Option<u32>,
    threads: usize,
    model: Option<PathBuf>,
    params: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyList>> {
    let params = speech_params(params)?;
    let threads = Threads::new(threads).map_err(py_error)?;
    let input = input(audio, sample_rate, "array".into(), true)?;
    if sample_rate.is_some() && matches!(input, Input::File(_)) {
        return Err(PyValueError::new_err(
            "sample_rate= is for arrays: a file's rate comes from its header",
        ));
    }
    let found = py
        .detach(|| -> Result<_, Error> {
            let model = parakeet::vad::VadModel::load(model.as_deref())?;
            let mut vad = parakeet::vad::Vad::new(model, threads)?;
            let audio = match input {
                Input::File(path) => audio_or_empty(parakeet::audio::load_audio(&path))?,
                Input::Samples { audio, .. } => audio,
            };
            detect(&mut vad, audio, &params)
        })
        .map_err(py_error)?;
    let segments = found
        .segments
        .iter()
        .map(|s| {
            let d = PyDict::new(py);
            let (start, end) = found.seconds(s);
            d.set_item("start", start)?;
            d.set_item("end", end)?;
            d.set_item("start_sample", s.start)?;
            d.set_item("end_sample", s.end)?;
            Ok(d)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, segments)
}

/// The speech-detection keywords of ``vad`` (and of ``Model.transcribe``'s ``vad=`` dict),
/// checked as the command line checks its flags; the defaults are the package's.
fn speech_params(given: Option<&Bound<'_, PyDict>>) -> PyResult<SpeechParams> {
    let mut p = SpeechParams::default();
    for (key, value) in given.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        match key.as_str() {
            "threshold" => p.threshold = value.extract()?,
            "neg_threshold" => p.neg_threshold = value.extract()?,
            "min_speech_ms" => p.min_speech_ms = value.extract()?,
            "max_speech_s" => {
                p.max_speech_s = value.extract::<Option<f64>>()?.unwrap_or(f64::INFINITY)
            }
            "min_silence_ms" => p.min_silence_ms = value.extract()?,
            "speech_pad_ms" => p.speech_pad_ms = value.extract()?,
            "min_silence_at_max_speech_ms" => p.min_silence_at_max_speech_ms = value.extract()?,
            "legacy_max_speech_split" => {
                p.use_max_poss_sil_at_max_speech = !value.extract::<bool>()?
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected speech-detection keyword {other:?}: expected threshold, \
                     neg_threshold, min_speech_ms, max_speech_s, min_silence_ms, speech_pad_ms, \
                     min_silence_at_max_speech_ms or legacy_max_speech_split"
                )));
            }
        }
    }
    p.validate().map_err(|e| {
        // The message names the parameter as the command line does (`min-speech-ms -3: ...`).
        let m = format!("{e:#}");
        let (name, rest) = m.split_once(' ').unwrap_or((&m, ""));
        PyValueError::new_err(format!("{} {rest}", name.replace('-', "_")))
    })?;
    Ok(p)
}

/// ``Model.transcribe``'s ``vad=``: None or False, none; True, the package's defaults; a dict,
/// ``vad()``'s keywords.
fn speech_request(vad: Option<&Bound<'_, PyAny>>) -> PyResult<Option<SpeechRequest>> {
    let params = match vad {
        None => return Ok(None),
        Some(v) if v.is_instance_of::<pyo3::types::PyBool>() => {
            if !v.extract::<bool>()? {
                return Ok(None);
            }
            speech_params(None)?
        }
        Some(v) => match v.cast::<PyDict>() {
            Ok(d) => speech_params(Some(d))?,
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "vad= takes True, False or a dict of speech-detection keywords, got {}",
                    v.get_type().name()?
                )));
            }
        },
    };
    Ok(Some(SpeechRequest {
        params,
        model: None,
    }))
}

#[pymodule]
fn _parakeet(m: &Bound<'_, PyModule>) -> PyResult<()> {
    parakeet::backend::silence_ggml_logs();
    m.add_class::<Model>()?;
    m.add_class::<Transcript>()?;
    m.add_class::<Word>()?;
    m.add_class::<Token>()?;
    m.add_class::<Alternative>()?;
    m.add_class::<stream::Stream>()?;
    m.add_function(wrap_pyfunction!(vad, m)?)?;
    m.add_class::<diar::SpeakerTurn>()?;
    m.add_class::<diar::Diarization>()?;
    m.add_function(wrap_pyfunction!(diar::diarize, m)?)?;
    m.add("ParakeetError", m.py().get_type::<ParakeetError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
