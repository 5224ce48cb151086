//! The fused attention ops alone, at the encoders' shapes: rel-pos attention (ASR encoders and
//! Sortformer's FastConformer at 66 s, 825 frames) and plain attention (Sortformer's
//! Transformer, heads of 24). The graph's input copies are included, as in a real graph they
//! are not: compare runs of this, not absolute times.
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
        "{:<6} {:>3} {:>5} {:>17} {:>8} {:>8}",
        "d_k", "h", "T", "window", "ms", "GFLOP/s"
    );
    for (dk, h, t, window, positional) in [
        (128usize, 8usize, 138usize, None, true),
        (64, 8, 138, None, true),
        (128, 8, 1000, None, true),
        (128, 8, 1000, Some((128usize, 128usize)), true),
        (64, 8, 825, None, true),
        (24, 8, 825, None, false),
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
                Ok(match positional {
                    true => {
                        g.rel_pos_attention(q, k, v, p, bu, bv, KeyWindow::band(left, right), &[])
                    }
                    false => g.dot_product_attention(q, k, v),
                })
            })
            .unwrap();
            samples.push(start.elapsed().as_secs_f64());
        }
        samples.sort_by(f64::total_cmp);
        let keys: usize = (0..t)
            .map(|i| (i + right).min(t - 1) + 1 - i.saturating_sub(left))
            .sum();
        let products = if positional { 3.0 } else { 2.0 };
        let flops = 2.0 * products * (keys * dk * h) as f64;
        println!(
            "{dk:<6} {h:>3} {t:>5} {:>17} {:>8.2} {:>8.1}",
            format!("[{left},{right}]{}", if positional { "" } else { " plain" }),
            samples[0] * 1e3,
            flops / samples[0] / 1e9
        );
    }
}
