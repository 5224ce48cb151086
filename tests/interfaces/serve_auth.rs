//! `parakeet serve`'s doors: the API key on every API route and the realtime socket (a
//! header, or a browser's subprotocol), 401 in OpenAI's shape, the origins allowed, the page
//! and its headers, `--no-ui`, and the warning for an exposed server without a key.

use crate::common::*;
use crate::serve::Server;
use parakeet::convert::OutType;
use serde_json::Value;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::http::{HeaderName, HeaderValue};

const KEY: &str = "sk-test_0123456789";

fn model() -> std::path::PathBuf {
    gguf("tiny_tdt", OutType::F32)
}

/// A response: status, the headers asked for, body.
struct Got {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// Asserts a 401 in OpenAI's shape with `code`.
    fn assert_unauthorized(&self, code: Option<&str>) {
        assert_eq!(self.status, 401, "{}", self.body);
        let e = &self.json()["error"];
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert_eq!(e["param"], Value::Null, "{e}");
        assert_eq!(e["code"], code.map_or(Value::Null, Value::from), "{e}");
        assert!(e["message"].as_str().unwrap().contains("API key"), "{e}");
        assert_eq!(self.header("www-authenticate"), Some("Bearer"));
    }
}

fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> Got {
    let mut r = ureq::request(method, url);
    for (k, v) in headers {
        r = r.set(k, v);
    }
    let resp = match r.call() {
        Ok(resp) => resp,
        Err(ureq::Error::Status(_, resp)) => resp,
        Err(e) => panic!("request failed: {e}"),
    };
    let names = resp.headers_names();
    Got {
        status: resp.status(),
        headers: names
            .iter()
            .filter_map(|n| resp.header(n).map(|v| (n.clone(), v.to_string())))
            .collect(),
        body: resp.into_string().unwrap(),
    }
}

fn get(server: &Server, path: &str, headers: &[(&str, &str)]) -> Got {
    request("GET", &format!("http://{}{path}", server.addr), headers)
}

/// Opens the realtime socket with `headers`; the handshake's status and, once open, the
/// first event and the subprotocol the server chose.
fn socket(server: &Server, headers: &[(&str, &str)]) -> Result<(Value, Option<String>), u16> {
    let mut req = format!("ws://{}/v1/realtime", server.addr)
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        let name = HeaderName::from_bytes(k.as_bytes()).unwrap();
        req.headers_mut()
            .insert(name, HeaderValue::from_str(v).unwrap());
    }
    match tungstenite::connect(req) {
        Ok((mut ws, resp)) => {
            let protocol = resp
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().unwrap().to_string());
            let first = loop {
                if let tungstenite::Message::Text(t) = ws.read().unwrap() {
                    break serde_json::from_str(t.as_str()).unwrap();
                }
            };
            Ok((first, protocol))
        }
        Err(tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("handshake failed: {e}"),
    }
}

