//! Per-chunk latency of cache-aware streaming (a benchmark, not a test): the audio is fed one
//! chunk's worth of samples at a time, as a live source would, and every `accept` that ran a
//! chunk is timed (mel frames, the encoder graph of the chunk, the decoder steps).
//!
//! Run: `cargo run --release --example bench_stream -- MODEL AUDIO [L,R] [THREADS] [ctc]`
//! (MODEL a .gguf or a .nemo; L,R one of the model's lookaheads, its default when absent;
//! THREADS defaults to 2). Prints p50 / p95 / max per chunk and the real-time factor; when
//! the first chunk's result and the first partial come (audio fed in 10 ms pieces: the audio
//! time plus that call's compute), against the latency bound; for audio over 10 minutes, the
//! per-chunk times of every 10 minutes and VmRSS after minute 1 and at the end.

use anyhow::{Context, Result, bail};
use parakeet::audio::{load_audio, resample_to_16k};
use parakeet::session::{DecoderChoice, Session};
use parakeet::stream::{CacheAwareConfig, CacheAwareStream, LiveTranscriber, StreamEvent};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        bail!("usage: bench_stream MODEL AUDIO [L,R] [THREADS] [ctc]");
    }
    let model =
        parakeet::model_source::resolve(&PathBuf::from(&args[0]), &mut |m| eprintln!("{m}"))?;
    let samples = resample_to_16k(load_audio(&PathBuf::from(&args[1]))?)?;
    let att_context = match args.get(2) {
        Some(s) => {
            let (l, r) = s.split_once(',').context("L,R")?;
            Some([l.trim().parse()?, r.trim().parse()?])
        }
        None => None,
    };
    let threads: usize = args.get(3).map_or(Ok(2), |t| t.parse())?;
    let decoder = match args.get(4).map(String::as_str) {
        Some("ctc") => DecoderChoice::Ctc,
        _ => DecoderChoice::Auto,
    };
    let session = Session::load(&model, threads)?;
    let config = CacheAwareConfig {
        att_context,
        decoder,
        record_chunks: false,
    };
    let mut stream = CacheAwareStream::new(session, config)?;
    let rate = f64::from(stream.sample_rate());
    let piece = (stream.chunk_seconds() * rate).round() as usize;
    let p = *stream.params();
    // One untimed pass readies the compute buffer for both chunk shapes.
    stream.accept(&samples[..samples.len().min(3 * piece)])?;
    stream.finish()?;
    let first = first_results(&mut stream, &samples)?;

    let mut chunk_ms = Vec::new();
    // The process's CPU time per chunk: the work a chunk costs, whatever else runs on the
    // machine (all threads, a spinning one included).
    let mut chunk_cpu_ms = Vec::new();
    // Per-chunk times of each window of `WINDOW_S` of audio, and VmRSS after the first minute.
    let mut windows: Vec<Vec<f64>> = Vec::new();
    let mut rss_minute_1 = None;
    let start = Instant::now();
    for (i, part) in samples.chunks(piece).enumerate() {
        let (t, cpu) = (Instant::now(), cpu_ms());
        let events = stream.accept(part)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let cpu = cpu_ms() - cpu;
        let fed_s = ((i + 1) * piece) as f64 / rate;
        // A piece may not complete a chunk (the first chunk is shorter than a shift).
        if i > 0 || !events.is_empty() {
            chunk_ms.push(ms);
            chunk_cpu_ms.push(cpu);
            let w = (fed_s / WINDOW_S) as usize;
            windows.resize_with(windows.len().max(w + 1), Vec::new);
            windows[w].push(ms);
        }
        if rss_minute_1.is_none() && fed_s >= 60.0 {
            rss_minute_1 = rss_kb("VmRSS");
        }
    }
    let rss_end = rss_kb("VmRSS");
    let events = stream.finish()?;
    let total = start.elapsed().as_secs_f64();
    let text = events.iter().find_map(|e| match e {
        StreamEvent::Final(u) => Some(u.text.clone()),
        _ => None,
    });
    let audio_s = samples.len() as f64 / rate;
    println!(
        "att_context [{}, {}]: chunk {:.0} ms, {threads} threads, {} chunks",
        p.att_context[0],
        p.att_context[1],
        stream.chunk_seconds() * 1e3,
        chunk_ms.len()
    );
    let (p50, p95, max) = percentiles(&mut chunk_ms);
    println!(
        "per chunk: p50 {p50:.2} ms, p95 {p95:.2} ms, max {max:.2} ms; real-time factor {:.4}",
        total / audio_s
    );
    let (c50, c95, cmax) = percentiles(&mut chunk_cpu_ms);
    println!("process CPU time per chunk: p50 {c50:.2} ms, p95 {c95:.2} ms, max {cmax:.2} ms");
    let first_chunk_s = p.chunk_size[0] as f64 * stream.chunk_seconds() / p.shift_size[1] as f64;
    println!(
        "first chunk ({:.0} ms of features, its lookahead included): result {:.1} ms after \
         the first sample ({:.0} ms of audio fed + {:.2} ms compute); bound chunk + lookahead \
         + one chunk's compute = {:.0} + {:.2} = {:.1} ms",
        first_chunk_s * 1e3,
        first.chunk_fed_s * 1e3 + first.chunk_compute_ms,
        first.chunk_fed_s * 1e3,
        first.chunk_compute_ms,
        stream.chunk_seconds() * 1e3,
        p50,
        stream.chunk_seconds() * 1e3 + p50,
    );
    if let Some((fed_s, compute_ms, token_s)) = first.partial {
        println!(
            "first partial: {:.1} ms after the first sample ({:.0} ms of audio fed + {:.2} ms \
             compute); its first token's frame ends at {:.0} ms of audio",
            fed_s * 1e3 + compute_ms,
            fed_s * 1e3,
            compute_ms,
            token_s * 1e3
        );
    }
    if windows.len() > 1 {
        for (w, times) in windows.iter_mut().enumerate() {
            if times.is_empty() {
                continue;
            }
            let (p50, p95, max) = percentiles(times);
            println!(
                "minutes {:>3}-{:<3}: {} chunks, p50 {p50:.2} ms, p95 {p95:.2} ms, max {max:.2} ms",
                w as f64 * WINDOW_S / 60.0,
                ((w + 1) as f64 * WINDOW_S / 60.0)
                    .min(audio_s / 60.0)
                    .ceil(),
                times.len()
            );
        }
    }
    if let (Some(a), Some(b)) = (rss_minute_1, rss_end) {
        println!(
            "VmRSS: {:.1} MB after minute 1, {:.1} MB at the end ({:+.1} MB); VmHWM {:.1} MB",
            a as f64 / 1024.0,
            b as f64 / 1024.0,
            (b as f64 - a as f64) / 1024.0,
            rss_kb("VmHWM").unwrap_or(0) as f64 / 1024.0
        );
    }
    let text = text.unwrap_or_default();
    let shown: String = text.chars().take(200).collect();
    println!("final ({} chars): {shown}", text.chars().count());
    Ok(())
}

