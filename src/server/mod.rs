//! `parakeet serve`: an OpenAI-compatible transcription server.
//!
//! One [`Model`] is loaded (memory-mapped) and shared read-only by N worker threads, each with
//! its own [`Session`] (backend + graph allocator). HTTP is axum on a small tokio runtime;
//! the compute happens on the workers ([`pool`]), fed by a bounded queue: a request that finds
//! the queue full is answered 503 with `Retry-After` at once. Uploads are decoded from memory
//! (nothing is written to disk). Live transcription is a WebSocket at `/v1/realtime`
//! ([`realtime`]): each connection gets its own transcriber over the same model.

pub mod auth;
pub mod conn;
mod language;
mod openai;
pub mod pool;
pub mod realtime;
mod ui;

use crate::decoder::boosting::BaseTree;
use crate::decoding_flags::{BeamArgs, BoostArgs, ConfidenceArgs};
use crate::diar::Diarizer;
use crate::error::{Blame, Context, Error, Result};
use crate::model::Model;
use crate::session::options::{boosting_error, boosting_trie};
use crate::session::pipeline::{Input, Limits, load_samples, transcribe_samples};
use crate::session::{DecodeOptions, DecodeRequest, Session, SpeechRequest, Threads};
use crate::stream::open::{LiveOptions, open_live};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use openai::{ApiError, Granularities, ResponseFormat};
use pool::{JobFailure, Pool};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// `parakeet serve` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Model: a .gguf file, a .nemo file (converted once into the cache), or a Hugging Face hub
    /// id such as nvidia/parakeet-tdt-0.6b-v2.
    #[arg(short, long, env = "PARAKEET_MODEL")]
    pub model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests transcribed at once, each by a worker with its own compute buffers (default:
    /// one per 4 cores; at most 256).
    #[arg(long, value_parser = count(1, 256))]
    pub workers: Option<usize>,
    /// Compute threads per worker (default: the cores divided among the workers).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Which ops compute the graphs: `auto` (our CPU kernels) or `ggml` (ggml's built-in ops
    /// only, over weights unpacked at load: what every ggml backend runs; a diagnostic, slower
    /// on a CPU).
    #[arg(long, value_name = "auto|ggml", default_value = "auto")]
    pub kernels: crate::backend::KernelChoice,
    /// Requests that may wait for a free worker (0 to 65536); beyond that the answer is 503 +
    /// Retry-After.
    #[arg(long, default_value_t = 16, value_parser = count(0, 1 << 16))]
    pub queue: usize,
    /// Largest request body accepted, in MiB (413 beyond; at most 1048576, a TiB).
    #[arg(long, value_name = "MIB", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_upload_mb: u64,
    /// Longest audio accepted, in seconds (400 beyond).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0, value_parser = positive_seconds)]
    pub max_audio_seconds: f64,
    /// A client that sends nothing of its request (head or body), or reads nothing of a live
    /// stream's events, for this long is disconnected (a body gets 408 first).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = positive_seconds)]
    pub io_timeout_seconds: f64,
    /// Connections open at once (live streams included); more are answered 503 and closed.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_connections: u64,
    /// On SIGTERM or SIGINT, the most time given to requests and live streams in flight; work
    /// still running after it is abandoned and the process exits.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = positive_seconds)]
    pub shutdown_seconds: f64,
    /// A worker whose compute buffer grew past this many MiB (a very long request) gets a
    /// fresh backend afterwards, releasing that memory.
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub release_buffer_mb: u64,
    /// Live streams (WebSocket connections at /v1/realtime) at once (1 to 65536); more are
    /// refused.
    #[arg(long, default_value_t = 8, value_parser = count(1, 1 << 16))]
    pub max_streams: usize,
    /// A live stream that sends no audio for this long is closed (other events and pings do
    /// not count).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = positive_seconds)]
    pub stream_idle_seconds: f64,
    /// Longest audio one live stream may send, in seconds; also the longest it may stay
    /// connected (a stream that trickles audio cannot hold its place for ever).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0, value_parser = positive_seconds)]
    pub max_stream_seconds: f64,
    /// Confidence for verbose_json's words (`probability`); `--confidence none` turns it off.
    #[command(flatten)]
    pub confidence: ConfidenceArgs,
    /// Phrases every request boosts; a request adds its own with `boost` form fields.
    #[command(flatten)]
    pub boost: BoostArgs,
    /// The device every worker computes on (the server's, not a request's).
    #[command(flatten)]
    pub device: crate::session::DeviceArg,
    /// Every request's beam search (verbose_json's words then carry no confidence).
    #[command(flatten)]
    pub beam: BeamArgs,
    /// A Sortformer diarization model (.gguf, .nemo or hub id): answers
    /// `response_format=diarized_json` and gives verbose_json's words their speakers.
    #[arg(long, value_name = "MODEL")]
    pub diar_model: Option<PathBuf>,
    /// Require this key of every API request (`Authorization: Bearer KEY`, as OpenAI's clients
    /// send it) and of the realtime socket (or, from a browser, its subprotocol
    /// `openai-insecure-api-key.KEY`); others get 401.
    #[arg(
        long,
        value_name = "KEY",
        env = "PARAKEET_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line), instead of --api-key.
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<PathBuf>,
    /// An origin (scheme://host[:port]) whose pages may call this server from a browser
    /// (repeatable); other cross-origin requests are refused with 403.
    #[arg(long, value_name = "ORIGIN")]
    pub allow_origin: Vec<String>,
    /// Serve no page at / (the API alone).
    #[arg(long)]
    pub no_ui: bool,
}