#[test]
fn every_api_route_and_the_socket_need_the_key() {
    let server = Server::start_with(&model(), &["--api-key", KEY]);
    let bearer = format!("Bearer {KEY}");
    // No key, a wrong key, a key not in Bearer auth.
    get(&server, "/v1/models", &[]).assert_unauthorized(None);
    get(
        &server,
        "/v1/models",
        &[("Authorization", "Bearer sk-wrong")],
    )
    .assert_unauthorized(Some("invalid_api_key"));
    get(&server, "/v1/models", &[("Authorization", KEY)])
        .assert_unauthorized(Some("invalid_api_key"));
    get(&server, "/v1/models/tiny", &[]).assert_unauthorized(None);
    get(&server, "/ui/info", &[]).assert_unauthorized(None);
    let post = request(
        "POST",
        &format!("http://{}/v1/audio/transcriptions", server.addr),
        &[],
    );
    post.assert_unauthorized(None);
    // The right key, in any case of the scheme.
    let models = get(&server, "/v1/models", &[("Authorization", &bearer)]);
    assert_eq!(models.status, 200, "{}", models.body);
    let lower = format!("bearer {KEY}");
    assert_eq!(
        get(&server, "/v1/models", &[("Authorization", &lower)]).status,
        200
    );
    let info = get(&server, "/ui/info", &[("Authorization", &bearer)]).json();
    assert_eq!(info["model"], models.json()["data"][0]["id"]);
    assert!(
        info["device"].as_str().unwrap().starts_with("CPU"),
        "{info}"
    );
    assert_eq!(info["diarization"], false);
    // Without the key the health check says only that the server is up.
    let health = get(&server, "/health", &[]).json();
    assert_eq!(health, serde_json::json!({"status": "ok"}));
    let health = get(&server, "/health", &[("Authorization", &bearer)]).json();
    assert!(health.get("workers").is_some(), "{health}");
    // The page itself needs no key: it asks for one.
    let page = get(&server, "/", &[]);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"key-form\""));

    // The socket: refused without the key or with a wrong one, in the header or the
    // subprotocol; taken with either, and a browser's subprotocol is answered `realtime`.
    assert_eq!(socket(&server, &[]).unwrap_err(), 401);
    assert_eq!(
        socket(&server, &[("Authorization", "Bearer nope")]).unwrap_err(),
        401
    );
    let wrong = "realtime, openai-insecure-api-key.nope";
    assert_eq!(
        socket(&server, &[("Sec-WebSocket-Protocol", wrong)]).unwrap_err(),
        401
    );
    let (first, protocol) = socket(&server, &[("Authorization", &bearer)]).unwrap();
    assert_eq!(first["type"], "session.created", "{first}");
    assert_eq!(protocol, None);
    let offered = format!("realtime, openai-insecure-api-key.{KEY}, openai-beta.realtime-v1");
    let (first, protocol) = socket(&server, &[("Sec-WebSocket-Protocol", &offered)]).unwrap();
    // The beta subprotocol names the beta dialect, as the OpenAI-Beta header does.
    assert_eq!(first["type"], "transcription_session.created", "{first}");
    assert_eq!(protocol.as_deref(), Some("realtime"));
    // The log names each refusal.
    let log = server.log_until("never", Duration::from_millis(500));
    assert!(
        log.iter()
            .any(|l| l.contains("refused GET /v1/models: 401")),
        "{log:?}"
    );
}