/// Audio per window of the long-stream report (10 minutes).
const WINDOW_S: f64 = 600.0;

/// p50, p95 and max of `ms` (sorted in place).
fn percentiles(ms: &mut [f64]) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95), at(1.0))
}

/// The process's CPU time so far (every thread), ms.
fn cpu_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// A `/proc/self/status` field in kB (Linux).
fn rss_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// When the first results come (within the first minute), the audio fed in 10 ms pieces as a
/// live source does.
struct FirstResults {
    /// Audio fed when the first chunk ran, and that `accept`'s compute.
    chunk_fed_s: f64,
    chunk_compute_ms: f64,
    /// Audio fed when the first partial came, that `accept`'s compute, and where (in audio
    /// time) the partial's first token's frame ends.
    partial: Option<(f64, f64, f64)>,
}

fn first_results(stream: &mut CacheAwareStream, samples: &[f32]) -> Result<FirstResults> {
    let rate = f64::from(stream.sample_rate());
    let piece = (rate / 100.0) as usize;
    let frame_s = stream.chunk_seconds() / stream.params().valid_out_len as f64;
    let mut first = FirstResults {
        chunk_fed_s: f64::NAN,
        chunk_compute_ms: f64::NAN,
        partial: None,
    };
    let mut fed = 0;
    // The first minute at most: a model that stays silent (random weights) is not waited for.
    let head = &samples[..samples.len().min(60 * stream.sample_rate() as usize)];
    for part in head.chunks(piece) {
        fed += part.len();
        let frames_before = stream.frames_done();
        let t = Instant::now();
        let events = stream.accept(part)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let fed_s = fed as f64 / rate;
        if first.chunk_fed_s.is_nan() && stream.frames_done() > frames_before {
            first.chunk_fed_s = fed_s;
            first.chunk_compute_ms = ms;
        }
        let partial = events.iter().find_map(|e| match e {
            StreamEvent::Partial(u) => Some(u),
            _ => None,
        });
        if let Some(u) = partial {
            let token_s = u
                .tokens
                .first()
                .map_or(0.0, |t| (t.frame + 1) as f64 * frame_s);
            first.partial = Some((fed_s, ms, token_s));
            break;
        }
    }
    stream.finish()?;
    Ok(first)
}