/// The API key the flags give: --api-key (or PARAKEET_API_KEY), or the first line of
/// --api-key-file; checked to fit a header and a WebSocket subprotocol.
fn api_key(args: &ServeArgs) -> Result<Option<String>> {
    let key = match (&args.api_key, &args.api_key_file) {
        (_, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::io(format!("--api-key-file {}", path.display()), &e))?;
            let line = text.lines().next().unwrap_or("").trim().to_string();
            auth::check_key(&line)
                .map_err(|e| Error::Options(format!("--api-key-file {}: {e}", path.display())))?;
            Some(line)
        }
        (Some(key), None) => {
            auth::check_key(key).map_err(|e| Error::Options(format!("--api-key: {e}")))?;
            Some(key.clone())
        }
        (None, None) => None,
    };
    Ok(key)
}

/// A worker's state: its session and, on a diarizing server, its own diarizer over the shared
/// Sortformer.
struct Worker {
    session: Session,
    diarizer: Option<Diarizer>,
}

/// A count flag within `min..=max` (as `usize`).
fn count(min: usize, max: usize) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |s: &str| match s.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a whole number from {min} to {max}")),
    }
}

/// A duration flag: a finite number of seconds above zero, and at most a year (a `Duration`
/// and the deadlines made of it cannot overflow).
fn positive_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if v.is_finite() && v > 0.0 && v <= 365.0 * 86400.0 {
        Ok(v)
    } else {
        Err(format!(
            "{s:?} is not a number of seconds above 0 (and at most a year)"
        ))
    }
}

/// Phrases one request may add with `boost` fields, and their bytes in all: a phrase costs
/// the boosting tree about 260 bytes of memory per byte while it is built.
const MAX_REQUEST_PHRASES: usize = 1000;
const MAX_REQUEST_PHRASE_BYTES: usize = 64 << 10;

/// Workers and threads per worker: what was asked, the rest filled in so that workers x
/// threads does not exceed `cores`. A worker uses its threads well up to about 4 (the decoder
/// is sequential), so the default is one worker per 4 cores.
pub fn plan_workers(
    cores: usize,
    workers: Option<usize>,
    threads: Option<usize>,
) -> (usize, usize) {
    let cores = cores.max(1);
    let per = |n: usize| (cores / n.max(1)).max(1);
    match (workers, threads) {
        (Some(w), Some(t)) => (w.max(1), t.max(1)),
        (Some(w), None) => (w.max(1), per(w)),
        (None, Some(t)) => (per(t), t.max(1)),
        (None, None) => {
            let w = per(4);
            (w, per(w))
        }
    }
}

