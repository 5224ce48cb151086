//! Live transcription over a WebSocket (`GET /v1/realtime`), speaking a subset of OpenAI's
//! Realtime transcription sessions so that their clients work unchanged. Two dialects, chosen by
//! what the client sent: a client that sends `OpenAI-Beta: realtime` (the beta clients do) gets
//! the beta's event names, any other the GA's (`session.created` with a `"transcription"`
//! session, `conversation.item.added` and `.done`); the events below are common to both.
//!
//! - client events: `transcription_session.update` / `session.update` (the audio format:
//!   `pcm16`, 24 kHz as OpenAI's, or `{"type": "audio/pcm", "rate": R}` for any rate the
//!   resampler takes; `turn_detection`, below), `input_audio_buffer.append` (base64 little-endian pcm16, mono),
//!   `input_audio_buffer.commit`, `input_audio_buffer.clear`;
//! - server events: `transcription_session.created` / `session.created` (on connect), `.updated`,
//!   `conversation.item.created` / `conversation.item.added` (an utterance's item, before its
//!   first transcript), `conversation.item.done` (GA, after the item's transcript),
//!   `input_audio_buffer.committed`, `input_audio_buffer.cleared`,
//!   `conversation.item.input_audio_transcription.delta` (the text added since the last delta,
//!   sent while the audio arrives: a cache-aware model's text only grows) and `.completed` (the
//!   utterance's transcript), `error` (OpenAI's shape; the connection stays usable).
//!
//! An utterance ends, and its item is committed and completed, when the client commits or when
//! the model ends it itself (an end-of-utterance token). With OpenAI's `turn_detection:
//! {"type": "server_vad", ...}` (the beta's field or the GA's `audio.input.turn_detection`) the
//! VAD ends it too: Silero VAD's `VADIterator` finds each turn (`input_audio_buffer.speech_started`
//! / `.speech_stopped`), whose audio alone is transcribed, then committed and completed. Each connection has its own
//! transcriber (made by the [`TranscriberFactory`]); the model behind it is shared. A connection
//! that sends no audio for longer than the idle timeout, whose audio passes the length limit, or
//! that sends a message over the size limit gets an `error` event and is closed; one that does
//! not read its events within the write timeout, or disconnects, has its state dropped at once.
//! On server shutdown each stream's audio so far is finished into a last `completed` item, and
//! the connection is closed with a close frame.

use crate::audio::decode::{MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
use crate::audio::resample::StreamResampler;
use crate::error::{Error, Result};
use crate::server::conn::{ConnSlot, Drain};
use crate::stream::StreamEvent;
use crate::stream::turns::{TurnEvent, TurnParams, Turns, under_a_frame};
use crate::vad::VadModel;
use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;
use base64::Engine;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

/// Makes the transcriber of one connection (a new stream with its own state over the shared
/// model), or says why the loaded model cannot stream.
pub type TranscriberFactory =
    Arc<dyn Fn() -> Result<Box<dyn crate::stream::LiveTranscriber + Send>> + Send + Sync>;

/// The WebSocket endpoint's limits.
#[derive(Clone, Debug)]
pub struct RealtimeConfig {
    /// The model's name, shown in the session object.
    pub model_name: String,
    /// A connection that sends no audio for this long is closed.
    pub idle_timeout: Duration,
    /// A connection whose client reads nothing of an event for this long is dropped.
    pub write_timeout: Duration,
    /// Seconds of audio one connection may send in all.
    pub max_seconds: f64,
    /// Connections streaming at once; more are refused with an `error` event.
    pub max_streams: usize,
    /// The server's shutdown signal; each connection holds a clone while it lives.
    pub drain: Drain,
}

/// OpenAI's rate for `pcm16`.
pub const OPENAI_PCM16_RATE: u32 = 24_000;

/// Largest event accepted (an append of 16 MiB is about 5.8 min of 24 kHz audio); a larger one
/// is answered with an `error` event and the connection is closed.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Largest WebSocket message read at all: up to it, an oversized event is read (and dropped)
/// so that the client, still sending, gets the `error` event instead of a reset.
const MAX_FRAME_BYTES: usize = 4 * MAX_MESSAGE_BYTES;

/// Events waiting to be written to a client that does not read them (bytes); beyond it the
/// connection fails instead of buffering.
const MAX_WRITE_BUFFER: usize = 1 << 20;

struct Live {
    config: RealtimeConfig,
    factory: TranscriberFactory,
    streams: AtomicUsize,
    next_session: AtomicU64,
}

/// The router serving `GET /v1/realtime` (a WebSocket upgrade).
pub fn router(config: RealtimeConfig, factory: TranscriberFactory) -> Router {
    let live = Arc::new(Live {
        config,
        factory,
        streams: AtomicUsize::new(0),
        next_session: AtomicU64::new(0),
    });
    Router::new()
        .route("/v1/realtime", get(upgrade))
        .with_state(live)
}

/// The event names a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    /// The generally available API.
    Ga,
    /// The beta (`OpenAI-Beta: realtime=v1`), whose clients expect `transcription_session.*`.
    Beta,
}

