//! The WebSocket endpoint (`/v1/realtime`) with a real client (tungstenite) against the server
//! on an ephemeral port, the counting test double as each connection's transcriber.

use crate::live_double::CountingTranscriber;
use base64::Engine;
use parakeet::server::conn::Drain;
use parakeet::server::realtime::{RealtimeConfig, TranscriberFactory, router};
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

type Client = WebSocket<MaybeTlsStream<TcpStream>>;

fn config() -> RealtimeConfig {
    RealtimeConfig {
        model_name: "counting-double".into(),
        idle_timeout: Duration::from_secs(20),
        write_timeout: Duration::from_secs(20),
        max_seconds: 60.0,
        max_streams: 8,
        drain: Drain::new().1,
    }
}

/// Serves the endpoint on 127.0.0.1 (any free port) on a thread of its own.
pub(crate) fn start(config: RealtimeConfig, factory: TranscriberFactory) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, router(config, factory))
                .await
                .unwrap();
        });
    });
    addr
}

/// Asks for 16 kHz pcm and appends the 10 s clip in 0.2 s pieces.
pub(crate) fn send_clip(ws: &mut Client) {
    send(
        ws,
        json!({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}),
    );
    for piece in crate::live_nemo::clip_s16le().chunks(6400) {
        let audio = base64::engine::general_purpose::STANDARD.encode(piece);
        send(
            ws,
            json!({"type": "input_audio_buffer.append", "audio": audio}),
        );
    }
}

/// Streams the 10 s clip (s16le at 16 kHz, in 0.2 s appends) through a real model's factory
/// and commits: the concatenated deltas and the completed transcript.
pub(crate) fn transcribe_clip(model_name: &str, factory: TranscriberFactory) -> (String, String) {
    transcribe_clip_at(start_real(model_name, factory))
}

/// A realtime endpoint over a real model's factory (timeouts for a debug build).
pub(crate) fn start_real(model_name: &str, factory: TranscriberFactory) -> SocketAddr {
    let config = RealtimeConfig {
        model_name: model_name.into(),
        idle_timeout: Duration::from_secs(20),
        write_timeout: Duration::from_secs(20),
        max_seconds: 60.0,
        max_streams: 2,
        drain: Drain::new().1,
    };
    start(config, factory)
}

/// [`transcribe_clip`] through the realtime endpoint of a server at `addr`.
pub(crate) fn transcribe_clip_at(addr: SocketAddr) -> (String, String) {
    let mut ws = connect(addr);
    if let MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    commit_clip(&mut ws)
}

/// Appends the 10 s clip and commits it: the concatenated deltas and the completed transcript.
pub(crate) fn commit_clip(ws: &mut Client) -> (String, String) {
    send_clip(ws);
    send(ws, json!({"type": "input_audio_buffer.commit"}));
    let mut deltas = String::new();
    loop {
        let Ok(Message::Text(t)) = ws.read() else {
            continue;
        };
        let event: Value = serde_json::from_str(t.as_str()).unwrap();
        match event["type"].as_str().unwrap() {
            "conversation.item.input_audio_transcription.delta" => {
                deltas.push_str(event["delta"].as_str().unwrap())
            }
            "conversation.item.input_audio_transcription.completed" => {
                return (deltas, event["transcript"].as_str().unwrap().to_owned());
            }
            "error" => panic!("{event}"),
            _ => {}
        }
    }
}

/// A factory of doubles with a word every 1600 samples (0.1 s at 16 kHz).
fn doubles(eou_after: Option<usize>, alive: &Arc<AtomicUsize>) -> TranscriberFactory {
    let alive = alive.clone();
    Arc::new(move || Ok(Box::new(CountingTranscriber::new(1600, eou_after).counted(&alive)) as _))
}

pub(crate) fn connect(addr: SocketAddr) -> Client {
    let (mut ws, _) = tungstenite::connect(format!("ws://{addr}/v1/realtime")).unwrap();
    if let MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    ws
}

pub(crate) fn send(ws: &mut Client, event: Value) {
    ws.send(Message::Text(event.to_string().into())).unwrap();
}