struct AppState {
    pool: Pool<Worker>,
    /// Whether the workers diarize (`--diar-model`).
    diarizes: bool,
    model: Arc<Model>,
    model_created: u64,
    workers: usize,
    threads: usize,
    max_upload: usize,
    max_audio_seconds: f64,
    /// Every request's decoding: the server-wide phrases' tree and the confidence
    /// verbose_json's words carry (built once; a request with phrases of its own gets options
    /// of both, checked by the same function).
    options: DecodeOptions,
    /// The request `options` was built from (without phrases), the boosting flags, and the
    /// server's phrases' tree, kept for merging: for requests that add phrases.
    request: DecodeRequest,
    boost: BoostArgs,
    boost_trie: Option<Arc<BaseTree>>,
    /// Each worker's compute buffer after its last request (0 after a release).
    buffers: Arc<Vec<AtomicUsize>>,
    next_id: AtomicU64,
    /// A request body must make progress within this.
    io_timeout: std::time::Duration,
    /// Set on shutdown: a body still uploading is refused at once.
    stop: conn::StopSignal,
}

/// Set on a transcription response, for the request log line.
#[derive(Clone, Copy)]
struct AudioSeconds(f64);

/// Runs the server until SIGTERM or SIGINT, then finishes the requests and live streams in
/// flight (at most `--shutdown-seconds`) and returns.
pub fn serve(args: ServeArgs) -> Result<()> {
    // The doors are checked first: a bad key or origin fails before a model loads.
    let key = api_key(&args)?;
    let public = if args.no_ui {
        Vec::new()
    } else {
        ui::public_paths()
    };
    let access =
        Arc::new(auth::Access::new(key, &args.allow_origin, public).map_err(Error::Options)?);
    let beam = args.beam.request()?;
    // Confidence comes from greedy decoding's steps: a beam search has none to show.
    let confidence = args.confidence.resolve(beam.is_none())?;
    let boost_phrases = args.boost.phrases()?;
    let threads = match args.threads {
        Some(n) => {
            let (t, warning) = Threads::resolve(Some(n))?;
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            Some(t.get())
        }
        None => None,
    };
    let load = crate::model::LoadOptions {
        lowering: args.kernels.resolve(),
        device: Some(args.device.resolve()?),
    };
    let model = Arc::new(crate::model_source::load_with(
        &args.model,
        &mut |line| eprintln!("{line}"),
        &load,
    )?);
    let request = DecodeRequest {
        confidence,
        beam,
        ..DecodeRequest::default()
    };
    let mut options = DecodeOptions::new(&model, &request)?;
    // The server's phrases' tree built once, kept for the requests that add phrases of their
    // own: theirs are merged into it.
    let boost_trie = match args.boost.config(boost_phrases) {
        Some(cfg) => Some(Arc::new(boosting_trie(&model, &cfg)?.into_base())),
        None => None,
    };
    if let Some(base) = &boost_trie {
        options = options.with_boosting(base.tree().clone())?;
    }
    let diar_model = match &args.diar_model {
        None => None,
        Some(spec) => {
            let sortformer =
                crate::model_source::load_with(spec, &mut |line| eprintln!("{line}"), &load)
                    .and_then(|m| {
                        // Refused here, with the flag named, rather than by the first worker.
                        Diarizer::check(&m)?;
                        Ok(Arc::new(m))
                    })
                    .with_context(|| format!("--diar-model {}", spec.display()))?;
            sortformer.file().populate();
            Some(sortformer)
        }
    };
    let diarizes = diar_model.is_some();
    model.file().populate();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (workers, threads) = plan_workers(cores, args.workers, threads);
    let threads = Threads::new(threads)?;
    let threads_n = threads.get();
    if workers * threads_n > cores {
        eprintln!(
            "warning: {workers} workers x {threads_n} threads oversubscribe the {cores} cores; requests will slow each other down"
        );
    }
    let release = usize::try_from(args.release_buffer_mb << 20).unwrap_or(usize::MAX);
    let buffers: Arc<Vec<AtomicUsize>> = Arc::new((0..workers).map(|_| 0.into()).collect());
    let pool = {
        let (model, buffers) = (model.clone(), buffers.clone());
        Pool::new(
            workers,
            args.queue,
            move |_| {
                Ok(Worker {
                    session: Session::new(model.clone(), threads)?,
                    diarizer: match &diar_model {
                        Some(m) => Some(Diarizer::new(m.clone(), threads)?),
                        None => None,
                    },
                })
            },
            move |i, worker: &Worker| {
                // The gallocr's buffer only grows; after a very long request, drop it whole.
                let bytes = worker.session.stats().compute_buffer_bytes;
                let recycle = bytes > release;
                buffers[i].store(if recycle { 0 } else { bytes }, Ordering::Relaxed);
                recycle
            },
        )?
    };
    let model_created = std::fs::metadata(model.path())
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    // The flags' parsers keep them finite, positive and within a year.
    let seconds = std::time::Duration::from_secs_f64;
    let limits = conn::Limits {
        io_timeout: seconds(args.io_timeout_seconds),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        shutdown_deadline: seconds(args.shutdown_seconds),
    };
    let (drain_control, drain) = conn::Drain::new();
    let live_config = realtime::RealtimeConfig {
        model_name: model.name().to_owned(),
        idle_timeout: seconds(args.stream_idle_seconds),
        write_timeout: limits.io_timeout,
        max_seconds: args.max_stream_seconds,
        max_streams: args.max_streams,
        drain: drain.clone(),
    };
    let live_factory: realtime::TranscriberFactory = {
        let model = model.clone();
        let options = LiveOptions::defaults(&model, threads)?;
        // A remote client learns no server path: the model is named by its public name.
        Arc::new(move || {
            open_live(&model, &options).map_err(|e| {
                let path = model.path().display().to_string();
                realtime::for_clients(e, &[model.shown(), &path], model.name())
            })
        })
    };
    let state = Arc::new(AppState {
        pool,
        diarizes,
        model: model.clone(),
        model_created,
        workers,
        threads: threads_n,
        max_upload: usize::try_from(args.max_upload_mb << 20).unwrap_or(usize::MAX),
        io_timeout: limits.io_timeout,
        stop: drain.signal(),
        max_audio_seconds: args.max_audio_seconds,
        options,
        request,
        boost: args.boost.clone(),
        boost_trie,
        buffers,
        next_id: AtomicU64::new(0),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let finished = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "parakeet serve: {} ({}), {workers} worker(s) x {threads_n} thread(s), queue {}, listening on http://{addr}",
            model.name(),
            model.path().display(),
            args.queue
        );
        if auth::exposed(addr.ip()) && !access.has_key() {
            eprintln!(
                "warning: listening on {addr}, reachable from other machines, without an API key: anyone who can reach it may transcribe (set --api-key or PARAKEET_API_KEY)"
            );
        }
        let mut app = router(state.clone()).merge(realtime::router(live_config, live_factory));
        if !args.no_ui {
            app = app.merge(ui::router(ui_info(&state, args.max_stream_seconds)));
            eprintln!("parakeet serve: the page is at http://{addr}/");
        }
        let app = app.layer(middleware::from_fn_with_state(access.clone(), auth::guard));
        let finished =
            conn::serve(listener, app, limits, drain_control, drain, shutdown_signal()).await;
        Ok::<_, Error>(finished)
    });
    match finished {
        Ok(true) if state.pool.counters.busy.load(Ordering::SeqCst) == 0 => {
            // Every connection and stream is closed, so every handler is done; the pool
            // (dropped with the last state reference) joins its idle workers (jobs still
            // queued are those of clients gone, which the workers skip).
            drop(state);
            drop(rt);
            eprintln!("parakeet serve: stopped");
        }
        Ok(_) => {
            // Work still runs past the deadline (or for a client already gone): neither wait for the workers (the pool joins
            // them on drop, so it is never dropped) nor for the runtime's tasks.
            std::mem::forget(state);
            rt.shutdown_background();
            eprintln!(
                "parakeet serve: stopped after {} s (--shutdown-seconds) with work still in flight, abandoned",
                args.shutdown_seconds
            );
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// What the page shows of the server and offers: the model, the device, the options the
/// server takes (speakers only with a diarization model), and its limits.
fn ui_info(st: &AppState, max_stream_seconds: f64) -> serde_json::Value {
    let live = crate::stream::open::LiveKind::of(&st.model);
    json!({
        "model": st.model.name(),
        "device": ui::device(),
        "workers": st.workers,
        "threads_per_worker": st.threads,
        "version": env!("CARGO_PKG_VERSION"),
        "diarization": st.diarizes,
        "confidence": st.request.confidence.is_some(),
        "streaming": live.describe(),
        "live_diarization": false,
        "max_upload_mb": st.max_upload >> 20,
        "max_audio_seconds": st.max_audio_seconds,
        "max_stream_seconds": max_stream_seconds,
    })
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/audio/transcriptions", post(transcriptions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // The upload is read by `read_body`, under its own limit.
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), log_request))
        .with_state(state)
}