async fn upgrade(
    State(live): State<Arc<Live>>,
    slot: Option<Extension<ConnSlot>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let beta = headers
        .get_all("openai-beta")
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("realtime")))
        || offers_subprotocol(&headers, BETA_SUBPROTOCOL);
    let dialect = if beta { Dialect::Beta } else { Dialect::Ga };
    // A browser's socket names its key (and the beta) in subprotocols and fails unless the
    // server picks one of those it offered: `realtime`, as OpenAI's does.
    ws.protocols([crate::server::auth::REALTIME_SUBPROTOCOL])
        .max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .max_write_buffer_size(MAX_WRITE_BUFFER)
        .on_upgrade(move |socket| async move {
            // The stream keeps its connection's place under --max-connections until it ends.
            let _slot = slot;
            let id = live.next_session.fetch_add(1, Ordering::Relaxed) + 1;
            let mut conn = Connection::new(live.clone(), socket, id, dialect);
            let reason = conn.run().await;
            eprintln!(
                "realtime #{id}: closed ({reason}), {:.2} s of audio",
                conn.received as f64 / f64::from(conn.rate)
            );
        })
}

/// The subprotocol a browser's socket names the beta dialect with (its `OpenAI-Beta` header).
const BETA_SUBPROTOCOL: &str = "openai-beta.realtime-v1";

/// Whether the handshake offers the subprotocol `name`.
fn offers_subprotocol(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == name)
}

/// Counts a connection among the live streams while it is held.
struct Slot(Arc<Live>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The item the current utterance is transcribed into, and the text already sent as deltas.
struct Item {
    id: String,
    sent: String,
    /// Its `conversation.item.added` was sent (a turn names its item before any text).
    announced: bool,
}

/// A conversation item of the user's audio, in OpenAI's shape (`transcript` once known).
fn audio_item(id: &str, status: &str, transcript: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": status,
        "content": [{"type": "input_audio", "transcript": transcript}],
    })
}

struct Connection {
    live: Arc<Live>,
    socket: WebSocket,
    /// The server's shutdown signal (and, held, the server waits for this connection).
    drain: Drain,
    session_id: String,
    /// `None` while it computes on a blocking thread (or after it failed).
    transcriber: Option<Turns>,
    /// Samples fed to the transcriber in all (at its rate), and where its current stream
    /// began among them: the VAD's boundaries count from there.
    fed: u64,
    stream_origin: u64,
    resampler: Option<StreamResampler>,
    /// The client's sample rate.
    rate: u32,
    /// Samples received in all (at the client's rate), for the length limit.
    received: u64,
    /// Samples appended since the last commit or clear.
    buffered: u64,
    /// Samples appended since the last completed item (its usage).
    item_samples: u64,
    dialect: Dialect,
    item: Option<Item>,
    previous_item: Option<String>,
    next_event: u64,
    next_item: u64,
}

/// Why a connection ends; its `error` event was sent already, if it gets one.
type Closed = &'static str;

impl Connection {
    fn new(live: Arc<Live>, socket: WebSocket, id: u64, dialect: Dialect) -> Self {
        Self {
            drain: live.config.drain.clone(),
            live,
            socket,
            session_id: format!("sess_{id}"),
            transcriber: None,
            fed: 0,
            stream_origin: 0,
            resampler: None,
            rate: OPENAI_PCM16_RATE,
            received: 0,
            buffered: 0,
            item_samples: 0,
            dialect,
            item: None,
            previous_item: None,
            next_event: 0,
            next_item: 0,
        }
    }

