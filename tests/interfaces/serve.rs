//! `parakeet serve` end to end: the real binary on an ephemeral port with the tiny TDT model,
//! every response format against the CLI's own output for the same file, concurrency, bad
//! requests, a full queue, buffer release and a clean exit on SIGTERM.

use crate::common::*;
use parakeet::convert::OutType;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    scratch_dir("serve", name)
}

fn model() -> PathBuf {
    gguf("tiny_tdt", OutType::F32)
}

fn clip(name: &str) -> PathBuf {
    fixtures().join("audio").join(name)
}

fn format_clip(name: &str) -> PathBuf {
    fixtures().join("audio/formats").join(name)
}

/// A running `parakeet serve`; killed on drop if still running.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: String,
    /// stderr lines after the "listening" line.
    log: Mutex<mpsc::Receiver<String>>,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_with(&model(), extra)
    }

    pub(crate) fn start_with(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_parakeet"))
            .args(["serve", "-m", model.to_str().unwrap(), "--port", "0"])
            .args(extra)
            .env("GGML_NO_BACKTRACE", "1")
            .env_remove("PARAKEET_MODEL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let addr = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the server did not start");
            if let Some(at) = line.find("listening on http://") {
                break line[at + "listening on http://".len()..].trim().to_string();
            }
        };
        Server {
            child,
            addr,
            log: Mutex::new(rx),
        }
    }

    /// The stderr lines logged after the "listening" line within `wait`, until `until` is
    /// among them.
    pub(crate) fn log_until(&self, until: &str, wait: Duration) -> Vec<String> {
        let log = self.log.lock().unwrap();
        let deadline = Instant::now() + wait;
        let mut lines = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match log.recv_timeout(left) {
                Ok(line) => {
                    let done = line.contains(until);
                    lines.push(line);
                    if done {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        lines
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn get(&self, path: &str) -> Reply {
        reply(ureq::get(&self.url(path)).call())
    }

    fn transcribe(&self, fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> Reply {
        let (content_type, body) = multipart(fields, file);
        self.post(&content_type, &body)
    }

    fn post(&self, content_type: &str, body: &[u8]) -> Reply {
        reply(
            ureq::post(&self.url("/v1/audio/transcriptions"))
                .set("Content-Type", content_type)
                .send_bytes(body),
        )
    }

    fn health(&self) -> Value {
        let r = self.get("/health");
        assert_eq!(r.status, 200);
        r.json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    content_type: String,
    retry_after: Option<String>,
    /// The worker's time on the request.
    worker_ms: Option<f64>,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// Asserts an OpenAI error body with this status, `param` and `code`.
    pub(crate) fn assert_error(&self, status: u16, param: Option<&str>, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert!(
            self.content_type.starts_with("application/json"),
            "{self:?}"
        );
        let e = &self.json()["error"];
        assert!(
            !e["message"].as_str().unwrap_or_default().is_empty(),
            "{self:?}"
        );
        let kind = if status >= 500 {
            "server_error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(e["type"], kind, "{self:?}");
        assert_eq!(e["param"].as_str(), param, "{self:?}");
        assert_eq!(e["code"], code, "{self:?}");
    }
}

fn reply(r: Result<ureq::Response, ureq::Error>) -> Reply {
    let resp = match r {
        Ok(resp) => resp,
        Err(ureq::Error::Status(_, resp)) => resp,
        Err(e) => panic!("request failed: {e}"),
    };
    Reply {
        status: resp.status(),
        content_type: resp.header("content-type").unwrap_or_default().to_string(),
        retry_after: resp.header("retry-after").map(str::to_string),
        worker_ms: resp.header("x-worker-ms").map(|v| v.parse().unwrap()),
        body: resp.into_string().unwrap(),
    }
}

/// A multipart/form-data body (written here: the test plays the client).
fn multipart(fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> (String, Vec<u8>) {
    let boundary = "----parakeet-test-boundary-7f3a9c";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    if let Some((file_name, bytes)) = file {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// What the CLI writes for `input`: txt, json, srt and vtt.
struct CliOutput {
    txt: String,
    json: Value,
    srt: String,
    vtt: String,
}

/// `parakeet transcribe -q -m <model> <input> <args>`, which must succeed.
fn cli_transcribe(input: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_parakeet"))
        .args(["transcribe", input.to_str().unwrap(), "-q", "-m"])
        .arg(model())
        .args(args)
        .env("GGML_NO_BACKTRACE", "1")
        .env_remove("PARAKEET_MODEL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn cli_output(input: &Path, dir: &Path) -> CliOutput {
    cli_transcribe(
        input,
        &["-f", "txt,json,srt,vtt", "-o", dir.to_str().unwrap()],
    );
    let stem = input.file_stem().unwrap().to_str().unwrap();
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{stem}.{ext}"))).unwrap();
    CliOutput {
        txt: read("txt"),
        json: serde_json::from_str(&read("json")).unwrap(),
        srt: read("srt"),
        vtt: read("vtt"),
    }
}

fn file_name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}

/// The upload of `path` as the server's `file` field, with `fields` before it.
pub(crate) fn upload(server: &Server, path: &Path, fields: &[(&str, &str)]) -> Reply {
    let bytes = std::fs::read(path).unwrap();
    server.transcribe(fields, Some((file_name(path), &bytes)))
}

/// `text` / `json` / `srt` / `vtt` answers for `path`, checked against the CLI's files.
fn assert_matches_cli(server: &Server, path: &Path, format: &str, cli: &CliOutput) {
    let r = upload(
        server,
        path,
        &[("model", "whisper-1"), ("response_format", format)],
    );
    assert_eq!(r.status, 200, "{format} {}: {r:?}", path.display());
    match format {
        "json" => {
            assert!(r.worker_ms.is_some_and(|ms| ms > 0.0), "{r:?}");
            let j = r.json();
            assert_eq!(j["text"].as_str().unwrap(), cli.txt.trim());
            let seconds = cli.json["duration"].as_f64().unwrap().ceil();
            assert_eq!(j["usage"]["seconds"].as_f64().unwrap(), seconds);
        }
        "text" => assert_eq!(r.body, cli.txt),
        "srt" => assert_eq!(r.body, cli.srt),
        "vtt" => assert_eq!(r.body, cli.vtt),
        _ => unreachable!(),
    }
}

#[test]
fn every_response_format_matches_the_cli() {
    let dir = scratch("formats");
    let server = Server::start(&["--workers", "1", "--threads", "2"]);
    for path in [clip("speech_10s.wav"), format_clip("s24_stereo_44100.flac")] {
        let cli = cli_output(&path, &dir);
        assert!(!cli.txt.trim().is_empty());
        for format in ["json", "text", "srt", "vtt"] {
            assert_matches_cli(&server, &path, format, &cli);
        }
        // verbose_json: segments by default, words when asked, both when both are asked.
        let r = upload(&server, &path, &[("response_format", "verbose_json")]);
        assert_eq!(r.status, 200, "{r:?}");
        let v = r.json();
        assert_eq!(v["text"].as_str().unwrap(), cli.txt.trim());
        assert_eq!(v["duration"], cli.json["duration"]);
        // The model's: its vocabulary has no letter beyond ASCII.
        assert_eq!(v["language"], "english");
        assert!(v.get("words").is_none());
        let segs = v["segments"].as_array().unwrap();
        let cli_segs = cli.json["segments"].as_array().unwrap();
        assert_eq!(segs.len(), cli_segs.len());
        assert!(!segs.is_empty());
        let mut tokens = 0;
        for (i, (s, c)) in segs.iter().zip(cli_segs).enumerate() {
            assert_eq!(s["id"], i);
            for key in ["start", "end", "text"] {
                assert_eq!(s[key], c[key], "segment {i} {key}");
            }
            tokens += s["tokens"].as_array().unwrap().len();
        }
        // Every token id lands in exactly one segment.
        assert_eq!(tokens, cli.json["tokens"].as_array().unwrap().len());

        let r = upload(
            &server,
            &path,
            &[
                ("response_format", "verbose_json"),
                ("timestamp_granularities[]", "word"),
            ],
        );
        let v = r.json();
        assert!(v.get("segments").is_none(), "{v}");
        assert_words_as_cli(&v["words"], &cli.json["words"]);
        assert!(!v["words"].as_array().unwrap().is_empty());

        let r = upload(
            &server,
            &path,
            &[
                ("response_format", "verbose_json"),
                ("timestamp_granularities[]", "word"),
                ("timestamp_granularities[]", "segment"),
                ("language", "DE"),
                ("prompt", "ignored"),
                ("temperature", "0.3"),
            ],
        );
        let v = r.json();
        assert_words_as_cli(&v["words"], &cli.json["words"]);
        assert_eq!(v["segments"].as_array().unwrap().len(), cli_segs.len());
        // The request's language, by the name OpenAI gives it.
        assert_eq!(v["language"], "german");
    }
    // A language that is not an ISO-639-1 code of one Parakeet transcribes: 400, by name.
    for bad in ["english", "en-US", "xx", ""] {
        let r = upload(
            &server,
            &clip("speech_10s.wav"),
            &[("response_format", "verbose_json"), ("language", bad)],
        );
        assert_eq!(r.status, 400, "{bad}: {r:?}");
        let e = &r.json()["error"];
        assert_eq!(e["param"], "language", "{bad}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("language {bad:?}: expected an ISO-639-1 code")),
            "{message}"
        );
    }

    // The model listing and health.
    let models = server.get("/v1/models").json();
    let name = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(server.get(&format!("/v1/models/{name}")).json()["id"], name);
    let h = server.health();
    assert_eq!(
        (h["status"].as_str(), h["workers"].as_u64()),
        (Some("ok"), Some(1))
    );
    assert_eq!(h["model"], name);
}

#[test]
fn concurrent_requests_are_untangled() {
    let dir = scratch("concurrent");
    let server = Server::start(&["--workers", "2", "--threads", "1"]);
    let inputs = [
        clip("speech_10s.wav"),
        clip("speech_2s.wav"),
        format_clip("mono_22050.mp3"),
        format_clip("s24_stereo_44100.flac"),
        format_clip("stereo_22050.ogg"),
        format_clip("s16_stereo_22050.aiff"),
        format_clip("ulaw_mono_8000.wav"),
        format_clip("f32_stereo_22050.wav"),
    ];
    let expected: Vec<String> = inputs.iter().map(|p| cli_output(p, &dir).txt).collect();
    // Different clips give different texts, so a mix-up cannot go unnoticed.
    let distinct: std::collections::HashSet<_> = expected.iter().collect();
    assert!(distinct.len() >= 4, "{expected:?}");
    let server = &server;
    std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .iter()
            .map(|p| s.spawn(move || upload(server, p, &[("response_format", "text")])))
            .collect();
        for ((h, want), path) in handles.into_iter().zip(&expected).zip(&inputs) {
            let r = h.join().unwrap();
            assert_eq!(r.status, 200, "{}: {r:?}", path.display());
            assert_eq!(&r.body, want, "{}", path.display());
        }
    });
    // Every request was logged once, with its audio seconds.
    // (A line is written before its response is sent, but reaches us through a pipe.)
    let mut logged = Vec::new();
    while logged.len() < inputs.len() {
        let Ok(line) = server
            .log
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
        else {
            break;
        };
        if line.contains("POST /v1/audio/transcriptions 200") {
            logged.push(line);
        }
    }
    assert_eq!(logged.len(), inputs.len(), "{logged:?}");
    assert!(logged.iter().all(|l| l.contains(" s time ")), "{logged:?}");
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_goes_on() {
    let dir = scratch("bad");
    let server = Server::start(&[
        "--workers",
        "1",
        "--max-upload-mb",
        "1",
        "--max-audio-seconds",
        "5",
    ]);
    let good = clip("speech_2s.wav");
    let good_text = cli_output(&good, &dir).txt;
    let wav = std::fs::read(&good).unwrap();
    let check_good = || {
        let r = upload(&server, &good, &[("response_format", "text")]);
        assert_eq!((r.status, r.body.as_str()), (200, good_text.as_str()));
    };
    let boundary_ct = "multipart/form-data; boundary=xyz";

    // Not multipart at all.
    server
        .post("application/json", br#"{"file": "x"}"#)
        .assert_error(400, None, "invalid_multipart");
    check_good();
    // Multipart that ends in the middle of a part.
    server
        .post(
            boundary_ct,
            b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF",
        )
        .assert_error(400, None, "invalid_multipart");
    check_good();
    // No file.
    server
        .transcribe(&[("model", "whisper-1")], None)
        .assert_error(400, Some("file"), "missing_file");
    check_good();
    // Bytes that are no audio.
    let r = server.transcribe(
        &[],
        Some(("notes.wav", b"this is not audio at all, just text")),
    );
    r.assert_error(400, Some("file"), "invalid_audio");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("notes.wav")
    );
    check_good();
    // A WAV cut short.
    server
        .transcribe(&[], Some(("cut.wav", &wav[..wav.len() / 2])))
        .assert_error(400, Some("file"), "invalid_audio");
    check_good();
    // An empty file.
    server
        .transcribe(&[], Some(("empty.wav", b"")))
        .assert_error(400, Some("file"), "invalid_audio");
    check_good();
    // A boost phrase that is empty, or spells nothing in the vocabulary.
    for phrase in ["", "\u{65e5}\u{672c}"] {
        server
            .transcribe(&[("boost", phrase)], Some(("a.wav", &wav)))
            .assert_error(400, Some("boost"), "invalid_value");
        check_good();
    }
    // Unknown response format and granularity.
    server
        .transcribe(&[("response_format", "xml")], Some(("a.wav", &wav)))
        .assert_error(400, Some("response_format"), "invalid_value");
    check_good();
    server
        .transcribe(
            &[
                ("response_format", "verbose_json"),
                ("timestamp_granularities[]", "char"),
            ],
            Some(("a.wav", &wav)),
        )
        .assert_error(400, Some("timestamp_granularities[]"), "invalid_value");
    check_good();
    // Over the upload limit (1 MiB).
    let big = vec![0u8; 3 << 20];
    server
        .transcribe(&[], Some(("big.wav", &big)))
        .assert_error(413, Some("file"), "file_too_large");
    check_good();
    // Over the duration limit (5 s).
    upload(&server, &clip("speech_10s.wav"), &[]).assert_error(400, Some("file"), "audio_too_long");
    check_good();
    // Unknown endpoint and method.
    server
        .get("/v1/audio/translations-nope")
        .assert_error(404, None, "unknown_url");
    server
        .get("/v1/audio/transcriptions")
        .assert_error(405, None, "method_not_allowed");
    server
        .get("/v1/models/no-such-model")
        .assert_error(404, Some("model"), "model_not_found");
    check_good();
}

/// A 16 kHz 16-bit WAV of `clip` repeated `times` times.
fn repeated_wav(clip: &Path, times: usize, out: &Path) -> Vec<u8> {
    let mut reader = hound::WavReader::open(clip).unwrap();
    let spec = reader.spec();
    let samples: Vec<i16> = reader.samples::<i16>().map(Result::unwrap).collect();
    let mut writer = hound::WavWriter::create(out, spec).unwrap();
    for _ in 0..times {
        for &s in &samples {
            writer.write_sample(s).unwrap();
        }
    }
    writer.finalize().unwrap();
    std::fs::read(out).unwrap()
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let dir = scratch("queue");
    let long = dir.join("long.wav");
    let bytes = repeated_wav(&clip("speech_10s.wav"), 6, &long);
    let want = cli_output(&long, &dir).txt;
    // One worker, nothing waiting: while a 60 s clip is transcribed, others are refused.
    let server = Server::start(&["--workers", "1", "--threads", "1", "--queue", "0"]);
    let server = &server;
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let bytes = &bytes;
                s.spawn(move || {
                    server.transcribe(&[("response_format", "text")], Some(("long.wav", bytes)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (ok, busy): (Vec<_>, Vec<_>) = replies.iter().partition(|r| r.status == 200);
    assert!(!ok.is_empty() && !busy.is_empty(), "{replies:?}");
    for r in ok {
        assert_eq!(r.body, want);
    }
    for r in busy {
        r.assert_error(503, None, "server_busy");
        assert_eq!(r.retry_after.as_deref(), Some("1"));
    }
    // Once the worker is free, requests are taken again.
    let r = upload(server, &clip("speech_2s.wav"), &[]);
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn a_long_request_s_compute_buffer_is_released() {
    let dir = scratch("release");
    let short = clip("speech_2s.wav");
    let short_text = cli_output(&short, &dir).txt;
    let long = dir.join("long.wav");
    repeated_wav(&clip("speech_10s.wav"), 6, &long);
    let long_text = cli_output(&long, &dir).txt;
    let server = Server::start(&["--workers", "1", "--release-buffer-mb", "4"]);
    let buffer = || server.health()["compute_buffer_bytes"][0].as_u64().unwrap();
    let r = upload(&server, &short, &[("response_format", "text")]);
    assert_eq!(r.body, short_text);
    // A 2 s clip's buffer stays (it is reused by the next request).
    let kept = buffer();
    assert!(kept > 0 && kept <= 4 << 20, "{kept}");
    // 60 s needs more than 4 MiB: the worker starts afresh after it.
    let r = upload(&server, &long, &[("response_format", "text")]);
    assert_eq!(r.body, long_text);
    assert_eq!(buffer(), 0);
    // And transcribes as before.
    let r = upload(&server, &short, &[("response_format", "text")]);
    assert_eq!(r.body, short_text);
    assert_eq!(buffer(), kept);
}

#[cfg(unix)]
#[test]
fn sigterm_finishes_the_request_in_flight_and_exits_0() {
    let dir = scratch("sigterm");
    let long = dir.join("long.wav");
    let bytes = repeated_wav(&clip("speech_10s.wav"), 3, &long);
    let want = cli_output(&long, &dir).txt;
    let mut server = Server::start(&["--workers", "1", "--threads", "1"]);
    let url = server.url("/v1/audio/transcriptions");
    let (content_type, body) =
        multipart(&[("response_format", "text")], Some(("long.wav", &bytes)));
    let in_flight = std::thread::spawn(move || {
        reply(
            ureq::post(&url)
                .set("Content-Type", &content_type)
                .send_bytes(&body),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.health()["busy"] != 1 {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    sigterm(&server);
    let r = in_flight.join().unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, want.as_str()));
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    // The process has exited: the pipe ends after its last line.
    let log: Vec<String> = server.log.get_mut().unwrap().iter().collect();
    assert!(log.iter().any(|l| l.contains("shutting down")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("stopped")), "{log:?}");
    // Nothing listens any more.
    assert!(ureq::get(&server.url("/health")).call().is_err());
}

/// verbose_json's words are the CLI JSON's, their confidence under whisper's name
/// `probability`.
fn assert_words_as_cli(server: &serde_json::Value, cli: &serde_json::Value) {
    let (server, cli) = (server.as_array().unwrap(), cli.as_array().unwrap());
    assert_eq!(server.len(), cli.len());
    for (s, c) in server.iter().zip(cli) {
        for key in ["word", "start", "end"] {
            assert_eq!(s[key], c[key], "{key}: {s} vs {c}");
        }
        let p = s["probability"].as_f64().expect("a word probability");
        assert!((0.0..=1.0).contains(&p), "{s}");
        assert_eq!(s["probability"], c["confidence"], "{s} vs {c}");
    }
}

/// A request's `boost` fields boost as the CLI's `--boost` does, on top of the server's own
/// phrases, and only for that request.
#[test]
fn boost_fields_boost_like_the_cli() {
    let dir = scratch("boost");
    let path = clip("speech_10s.wav");
    let cli = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_parakeet"))
            .args(["transcribe", path.to_str().unwrap(), "-q", "-m"])
            .arg(model())
            .args(extra)
            .current_dir(&dir)
            .env_remove("PARAKEET_MODEL")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = cli(&[]);
    let both = cli(&["--boost", "data", "--boost", "the cat"]);
    assert_ne!(plain, both, "the phrases change nothing on this clip");
    let server = Server::start(&["--workers", "1", "--threads", "2", "--boost", "data"]);
    let text = |fields: &[(&str, &str)]| {
        let mut f = vec![("response_format", "text")];
        f.extend_from_slice(fields);
        let r = upload(&server, &path, &f);
        assert_eq!(r.status, 200, "{r:?}");
        r.body
    };
    assert_eq!(text(&[("boost", "the cat")]), both);
    assert_eq!(text(&[]), cli(&["--boost", "data"]));
    assert_ne!(text(&[]), both);
}

/// `serve` checks its decoding and thread flags with the command line's words: a bad one stops
/// it before it listens (exit 2, one line); more threads than cores are the cores, with a
/// warning, and the server transcribes.
#[test]
fn serve_checks_its_decoding_and_thread_flags_as_transcribe_does() {
    let dir = scratch("flags");
    let model = model();
    for (flags, says) in [
        (
            &["--boost", "data", "--boost-alpha", "1e37"][..],
            "--boost-alpha",
        ),
        (
            &["--boost", "data", "--boost-context-score", "3e38"][..],
            "--boost-context-score",
        ),
        (&["--confidence-alpha", "100"][..], "--confidence-alpha 100"),
        (&["--threads", "0"][..], "--threads 0: at least 1 thread"),
    ] {
        let args = [
            &["serve", "-m", model.to_str().unwrap(), "--port", "0"][..],
            flags,
        ]
        .concat();
        let out = run_parakeet(&args, Path::new(env!("CARGO_TARGET_TMPDIR")));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    let server = Server::start(&["--threads", "10000", "--workers", "1"]);
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(server.health()["threads_per_worker"], cores);
    let good = clip("speech_2s.wav");
    let r = upload(&server, &good, &[("response_format", "text")]);
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, cli_output(&good, &dir).txt.as_str())
    );
}

/// Waits at most `limit` for the server to exit; its exit code.
fn exits_within(server: &mut Server, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status.code();
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit within {limit:?} of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(unix)]
fn sigterm(server: &Server) {
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
}

/// Reads what the server sends until it closes (or `limit` passes): the bytes and whether it
/// closed.
fn read_until_closed(tcp: &mut std::net::TcpStream, limit: Duration) -> (String, bool) {
    use std::io::Read;
    tcp.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tcp.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (String::from_utf8_lossy(&got).into_owned(), true);
            }
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

/// The head and the first bytes of a multipart upload that promises 100,000 bytes.
const HALF_A_BODY: &str = "POST /v1/audio/transcriptions HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\ncontent-length: 100000\r\n\r\n--b\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF";

#[test]
fn silent_and_stalled_clients_are_cut_and_connections_are_capped() {
    use std::io::Write;
    use std::net::TcpStream;
    let server = Server::start(&["--io-timeout-seconds", "1", "--max-connections", "6"]);
    let addr = server.addr.clone();
    // A connection that never sends its request head is closed.
    let began = Instant::now();
    let mut silent = TcpStream::connect(&addr).unwrap();
    let (said, closed) = read_until_closed(&mut silent, Duration::from_secs(5));
    assert!(
        closed && began.elapsed() < Duration::from_secs(4),
        "{said:?} after {:?}",
        began.elapsed()
    );
    // Half a request head: the same.
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"POST /v1/audio/transcriptions HTTP/1.1\r\nhost:")
        .unwrap();
    let (_, closed) = read_until_closed(&mut half, Duration::from_secs(5));
    assert!(closed, "half a request head held the connection");
    // A body that stalls is answered 408, and the connection closed.
    let mut stalled = TcpStream::connect(&addr).unwrap();
    stalled.write_all(HALF_A_BODY.as_bytes()).unwrap();
    let (said, closed) = read_until_closed(&mut stalled, Duration::from_secs(5));
    assert!(closed && said.starts_with("HTTP/1.1 408"), "{said:?}");
    assert!(said.contains("request_timeout"), "{said}");

    drop(server);

    // Six silent connections fill the cap (a timeout long enough that a loaded machine cannot
    // cut them first): the seventh is answered 503 at once.
    let server = Server::start(&["--io-timeout-seconds", "60", "--max-connections", "6"]);
    let addr = server.addr.clone();
    let held: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = TcpStream::connect(&addr).unwrap();
    let (said, closed) = read_until_closed(&mut over, Duration::from_secs(5));
    assert!(closed && said.starts_with("HTTP/1.1 503"), "{said:?}");
    assert!(said.contains("--max-connections"), "{said}");
    // Once they go, their slots are free again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ureq::get(&server.url("/health")).call().is_err() {
        assert!(
            Instant::now() < deadline,
            "the closed connections kept their slots"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A body that keeps arriving, but too slowly (10 bytes every 0.2 s), is cut with a 408 once
/// it falls below the minimum rate, not when the client is done.
#[test]
fn a_trickled_body_is_cut_at_the_minimum_rate() {
    use std::io::Write;
    let server = Server::start(&["--io-timeout-seconds", "1"]);
    let mut tcp = std::net::TcpStream::connect(&server.addr).unwrap();
    tcp.write_all(HALF_A_BODY.as_bytes()).unwrap();
    let began = Instant::now();
    let reader = {
        let mut tcp = tcp.try_clone().unwrap();
        std::thread::spawn(move || read_until_closed(&mut tcp, Duration::from_secs(20)))
    };
    while !reader.is_finished() && began.elapsed() < Duration::from_secs(20) {
        if tcp.write_all(b"0123456789").is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (said, closed) = reader.join().unwrap();
    assert!(closed && said.starts_with("HTTP/1.1 408"), "{said:?}");
    assert!(said.contains("too slowly"), "{said}");
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
}

/// A live stream keeps its connection's place under --max-connections after the upgrade.
#[test]
fn live_streams_count_against_max_connections() {
    let server = Server::start(&["--max-connections", "1", "--io-timeout-seconds", "30"]);
    let (ws, _) = tungstenite::connect(format!("ws://{}/v1/realtime", server.addr)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let r = server.get("/health");
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("--max-connections"), "{}", r.body);
    drop(ws);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ureq::get(&server.url("/health")).call().is_err() {
        assert!(Instant::now() < deadline, "the closed stream kept its slot");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A stream that trickles audio (one sample a second, never idle) is closed once it has been
/// open --max-stream-seconds of wall time.
#[test]
fn a_trickling_live_stream_expires() {
    use serde_json::json;
    use tungstenite::Message;
    let server = Server::start(&["--max-stream-seconds", "2", "--stream-idle-seconds", "30"]);
    let (mut ws, _) = tungstenite::connect(format!("ws://{}/v1/realtime", server.addr)).unwrap();
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
    }
    let began = Instant::now();
    let error = loop {
        assert!(began.elapsed() < Duration::from_secs(15), "never expired");
        let one = json!({"type": "input_audio_buffer.append", "audio": "AAA="});
        ws.send(Message::Text(one.to_string().into()))
            .expect("closed without an error event");
        if let Some(e) = crate::realtime::wait_for(&mut ws, "error", Duration::from_secs(1)) {
            break e;
        }
    };
    assert_eq!(error["error"]["code"], "session_expired", "{error}");
    assert!(
        began.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        began.elapsed()
    );
}

#[cfg(unix)]
#[test]
fn sigterm_with_a_client_holding_half_a_body_exits_at_once() {
    use std::io::Write;
    let mut server = Server::start(&["--io-timeout-seconds", "60", "--shutdown-seconds", "5"]);
    let mut tcp = std::net::TcpStream::connect(&server.addr).unwrap();
    tcp.write_all(HALF_A_BODY.as_bytes()).unwrap();
    // The server is reading the body when the signal comes.
    std::thread::sleep(Duration::from_millis(1000));
    sigterm(&server);
    // The upload is cut with a 503 (not after the 60 s read timeout), and the server is done.
    let (said, _) = read_until_closed(&mut tcp, Duration::from_secs(4));
    assert!(said.starts_with("HTTP/1.1 503"), "{said:?}");
    assert!(said.contains("shutting down"), "{said}");
    assert_eq!(exits_within(&mut server, Duration::from_secs(4)), Some(0));
}

#[cfg(unix)]
#[test]
fn work_past_the_shutdown_deadline_is_abandoned_and_the_server_exits() {
    let dir = scratch("deadline");
    let long = dir.join("long.wav");
    // 40 min of audio: several seconds of work for the tiny model.
    let bytes = repeated_wav(&clip("speech_10s.wav"), 240, &long);
    let mut server = Server::start(&[
        "--workers",
        "1",
        "--threads",
        "1",
        "--shutdown-seconds",
        "0.2",
        "--max-upload-mb",
        "200",
    ]);
    let url = server.url("/v1/audio/transcriptions");
    let (content_type, body) =
        multipart(&[("response_format", "text")], Some(("long.wav", &bytes)));
    let in_flight = std::thread::spawn(move || {
        ureq::post(&url)
            .set("Content-Type", &content_type)
            .send_bytes(&body)
            .map(|r| r.status())
            .map_err(|e| e.to_string())
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.health()["busy"] != 1 {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let began = Instant::now();
    sigterm(&server);
    assert_eq!(exits_within(&mut server, Duration::from_secs(3)), Some(0));
    let took = began.elapsed();
    let log: Vec<String> = server.log.get_mut().unwrap().iter().collect();
    assert!(
        log.iter().any(|l| l.contains("abandoned")),
        "{log:?} after {took:?}"
    );
    // The client gets no transcript: its connection is gone.
    let r = in_flight.join().unwrap();
    assert!(r.is_err(), "{r:?}");
}

/// Start-up flags that would turn a limit off or refuse everything are refused, exit 2.
#[test]
fn serve_limits_are_checked_at_start_up() {
    for (flag, value) in [
        ("--max-audio-seconds", "NaN"),
        ("--max-audio-seconds", "-1"),
        ("--max-audio-seconds", "0"),
        ("--max-audio-seconds", "inf"),
        ("--max-upload-mb", "17592186044416"),
        ("--max-upload-mb", "0"),
        ("--max-stream-seconds", "NaN"),
        ("--max-stream-seconds", "-5"),
        ("--max-stream-seconds", "0"),
        ("--stream-idle-seconds", "0"),
        ("--io-timeout-seconds", "-1"),
        ("--shutdown-seconds", "NaN"),
        ("--max-connections", "0"),
        ("--workers", "0"),
        ("--workers", "1000000"),
        ("--queue", "18446744073709551615"),
        ("--max-streams", "0"),
        ("--release-buffer-mb", "17592186044416"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_parakeet"))
            .args(["serve", "-m", "no-such-model.gguf", "--port", "0"])
            .arg(format!("{flag}={value}"))
            .env_remove("PARAKEET_MODEL")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(value),
            "{flag} {value}: {err}"
        );
        assert!(
            !err.contains("no-such-model"),
            "{flag} {value}: checked too late: {err}"
        );
    }
}

/// A request's `boost` fields are limited in number and size (each phrase costs the
/// boosting tree memory while it is built).
#[test]
fn too_many_boost_phrases_are_refused() {
    let server = Server::start(&["--workers", "1", "--threads", "1"]);
    let wav = std::fs::read(clip("speech_10s.wav")).unwrap();
    let phrases: Vec<String> = (0..1001).map(|i| format!("phrase {i}")).collect();
    let mut fields: Vec<(&str, &str)> = phrases.iter().map(|p| ("boost", p.as_str())).collect();
    fields.push(("response_format", "text"));
    let r = server.transcribe(&fields, Some(("a.wav", &wav)));
    r.assert_error(400, Some("boost"), "invalid_value");
    let big = "word ".repeat(20_000);
    let r = server.transcribe(&[("boost", &big)], Some(("a.wav", &wav)));
    r.assert_error(400, Some("boost"), "invalid_value");
    // Within the limits the request goes through.
    let r = server.transcribe(
        &[("boost", "the cat"), ("response_format", "text")],
        Some(("a.wav", &wav)),
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// SIGTERM finishes a live stream: the audio received becomes a last completed item (NeMo's
/// streaming text of the clip), a close frame says the server is going away, and the server
/// exits 0 within its deadline.
#[cfg(unix)]
#[test]
fn sigterm_completes_live_streams_and_closes_them() {
    use serde_json::json;
    use tungstenite::Message;
    let model = gguf(crate::live_nemo::MODEL, OutType::F32);
    let mut server = Server::start_with(&model, &["--threads", "1", "--shutdown-seconds", "20"]);
    let (mut ws, _) = tungstenite::connect(format!("ws://{}/v1/realtime", server.addr)).unwrap();
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_mut() {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    }
    crate::realtime::send_clip(&mut ws);
    let mut send = |v: Value| ws.send(Message::Text(v.to_string().into())).unwrap();
    // Events are handled in order: once this is answered, every append was heard.
    send(json!({"type": "session.update", "session": {}}));
    let events = |ws: &mut tungstenite::WebSocket<_>| loop {
        match ws.read() {
            Ok(Message::Text(t)) => return Ok(serde_json::from_str::<Value>(t.as_str()).unwrap()),
            Ok(Message::Close(frame)) => return Err(frame),
            Ok(_) => {}
            Err(e) => panic!("the server closed without a close frame: {e}"),
        }
    };
    let mut updates = 0;
    while updates < 2 {
        let e = events(&mut ws).expect("closed early");
        assert_ne!(e["type"], "error", "{e}");
        updates += usize::from(e["type"] == "session.updated");
    }
    sigterm(&server);
    let completed = loop {
        let e = events(&mut ws).expect("closed before the last item");
        if e["type"] == "conversation.item.input_audio_transcription.completed" {
            break e;
        }
        assert_ne!(e["type"], "error", "{e}");
    };
    let (_, nemo_final) = crate::live_nemo::nemo_texts("rnnt");
    assert_eq!(completed["transcript"], nemo_final.as_str());
    // The GA's item.done, then a close frame.
    let done = events(&mut ws).expect("closed before the item's done");
    assert_eq!(done["type"], "conversation.item.done", "{done}");
    assert_eq!(
        done["item"]["content"][0]["transcript"],
        nemo_final.as_str()
    );
    let frame = events(&mut ws)
        .expect_err("an event after the last item")
        .expect("a close frame with a code");
    assert_eq!(u16::from(frame.code), 1001, "{frame:?}");
    assert_eq!(exits_within(&mut server, Duration::from_secs(20)), Some(0));
}

/// The official `openai` package, as an application uses it, against our server:
/// `stream=True` transcription and both realtime dialects, every event validated with the
/// package's own models (tests/openai_client/check_events.py). Needs a Python with `openai` and
/// `websockets` (`PARAKEET_TEST_PYTHON`, else `python3`); without them the test says so and
/// passes, unless `PARAKEET_TEST_PYTHON` names the Python (CI's, which must run it).
/// Needs a Python with the `openai` and `websockets` packages, which a plain `cargo test`
/// cannot count on: ignored there (and listed as ignored), run by `.ci/run` with them.
#[test]
#[ignore = "needs Python with the openai package: PARAKEET_TEST_PYTHON=python cargo test -- --ignored"]
fn the_openai_package_validates_every_event_we_send() {
    let python = std::env::var("PARAKEET_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let model = gguf(crate::live_nemo::MODEL, OutType::F32);
    let server = Server::start_with(&model, &["--threads", "1"]);
    let wav = clip("speech_10s.wav");
    let r = upload(&server, &wav, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    let text = r.json()["text"].as_str().unwrap().to_string();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client/check_events.py");
    let out = match Command::new(&python)
        .arg(&script)
        .args(["--addr", &server.addr, "--wav", wav.to_str().unwrap()])
        .args(["--text", &text])
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!("cannot run {python} (set PARAKEET_TEST_PYTHON): {e}"),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(77),
        "{python} lacks the openai or websockets package: {stderr}"
    );
    assert!(
        out.status.success(),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `stream=true`: server-sent events, `transcript.text.delta`s that join to the text the same
/// request gives without streaming, then `transcript.text.done` with it.
#[test]
fn stream_true_answers_with_text_delta_events() {
    let server = Server::start(&["--workers", "1", "--threads", "2"]);
    let path = clip("speech_10s.wav");
    let plain = upload(&server, &path, &[]);
    let want = plain.json()["text"].as_str().unwrap().to_string();
    let r = upload(&server, &path, &[("stream", "true")]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.content_type.starts_with("text/event-stream"), "{r:?}");
    let events: Vec<Value> = r
        .body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").expect("a data line")).unwrap())
        .collect();
    let (done, deltas) = events.split_last().unwrap();
    assert_eq!(done["type"], "transcript.text.done", "{done}");
    assert_eq!(done["text"], want.as_str());
    assert!(deltas.len() > 1, "{events:?}");
    let joined: String = deltas
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "transcript.text.delta", "{e}");
            e["delta"].as_str().unwrap()
        })
        .collect();
    assert_eq!(joined, want);
    upload(&server, &path, &[("stream", "maybe")]).assert_error(
        400,
        Some("stream"),
        "invalid_value",
    );
    upload(
        &server,
        &path,
        &[("stream", "true"), ("response_format", "srt")],
    )
    .assert_error(400, Some("stream"), "invalid_value");
    // A field given twice, agreeing or not, is refused: no reading of the form settles it.
    for fields in [
        &[("stream", "true"), ("stream", "false")][..],
        &[("response_format", "json"), ("response_format", "json")][..],
    ] {
        let r = upload(&server, &path, fields);
        r.assert_error(400, Some(fields[0].0), "duplicate_field");
        assert!(r.body.contains("more than once"), "{r:?}");
    }
}

/// `serve --beam N` decodes every request by the beam search `transcribe --beam N` runs.
#[test]
fn serve_takes_the_beam_flags_as_transcribe_does() {
    let good = clip("speech_2s.wav");
    let out = cli_transcribe(&good, &["--beam", "4"]);
    let server = Server::start(&["--workers", "1", "--threads", "2", "--beam", "4"]);
    let r = upload(&server, &good, &[("response_format", "text")]);
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, &*String::from_utf8_lossy(&out.stdout))
    );
    let fields = [
        ("response_format", "verbose_json"),
        ("timestamp_granularities[]", "word"),
    ];
    let r = upload(&server, &good, &fields);
    assert_eq!(r.status, 200, "{r:?}");
    let words = r.json()["words"].as_array().unwrap().clone();
    assert!(
        !words.is_empty() && words.iter().all(|w| w.get("probability").is_none()),
        "{r:?}"
    );
}

/// `vad=true` transcribes only the speech, as `transcribe --vad` does; a bad value is a 400
/// naming the field.
#[test]
fn a_vad_field_transcribes_only_speech_like_the_cli() {
    let path = fixtures().join("vad/audio/speech_long_silence.wav");
    let out = Command::new(env!("CARGO_BIN_EXE_parakeet"))
        .args(["transcribe", "--vad", "-q", "-m"])
        .arg(model())
        .arg(&path)
        .env_remove("PARAKEET_MODEL")
        .output()
        .unwrap();
    assert!(out.status.success());
    let cli = String::from_utf8(out.stdout).unwrap();
    let server = Server::start(&["--workers", "1", "--threads", "2"]);
    let r = upload(
        &server,
        &path,
        &[("response_format", "text"), ("vad", "true")],
    );
    assert_eq!((r.status, r.body.as_str()), (200, cli.as_str()), "{r:?}");
    let plain = upload(&server, &path, &[("response_format", "text")]);
    assert_ne!(plain.body, r.body, "--vad changes nothing on this clip");
    upload(&server, &path, &[("vad", "maybe")]).assert_error(400, Some("vad"), "invalid_value");
}