/// Resolves on SIGTERM or SIGINT; the server then stops accepting and drains.
async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    // Windows: Ctrl-Break and the console closing (tokio's handler keeps the process alive
    // for the few seconds Windows allows, while the requests in flight finish).
    #[cfg(windows)]
    let terminate = async {
        use tokio::signal::windows::{ctrl_break, ctrl_close};
        match (ctrl_break(), ctrl_close()) {
            (Ok(mut brk), Ok(mut close)) => {
                tokio::select! {
                    _ = brk.recv() => {}
                    _ = close.recv() => {}
                }
            }
            _ => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(any(unix, windows)))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
    eprintln!("parakeet serve: shutting down, finishing the requests and streams in flight");
}

/// One line per request: id, method and path, status, audio seconds, time. The id is also
/// returned as `x-request-id`.
async fn log_request(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let id = st.next_id.fetch_add(1, Ordering::Relaxed) + 1;
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let start = Instant::now();
    let mut resp = next.run(req).await;
    let audio = resp
        .extensions()
        .get::<AudioSeconds>()
        .map_or("-".to_string(), |a| format!("{:.2} s", a.0));
    eprintln!(
        "#{id} {method} {path} {} audio {audio} time {:.3} s",
        resp.status().as_u16(),
        start.elapsed().as_secs_f64()
    );
    resp.headers_mut()
        .insert("x-request-id", HeaderValue::from(id));
    resp
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown endpoint: this server offers POST /v1/audio/transcriptions, GET /v1/models and GET /health",
        None,
        Some("unknown_url"),
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
        None,
        Some("method_not_allowed"),
    )
}