    async fn run(&mut self) -> Closed {
        let live = self.live.clone();
        let limit = live.config.max_streams;
        if live
            .streams
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_err()
        {
            let msg = format!("the server is busy: {limit} streams are live (--max-streams)");
            return self.refuse("server_busy", &msg).await;
        }
        let _slot = Slot(live.clone());
        if self.drain.is_stopped() {
            return self
                .refuse("server_shutting_down", "the server is shutting down")
                .await;
        }
        let factory = live.factory.clone();
        match tokio::task::spawn_blocking(move || factory()).await {
            Ok(Ok(t)) => self.transcriber = Some(Turns::Manual(t)),
            Ok(Err(e)) => return self.refuse("model_not_streaming", &format!("{e:#}")).await,
            Err(_) => return self.refuse("internal_error", "cannot start a stream").await,
        }
        if let Err(closed) = self.set_rate(OPENAI_PCM16_RATE) {
            return closed;
        }
        let created = match self.dialect {
            Dialect::Ga => "session.created",
            Dialect::Beta => "transcription_session.created",
        };
        let created = json!({"type": created, "session": self.session()});
        if self.send(created).await.is_err() {
            return "client gone";
        }
        // Idle is measured on audio: pings and other events do not keep a stream alive.
        let mut idle_since = Instant::now();
        // Wall time is bounded too, so that a trickle of audio cannot hold a stream's place.
        let expires = Instant::now() + Duration::from_secs_f64(live.config.max_seconds);
        loop {
            let received = self.received;
            let message = tokio::select! {
                m = self.socket.recv() => m,
                () = tokio::time::sleep_until(expires) => {
                    let msg = format!(
                        "the stream has been open for {} s, the most this server allows (--max-stream-seconds): reconnect to go on",
                        live.config.max_seconds
                    );
                    return self.refuse("session_expired", &msg).await;
                }
                () = tokio::time::sleep_until(idle_since + live.config.idle_timeout) => {
                    let msg = format!(
                        "no audio for {} s: the connection is closed (--stream-idle-seconds)",
                        live.config.idle_timeout.as_secs_f64()
                    );
                    return self.refuse("idle_timeout", &msg).await;
                }
                () = self.drain.stopped() => return self.shut_down().await,
            };
            let message = match message {
                None => return "client gone",
                Some(Err(e)) => {
                    // A message over even the read limit: say so if the client still listens.
                    let e = e.to_string();
                    if e.contains("too long") || e.contains("too big") {
                        return self.too_large(None).await;
                    }
                    return "client gone";
                }
                Some(Ok(m)) => m,
            };
            let outcome = match message {
                Message::Text(text) if text.len() > MAX_MESSAGE_BYTES => {
                    return self.too_large(Some(text.len())).await;
                }
                Message::Text(text) => self.handle(text.as_str()).await,
                Message::Binary(_) => {
                    self.error(
                        "invalid_event",
                        "binary messages are not events: send JSON text (audio goes base64 in input_audio_buffer.append)",
                        None,
                    )
                    .await
                }
                Message::Close(_) => return "client closed",
                Message::Ping(_) | Message::Pong(_) => Ok(()),
            };
            if let Err(closed) = outcome {
                return closed;
            }
            if self.received != received {
                idle_since = Instant::now();
            }
        }
    }

    /// Refuses a message over the size limit (`bytes`, if it was read at all) and closes.
    async fn too_large(&mut self, bytes: Option<usize>) -> Closed {
        let size = bytes.map_or_else(
            || format!("over {} MiB", MAX_FRAME_BYTES >> 20),
            |b| format!("{b} bytes"),
        );
        let msg = format!(
            "the message ({size}) is larger than this server's limit of {} MiB per event: send audio in smaller appends",
            MAX_MESSAGE_BYTES >> 20
        );
        self.refuse("message_too_large", &msg).await
    }

    /// The server is shutting down: the audio received so far is finished into a last
    /// completed item, then the connection is closed as going away.
    async fn shut_down(&mut self) -> Closed {
        if self.buffered > 0 && self.transcriber.is_some() {
            let events = match self.end_stream().await {
                Ok((events, _)) => events,
                Err(closed) => return closed,
            };
            match self.forward(events).await {
                Ok(0) => {
                    if let Err(closed) = self.complete_open().await {
                        return closed;
                    }
                }
                Ok(_) => {}
                Err(closed) => return closed,
            }
        }
        self.close(axum::extract::ws::close_code::AWAY, "server shutting down")
            .await;
        "server shutting down"
    }