#[test]
fn the_key_comes_from_the_environment_or_a_file_and_a_bad_one_is_refused() {
    let dir = scratch_dir("serve_auth", "key-file");
    let file = dir.join("key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    let server = Server::start_with(&model(), &["--api-key-file", file.to_str().unwrap()]);
    get(&server, "/v1/models", &[]).assert_unauthorized(None);
    let bearer = format!("Bearer {KEY}");
    assert_eq!(
        get(&server, "/v1/models", &[("Authorization", &bearer)]).status,
        200
    );
    drop(server);
    let m = model();
    let m = m.to_str().unwrap();
    let mut command = parakeet_command(&["serve", "-m", m, "--port", "0"], &dir);
    command.env("PARAKEET_API_KEY", "sk-env");
    let mut child = command
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The environment's key is required: poll until the server answers.
    let stderr = child.stderr.take().unwrap();
    let addr = listening_address(stderr);
    let got = request("GET", &format!("http://{addr}/v1/models"), &[]);
    got.assert_unauthorized(None);
    let got = request(
        "GET",
        &format!("http://{addr}/v1/models"),
        &[("Authorization", "Bearer sk-env")],
    );
    assert_eq!(got.status, 200);
    let _ = child.kill();
    let _ = child.wait();

    // A key that cannot travel in a header, an empty key file, a missing one, a bad origin:
    // exit 2 with the flag named, before any model loads.
    let empty = dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = dir.join("missing");
    for (args, says) in [
        (
            vec!["--api-key", "two words"],
            "--api-key: the API key holds ' '",
        ),
        (
            vec!["--api-key-file", empty.to_str().unwrap()],
            "the API key is empty",
        ),
        (
            vec!["--api-key-file", missing.to_str().unwrap()],
            "--api-key-file",
        ),
        (
            vec!["--allow-origin", "example.com"],
            "--allow-origin \"example.com\" is not an origin",
        ),
    ] {
        let out = run_parakeet(
            &[&["serve", "-m", m, "--port", "0"][..], &args].concat(),
            &dir,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// The address a starting server prints; its stderr is read to the end on a thread (a
/// closed pipe would fail the server's next log line).
fn listening_address(stderr: std::process::ChildStderr) -> String {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(at) = line.find("listening on http://") {
                let _ = tx.send(line[at + "listening on http://".len()..].trim().to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the server did not start")
}

#[test]
fn cross_origin_requests_are_refused_unless_allowed() {
    let app = "http://app.example.test";
    let server = Server::start_with(&model(), &["--allow-origin", app]);
    let own = format!("http://{}", server.addr);
    // The page's own origin, and none (a program), pass.
    assert_eq!(get(&server, "/v1/models", &[("Origin", &own)]).status, 200);
    assert_eq!(get(&server, "/v1/models", &[]).status, 200);
    // Another origin: 403 in OpenAI's shape, the socket too.
    let evil = get(&server, "/v1/models", &[("Origin", "http://evil.test")]);
    assert_eq!(evil.status, 403, "{}", evil.body);
    assert_eq!(evil.json()["error"]["code"], "origin_not_allowed");
    assert!(
        evil.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allow-origin http://evil.test")
    );
    assert_eq!(evil.header("access-control-allow-origin"), None);
    assert_eq!(
        socket(&server, &[("Origin", "http://evil.test")]).unwrap_err(),
        403
    );
    assert!(socket(&server, &[("Origin", &own)]).is_ok());
    // The allowed origin: its preflight is answered, its responses carry the CORS headers.
    let preflight = request(
        "OPTIONS",
        &format!("http://{}/v1/audio/transcriptions", server.addr),
        &[
            ("Origin", app),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization"),
        ],
    );
    assert_eq!(preflight.status, 204);
    assert_eq!(preflight.header("access-control-allow-origin"), Some(app));
    assert!(
        preflight
            .header("access-control-allow-headers")
            .unwrap()
            .contains("authorization")
    );
    let allowed = get(&server, "/v1/models", &[("Origin", app)]);
    assert_eq!(allowed.status, 200);
    assert_eq!(allowed.header("access-control-allow-origin"), Some(app));
    assert!(socket(&server, &[("Origin", app)]).is_ok());
}

#[test]
fn the_page_has_its_headers_and_no_ui_turns_it_off() {
    let server = Server::start_with(&model(), &[]);
    let page = get(&server, "/", &[]);
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("default-src 'none'"), "{csp}");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    // Nothing the page loads comes from elsewhere.
    for asset in [
        "/ui/app.js",
        "/ui/app.css",
        "/ui/capture.js",
        "/ui/icon.svg",
    ] {
        let got = get(&server, asset, &[]);
        assert_eq!(got.status, 200, "{asset}");
        assert!(
            !got.body.contains("https://"),
            "{asset} names another origin"
        );
    }
    assert!(!page.body.contains("https://") && !page.body.contains("http://"));
    // Without a key on loopback, no warning.
    let log = server.log_until("never", Duration::from_millis(300));
    assert!(!log.iter().any(|l| l.contains("warning")), "{log:?}");
    drop(server);

    let server = Server::start_with(&model(), &["--no-ui"]);
    assert_eq!(get(&server, "/", &[]).status, 404);
    assert_eq!(get(&server, "/ui/app.js", &[]).status, 404);
    assert_eq!(get(&server, "/ui/info", &[]).status, 404);
    assert_eq!(get(&server, "/v1/models", &[]).status, 200);
}

#[test]
fn an_exposed_address_without_a_key_is_warned_about() {
    let server = Server::start_with(&model(), &["--host", "0.0.0.0"]);
    let log = server.log_until("warning", Duration::from_secs(5));
    assert!(
        log.iter()
            .any(|l| l.contains("warning") && l.contains("without an API key")),
        "{log:?}"
    );
    drop(server);
    let server = Server::start_with(&model(), &["--host", "0.0.0.0", "--api-key", KEY]);
    let log = server.log_until("warning", Duration::from_millis(500));
    assert!(!log.iter().any(|l| l.contains("warning")), "{log:?}");
}

/// The key compare takes as long for a guess wrong in its first byte as for one wrong in its
/// last: a compare that stopped at the first difference would be many times faster for the
/// first (4096-byte keys, the fastest of many runs each, so that a busy machine only slows
/// both).
#[test]
fn the_key_compare_takes_the_same_time_wherever_a_guess_differs() {
    use parakeet::server::auth::keys_match;
    let key = vec![b'k'; 4096];
    let mut first = key.clone();
    first[0] = b'x';
    let mut last = key.clone();
    last[4095] = b'x';
    let fastest = |guess: &[u8]| {
        (0..2000)
            .map(|_| {
                let t = Instant::now();
                assert!(!keys_match(std::hint::black_box(guess), &key));
                t.elapsed()
            })
            .min()
            .unwrap()
    };
    // Interleaved, so that a change in the machine's load falls on both.
    let (mut a, mut b) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        a = a.min(fastest(&first));
        b = b.min(fastest(&last));
    }
    let ratio = a.as_secs_f64() / b.as_secs_f64();
    assert!(
        (0.5..2.0).contains(&ratio),
        "wrong first byte {a:?}, wrong last byte {b:?}: ratio {ratio:.2}"
    );
    assert!(keys_match(&key, &key));
}