fn model_entry(st: &AppState) -> serde_json::Value {
    json!({
        "id": st.model.name(),
        "object": "model",
        "created": st.model_created,
        "owned_by": "parakeet",
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": [model_entry(&st)]}))
}

async fn model_by_id(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id == st.model.name() {
        Json(model_entry(&st)).into_response()
    } else {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "the model {id:?} is not loaded (this server holds {:?})",
                st.model.name()
            ),
            Some("model"),
            Some("model_not_found"),
        )
        .into_response()
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let c = &st.pool.counters;
    let buffers: Vec<usize> = st
        .buffers
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    Json(json!({
        "status": "ok",
        "model": st.model.name(),
        "workers": st.workers,
        "threads_per_worker": st.threads,
        "busy": c.busy.load(Ordering::SeqCst),
        "queued": c.queued.load(Ordering::SeqCst),
        "compute_buffer_bytes": buffers,
    }))
}

/// `POST /v1/audio/transcriptions`.
async fn transcriptions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    match transcribe_request(&st, req).await {
        Ok(resp) => resp,
        Err(e) => {
            let mut resp = e.into_response();
            // The rest of a stalled body will not be read: the connection cannot carry
            // another request.
            if resp.status() == StatusCode::REQUEST_TIMEOUT {
                resp.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    HeaderValue::from_static("close"),
                );
            }
            resp
        }
    }
}

/// The request's fields, as read from the multipart body.
struct Fields {
    file: Bytes,
    file_name: String,
    format: ResponseFormat,
    granularities: Granularities,
    /// The request's own phrases to boost (`boost` fields).
    boost: Vec<String>,
    /// `stream=true`: the answer as server-sent events.
    stream: bool,
    /// `vad=true`: transcribe only the speech (as `transcribe --vad`, the default parameters).
    vad: bool,
    /// The `language` field's language, by name.
    language: Option<&'static str>,
}

/// A request's decoding options: the server's, or the server's with the request's own phrases
/// added, checked as the server's were and built on the worker (a tree of many phrases takes
/// time: never on the async threads, which must stay free to answer everyone else). The
/// server's tree is not built again: the request's phrases are merged into a copy of it.
enum RequestOptions {
    Ready(DecodeOptions),
    Extend {
        options: DecodeOptions,
        server: Arc<BaseTree>,
        request: Vec<String>,
        vad: bool,
    },
    Build {
        args: BoostArgs,
        base: DecodeRequest,
        request: Vec<String>,
        vad: bool,
    },
}

