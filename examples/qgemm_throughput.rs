//! Linear-layer throughput per weight type at encoder shapes, through the production path
//! (`Graph::linear` in a ggml graph on the CPU backend):
//! `cargo run --release --example qgemm_throughput [threads...]` (default: 1 and 2).
//!
//! Types: f32 (the f32 GEMM), q8_0 in ggml's layout (ggml's quantized matmul), q8_0x8 (our int8
//! kernel), q4_0 (ggml). Prints the median of several runs, in ms and GMAC/s. Then every int8
//! kernel this CPU runs (AVX2, AVX-512 VNNI, portable) on its own, outside a graph.

use parakeet::backend::{Backend, DType, quantize_rows};
use parakeet::gguf::{GgufFile, GgufWriter};
use parakeet::kernels::FusedOps;
use parakeet::kernels::cpu::Kernel;
use parakeet::kernels::qgemm;
use parakeet::layout::{self, Layout};
use std::time::Instant;

const TYPES: [(&str, DType, Layout); 4] = [
    ("f32", DType::F32, Layout::Plain),
    ("q8_0", DType::Q8_0, Layout::Plain),
    ("q8_0x8", DType::Q8_0, Layout::Q8_0x8),
    ("q4_0", DType::Q4_0, Layout::Plain),
];

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let threads = if threads.is_empty() {
        vec![1, 2]
    } else {
        threads
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.gguf");
    let shapes = [(1024usize, 4096usize), (4096, 1024), (1024, 1024)];
    let mut w = GgufWriter::new();
    for (k, m) in shapes {
        for (ty, dtype, layout) in TYPES {
            let name = format!("{ty}.{k}x{m}");
            w.add_tensor_with_layout(&name, &[k, m], dtype, layout)
                .unwrap();
        }
    }
    w.write(&path, |i| {
        let (k, m) = shapes[i / TYPES.len()];
        Ok((0..k * m)
            .map(|j| (((j * 7919) % 2003) as f32 - 1001.0) * 1e-4)
            .collect())
    })
    .unwrap();
    let file = GgufFile::open(&path).unwrap();

    for &nth in &threads {
        let mut be = Backend::cpu(nth).unwrap();
        for (k, m) in shapes {
            for n in [1usize, 138, 276] {
                let x: Vec<f32> = (0..k * n)
                    .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
                    .collect();
                let mut line = format!("threads {nth} K={k:<4} M={m:<4} N={n:<3}:");
                for (ty, _, _) in TYPES {
                    let wt = file.any_weight(&format!("{ty}.{k}x{m}")).unwrap();
                    let reps = if n == 1 { 50 } else { 7 };
                    let mut times: Vec<f64> = (0..reps)
                        .map(|_| {
                            let t = Instant::now();
                            be.compute(|g| {
                                let xi = g.input_f32(&x, &[k, n]);
                                Ok(g.linear(xi, wt, None))
                            })
                            .unwrap();
                            t.elapsed().as_secs_f64()
                        })
                        .collect();
                    times.sort_by(f64::total_cmp);
                    let s = times[reps / 2];
                    line += &format!(
                        "  {ty} {:7.3} ms {:6.1} GMAC/s",
                        s * 1e3,
                        (k * m * n) as f64 / s / 1e9
                    );
                }
                println!("{line}");
            }
        }
    }
    kernels(&threads, &shapes);
}

/// Each int8 kernel on its own (std threads, split as in the graph).
fn kernels(threads: &[usize], shapes: &[(usize, usize)]) {
    for &nth in threads {
        for &(k, m) in shapes {
            let w: Vec<f32> = (0..k * m)
                .map(|j| (((j * 7919) % 2003) as f32 - 1001.0) * 1e-4)
                .collect();
            let plain = quantize_rows(&w, k, DType::Q8_0).unwrap();
            let packed = layout::repack_q8_0x8(&plain, k, m);
            let n = 138;
            let x: Vec<f32> = (0..k * n)
                .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
                .collect();
            let mut line = format!("kernels threads {nth} K={k:<4} M={m:<4} N={n:<3}:");
            for kernel in Kernel::available() {
                let mut times: Vec<f64> = (0..7)
                    .map(|_| {
                        let t = Instant::now();
                        qgemm::gemm_q8_0x8(kernel, &packed, k, m, &x, n, None, nth);
                        t.elapsed().as_secs_f64()
                    })
                    .collect();
                times.sort_by(f64::total_cmp);
                line += &format!(
                    "  {} {:6.1} GMAC/s",
                    kernel.name(),
                    (k * m * n) as f64 / times[3] / 1e9
                );
            }
            println!("{line}");
        }
    }
}