    /// Sends a close frame (within the write timeout).
    async fn close(&mut self, code: u16, reason: &str) {
        let frame = Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }));
        let _ = tokio::time::timeout(self.live.config.write_timeout, self.socket.send(frame)).await;
    }

    /// Sends an `error` event and closes the connection.
    async fn refuse(&mut self, code: &str, message: &str) -> Closed {
        if self.error(code, message, None).await.is_ok() {
            self.close(axum::extract::ws::close_code::POLICY, code)
                .await;
        }
        "refused"
    }

    async fn handle(&mut self, text: &str) -> Result<(), Closed> {
        let event: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            // serde_json stops at 128 levels, which no event of the API comes near.
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
                return self
                    .error(
                        "invalid_json",
                        "the message is nested too deeply (more than 128 levels of arrays and objects)",
                        None,
                    )
                    .await;
            }
            _ => {
                return self
                    .error("invalid_json", "the message is not a JSON object", None)
                    .await;
            }
        };
        let client_id = event
            .get("event_id")
            .and_then(Value::as_str)
            .map(String::from);
        let client_id = client_id.as_deref();
        match event.get("type").and_then(Value::as_str).unwrap_or("") {
            kind @ ("transcription_session.update" | "session.update") => {
                self.update(&event, kind, client_id).await
            }
            "input_audio_buffer.append" => self.append(&event, client_id).await,
            "input_audio_buffer.commit" => self.commit(client_id).await,
            "input_audio_buffer.clear" => self.clear().await,
            "" => {
                self.error("invalid_event", "the event has no `type`", client_id)
                    .await
            }
            other => {
                let other: String = other.chars().take(64).collect();
                let msg = format!(
                    "unsupported event type {other:?}: this server takes transcription_session.update, session.update and input_audio_buffer.append / commit / clear"
                );
                self.error("unknown_event", &msg, client_id).await
            }
        }
    }

    async fn update(
        &mut self,
        event: &Value,
        kind: &str,
        client_id: Option<&str>,
    ) -> Result<(), Closed> {
        // A beta event names the beta's dialect, whatever the connection started with.
        if kind == "transcription_session.update" {
            self.dialect = Dialect::Beta;
        }
        let session = event.get("session").unwrap_or(&Value::Null);
        let turns = match turn_detection(session) {
            Ok(turns) => turns.filter(|&t| t != self.turn_params()),
            Err((param, msg)) => {
                return self
                    .error_event("invalid_value", &msg, Some(&param), client_id)
                    .await;
            }
        };
        let busy = match self.turn_params() {
            None => self.buffered > 0,
            Some(_) => self.transcriber.as_ref().is_some_and(Turns::in_turn),
        };
        if turns.is_some() && busy {
            return self
                .error(
                    "invalid_session_update",
                    "turn detection cannot change while the buffer holds audio or speech is under way: commit or clear it first",
                    client_id,
                )
                .await;
        }
        // The beta shape names the format, the GA shape nests it with its rate.
        let beta = session.get("input_audio_format");
        let ga = session.pointer("/audio/input/format");
        if let (Some(b), Some(g)) = (beta, ga) {
            let ga_rate = g.get("rate").and_then(Value::as_u64);
            let agree = b == "pcm16"
                && g.get("type").and_then(Value::as_str) == Some("audio/pcm")
                && ga_rate.is_none_or(|r| r == u64::from(OPENAI_PCM16_RATE));
            if !agree {
                let msg = format!(
                    "conflicting audio formats: input_audio_format {b} and audio.input.format {g}; send one of them"
                );
                return self.error("invalid_session_update", &msg, client_id).await;
            }
        }
        let rate = match (beta, ga) {
            (Some(Value::String(f)), _) if f == "pcm16" => Some(OPENAI_PCM16_RATE),
            (_, Some(format))
                if format.get("type").and_then(Value::as_str) == Some("audio/pcm") =>
            {
                match format.get("rate") {
                    None => Some(OPENAI_PCM16_RATE),
                    Some(r) => match r.as_u64().and_then(|r| u32::try_from(r).ok()) {
                        Some(r) if (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&r) => Some(r),
                        _ => {
                            let msg = format!(
                                "audio rate {r} is not a sample rate in {MIN_SAMPLE_RATE}..={MAX_SAMPLE_RATE} Hz"
                            );
                            return self
                                .error("unsupported_audio_format", &msg, client_id)
                                .await;
                        }
                    },
                }
            }
            (None, None) => None,
            (b, g) => {
                let msg = format!(
                    "unsupported audio format {}: this server takes pcm16 (mono, little-endian)",
                    b.or(g).map_or_else(String::new, Value::to_string)
                );
                return self
                    .error("unsupported_audio_format", &msg, client_id)
                    .await;
            }
        };
        if let Some(rate) = rate
            && rate != self.rate
        {
            if self.buffered > 0 {
                return self
                    .error(
                        "invalid_session_update",
                        "the audio format cannot change while the buffer holds audio: commit or clear it first",
                        client_id,
                    )
                    .await;
            }
            self.set_rate(rate)?;
        }
        if let Some(params) = turns {
            let t = self.transcriber.take().ok_or("no transcriber")?;
            match t.with_params(params, builtin_vad) {
                Ok(t) => self.transcriber = Some(t),
                Err(e) => return Err(self.refuse("internal_error", &format!("{e:#}")).await),
            }
            self.stream_origin = self.fed;
        }
        let updated = kind.replace(".update", ".updated");
        self.send(json!({"type": updated, "session": self.session()}))
            .await
    }

    async fn append(&mut self, event: &Value, client_id: Option<&str>) -> Result<(), Closed> {
        let Some(b64) = event.get("audio").and_then(Value::as_str) else {
            return self
                .error(
                    "invalid_audio",
                    "input_audio_buffer.append needs `audio`, base64 pcm16",
                    client_id,
                )
                .await;
        };
        let bytes = match base64::engine::general_purpose::STANDARD.decode(b64) {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("`audio` is not base64: {e}");
                return self.error("invalid_audio", &msg, client_id).await;
            }
        };
        if bytes.len() % 2 != 0 {
            return self
                .error(
                    "invalid_audio",
                    "`audio` is not whole pcm16 samples (an odd number of bytes)",
                    client_id,
                )
                .await;
        }
        let samples: Vec<f32> = bytes
            .chunks_exact(2)
            .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0)
            .collect();
        let limit = (self.live.config.max_seconds * f64::from(self.rate)) as u64;
        if self.received + samples.len() as u64 > limit {
            let msg = format!(
                "the stream is longer than this server's limit of {} s of audio (--max-stream-seconds)",
                self.live.config.max_seconds
            );
            return Err(self.refuse("audio_too_long", &msg).await);
        }
        self.received += samples.len() as u64;
        self.buffered += samples.len() as u64;
        self.item_samples += samples.len() as u64;
        let mut resampled = Vec::new();
        self.resampler()
            .push(&samples, &mut resampled)
            .map_err(|_| "resampler failed")?;
        self.fed += resampled.len() as u64;
        let events = self.compute(move |t| t.accept(&resampled)).await?;
        self.forward(events).await.map(|_| ())
    }

    async fn commit(&mut self, client_id: Option<&str>) -> Result<(), Closed> {
        if self.buffered == 0 {
            return self
                .error(
                    "input_audio_buffer_commit_empty",
                    "the input audio buffer is empty: append audio before committing",
                    client_id,
                )
                .await;
        }
        let (events, short) = self.end_stream().await?;
        if short {
            // The transcriber refused the stream as `transcribe` refuses such a file; the
            // audio is dropped and the connection stays usable.
            return self
                .error(
                    "input_audio_buffer_commit_empty",
                    "the input audio buffer holds less than one 10 ms feature frame: audio too \
                     short, nothing to transcribe",
                    client_id,
                )
                .await;
        }
        // The commit is answered by an item even when the model heard no words in it.
        if self.forward(events).await? == 0 {
            self.complete_open().await?;
        }
        Ok(())
    }

    async fn clear(&mut self) -> Result<(), Closed> {
        // What the buffer held is dropped unheard, the utterance with it.
        self.end_stream().await?;
        self.item = None;
        self.item_samples = 0;
        self.send(json!({"type": "input_audio_buffer.cleared"}))
            .await
    }

    /// Flushes the resampler and finishes the transcriber's stream (the next audio starts a
    /// new one); returns the events that came of it, and whether the stream was refused as
    /// shorter than one feature frame (turns ended by hand: the stream is the buffer's audio).
    async fn end_stream(&mut self) -> Result<(Vec<TurnEvent>, bool), Closed> {
        self.buffered = 0;
        let mut rest = Vec::new();
        self.resampler()
            .finish(&mut rest)
            .map_err(|_| "resampler failed")?;
        self.fed += rest.len() as u64;
        let samples = (self.fed - self.stream_origin) as usize;
        let short = self.turn_params().is_none()
            && samples > 0
            && self
                .transcriber
                .as_ref()
                .is_some_and(|t| under_a_frame(samples, t.sample_rate()));
        let events = self
            .compute(move |t| {
                let mut events = t.accept(&rest)?;
                match t.finish() {
                    Err(_) if short => {}
                    r => events.extend(r?),
                }
                Ok(events)
            })
            .await?;
        self.stream_origin = self.fed;
        Ok((events, short))
    }

    /// Runs `work` on the transcriber on a blocking thread (the model's compute must not hold
    /// the async runtime's threads); the VAD's boundaries come back counted from the start of
    /// the session. A failure is reported and closes the connection.
    async fn compute<F>(&mut self, work: F) -> Result<Vec<TurnEvent>, Closed>
    where
        F: FnOnce(&mut Turns) -> Result<Vec<TurnEvent>> + Send + 'static,
    {
        let Some(mut t) = self.transcriber.take() else {
            return Err("no transcriber");
        };
        let joined = tokio::task::spawn_blocking(move || {
            let result = work(&mut t);
            (t, result)
        })
        .await;
        let origin = self.stream_origin as usize;
        match joined {
            Ok((t, Ok(events))) => {
                self.transcriber = Some(t);
                Ok(events
                    .into_iter()
                    .map(|e| match e {
                        TurnEvent::SpeechStarted(at) => TurnEvent::SpeechStarted(origin + at),
                        TurnEvent::SpeechStopped(at) => TurnEvent::SpeechStopped(origin + at),
                        e => e,
                    })
                    .collect())
            }
            Ok((_, Err(e))) => Err(self.refuse("transcription_failed", &format!("{e:#}")).await),
            Err(_) => Err(self
                .refuse("internal_error", "the transcriber panicked")
                .await),
        }
    }

    /// Turns the transcriber's events into deltas and completed items, and the VAD's
    /// boundaries into `speech_started` / `speech_stopped`; returns how many items were
    /// completed.
    async fn forward(&mut self, events: Vec<TurnEvent>) -> Result<usize, Closed> {
        let mut completed = 0;
        // A turn the VAD ended is committed even when the model heard no words in it.
        let mut stopped = false;
        for event in events {
            match event {
                TurnEvent::SpeechStarted(at) => {
                    if std::mem::take(&mut stopped) {
                        self.complete_open().await?;
                        completed += 1;
                    }
                    self.speech("started", "audio_start_ms", at).await?;
                }
                TurnEvent::SpeechStopped(at) => {
                    self.speech("stopped", "audio_end_ms", at).await?;
                    // The turn's audio is committed: what follows is a new buffer.
                    self.buffered = 0;
                    stopped = true;
                }
                TurnEvent::Transcript(event) => {
                    let (StreamEvent::Partial(u) | StreamEvent::Final(u)) = &event;
                    self.delta(&u.text).await?;
                    if let StreamEvent::Final(u) = event {
                        self.complete(u.text).await?;
                        completed += 1;
                        stopped = false;
                    }
                }
            }
        }
        if stopped {
            self.complete_open().await?;
            completed += 1;
        }
        Ok(completed)
    }

    /// `input_audio_buffer.speech_<what>` at sample `at`, naming the item the turn goes to.
    async fn speech(&mut self, what: &str, field: &str, at: usize) -> Result<(), Closed> {
        let item = self.item_mut().id.clone();
        let mut event =
            json!({"type": format!("input_audio_buffer.speech_{what}"), "item_id": item});
        event[field] = json!(self.stream_ms(at));
        self.send(event).await
    }

    /// Completes the current item with the text sent of it so far (none: empty).
    async fn complete_open(&mut self) -> Result<(), Closed> {
        let text = self
            .item
            .as_ref()
            .map_or_else(String::new, |i| i.sent.clone());
        self.complete(text).await
    }

    /// Milliseconds from the start of the session to sample `at` of the transcriber's audio.
    fn stream_ms(&self, at: usize) -> u64 {
        let rate = self.transcriber.as_ref().map_or(16_000, Turns::sample_rate);
        (at as u64 * 1000) / u64::from(rate)
    }

    /// The session's turn detection (`None`: by commits).
    fn turn_params(&self) -> Option<TurnParams> {
        self.transcriber.as_ref().and_then(Turns::params)
    }

    /// Sends what `text` (the utterance so far) adds to the text already sent.
    async fn delta(&mut self, text: &str) -> Result<(), Closed> {
        self.open_item().await?;
        let item = self.item_mut();
        let Some(added) = text.strip_prefix(item.sent.as_str()) else {
            return Ok(()); // not an extension: the completed transcript carries it
        };
        if added.is_empty() {
            return Ok(());
        }
        let event = json!({
            "type": "conversation.item.input_audio_transcription.delta",
            "item_id": item.id,
            "content_index": 0,
            "delta": added,
        });
        item.sent = text.to_string();
        self.send(event).await
    }

    /// Announces the current item if it is new (before any of its transcript).
    async fn open_item(&mut self) -> Result<(), Closed> {
        if self.item.as_ref().is_some_and(|i| i.announced) {
            return Ok(());
        }
        let item = self.item_mut();
        item.announced = true;
        let id = item.id.clone();
        let kind = match self.dialect {
            Dialect::Ga => "conversation.item.added",
            Dialect::Beta => "conversation.item.created",
        };
        self.send(json!({
            "type": kind,
            "previous_item_id": self.previous_item,
            "item": audio_item(&id, "in_progress", None),
        }))
        .await
    }

    /// Commits the current item and completes it with `transcript`.
    async fn complete(&mut self, transcript: String) -> Result<(), Closed> {
        self.open_item().await?;
        let id = self.item_mut().id.clone();
        self.item = None;
        let previous = self.previous_item.replace(id.clone());
        let seconds = self.item_samples as f64 / f64::from(self.rate);
        self.item_samples = 0;
        self.send(json!({
            "type": "input_audio_buffer.committed",
            "previous_item_id": previous,
            "item_id": id,
        }))
        .await?;
        self.send(json!({
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": id,
            "content_index": 0,
            "transcript": transcript,
            // The audio since the previous item (an utterance the model ended itself has no
            // exact boundary in the client's audio).
            "usage": {"type": "duration", "seconds": (seconds * 1000.0).round() / 1000.0},
        }))
        .await?;
        if self.dialect == Dialect::Ga {
            self.send(json!({
                "type": "conversation.item.done",
                "previous_item_id": previous,
                "item": audio_item(&id, "completed", Some(&transcript)),
            }))
            .await?;
        }
        Ok(())
    }

    fn item_mut(&mut self) -> &mut Item {
        let next = &mut self.next_item;
        self.item.get_or_insert_with(|| {
            *next += 1;
            Item {
                id: format!("item_{next}"),
                sent: String::new(),
                announced: false,
            }
        })
    }

    fn set_rate(&mut self, rate: u32) -> Result<(), Closed> {
        let to = self.transcriber.as_ref().map_or(rate, |t| t.sample_rate());
        self.resampler = Some(StreamResampler::new(rate, to).map_err(|_| "resampler failed")?);
        self.rate = rate;
        Ok(())
    }

    fn resampler(&mut self) -> &mut StreamResampler {
        self.resampler
            .get_or_insert_with(|| StreamResampler::new(16_000, 16_000).expect("equal rates"))
    }

    fn session(&self) -> Value {
        // The GA's fields and the beta's side by side: each dialect's clients read theirs.
        let model = &self.live.config.model_name;
        json!({
            "id": self.session_id,
            "object": "realtime.transcription_session",
            "type": "transcription",
            "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": self.rate},
                "transcription": {"model": model},
                "turn_detection": turn_json(self.turn_params()),
            }},
            "input_audio_format": "pcm16",
            "turn_detection": turn_json(self.turn_params()),
            // The beta's session model requires an ephemeral key; this server issues none.
            "client_secret": {"value": "", "expires_at": 0},
        })
    }

    /// An `error` event in OpenAI's shape; the connection stays open.
    async fn error(
        &mut self,
        code: &str,
        message: &str,
        client_id: Option<&str>,
    ) -> Result<(), Closed> {
        self.error_event(code, message, None, client_id).await
    }

    /// An `error` event; `param` names the field at fault.
    async fn error_event(
        &mut self,
        code: &str,
        message: &str,
        param: Option<&str>,
        client_id: Option<&str>,
    ) -> Result<(), Closed> {
        self.send(json!({
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "code": code,
                "message": message,
                "param": param,
                "event_id": client_id,
            },
        }))
        .await
    }

    /// Sends a server event, numbering it.
    async fn send(&mut self, mut event: Value) -> Result<(), Closed> {
        self.next_event += 1;
        event["event_id"] = Value::String(format!("event_{}", self.next_event));
        // A client that reads nothing would hold this send (and the stream's slot) forever.
        let message = Message::Text(event.to_string().into());
        match tokio::time::timeout(self.live.config.write_timeout, self.socket.send(message)).await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("client gone"),
            Err(_) => Err("client not reading"),
        }
    }
}

