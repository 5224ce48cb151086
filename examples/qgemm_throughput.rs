//! Linear-layer throughput per weight type at encoder shapes, through the production path
//! (`Graph::linear` in a ggml graph on the CPU backend):
//! `cargo run --release --example qgemm_throughput [threads...] [KxM...] [n=STEPS...]`
//! (default: 1 and 2 threads; the 0.6b encoder's 1024 x 4096, 4096 x 1024 and 1024 x 1024;
//! 1, 138 and 276 steps, the kernels alone at the largest).
//!
//! Types: f32 (the f32 GEMM), q8_0 in ggml's layout (ggml's quantized matmul), q8_0x8 (our int8
//! kernel), q4_0 (ggml), q4_0x8 (our int8 kernel on 4-bit weights). The types' runs are
//! interleaved (one of each per round) so that a load change on a shared machine hits all of
//! them alike; prints the median, in ms and GMAC/s. Then every int8 kernel this CPU runs (AVX2,
//! AVX-512 VNNI, portable) on its own, outside a graph, `q8_0x8` and `q4_0x8` interleaved, with
//! wall and process CPU time.

use parakeet::backend::{Backend, DType, quantize_rows};
use parakeet::gguf::{GgufFile, GgufWriter};
use parakeet::kernels::FusedOps;
use parakeet::kernels::cpu::Kernel;
use parakeet::kernels::qgemm;
use parakeet::layout::{self, Layout};
use std::time::Instant;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_seconds;

const TYPES: [(&str, DType, Layout); 5] = [
    ("f32", DType::F32, Layout::Plain),
    ("q8_0", DType::Q8_0, Layout::Plain),
    ("q8_0x8", DType::Q8_0, Layout::Q8_0x8),
    ("q4_0", DType::Q4_0, Layout::Plain),
    ("q4_0x8", DType::Q4_0, Layout::Q4_0x8),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let or = |v: Vec<usize>, default: &[usize]| if v.is_empty() { default.to_vec() } else { v };
    let threads = or(
        args.iter().filter_map(|a| a.parse().ok()).collect(),
        &[1, 2],
    );
    let steps = or(
        args.iter()
            .filter_map(|a| a.strip_prefix("n=")?.parse().ok())
            .collect(),
        &[1, 138, 276],
    );
    let shapes: Vec<(usize, usize)> = args
        .iter()
        .filter_map(|a| {
            let (k, m) = a.split_once('x')?;
            Some((k.parse().ok()?, m.parse().ok()?))
        })
        .collect();
    let shapes = if shapes.is_empty() {
        vec![(1024usize, 4096usize), (4096, 1024), (1024, 1024)]
    } else {
        shapes
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.gguf");
    let mut w = GgufWriter::new();
    for &(k, m) in &shapes {
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
        for &(k, m) in &shapes {
            for &n in &steps {
                let x: Vec<f32> = (0..k * n)
                    .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
                    .collect();
                let mut line = format!("threads {nth} K={k:<4} M={m:<4} N={n:<3}:");
                let weights: Vec<_> = TYPES
                    .iter()
                    .map(|(ty, _, _)| file.any_weight(&format!("{ty}.{k}x{m}")).unwrap())
                    .collect();
                let reps = if n == 1 { 50 } else { 7 };
                let mut times = vec![Vec::new(); TYPES.len()];
                for _ in 0..reps {
                    for (wt, times) in weights.iter().zip(&mut times) {
                        let t = Instant::now();
                        be.compute(|g| {
                            let xi = g.input_f32(&x, &[k, n]);
                            Ok(g.linear(xi, wt, None))
                        })
                        .unwrap();
                        times.push(t.elapsed().as_secs_f64());
                    }
                }
                for ((ty, _, _), times) in TYPES.iter().zip(times) {
                    let s = median(times);
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
    kernels(&threads, &shapes, *steps.iter().max().unwrap());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Each int8 kernel on its own (std threads, split as in the graph), both formats interleaved
/// rep by rep: GMAC/s by wall and by process CPU time, and q4_0x8's time over q8_0x8's.
fn kernels(threads: &[usize], shapes: &[(usize, usize)], n: usize) {
    let formats = [
        (qgemm::Format::Q8_0x8, DType::Q8_0),
        (qgemm::Format::Q4_0x8, DType::Q4_0),
    ];
    for &nth in threads {
        for &(k, m) in shapes {
            let w: Vec<f32> = (0..k * m)
                .map(|j| (((j * 7919) % 2003) as f32 - 1001.0) * 1e-4)
                .collect();
            let packed: Vec<Vec<u8>> = formats
                .iter()
                .map(|&(format, dtype)| {
                    let plain = quantize_rows(&w, k, dtype).unwrap();
                    match format {
                        qgemm::Format::Q8_0x8 => layout::repack_q8_0x8(&plain, k, m),
                        qgemm::Format::Q4_0x8 => layout::repack_q4_0x8(&plain, k, m),
                    }
                })
                .collect();
            let x: Vec<f32> = (0..k * n)
                .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
                .collect();
            let macs = (k * m * n) as f64;
            for kernel in Kernel::available() {
                let mut line = format!(
                    "kernels threads {nth} K={k:<4} M={m:<4} N={n:<3} {:<10}:",
                    kernel.name()
                );
                let mut wall = [vec![], vec![]];
                let mut cpu = [vec![], vec![]];
                for _ in 0..9 {
                    for (i, &(format, _)) in formats.iter().enumerate() {
                        if format == qgemm::Format::Q4_0x8 && kernel.name() == "amx-int8" {
                            continue; // q4_0x8 runs on VNNI there
                        }
                        let (t, c) = (Instant::now(), cpu_seconds());
                        qgemm::gemm_int8(kernel, format, &packed[i], k, m, &x, n, None, nth);
                        wall[i].push(t.elapsed().as_secs_f64());
                        cpu[i].push(cpu_seconds() - c);
                    }
                }
                let mut medians = vec![];
                for (i, &(format, _)) in formats.iter().enumerate() {
                    if wall[i].is_empty() {
                        continue;
                    }
                    let (w, c) = (median(wall[i].clone()), median(cpu[i].clone()));
                    medians.push((w, c));
                    line += &format!(
                        "  {} {:6.1} GMAC/s wall {:6.1} cpu",
                        format.name(),
                        macs / w / 1e9,
                        macs / c / 1e9
                    );
                }
                if let [(w8, c8), (w4, c4)] = medians[..] {
                    line += &format!("  q4/q8 time: wall {:.3}x cpu {:.3}x", w4 / w8, c4 / c8);
                }
                println!("{line}");
            }
        }
    }
}
