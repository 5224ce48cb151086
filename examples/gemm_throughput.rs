//! f32 linear-layer throughput at encoder shapes (weights [K, M] x activations [K, N]) through
//! the graph, for both weight paths: the panel-packed GEMM (what converted f32 models run) and
//! the `gemm` crate on plain weights (older GGUFs; it packs the weight on every call).
//!
//! `cargo run --release --example gemm_throughput [THREADS]` (default 2).

use parakeet::backend::Backend;
use parakeet::backend::HostWeights;
use parakeet::kernels::FusedOps;
use parakeet::kernels::cpu::Isa;
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut be = Backend::cpu(threads).unwrap();
    println!(
        "{threads} threads; panel16 kernel: {}; GFLOP/s (median of 9)",
        Isa::best().name()
    );
    println!(
        "{:<16} {:>5} {:>10} {:>10}",
        "K x M", "N", "panel16", "gemm"
    );
    for (k, m) in [
        (1024usize, 4096usize),
        (4096, 1024),
        (1024, 1024),
        (512, 2048),
    ] {
        let w: Vec<f32> = (0..k * m)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
            .collect();
        let mut hw = HostWeights::new();
        hw.push("plain", &[k, m], w.clone());
        hw.push_panel16("packed", m, k, &w);
        let ws = hw.realize().unwrap();
        for n in [1usize, 8, 64, 138, 276, 1000] {
            let x: Vec<f32> = (0..k * n)
                .map(|i| ((i % 89) as f32 - 44.0) * 1e-3)
                .collect();
            let mut time = |path: &str| {
                let mut samples = Vec::new();
                for _ in 0..9 {
                    let t = Instant::now();
                    be.compute(|g| {
                        let xi = g.input_f32(&x, &[k, n]);
                        Ok(match path {
                            "packed" => g.linear(xi, &ws["packed"], None),
                            _ => g.linear(xi, &ws["plain"], None),
                        })
                    })
                    .unwrap();
                    samples.push(t.elapsed().as_secs_f64());
                }
                samples.sort_by(f64::total_cmp);
                2.0 * (k * m * n) as f64 / samples[4] / 1e9
            };
            let packed = time("packed");
            let gemm = time("plain");
            println!(
                "{:<16} {n:>5} {packed:>10.1} {gemm:>10.1}",
                format!("{k} x {m}")
            );
        }
    }
}