impl RequestOptions {
    fn new(st: &AppState, request: Vec<String>, vad: bool) -> RequestOptions {
        if request.is_empty() && !vad {
            return RequestOptions::Ready(st.options.clone());
        }
        match &st.boost_trie {
            Some(server) => RequestOptions::Extend {
                options: st.options.clone(),
                server: server.clone(),
                request,
                vad,
            },
            None => RequestOptions::Build {
                args: st.boost.clone(),
                base: st.request.clone(),
                request,
                vad,
            },
        }
    }

    /// The options, `with_confidence` or without.
    fn build(self, model: &Model, with_confidence: bool) -> Result<DecodeOptions, ApiError> {
        let options = match self {
            RequestOptions::Ready(options) => options,
            RequestOptions::Extend {
                options,
                server,
                request,
                vad,
            } => {
                let mut options = options;
                if !request.is_empty() {
                    let all = server
                        .merge(model.tokenizer(), &request)
                        .map_err(|e| api_error(boosting_error(e), Some("boost")))?;
                    options = options
                        .with_boosting(Arc::new(all))
                        .map_err(|e| api_error(e, Some("boost")))?;
                }
                if vad {
                    options = options
                        .with_speech(&SpeechRequest::default())
                        .map_err(|e| api_error(e, Some("vad")))?;
                }
                options
            }
            RequestOptions::Build {
                args,
                base,
                request,
                vad,
            } => {
                let request = DecodeRequest {
                    boost: args.config(request),
                    speech: vad.then(SpeechRequest::default),
                    ..base
                };
                DecodeOptions::new(model, &request).map_err(|e| api_error(e, Some("boost")))?
            }
        };
        Ok(if with_confidence {
            options
        } else {
            options.without_confidence()
        })
    }
}

/// A library error as the API's: the user's are 400 (naming the field `param` when the
/// failure is one field's), ours 500.
fn api_error(e: Error, param: Option<&'static str>) -> ApiError {
    let message = e.to_string();
    let (param, code) = match &e {
        Error::Audio(_) | Error::NoSamples { .. } => (Some("file"), "invalid_audio"),
        Error::AudioTooLong(_) => (Some("file"), "audio_too_long"),
        Error::Options(_) => (param, "invalid_value"),
        Error::Model(_) | Error::Io { .. } | Error::Internal(_) => (None, "internal_error"),
    };
    match e.blame() {
        // The model and the files are the server's, not the client's.
        Blame::User if !matches!(e, Error::Model(_) | Error::Io { .. }) => {
            ApiError::bad_request(message, param, Some(code))
        }
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            message,
            None,
            Some("internal_error"),
        ),
    }
}

async fn transcribe_request(st: &AppState, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_body(body, st).await?;
    let req = Request::from_parts(parts, Body::from(body));
    let multipart = Multipart::from_request(req, &()).await.map_err(|e| {
        ApiError::bad_request(
            format!("expected a multipart/form-data body: {}", e.body_text()),
            None,
            Some("invalid_multipart"),
        )
    })?;
    let fields = read_fields(multipart).await?;
    let max_seconds = st.max_audio_seconds;
    let Fields {
        file,
        file_name,
        format,
        granularities,
        boost,
        stream,
        vad,
        language,
    } = fields;
    if format == ResponseFormat::DiarizedJson && !st.diarizes {
        return Err(ApiError::bad_request(
            "response_format diarized_json needs a server started with --diar-model (a Sortformer diarization model)",
            Some("response_format"),
            Some("invalid_value"),
        ));
    }
    // Speakers only where they are shown: diarized_json, and verbose_json's words.
    let diarize = st.diarizes
        && (format == ResponseFormat::DiarizedJson
            || (format == ResponseFormat::VerboseJson && granularities.word));
    let options = RequestOptions::new(st, boost, vad);
    // Only verbose_json's words show a confidence: nothing else pays for it.
    let with_confidence = format == ResponseFormat::VerboseJson && granularities.word;
    let reply = st
        .pool
        .submit(move |worker: &mut Worker| {
            let start = Instant::now();
            let Worker { session, diarizer } = worker;
            let options = options.build(session.model(), with_confidence)?;
            let input = Input::Bytes {
                data: &file,
                name: &file_name,
            };
            let limits = Limits {
                max_seconds: Some(max_seconds),
            };
            // The pipeline's two steps, so that the upload is freed before the transcription.
            let samples = load_samples(input, limits).map_err(|e| api_error(e, None))?;
            drop(file);
            let diarizer = diarizer.as_mut().filter(|_| diarize);
            transcribe_samples(session, diarizer, samples, &options, &file_name)
                .map(|t| (t, start.elapsed()))
                .map_err(|e| api_error(e, None))
        })
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is busy (every worker is busy and the queue is full); retry later",
                None,
                Some("server_busy"),
            )
        })?;
    let (transcript, worker_time) = match reply.await {
        Ok(Ok(result)) => result?,
        Ok(Err(JobFailure::Panicked(msg))) => {
            eprintln!("error: a worker panicked: {msg}");
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error while transcribing (the server goes on)",
                None,
                Some("internal_error"),
            ));
        }
        Ok(Err(JobFailure::Busy)) | Err(_) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down",
                None,
                Some("server_busy"),
            ));
        }
    };
    let mut resp = if stream {
        openai::render_stream(&transcript)
    } else {
        let language = language.unwrap_or_else(|| language::of_model(st.model.tokenizer()));
        openai::render(format, &transcript, granularities, language)
    };
    resp.extensions_mut()
        .insert(AudioSeconds(transcript.audio_seconds));
    // What the worker spent decoding and transcribing: the rest of a client's wait is the
    // server's overhead (and the queue).
    let ms = format!("{:.3}", worker_time.as_secs_f64() * 1e3);
    if let Ok(v) = HeaderValue::from_str(&ms) {
        resp.headers_mut().insert("x-worker-ms", v);
    }
    Ok(resp)
}

