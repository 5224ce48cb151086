//! Concurrent live streams on `parakeet serve`'s `/v1/realtime` WebSocket (a benchmark, not a
//! test): do N streams keep up with real time, and are their texts those of one stream alone?
//!
//! Start a server with a cache-aware model first, e.g.
//! `parakeet serve -m stream_rnnt_120m-q8_0.gguf --port 8090 --max-streams 16`, then
//! `cargo run --release --example realtime_bench -- ws://127.0.0.1:8090 AUDIO [STREAMS] [PIECE_MS]`.
//!
//! First one stream sends AUDIO as fast as the server takes it: its text is the reference.
//! Then STREAMS (default 8) clients each send AUDIO at the speaker's pace, PIECE_MS (default
//! 100) of pcm16 at 16 kHz an `input_audio_buffer.append`, starting a fraction of a piece apart
//! so their chunks do not line up, and commit at the end. A stream that fell behind real time
//! would have a backlog of appends when it commits: the time from its commit to its
//! `.completed` ("final lag") shows it. A stream also notes how late each append went out
//! against its schedule (the client's own lateness, should the machine be too busy to send).

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use serde_json::{Value, json};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

const RATE: u32 = 16_000;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        bail!("usage: realtime_bench ws://HOST:PORT AUDIO [STREAMS] [PIECE_MS]");
    }
    let url = format!("{}/v1/realtime", args[0].trim_end_matches('/'));
    let streams: usize = args.get(2).map_or(Ok(8), |s| s.parse())?;
    let piece_ms: u64 = args.get(3).map_or(Ok(100), |s| s.parse())?;
    let decoded = parakeet::audio::load_audio(Path::new(&args[1]))?;
    let samples = parakeet::audio::resample_to_16k(decoded)?;
    let pcm: Vec<u8> = samples
        .iter()
        .flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
        .collect();
    let seconds = samples.len() as f64 / f64::from(RATE);
    let piece_bytes = 2 * (RATE as usize) * piece_ms as usize / 1000;

    let reference = run_stream(&url, &pcm, piece_bytes, None)?;
    println!(
        "reference (1 stream, unpaced): {:.2} s of audio, {} chars, final lag {:.1} ms",
        seconds,
        reference.text.len(),
        reference.final_lag_ms
    );

    let piece = Duration::from_millis(piece_ms);
    let start = Instant::now() + Duration::from_millis(500);
    let results: Vec<Result<Run>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..streams)
            .map(|i| {
                let (url, pcm) = (&url, &pcm);
                let offset = piece.mul_f64(i as f64 / streams as f64);
                s.spawn(move || run_stream(url, pcm, piece_bytes, Some((start + offset, piece))))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    println!(
        "{streams} streams at real time, {piece_ms} ms appends, {seconds:.1} s of audio each:"
    );
    let mut all_equal = true;
    let mut worst_lag: f64 = 0.0;
    for (i, r) in results.into_iter().enumerate() {
        let r = r.with_context(|| format!("stream {i}"))?;
        let same = r.text == reference.text;
        all_equal &= same;
        worst_lag = worst_lag.max(r.final_lag_ms);
        println!(
            "  stream {i}: final lag {:7.1} ms, deltas {:4}, client late max {:6.1} ms, text {}",
            r.final_lag_ms,
            r.deltas,
            r.client_late_max_ms,
            if same { "= reference" } else { "DIFFERS" }
        );
    }
    println!(
        "worst final lag {worst_lag:.1} ms; texts identical to the single stream: {}",
        if all_equal { "yes" } else { "NO" }
    );
    ensure!(
        all_equal,
        "a stream's text differs from the single stream's"
    );
    Ok(())
}

struct Run {
    text: String,
    final_lag_ms: f64,
    deltas: usize,
    client_late_max_ms: f64,
}

/// Streams `pcm` (16 kHz pcm16) in pieces, paced from `schedule` (first send time, interval)
/// or as fast as the server reads them, commits, and waits for the transcript.
fn run_stream(
    url: &str,
    pcm: &[u8],
    piece_bytes: usize,
    schedule: Option<(Instant, Duration)>,
) -> Result<Run> {
    let (mut ws, _) = tungstenite::connect(url).with_context(|| format!("connecting to {url}"))?;
    expect(&mut ws, "transcription_session.created")?;
    let update = json!({"type": "session.update",
        "session": {"audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}}}});
    ws.send(Message::text(update.to_string()))?;
    expect(&mut ws, "session.updated")?;
    if let MaybeTlsStream::Plain(tcp) = ws.get_ref() {
        tcp.set_nodelay(true)?;
        tcp.set_read_timeout(Some(Duration::from_millis(1)))?;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut deltas, mut late_max) = (0, 0.0f64);
    for (k, piece) in pcm.chunks(piece_bytes).enumerate() {
        if let Some((first, every)) = schedule {
            let due = first + every * k as u32;
            // Read what the server sent while waiting for the piece's time.
            while Instant::now() < due {
                deltas += drain(&mut ws)?;
            }
            late_max = late_max.max(due.elapsed().as_secs_f64() * 1e3);
        }
        let append = json!({"type": "input_audio_buffer.append", "audio": b64.encode(piece)});
        ws.send(Message::text(append.to_string()))?;
        deltas += drain(&mut ws)?;
    }
    ws.send(Message::text(
        json!({"type": "input_audio_buffer.commit"}).to_string(),
    ))?;
    let committed = Instant::now();
    if let MaybeTlsStream::Plain(tcp) = ws.get_ref() {
        tcp.set_read_timeout(Some(Duration::from_secs(120)))?;
    }
    loop {
        let event = next_event(&mut ws)?.context("the server closed before the transcript")?;
        match event["type"].as_str().unwrap_or("") {
            "conversation.item.input_audio_transcription.delta" => deltas += 1,
            "conversation.item.input_audio_transcription.completed" => {
                let final_lag_ms = committed.elapsed().as_secs_f64() * 1e3;
                let text = event["transcript"].as_str().unwrap_or("").to_owned();
                let _ = ws.close(None);
                return Ok(Run {
                    text,
                    final_lag_ms,
                    deltas,
                    client_late_max_ms: late_max,
                });
            }
            "error" => bail!("server error: {event}"),
            _ => {}
        }
    }
}

/// Reads the events waiting now (the socket has a short read timeout); counts the deltas.
fn drain(ws: &mut Socket) -> Result<usize> {
    let mut deltas = 0;
    while let Some(event) = next_event(ws)? {
        match event["type"].as_str().unwrap_or("") {
            "conversation.item.input_audio_transcription.delta" => deltas += 1,
            "error" => bail!("server error: {event}"),
            _ => {}
        }
    }
    Ok(deltas)
}

/// The next JSON event, or None when nothing arrived within the socket's read timeout.
fn next_event(ws: &mut Socket) -> Result<Option<Value>> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return Ok(Some(serde_json::from_str(t.as_str())?)),
            Ok(Message::Close(_)) => bail!("the server closed the connection"),
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn expect(ws: &mut Socket, kind: &str) -> Result<Value> {
    let event = next_event(ws)?.with_context(|| format!("no {kind} event"))?;
    ensure!(event["type"] == kind, "expected {kind}, got {event}");
    Ok(event)
}
