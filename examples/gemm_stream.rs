//! f32 GEMM throughput with the weights streaming from memory, as in the 0.6b encoder (2.3 GB
//! of weights per utterance): a chain of feed-forward linears (1024 -> 4096 -> 1024) through
//! distinct weights per layer, against the same chain reusing one layer's weights (cached).
//!
//! `cargo run --release --example gemm_stream [THREADS=2] [LAYERS=24] [N=138]`

use parakeet::backend::Backend;
use parakeet::backend::HostWeights;
use parakeet::kernels::FusedOps;
use std::time::Instant;
fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let layers: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(24);
    let n: usize = std::env::args()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(138);
    let (d, ff) = (1024usize, 4096usize);
    let mut be = Backend::cpu(threads).unwrap();
    let mut hw = HostWeights::new();
    for l in 0..layers {
        let w: Vec<f32> = (0..d * ff)
            .map(|i| (((i + l) % 97) as f32 - 48.0) * 1e-4)
            .collect();
        hw.push_panel16(&format!("up{l}"), ff, d, &w);
        hw.push_panel16(&format!("down{l}"), d, ff, &w);
    }
    let ws = hw.realize().unwrap();
    let x: Vec<f32> = (0..d * n)
        .map(|i| ((i % 89) as f32 - 44.0) * 1e-3)
        .collect();
    for distinct in [true, false] {
        let mut samples = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            be.compute_sized(8192, |g| {
                let mut h = g.input_f32(&x, &[d, n]);
                for l in 0..layers {
                    let l = if distinct { l } else { 0 };
                    let u = g.linear(h, &ws[&format!("up{l}")], None);
                    h = g.linear(u, &ws[&format!("down{l}")], None);
                }
                Ok(h)
            })
            .unwrap();
            samples.push(t.elapsed().as_secs_f64());
        }
        samples.sort_by(f64::total_cmp);
        let flop = 2.0 * 2.0 * (d * ff * n * layers) as f64;
        println!(
            "distinct={distinct}: {:.1} ms, {:.1} GFLOP/s",
            samples[3] * 1e3,
            flop / samples[3] / 1e9
        );
    }
}