/// After the limit, the rest of an oversized body is still read (and dropped) up to this many
/// bytes, so that the client, still sending, reads the 413 instead of a connection reset.
const DRAIN_LIMIT: usize = 256 << 20;

/// The slowest average upload accepted (after the first `--io-timeout-seconds`): 8 KiB/s, a
/// 64 kbit/s line (the largest upload by default, 100 MiB, may take up to 3.6 hours).
const MIN_BODY_BYTES_PER_SECOND: f64 = 8192.0;

/// The whole request body, at most `max_upload` bytes; each part must come within the I/O
/// timeout, and a shutdown cuts the upload.
async fn read_body(mut body: Body, st: &AppState) -> Result<Bytes, ApiError> {
    let limit = st.max_upload;
    let mut stop = st.stop.clone();
    let mut buf = Vec::new();
    let mut total = 0usize;
    let started = tokio::time::Instant::now();
    loop {
        // Each read within the timeout, and the whole body at no less than the minimum rate
        // after the first timeout's grace: a trickle cannot hold a connection for ever.
        let by_rate = started
            + st.io_timeout
            + Duration::from_secs_f64(total as f64 / MIN_BODY_BYTES_PER_SECOND);
        let by_read = tokio::time::Instant::now() + st.io_timeout;
        let frame = tokio::select! {
            frame = tokio::time::timeout_at(by_rate.min(by_read), body.frame()) => match frame {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    let why = if by_rate < by_read {
                        format!(
                            "the request body arrives too slowly: {total} bytes in {:.0} s, below this server's minimum of {} KiB/s",
                            started.elapsed().as_secs_f64(),
                            MIN_BODY_BYTES_PER_SECOND as usize >> 10
                        )
                    } else {
                        format!(
                            "the request body stalled: nothing arrived for {} s (--io-timeout-seconds)",
                            st.io_timeout.as_secs_f64()
                        )
                    };
                    return Err(ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        why,
                        None,
                        Some("request_timeout"),
                    ));
                }
            },
            () = stop.stopped() => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server is shutting down",
                    None,
                    Some("server_busy"),
                ));
            }
        };
        let frame = frame.map_err(|e| {
            ApiError::bad_request(
                format!("cannot read the request body: {e}"),
                None,
                Some("body_read_error"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total = total.saturating_add(data.len());
        if total <= limit {
            buf.extend_from_slice(&data);
        } else {
            buf = Vec::new();
            if total > limit.saturating_add(DRAIN_LIMIT) {
                break;
            }
        }
    }
    if total > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than this server's limit of {} MiB (--max-upload-mb)",
                limit >> 20
            ),
            Some("file"),
            Some("file_too_large"),
        ));
    }
    Ok(Bytes::from(buf))
}

/// The form's fields that take one value (`boost` and `timestamp_granularities[]` repeat).
const SINGLE_FIELDS: &[&str] = &["file", "response_format", "stream", "vad", "language"];