/// The built-in Silero VAD, parsed once for every session that detects turns.
fn builtin_vad() -> Result<Arc<VadModel>> {
    static MODEL: OnceLock<Arc<VadModel>> = OnceLock::new();
    if let Some(m) = MODEL.get() {
        return Ok(m.clone());
    }
    let m = VadModel::builtin()?;
    Ok(MODEL.get_or_init(|| m).clone())
}

/// OpenAI's server VAD defaults: threshold 0.5, 300 ms of audio kept before the speech, 500 ms
/// of silence to end it.
const SERVER_VAD: TurnParams = TurnParams {
    threshold: 0.5,
    min_silence_ms: 500.0,
    speech_pad_ms: 300.0,
};

/// A session update's `turn_detection` (the beta's field or the GA's
/// `audio.input.turn_detection`): `None` when it has none, `Some(None)` for `null` (turns end
/// at commits), `Some(Some(params))` for `server_vad` (Silero VAD's `VADIterator`, its speech
/// padding `prefix_padding_ms`, its minimum silence `silence_duration_ms`). A bad value is
/// `(param, message)`.
fn turn_detection(session: &Value) -> Result<Option<Option<TurnParams>>, (String, String)> {
    let beta = session.get("turn_detection");
    let ga = session.pointer("/audio/input/turn_detection");
    let (value, at) = match (beta, ga) {
        (Some(b), Some(g)) if b != g => {
            let msg = format!(
                "conflicting turn detection: turn_detection {b} and audio.input.turn_detection {g}; send one of them"
            );
            return Err(("session.turn_detection".into(), msg));
        }
        (Some(v), _) => (v, "session.turn_detection"),
        (None, Some(v)) => (v, "session.audio.input.turn_detection"),
        (None, None) => return Ok(None),
    };
    let fields = match value {
        Value::Null => return Ok(Some(None)),
        Value::Object(fields) => fields,
        other => {
            let msg = format!("turn_detection {other}: expected an object or null");
            return Err((at.into(), msg));
        }
    };
    match fields.get("type").map(|t| t.as_str()) {
        None | Some(Some("server_vad")) => {}
        Some(t) => {
            let t = t.map_or_else(|| fields["type"].to_string(), |t| format!("{t:?}"));
            let msg = format!(
                "turn_detection type {t} is not supported: this server detects turns with \"server_vad\" (Silero VAD), or none (null: turns end at commits)"
            );
            return Err((format!("{at}.type"), msg));
        }
    }
    let mut p = SERVER_VAD;
    for (name, slot) in [
        ("threshold", &mut p.threshold),
        ("prefix_padding_ms", &mut p.speech_pad_ms),
        ("silence_duration_ms", &mut p.min_silence_ms),
    ] {
        match fields.get(name) {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_f64() {
                Some(x) => *slot = x,
                None => {
                    let msg = format!("turn_detection.{name} {v}: expected a number");
                    return Err((format!("{at}.{name}"), msg));
                }
            },
        }
    }
    let names = ["threshold", "silence_duration_ms", "prefix_padding_ms"];
    if let Err(e) = p.validate(names) {
        let name = names
            .into_iter()
            .find(|n| e.to_string().starts_with(n))
            .unwrap_or("threshold");
        return Err((format!("{at}.{name}"), format!("turn_detection.{e:#}")));
    }
    Ok(Some(Some(p)))
}

