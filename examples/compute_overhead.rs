//! Per-call overhead of `Backend::compute` for tiny graphs (a benchmark, not a test).
//!
//! Each call builds the graph in a fresh metadata context, allocates it with the persistent
//! gallocr, uploads the inputs, computes and reads the result back; the time printed is the whole
//! `compute` call as a caller sees it.
//!
//! Run: `cargo run --release --example compute_overhead [N]` (N defaults to 2000).

use parakeet::backend::{self, Backend, HostWeights};
use parakeet::kernels::FusedOps;
use std::time::Instant;

const WARMUP: usize = 100;

/// Median and 90th percentile of `samples` (microseconds).
fn median_p90(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

/// Time `n` calls of `call` (after a warm-up), in microseconds per call.
fn time_calls(n: usize, mut call: impl FnMut()) -> (f64, f64) {
    for _ in 0..WARMUP {
        call();
    }
    let samples = (0..n)
        .map(|_| {
            let start = Instant::now();
            call();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    median_p90(samples)
}

fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 2000,
    };
    backend::silence_ggml_logs();

    // A 512x512 f32 weight realised once (not re-uploaded per call), applied to 8 columns.
    let (k, cols) = (512, 8);
    let mut hw = HostWeights::new();
    let w: Vec<f32> = (0..k * k)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect();
    hw.push("w", &[k, k], w);
    let weights = hw.realize()?;
    let w = &weights["w"];
    let x: Vec<f32> = (0..k * cols).map(|i| (i % 17) as f32 * 0.1).collect();
    let (a, b) = ([1.0f32, 2.0, 3.0, 4.0], [0.5f32; 4]);

    println!(
        "Backend::compute per-call wall time, {n} calls after {WARMUP} warm-up ({} cores available)",
        std::thread::available_parallelism().map_or(0, |p| p.get())
    );
    println!(
        "{:<38} {:>7} {:>11} {:>11}",
        "graph", "threads", "median µs", "p90 µs"
    );
    for threads in [1, 2] {
        let mut be = Backend::cpu(threads)?;
        let (med, p90) = time_calls(n, || {
            let out = be
                .compute(|g| {
                    let xt = g.input_f32(&x, &[k, cols]);
                    let wt = g.weight(w);
                    Ok(g.matmul(wt, xt))
                })
                .expect("matmul compute");
            std::hint::black_box(out);
        });
        println!(
            "{:<38} {threads:>7} {med:>11.1} {p90:>11.1}",
            "matmul 512x512 f32 weight x 8 columns"
        );
        let (med, p90) = time_calls(n, || {
            let out = be
                .compute(|g| {
                    let at = g.input_f32(&a, &[4]);
                    let bt = g.input_f32(&b, &[4]);
                    Ok(g.add(at, bt))
                })
                .expect("add compute");
            std::hint::black_box(out);
        });
        println!(
            "{:<38} {threads:>7} {med:>11.1} {p90:>11.1}",
            "add of two 4-element inputs"
        );
        let s = be.stats();
        println!(
            "{:<38} {threads:>7} graphs {}, compute buffer {} B (peak {} B)",
            "  stats", s.graphs_computed, s.compute_buffer_bytes, s.peak_compute_buffer_bytes
        );
    }
    Ok(())
}
