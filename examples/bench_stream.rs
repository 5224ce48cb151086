//! Per-chunk latency of cache-aware streaming (a benchmark, not a test): the audio is fed one
//! chunk's worth of samples at a time, as a live source would, and every `accept` that ran a
//! chunk is timed (mel frames, the encoder graph of the chunk, the decoder steps).
//!
//! Run: `cargo run --release --example bench_stream -- MODEL AUDIO [L,R] [THREADS] [ctc]`
//! (MODEL a .gguf or a .nemo; L,R one of the model's lookaheads, its default when absent;
//! THREADS defaults to 2). Prints p50 / p95 / max per chunk and the real-time factor.

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
    let piece = (stream.chunk_seconds() * f64::from(stream.sample_rate())).round() as usize;
    let p = *stream.params();
    // One untimed pass readies the compute buffer for both chunk shapes.
    stream.accept(&samples[..samples.len().min(3 * piece)])?;
    stream.finish()?;

    let mut chunk_ms = Vec::new();
    let mut first_partial = None;
    let start = Instant::now();
    for (i, part) in samples.chunks(piece).enumerate() {
        let t = Instant::now();
        let events = stream.accept(part)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        // A piece may not complete a chunk (the first chunk is shorter than a shift).
        if i > 0 || !events.is_empty() {
            chunk_ms.push(ms);
        }
        if first_partial.is_none() && events.iter().any(|e| matches!(e, StreamEvent::Partial(_))) {
            first_partial = Some((i + 1) as f64 * stream.chunk_seconds());
        }
    }
    let events = stream.finish()?;
    let total = start.elapsed().as_secs_f64();
    let text = events.iter().find_map(|e| match e {
        StreamEvent::Final(u) => Some(u.text.clone()),
        _ => None,
    });
    chunk_ms.sort_by(f64::total_cmp);
    let at = |q: f64| chunk_ms[((chunk_ms.len() - 1) as f64 * q).round() as usize];
    let audio_s = samples.len() as f64 / f64::from(stream.sample_rate());
    println!(
        "att_context [{}, {}]: chunk {:.0} ms, {threads} threads, {} chunks",
        p.att_context[0],
        p.att_context[1],
        stream.chunk_seconds() * 1e3,
        chunk_ms.len()
    );
    println!(
        "per chunk: p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms; real-time factor {:.4}",
        at(0.5),
        at(0.95),
        at(1.0),
        total / audio_s
    );
    if let Some(s) = first_partial {
        println!("first partial after {s:.2} s of audio");
    }
    println!("final: {}", text.unwrap_or_default());
    Ok(())
}
