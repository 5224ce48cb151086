//! The fused rel-pos attention op alone, at the encoder's shapes (the graph's input copies
//! included, as in a real graph they are not: compare runs of this, not absolute times).
//!
//! `cargo run --release --example attention_throughput [THREADS]` (default 2).

use parakeet::backend::Backend;
use parakeet::kernels::{FusedOps, KeyWindow};
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut be = Backend::cpu(threads).unwrap();
    println!("{threads} threads; best of 41 (ms), GFLOP/s of the three products");
    println!(
        "{:<6} {:>3} {:>5} {:>11} {:>8} {:>8}",
        "d_k", "h", "T", "window", "ms", "GFLOP/s"
    );
    for (dk, h, t, window) in [
        (128usize, 8usize, 138usize, None),
        (64, 8, 138, None),
        (128, 8, 1000, None),
        (128, 8, 1000, Some((128usize, 128usize))),
    ] {
        let (left, right) = window.unwrap_or((t - 1, t - 1));
        let rows = left + right + 1;
        let data = |n: usize, salt: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * 31 + salt) % 101) as f32 - 50.0) * 2e-3)
                .collect()
        };
        let (q, k, v) = (
            data(dk * h * t, 1),
            data(dk * h * t, 2),
            data(dk * h * t, 3),
        );
        let (p, bu, bv) = (data(dk * h * rows, 4), data(dk * h, 5), data(dk * h, 6));
        let mut samples = Vec::new();
        for _ in 0..41 {
            let start = Instant::now();
            be.compute(|g| {
                let [q, k, v] = [&q, &k, &v].map(|x| g.input_f32(x, &[dk, h, t]));
                let p = g.input_f32(&p, &[dk, h, rows]);
                let [bu, bv] = [&bu, &bv].map(|x| g.input_f32(x, &[dk, h]));
                Ok(g.rel_pos_attention(q, k, v, p, bu, bv, KeyWindow::band(left, right)))
            })
            .unwrap();
            samples.push(start.elapsed().as_secs_f64());
        }
        samples.sort_by(f64::total_cmp);
        let keys: usize = (0..t)
            .map(|i| (i + right).min(t - 1) + 1 - i.saturating_sub(left))
            .sum();
        let flops = 2.0 * 3.0 * (keys * dk * h) as f64;
        println!(
            "{dk:<6} {h:>3} {t:>5} {:>11} {:>8.2} {:>8.1}",
            format!("[{left},{right}]"),
            samples[0] * 1e3,
            flops / samples[0] / 1e9
        );
    }
}
