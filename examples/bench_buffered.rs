//! Per-chunk cost of buffered streaming of an offline model (a benchmark, not a test): the
//! audio is fed one chunk at a time, as a live source would, and every step is timed (the
//! buffer's features, its encoder pass, the decoding), wall and process CPU time.
//!
//! Run: `cargo run --release --example bench_buffered -- MODEL AUDIO [CHUNK,LEFT,RIGHT ...]
//! [THREADS] [ctc]` (MODEL a .gguf or a .nemo; seconds; THREADS defaults to 2). Without sizes
//! it runs NeMo's default (4.8,1.6,1.6: an 8 s buffer) and a 1.6 s chunk (1.6,1.6,1.6); several
//! sizes are separated by spaces. For each it prints the step's wall time (p50, p90, p95, max)
//! and CPU time, the real-time factor (a step's wall time over its chunk's audio), the stage
//! split, the latency from the end of a chunk's audio to the event of the step that commits it
//! on a live source's clock, and VmRSS after the first steps and at the end (flat over a long
//! stream).

#[path = "common/cpu_time.rs"]
mod cpu_time;

use anyhow::{Context, Result, bail};
use cpu_time::cpu_seconds;
use parakeet::audio::{load_audio, resample_to_16k};
use parakeet::session::{DecoderChoice, Session, Threads};
use parakeet::stream::{BufferedConfig, BufferedStream, LiveTranscriber};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: bench_buffered MODEL AUDIO [CHUNK,LEFT,RIGHT ...] [THREADS] [ctc]";
    if args.len() < 2 {
        bail!("{usage}");
    }
    let model =
        parakeet::model_source::resolve(&PathBuf::from(&args[0]), &mut |m| eprintln!("{m}"))?;
    let samples = resample_to_16k(load_audio(&PathBuf::from(&args[1]))?)?;
    let mut sizes = Vec::new();
    let mut threads = 2;
    let mut decoder = DecoderChoice::Auto;
    for a in &args[2..] {
        if a == "ctc" {
            decoder = DecoderChoice::Ctc;
        } else if a.contains(',') {
            let v: Vec<f64> = a
                .split(',')
                .map(|x| x.trim().parse())
                .collect::<Result<_, _>>()
                .with_context(|| format!("{a}: CHUNK,LEFT,RIGHT in seconds"))?;
            let [c, l, r] = v[..] else {
                bail!("{a}: CHUNK,LEFT,RIGHT, three numbers");
            };
            sizes.push((c, l, r));
        } else {
            threads = a.parse().with_context(|| format!("{a}: {usage}"))?;
        }
    }
    if sizes.is_empty() {
        sizes = vec![(4.8, 1.6, 1.6), (1.6, 1.6, 1.6)];
    }
    println!(
        "{}, {:.1} s of audio, {threads} threads",
        model.display(),
        samples.len() as f64 / 16000.0
    );
    for (chunk_secs, left_secs, right_secs) in sizes {
        let config = BufferedConfig {
            chunk_secs,
            left_secs,
            right_secs,
            decoder,
            ..BufferedConfig::default()
        };
        bench(&model, &samples, config, threads)?;
    }
    Ok(())
}

/// One stream over `samples` at `config`, printed.
fn bench(model: &Path, samples: &[f32], config: BufferedConfig, threads: usize) -> Result<()> {
    let session = Session::load(model, Threads::new(threads)?)?;
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
    let mut with_events = Vec::new();
    let mut rss_early = None;
    for (i, part) in samples.chunks(piece).enumerate() {
        if part.len() < piece {
            break;
        }
        let (t, c) = (Instant::now(), cpu_seconds());
        let events = stream.accept(part)?;
        wall.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push((cpu_seconds() - c) * 1e3);
        // A step runs once its request is known not to be the last (the first sample after
        // it): that is the accept of the next chunk, which ran the previous chunk's step.
        with_events.push(!events.is_empty());
        if i == 0 {
            continue;
        }
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
    // The first accept only filled the first request: its time is no step's.
    if wall.len() < 2 {
        bail!("the audio is shorter than two chunks");
    }
    wall.remove(0);
    cpu.remove(0);
    with_events.remove(0);
    let n = wall.len();
    let chunk_ms = config.chunk_secs * 1e3;
    let right_ms = config.right_secs * 1e3;
    let latency = live_latency(&wall, &with_events, chunk_ms, right_ms);
    let s = stream.sizes();
    println!(
        "chunk {} s, left {} s, right {} s ({} encoder frames a buffer), {n} steps:",
        config.chunk_secs, config.left_secs, config.right_secs, s.buffer_frames
    );
    let mut sorted = wall.clone();
    let w = Percentiles::of(&mut sorted);
    let c = Percentiles::of(&mut cpu);
    println!(
        "  step wall: p50 {:.1} ms, p90 {:.1} ms, p95 {:.1} ms, max {:.1} ms (CPU p50 {:.1} ms, \
         p90 {:.1} ms)",
        w.p50, w.p90, w.p95, w.max, c.p50, c.p90
    );
    println!(
        "  real-time factor (step wall / {chunk_ms:.0} ms chunk): p50 {:.3}, p90 {:.3}, max {:.3}",
        w.p50 / chunk_ms,
        w.p90 / chunk_ms,
        w.max / chunk_ms
    );
    println!(
        "  stages (mean): features {:.1} ms, encoder {:.1} ms, decoder {:.1} ms ({:.1} tokens a \
         step); setup (zero buffer) {setup_ms:.1} ms",
        features / n as f64,
        encoder / n as f64,
        decoder / n as f64,
        tokens as f64 / n as f64
    );
    match latency {
        Some(mut l) => {
            let count = l.len();
            let l = Percentiles::of(&mut l);
            println!(
                "  latency, end of a chunk's audio to its step's event (right context {right_ms:.0} \
                 ms + waiting + step, live clock, {count} steps with events): p50 {:.0} ms, p90 \
                 {:.0} ms, max {:.0} ms",
                l.p50, l.p90, l.max
            );
        }
        None => println!("  latency: no step gave an event"),
    }
    if let (Some(a), Some(b)) = (rss_early, rss_kb("VmRSS")) {
        println!(
            "  VmRSS after 5 chunks {} MB, at the end {} MB",
            a / 1024,
            b / 1024
        );
    }
    Ok(())
}

/// The latency of each step that gave events, on a live source's clock: step `i` may start
/// when chunk `i`'s audio has arrived, `(i + 1)` chunks after the stream's start (its first
/// sample after the one measured: a step waits for the next sample), or when the step before
/// it is done, whichever is later; the audio it commits ends a right context before that, so
/// the latency is the right context, the wait for the step before, and the step itself.
fn live_latency(
    wall: &[f64],
    with_events: &[bool],
    chunk_ms: f64,
    right_ms: f64,
) -> Option<Vec<f64>> {
    let mut done = 0.0f64;
    let mut latency = Vec::new();
    for (i, (&w, &events)) in wall.iter().zip(with_events).enumerate() {
        let arrived = (i + 1) as f64 * chunk_ms;
        done = done.max(arrived) + w;
        if events {
            latency.push(done - (arrived - right_ms));
        }
    }
    (!latency.is_empty()).then_some(latency)
}

struct Percentiles {
    p50: f64,
    p90: f64,
    p95: f64,
    max: f64,
}

impl Percentiles {
    /// Of `ms` (sorted in place; not empty).
    fn of(ms: &mut [f64]) -> Percentiles {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p95: at(0.95),
            max: at(1.0),
        }
    }
}

/// A `/proc/self/status` field in kB (Linux).
fn rss_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
