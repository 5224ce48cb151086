//! Per-chunk cost of buffered streaming of an offline model (a benchmark, not a test): the
//! audio is fed one chunk at a time, as a live source would, and every step is timed (the
//! buffer's features, its encoder pass, the decoding), wall and process CPU time.
//!
//! Run: `cargo run --release --example bench_buffered -- MODEL AUDIO [CHUNK,LEFT,RIGHT]
//! [THREADS] [ctc]` (MODEL a .gguf or a .nemo; seconds, NeMo's 4.8,1.6,1.6 when absent;
//! THREADS defaults to 2). Prints p50 / p95 / max per chunk, the real-time factor (a chunk's
//! work over its audio), the stage split and VmRSS after the first steps and at the end (flat
//! over a long stream).

#[path = "common/cpu_time.rs"]
mod cpu_time;

use anyhow::{Context, Result, bail};
use cpu_time::cpu_seconds;
use parakeet::audio::{load_audio, resample_to_16k};
use parakeet::session::{DecoderChoice, Session};
use parakeet::stream::{BufferedConfig, BufferedStream, LiveTranscriber};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        bail!("usage: bench_buffered MODEL AUDIO [CHUNK,LEFT,RIGHT] [THREADS] [ctc]");
    }
    let model =
        parakeet::model_source::resolve(&PathBuf::from(&args[0]), &mut |m| eprintln!("{m}"))?;
    let samples = resample_to_16k(load_audio(&PathBuf::from(&args[1]))?)?;
    let mut config = BufferedConfig::default();
    if let Some(s) = args.get(2) {
        let v: Vec<f64> = s
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<Result<_, _>>()
            .context("CHUNK,LEFT,RIGHT in seconds")?;
        let [c, l, r] = v[..] else {
            bail!("CHUNK,LEFT,RIGHT: three numbers");
        };
        (config.chunk_secs, config.left_secs, config.right_secs) = (c, l, r);
    }
    let threads: usize = args.get(3).map_or(Ok(2), |t| t.parse())?;
    if args.get(4).map(String::as_str) == Some("ctc") {
        config.decoder = DecoderChoice::Ctc;
    }
    let session = Session::load(&model, parakeet::session::Threads::new(threads)?)?;
    let t = Instant::now();
    let mut stream = BufferedStream::new(session, config.clone())?;
    let setup_ms = t.elapsed().as_secs_f64() * 1e3;
    let rate = f64::from(stream.sample_rate());
    let piece = (config.chunk_secs * rate).round() as usize;
    // One untimed step readies the compute buffer.
    stream.accept(&samples[..samples.len().min(piece)])?;
    stream.finish()?;

    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    let (mut features, mut encoder, mut decoder, mut tokens) = (0.0, 0.0, 0.0, 0);
    let mut rss_early = None;
    for (i, part) in samples.chunks(piece).enumerate() {
        if part.len() < piece {
            break;
        }
        let (t, c) = (Instant::now(), cpu_seconds());
        stream.accept(part)?;
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push((cpu_seconds() - c) * 1e3);
        let st = stream.last_step_times();
        features += st.features.as_secs_f64() * 1e3;
        encoder += st.encoder.as_secs_f64() * 1e3;
        decoder += st.decoder.as_secs_f64() * 1e3;
        tokens += st.tokens;
        if i == 4 {
            rss_early = rss_kb("VmRSS");
        }
    }
    stream.finish()?;
    let n = wall.len();
    if n == 0 {
        bail!("the audio is shorter than one chunk");
    }
    let chunk_ms = config.chunk_secs * 1e3;
    let (p50, p95, max) = percentiles(&mut wall);
    let (c50, _, _) = percentiles(&mut cpu);
    let s = stream.sizes();
    println!(
        "{}: chunk {} s, left {} s, right {} s ({} encoder frames a buffer), {threads} threads, {n} chunks",
        model.display(),
        config.chunk_secs,
        config.left_secs,
        config.right_secs,
        s.buffer_frames
    );
    println!(
        "per chunk: p50 {p50:.1} ms, p95 {p95:.1} ms, max {max:.1} ms (CPU p50 {c50:.1} ms); \
         RTF p50 {:.3}, max {:.3}",
        p50 / chunk_ms,
        max / chunk_ms
    );
    println!(
        "stages (mean): features {:.1} ms, encoder {:.1} ms, decoder {:.1} ms ({:.1} tokens a \
         step); setup (zero buffer) {setup_ms:.1} ms",
        features / n as f64,
        encoder / n as f64,
        decoder / n as f64,
        tokens as f64 / n as f64
    );
    // A live source delivers a chunk's last sample, then the step runs: its events come a
    // step's work later; the chunk's own audio ended a right context before that sample.
    let right_ms = config.right_secs * 1e3;
    println!(
        "latency to a step's events: after its newest sample p50 {p50:.0} ms, max {max:.0} ms; \
         after the end of the audio it commits (+ right context) p50 {:.0} ms, max {:.0} ms",
        p50 + right_ms,
        max + right_ms
    );
    if let (Some(a), Some(b)) = (rss_early, rss_kb("VmRSS")) {
        println!(
            "VmRSS after 5 chunks {} MB, at the end {} MB",
            a / 1024,
            b / 1024
        );
    }
    Ok(())
}

/// p50, p95 and max of `ms` (sorted in place).
fn percentiles(ms: &mut [f64]) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95), at(1.0))
}

/// A `/proc/self/status` field in kB (Linux).
fn rss_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
