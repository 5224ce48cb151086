//! `parakeet serve` against in-process transcription (a benchmark, not a test).
//!
//! Start a server first, e.g. `parakeet serve -m MODEL --workers 1 --threads 2`, then:
//!
//! - `cargo run --release --example serve_bench -- overhead URL MODEL AUDIO [N] [THREADS]`:
//!   alternately, N times each (after one warm-up of each), transcribes AUDIO in this process
//!   (decode from memory, resample, transcribe: what a worker does) and through the server
//!   (`response_format=json`); prints both medians and their difference, the request overhead.
//!   THREADS (default 2) must match the server's threads per worker.
//! - `cargo run --release --example serve_bench -- throughput URL AUDIO [REQUESTS] [CLIENTS]`:
//!   REQUESTS uploads of AUDIO from CLIENTS concurrent clients; prints requests per second and
//!   seconds of audio per second.

use parakeet::audio;
use parakeet::session::{DecodeOptions, Session, Threads};
use std::path::Path;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    parakeet::backend::silence_ggml_logs();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    match args.first().map(String::as_str) {
        Some("overhead") if args.len() >= 4 => overhead(
            &args[1],
            Path::new(&args[2]),
            Path::new(&args[3]),
            arg(4, "20").parse()?,
            arg(5, "2").parse()?,
        ),
        Some("throughput") if args.len() >= 3 => throughput(
            &args[1],
            Path::new(&args[2]),
            arg(3, "16").parse()?,
            arg(4, "2").parse()?,
        ),
        _ => anyhow::bail!(
            "usage: serve_bench overhead URL MODEL AUDIO [N] [THREADS] | throughput URL AUDIO [REQUESTS] [CLIENTS]"
        ),
    }
}

fn multipart(file_name: &str, bytes: &[u8]) -> (String, Vec<u8>) {
    let boundary = "----serve-bench-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nparakeet\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// The answer, and the worker's own time on it (ms, from `x-worker-ms`).
fn post(url: &str, content_type: &str, body: &[u8]) -> anyhow::Result<(String, f64)> {
    let resp = ureq::post(&format!("{url}/v1/audio/transcriptions"))
        .set("Content-Type", content_type)
        .send_bytes(body)?;
    let worker_ms = resp
        .header("x-worker-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    Ok((resp.into_string()?, worker_ms))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn overhead(url: &str, model: &Path, path: &Path, n: usize, threads: usize) -> anyhow::Result<()> {
    let bytes = std::fs::read(path)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut session = Session::load(model, Threads::new(threads)?)?;
    let options = DecodeOptions::greedy(session.model())?;
    let (content_type, body) = multipart(&name, &bytes);
    let mut local = || -> anyhow::Result<String> {
        let decoded = audio::decode_bytes(&bytes, &name)?;
        let samples = audio::resample_to_16k(decoded)?;
        Ok(session.transcribe(samples, &options)?.text)
    };
    let text = local()?;
    let (remote, _) = post(url, &content_type, &body)?;
    let remote_text: serde_json::Value = serde_json::from_str(&remote)?;
    anyhow::ensure!(
        remote_text["text"] == text.trim(),
        "the server answered another text (another model?): {remote}"
    );
    let (mut t_local, mut t_remote, mut t_over) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        local()?;
        t_local.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let (_, worker_ms) = post(url, &content_type, &body)?;
        let total = t.elapsed().as_secs_f64() * 1e3;
        t_remote.push(total);
        t_over.push(total - worker_ms);
    }
    let (l, r) = (median(t_local.clone()), median(t_remote.clone()));
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!("{n} runs each, {threads} threads, {}", path.display());
    println!("in process: median {l:.1} ms (min {:.1})", min(&t_local));
    println!("HTTP:       median {r:.1} ms (min {:.1})", min(&t_remote));
    println!(
        "difference: median {:.1} ms, min-to-min {:.1} ms",
        r - l,
        min(&t_remote) - min(&t_local)
    );
    // Per request, the client's wait less the worker's decode + transcribe time: what HTTP,
    // multipart, the queue hand-off and rendering cost, free of the compute's variance.
    println!(
        "overhead per request (HTTP wait - x-worker-ms): median {:.2} ms, min {:.2} ms, max {:.2} ms",
        median(t_over.clone()),
        min(&t_over),
        t_over.iter().copied().fold(0.0, f64::max)
    );
    Ok(())
}

fn throughput(url: &str, path: &Path, requests: usize, clients: usize) -> anyhow::Result<()> {
    let bytes = std::fs::read(path)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let seconds = audio::decode_bytes(&bytes, &name)?.duration_s;
    let (content_type, body) = multipart(&name, &bytes);
    post(url, &content_type, &body)?; // warm-up
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..clients.max(1))
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                        post(url, &content_type, &body)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("client thread")?;
        }
        Ok(())
    })?;
    let wall = start.elapsed().as_secs_f64();
    println!(
        "{requests} requests of {seconds:.1} s audio, {clients} clients: {wall:.2} s, {:.2} requests/s, {:.1} s of audio per second",
        requests as f64 / wall,
        requests as f64 * seconds / wall
    );
    Ok(())
}
