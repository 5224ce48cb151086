//! `--model owner/name`: the hub path, against a local HTTP server that serves a reference
//! `.nemo` in the hub's URL layout (`HF_ENDPOINT` points the client at it). No other network.

use crate::common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const REPO: &str = "nvidia/parakeet-tiny-test";
const FILE: &str = "parakeet-tiny-test.nemo";
const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// Serves the repo info and the file (with Range support); counts file downloads.
fn serve(body: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let downloads = Arc::new(AtomicUsize::new(0));
    let counter = downloads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let mut range = None;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if request.is_empty() {
                    request = line.clone();
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = v.trim().split_once('-').unwrap();
                    let a: usize = a.parse().unwrap();
                    let b: usize = if b.is_empty() {
                        body.len() - 1
                    } else {
                        b.parse().unwrap()
                    };
                    range = Some((a, b.min(body.len() - 1)));
                }
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            let info_path = format!("/api/models/{REPO}/revision/main");
            let file_path = format!("/{REPO}/resolve/main/{FILE}");
            let response = if path == info_path {
                let json = format!(
                    r#"{{"sha":"{SHA}","siblings":[{{"rfilename":"README.md"}},{{"rfilename":"{FILE}"}}]}}"#
                );
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    json.len()
                )
                .into_bytes();
                r.extend(json.as_bytes());
                r
            } else if path == file_path {
                let (a, b) = range.unwrap_or((0, body.len() - 1));
                if b > a {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                let mut r = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{b}/{}\r\nETag: \"nemo-etag-1\"\r\nX-Repo-Commit: {SHA}\r\nConnection: close\r\n\r\n",
                    b + 1 - a,
                    body.len()
                )
                .into_bytes();
                r.extend(&body[a..=b]);
                r
            } else {
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            };
            let _ = stream.write_all(&response);
        }
    });
    (format!("http://{addr}"), downloads)
}

fn run(endpoint: &str, home: &Path, model: &str) -> std::process::Output {
    let clip = reference("").join("speech_2s.wav");
    Command::new(env!("CARGO_BIN_EXE_parakeet"))
        .args(["transcribe", clip.to_str().unwrap(), "-m", model])
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", home.join("hf"))
        .env("PARAKEET_CACHE", home.join("cache"))
        .env("GGML_NO_BACKTRACE", "1")
        .output()
        .unwrap()
}

#[test]
fn hub_id_is_downloaded_converted_and_cached_once() {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hub-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let (endpoint, downloads) = serve(std::fs::read(nemo("tiny_tdt")).unwrap());
    let nemo_text = json(&reference("tiny_tdt_2s").join("result.json"))["greedy_batch"]["text"]
        .as_str()
        .unwrap()
        .to_string();

    let first = run(&endpoint, &home, REPO);
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&first.stdout).trim_end(), nemo_text);
    assert!(
        err.contains("fetching") && err.contains("converting"),
        "{err}"
    );
    assert_eq!(downloads.load(Ordering::SeqCst), 1);
    // The checkpoint sits in the hub's standard cache layout.
    let hub_copy = home
        .join("hf/hub/models--nvidia--parakeet-tiny-test/snapshots")
        .join(SHA)
        .join(FILE);
    assert!(hub_copy.exists(), "{}", hub_copy.display());

    let second = run(&endpoint, &home, REPO);
    assert!(second.status.success());
    assert_eq!(second.stdout, first.stdout);
    assert_eq!(
        downloads.load(Ordering::SeqCst),
        1,
        "second run downloaded again"
    );
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!err.contains("converting"), "{err}");

    let missing = run(&endpoint, &home, "nvidia/no-such-model");
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("nvidia/no-such-model"), "{err}");
}