/// The next server event (control frames skipped); `None` when the server closed.
fn next(ws: &mut Client) -> Option<Value> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return Some(serde_json::from_str(t.as_str()).unwrap()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Reads events up to and including one of type `last`, dropping their `event_id`s.
pub(crate) fn until(ws: &mut Client, last: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    while let Some(mut e) = next(ws) {
        assert!(e["event_id"].as_str().unwrap().starts_with("event_"));
        e.as_object_mut().unwrap().remove("event_id");
        let done = e["type"] == last;
        seen.push(e);
        if done {
            return seen;
        }
    }
    panic!("the server closed before {last}: {seen:?}");
}

pub(crate) fn append(ws: &mut Client, samples: usize) {
    let pcm: Vec<u8> = (0..samples)
        .flat_map(|i| ((i % 200) as i16).to_le_bytes())
        .collect();
    let audio = base64::engine::general_purpose::STANDARD.encode(pcm);
    send(
        ws,
        json!({"type": "input_audio_buffer.append", "audio": audio}),
    );
}

/// A client of the beta API (its header chooses the beta's event names).
fn connect_beta(addr: SocketAddr) -> Client {
    use tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{addr}/v1/realtime")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("OpenAI-Beta", "realtime=v1".parse().unwrap());
    let (mut ws, _) = tungstenite::connect(request).unwrap();
    if let MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    ws
}

pub(crate) fn at_16k(ws: &mut Client) {
    let created = until(ws, "session.created");
    assert_eq!(created[0]["session"]["type"], "transcription");
    assert_eq!(
        created[0]["session"]["audio"]["input"]["format"]["rate"],
        24_000
    );
    send(
        ws,
        json!({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}),
    );
    let updated = until(ws, "session.updated");
    assert_eq!(
        updated[0]["session"]["audio"]["input"]["format"]["rate"],
        16_000
    );
}

fn delta(item: &str, text: &str) -> Value {
    json!({"type": "conversation.item.input_audio_transcription.delta", "item_id": item, "content_index": 0, "delta": text})
}

fn committed(item: &str, previous: Option<&str>) -> Value {
    json!({"type": "input_audio_buffer.committed", "item_id": item, "previous_item_id": previous})
}

/// The completed transcript of an item of `samples` at 16 kHz.
fn completed(item: &str, text: &str, samples: u32) -> Value {
    json!({"type": "conversation.item.input_audio_transcription.completed", "item_id": item, "content_index": 0, "transcript": text,
        "usage": {"type": "duration", "seconds": f64::from(samples) / 16000.0}})
}

/// The announcement of an item (GA: `added`, beta: `created`).
fn added(kind: &str, item: &str, previous: Option<&str>) -> Value {
    json!({"type": kind, "previous_item_id": previous, "item": {"id": item, "object": "realtime.item", "type": "message", "role": "user", "status": "in_progress", "content": [{"type": "input_audio", "transcript": null}]}})
}

/// The GA's last event of an item.
fn done(item: &str, previous: Option<&str>, text: &str) -> Value {
    json!({"type": "conversation.item.done", "previous_item_id": previous, "item": {"id": item, "object": "realtime.item", "type": "message", "role": "user", "status": "completed", "content": [{"type": "input_audio", "transcript": text}]}})
}

#[test]
fn appended_audio_streams_deltas_and_a_commit_completes_the_item() {
    let alive = Arc::new(AtomicUsize::new(0));
    let addr = start(config(), doubles(None, &alive));
    let mut ws = connect(addr);
    at_16k(&mut ws);
    for piece in [1000, 2000, 1800] {
        append(&mut ws, piece);
    }
    send(&mut ws, json!({"type": "input_audio_buffer.commit"}));
    assert_eq!(
        until(
            &mut ws,
            "conversation.item.input_audio_transcription.completed"
        ),
        [
            added("conversation.item.added", "item_1", None),
            delta("item_1", "s1600"),
            delta("item_1", " s3200"),
            delta("item_1", " s4800"),
            committed("item_1", None),
            completed("item_1", "s1600 s3200 s4800", 4800),
        ]
    );
    assert_eq!(
        until(&mut ws, "conversation.item.done"),
        [done("item_1", None, "s1600 s3200 s4800")]
    );
    // The next utterance starts a new stream and a new item.
    append(&mut ws, 2000);
    send(&mut ws, json!({"type": "input_audio_buffer.commit"}));
    assert_eq!(
        until(
            &mut ws,
            "conversation.item.input_audio_transcription.completed"
        ),
        [
            added("conversation.item.added", "item_2", Some("item_1")),
            delta("item_2", "s1600"),
            delta("item_2", " s2000"),
            committed("item_2", Some("item_1")),
            completed("item_2", "s1600 s2000", 2000),
        ]
    );
}

#[test]
fn openai_rate_pcm16_is_resampled_and_the_model_may_end_utterances_itself() {
    let alive = Arc::new(AtomicUsize::new(0));
    let addr = start(config(), doubles(Some(4), &alive));
    let mut ws = connect_beta(addr);
    until(&mut ws, "transcription_session.created");
    send(
        &mut ws,
        json!({"type": "transcription_session.update", "session": {"input_audio_format": "pcm16"}}),
    );
    until(&mut ws, "transcription_session.updated");
    // 1 s at 24 kHz is 16,000 samples at 16 kHz: ten words, a final after every four.
    for _ in 0..6 {
        append(&mut ws, 4000);
    }
    send(&mut ws, json!({"type": "input_audio_buffer.commit"}));
    let mut events = until(
        &mut ws,
        "conversation.item.input_audio_transcription.completed",
    );
    events.extend(until(
        &mut ws,
        "conversation.item.input_audio_transcription.completed",
    ));
    events.extend(until(
        &mut ws,
        "conversation.item.input_audio_transcription.completed",
    ));
    let of = |kind: &str, field: &str| -> Vec<(String, String)> {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| {
                (
                    e["item_id"].as_str().unwrap().to_string(),
                    e[field].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let transcripts = of(
        "conversation.item.input_audio_transcription.completed",
        "transcript",
    );
    let words: Vec<String> = (1..=10).map(|k| format!("s{}", k * 1600)).collect();
    let expected = [
        ("item_1", words[0..4].join(" ")),
        ("item_2", words[4..8].join(" ")),
        ("item_3", words[8..10].join(" ")),
    ];
    assert_eq!(
        transcripts,
        expected.map(|(i, t)| (i.to_string(), t)).to_vec()
    );
    // Each item's deltas add up to its transcript.
    for (item, text) in &transcripts {
        let joined: String = of("conversation.item.input_audio_transcription.delta", "delta")
            .into_iter()
            .filter(|(i, _)| i == item)
            .map(|(_, d)| d)
            .collect();
        assert_eq!(&joined, text);
    }
}

/// Waits (at most 10 s) until `alive` transcribers are left.
fn wait_until_alive(alive: &AtomicUsize, left: usize, failure: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive.load(Ordering::SeqCst) != left {
        assert!(Instant::now() < deadline, "{failure}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn error_code(ws: &mut Client) -> (String, Value) {
    let e = until(ws, "error").pop().unwrap();
    (e["error"]["code"].as_str().unwrap().to_string(), e)
}

#[test]
fn garbage_gets_error_events_and_the_connection_stays_usable() {
    let alive = Arc::new(AtomicUsize::new(0));
    let addr = start(config(), doubles(None, &alive));
    let mut ws = connect(addr);
    at_16k(&mut ws);
    ws.send(Message::Text("not json".into())).unwrap();
    assert_eq!(error_code(&mut ws).0, "invalid_json");
    // An object 50,000 deep is refused for its depth, not called something it is not.
    let deep = "{\"a\":".repeat(50_000) + "1" + &"}".repeat(50_000);
    ws.send(Message::Text(deep.into())).unwrap();
    let (code, e) = error_code(&mut ws);
    assert_eq!(code, "invalid_json");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("nested too deeply"), "{message}");
    send(
        &mut ws,
        json!({"type": "input_audio_buffer.append", "audio": "!!!"}),
    );
    assert_eq!(error_code(&mut ws).0, "invalid_audio");
    send(
        &mut ws,
        json!({"type": "input_audio_buffer.append", "audio": "AA=="}),
    );
    assert_eq!(error_code(&mut ws).0, "invalid_audio");
    send(
        &mut ws,
        json!({"type": "response.create", "event_id": "mine"}),
    );
    let (code, e) = error_code(&mut ws);
    assert_eq!(code, "unknown_event");
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["event_id"], "mine");
    send(&mut ws, json!({"type": "input_audio_buffer.commit"}));
    assert_eq!(error_code(&mut ws).0, "input_audio_buffer_commit_empty");
    send(
        &mut ws,
        json!({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}),
    );
    assert_eq!(error_code(&mut ws).0, "unsupported_audio_format");
    ws.send(Message::Binary(vec![1, 2, 3].into())).unwrap();
    assert_eq!(error_code(&mut ws).0, "invalid_event");
    // Cleared audio is dropped unheard.
    append(&mut ws, 1000);
    send(&mut ws, json!({"type": "input_audio_buffer.clear"}));
    until(&mut ws, "input_audio_buffer.cleared");
    append(&mut ws, 1600);
    send(&mut ws, json!({"type": "input_audio_buffer.commit"}));
    let events = until(
        &mut ws,
        "conversation.item.input_audio_transcription.completed",
    );
    assert_eq!(events.last().unwrap()["transcript"], "s1600");
}

#[test]
fn a_client_gone_mid_stream_frees_its_state_and_others_go_on() {
    let alive = Arc::new(AtomicUsize::new(0));
    let addr = start(config(), doubles(None, &alive));
    let mut first = connect(addr);
    at_16k(&mut first);
    append(&mut first, 2000);
    until(
        &mut first,
        "conversation.item.input_audio_transcription.delta",
    );
    let mut second = connect(addr);
    at_16k(&mut second);
    assert_eq!(alive.load(Ordering::SeqCst), 2);
    // The first client vanishes without a close frame.
    drop(first);
    wait_until_alive(&alive, 1, "the gone client's transcriber was never dropped");
    append(&mut second, 1600);
    send(&mut second, json!({"type": "input_audio_buffer.commit"}));
    let events = until(
        &mut second,
        "conversation.item.input_audio_transcription.completed",
    );
    assert_eq!(events.last().unwrap()["transcript"], "s1600");
}

#[test]
fn idle_too_long_too_much_audio_too_many_streams_and_no_streaming_model_close_with_an_error() {
    let alive = Arc::new(AtomicUsize::new(0));
    // The length limit also bounds a stream's wall time: long enough here for the appends.
    let limits = RealtimeConfig {
        max_seconds: 10.0,
        max_streams: 1,
        ..config()
    };
    let addr = start(limits, doubles(None, &alive));
    let mut ws = connect(addr);
    at_16k(&mut ws);
    let mut busy = connect(addr);
    assert_eq!(error_code(&mut busy).0, "server_busy");
    assert!(next(&mut busy).is_none());
    append(&mut ws, 160_001);
    assert_eq!(error_code(&mut ws).0, "audio_too_long");
    assert!(next(&mut ws).is_none());
    // Its slot is free once its transcriber is gone.
    wait_until_alive(&alive, 0, "the refused stream was never freed");
    let limits = RealtimeConfig {
        idle_timeout: Duration::from_millis(300),
        ..config()
    };
    let mut idle = connect(start(limits, doubles(None, &alive)));
    until(&mut idle, "session.created");
    let (code, e) = error_code(&mut idle);
    assert_eq!(code, "idle_timeout", "{e}");
    assert!(next(&mut idle).is_none());

    let refusing: TranscriberFactory = Arc::new(|| {
        parakeet::bail!(
            Options,
            "the model tiny cannot stream: it is not cache-aware"
        )
    });
    let addr = start(config(), refusing);
    let mut ws = connect(addr);
    let (code, e) = error_code(&mut ws);
    assert_eq!(code, "model_not_streaming");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot stream")
    );
    assert!(next(&mut ws).is_none());
}

/// Reads events until one of type `kind`, the server's close, or `limit`; the event if seen.
pub(crate) fn wait_for(ws: &mut Client, kind: &str, limit: Duration) -> Option<Value> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match ws.read() {
            Ok(Message::Text(t)) => {
                let e: Value = serde_json::from_str(t.as_str()).unwrap();
                if e["type"] == kind {
                    return Some(e);
                }
            }
            Ok(Message::Close(_)) => return None,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
    None
}

#[test]
fn pings_do_not_keep_a_stream_alive_and_a_client_that_never_reads_is_dropped() {
    let alive = Arc::new(AtomicUsize::new(0));
    let limits = RealtimeConfig {
        idle_timeout: Duration::from_secs(1),
        ..config()
    };
    let addr = start(limits, doubles(None, &alive));
    let mut ws = connect(addr);
    if let MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
    }
    until(&mut ws, "session.created");
    // Pings every 100 ms (and a session.update): no audio, so the stream is idle.
    let began = Instant::now();
    let mut idle = None;
    while idle.is_none() && began.elapsed() < Duration::from_secs(4) {
        ws.send(Message::Ping(vec![1].into())).unwrap();
        send(&mut ws, json!({"type": "session.update", "session": {}}));
        idle = wait_for(&mut ws, "error", Duration::from_millis(100));
    }
    let idle = idle.expect("pings kept an idle stream open for 4 s (idle timeout 1 s)");
    assert_eq!(idle["error"]["code"], "idle_timeout", "{idle}");
    drop(ws);
    wait_until_alive(&alive, 0, "the idle stream was never freed");

    // A client that sends events but never reads their answers: once its buffers are full
    // the server's writes stall, and the write timeout drops it.
    let limits = RealtimeConfig {
        idle_timeout: Duration::from_secs(120),
        write_timeout: Duration::from_millis(500),
        ..config()
    };
    let addr = start(limits, doubles(None, &alive));
    let mut ws = connect(addr);
    if let MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    }
    wait_until_alive(&alive, 1, "the stream never started");
    // Each `{}` is answered by an error event of about 200 bytes: 40 MB unread in all.
    for _ in 0..200_000 {
        if ws.send(Message::Text("{}".into())).is_err() {
            break;
        }
    }
    wait_until_alive(&alive, 0, "a client that never reads held its stream");
}

#[test]
fn an_oversized_append_and_conflicting_formats_get_error_events() {
    let alive = Arc::new(AtomicUsize::new(0));
    let addr = start(config(), doubles(None, &alive));
    let mut ws = connect(addr);
    until(&mut ws, "session.created");
    // pcm16 is 24 kHz, the GA format says 8 kHz: neither is guessed.
    send(
        &mut ws,
        json!({"type": "session.update", "session": {"input_audio_format": "pcm16", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}}),
    );
    let (code, e) = error_code(&mut ws);
    assert_eq!(code, "invalid_session_update", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("8000"),
        "{e}"
    );
    // Agreeing fields are fine.
    send(
        &mut ws,
        json!({"type": "session.update", "session": {"input_audio_format": "pcm16", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}}}),
    );
    let updated = until(&mut ws, "session.updated");
    assert_eq!(
        updated[0]["session"]["audio"]["input"]["format"]["rate"],
        24_000
    );

    // 50 MB in one append: an error event says why, then the server closes.
    let audio = "A".repeat(50 << 20);
    let event = format!(r#"{{"type": "input_audio_buffer.append", "audio": "{audio}"}}"#);
    drop(audio);
    ws.send(Message::Text(event.into())).unwrap();
    let (code, e) = error_code(&mut ws);
    assert_eq!(code, "message_too_large", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("52428"),
        "{e}"
    );
    assert!(next(&mut ws).is_none());
    wait_until_alive(&alive, 0, "the refused stream was never freed");
}

#[test]
fn a_shutdown_completes_each_stream_s_audio_and_closes_it() {
    let alive = Arc::new(AtomicUsize::new(0));
    let (control, drain) = Drain::new();
    let addr = start(RealtimeConfig { drain, ..config() }, doubles(None, &alive));
    let mut ws = connect(addr);
    at_16k(&mut ws);
    append(&mut ws, 2000);
    until(&mut ws, "conversation.item.input_audio_transcription.delta");
    control.stop();
    assert_eq!(
        until(
            &mut ws,
            "conversation.item.input_audio_transcription.completed"
        ),
        [
            delta("item_1", " s2000"),
            committed("item_1", None),
            completed("item_1", "s1600 s2000", 2000),
        ]
    );
    until(&mut ws, "conversation.item.done");
    // A close frame says why: going away.
    let frame = loop {
        match ws.read() {
            Ok(Message::Close(frame)) => break frame.expect("a close frame with a code"),
            Ok(Message::Text(t)) => panic!("after the last item: {t}"),
            Ok(_) => {}
            Err(e) => panic!("no close frame: {e}"),
        }
    };
    assert_eq!(u16::from(frame.code), 1001, "{frame:?}");
    wait_until_alive(&alive, 0, "the stream was never freed");
    // New streams are refused.
    let mut late = connect(addr);
    assert_eq!(error_code(&mut late).0, "server_shutting_down");
}