/// A session's `turn_detection` as OpenAI shows it.
fn turn_json(params: Option<TurnParams>) -> Value {
    // Whole milliseconds as integers, as OpenAI's are.
    let ms = |x: f64| {
        if x.fract() == 0.0 && x < 1e15 {
            json!(x as u64)
        } else {
            json!(x)
        }
    };
    match params {
        None => Value::Null,
        Some(p) => json!({
            "type": "server_vad",
            "threshold": p.threshold,
            "prefix_padding_ms": ms(p.speech_pad_ms),
            "silence_duration_ms": ms(p.min_silence_ms),
        }),
    }
}

/// A stream's failure as a remote client may read it: every server path in it (`paths`: the
/// model file and what the operator named it by) replaced by the model's public `name`.
pub fn for_clients(e: Error, paths: &[&str], name: &str) -> Error {
    e.map_message(|m| {
        let mut m = m;
        // Longest first, so that a path inside another is not half replaced.
        let mut paths: Vec<&str> = paths.iter().copied().filter(|p| !p.is_empty()).collect();
        paths.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in paths {
            m = m.replace(p, name);
        }
        m
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_no_server_path() {
        let e = Error::Options(
            "/srv/models/tiny.nemo is an offline model, not a cache-aware one; \
             /var/cache/parakeet/tiny-0123.gguf"
                .into(),
        );
        let e = for_clients(
            e,
            &[
                "/srv/models/tiny.nemo",
                "/var/cache/parakeet/tiny-0123.gguf",
            ],
            "tiny",
        );
        assert!(matches!(&e, Error::Options(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "tiny is an offline model, not a cache-aware one; tiny"
        );
    }
}
