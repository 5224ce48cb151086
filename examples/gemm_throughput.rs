//! f32 matmul throughput of the ggml CPU backend at encoder shapes (weights [K, M] x
//! activations [K, N]): `cargo run --release --example gemm_throughput`. Shows whether the
//! encoder is bound by the GEMM kernel (flat GFLOP/s over N) or by re-streaming the weights.

use parakeet::backend::Backend;
use parakeet::backend::gguf::HostWeights;
use std::time::Instant;
fn main() {
    let mut be = Backend::cpu(2).unwrap();
    for (k, m) in [(1024usize, 4096usize), (4096, 1024)] {
        let mut hw = HostWeights::new();
        hw.push(
            "w",
            &[k, m],
            (0..k * m).map(|i| ((i % 97) as f32) * 1e-3).collect(),
        );
        let w = hw.realize().unwrap().remove("w").unwrap();
        for n in [8usize, 32, 64, 138, 276] {
            let x: Vec<f32> = (0..k * n).map(|i| ((i % 89) as f32) * 1e-3).collect();
            let reps = 10;
            let t = Instant::now();
            for _ in 0..reps {
                be.compute(|g| {
                    let xi = g.input_f32(&x, &[k, n]);
                    let wi = g.weight(&w);
                    Ok(g.matmul(wi, xi))
                })
                .unwrap();
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "K={k} M={m} N={n}: {:.2} ms, {:.1} GFLOP/s",
                s * 1e3,
                2.0 * (k * m * n) as f64 / s / 1e9
            );
        }
    }
}