async fn read_fields(mut multipart: Multipart) -> Result<Fields, ApiError> {
    let bad = |e: axum::extract::multipart::MultipartError| {
        ApiError::bad_request(
            format!("malformed multipart body: {}", e.body_text()),
            None,
            Some("invalid_multipart"),
        )
    };
    let mut file = None;
    let mut format = ResponseFormat::Json;
    let mut granularities: Option<Granularities> = None;
    let mut boost = Vec::new();
    let mut stream = false;
    let mut vad = false;
    let mut language = None;
    let mut seen: Vec<&'static str> = Vec::new();
    while let Some(field) = multipart.next_field().await.map_err(bad)? {
        let name = field.name().unwrap_or_default().to_string();
        // A field that takes one value, given twice (`stream=true` and `stream=false`), is a
        // conflict no reading of the form settles.
        if let Some(&single) = SINGLE_FIELDS.iter().find(|f| **f == name) {
            if seen.contains(&single) {
                return Err(ApiError::bad_request(
                    format!("the `{single}` field is given more than once: send it once"),
                    Some(single),
                    Some("duplicate_field"),
                ));
            }
            seen.push(single);
        }
        match name.as_str() {
            "file" => {
                let file_name = field.file_name().unwrap_or("upload").to_string();
                file = Some((field.bytes().await.map_err(bad)?, file_name));
            }
            "response_format" => format = ResponseFormat::parse(&field.text().await.map_err(bad)?)?,
            "stream" => stream = openai::parse_stream(&field.text().await.map_err(bad)?)?,
            "vad" => vad = openai::parse_flag("vad", &field.text().await.map_err(bad)?)?,
            "language" => {
                let code = field.text().await.map_err(bad)?;
                language = Some(language::requested(&code).map_err(|message| {
                    ApiError::bad_request(message, Some("language"), Some("invalid_value"))
                })?);
            }
            "boost" | "boost[]" => {
                boost.push(field.text().await.map_err(bad)?);
                let bytes: usize = boost.iter().map(String::len).sum();
                if boost.len() > MAX_REQUEST_PHRASES || bytes > MAX_REQUEST_PHRASE_BYTES {
                    return Err(ApiError::bad_request(
                        format!(
                            "too many phrases to boost: a request may add at most {MAX_REQUEST_PHRASES} `boost` fields of {} KiB in all (phrases for every request belong in --boost-file)",
                            MAX_REQUEST_PHRASE_BYTES >> 10
                        ),
                        Some("boost"),
                        Some("invalid_value"),
                    ));
                }
            }
            "timestamp_granularities[]" | "timestamp_granularities" => granularities
                .get_or_insert_with(Granularities::default)
                .add(&field.text().await.map_err(bad)?)?,
            // `model`, `prompt`, `temperature` and anything newer are accepted and ignored:
            // there is one model, and greedy decoding has no prompt or temperature. The parser skips the field's body when the next one is asked for.
            _ => {}
        }
    }
    let Some((file, file_name)) = file else {
        return Err(ApiError::bad_request(
            "no audio: the multipart body has no `file` field",
            Some("file"),
            Some("missing_file"),
        ));
    };
    if stream && !matches!(format, ResponseFormat::Json | ResponseFormat::Text) {
        return Err(ApiError::bad_request(
            "stream=true answers with transcript.text.delta events: response_format must be json or text",
            Some("stream"),
            Some("invalid_value"),
        ));
    }
    Ok(Fields {
        file,
        file_name,
        format,
        granularities: Granularities::resolve(granularities),
        boost,
        stream,
        vad,
        language,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_never_oversubscribes() {
        for cores in 1..=128 {
            let (w, t) = plan_workers(cores, None, None);
            assert!(w >= 1 && t >= 1 && w * t <= cores, "{cores}: {w} x {t}");
            let (w2, t2) = plan_workers(cores, Some(2), None);
            assert_eq!(w2, 2);
            assert!(w2 * t2 <= cores.max(2), "{cores}: {w2} x {t2}");
            let (w3, t3) = plan_workers(cores, None, Some(3));
            assert!(w3 * t3 <= cores.max(3), "{cores}: {w3} x {t3}");
        }
        assert_eq!(plan_workers(2, None, None), (1, 2));
        assert_eq!(plan_workers(16, None, None), (4, 4));
        assert_eq!(plan_workers(8, Some(3), Some(5)), (3, 5));
    }
}
