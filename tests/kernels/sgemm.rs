//! The panel-packed f32 GEMM (`kernels::sgemm`) against a plain f64 reference: every kernel this
//! CPU runs (portable, AVX2+FMA, AVX-512F), odd shapes (inner and column counts that are not
//! multiples of any tile or block, one column), and through the graph on 1-3 threads.
//!
//! Bound: relative error 1e-6 (f32 accumulation over k <= 700 of values in [-1, 1); a wrong
//! index or a lost tile shows up as O(1)).

use crate::common::{Lcg, rel_err_f64 as rel_err};
use parakeet::backend::HostWeights;
use parakeet::backend::{self, Backend};
use parakeet::kernels::FusedOps;
use parakeet::kernels::cpu::Isa;
use parakeet::kernels::sgemm::{Dims, gemm_packed, gemm_packed_bias_relu};
use parakeet::layout::{Layout, pack_panels, unpack_panels};

const REL_TOL: f64 = 1e-6;

/// `y[j][i] = sum_kk w[i][kk] x[j][kk]` in f64 (`w` row-major `[m][k]`).
fn reference(w: &[f32], x: &[f32], d: Dims) -> Vec<f64> {
    let mut y = vec![0f64; d.n * d.m];
    for j in 0..d.n {
        for i in 0..d.m {
            y[j * d.m + i] = (0..d.k)
                .map(|kk| w[i * d.k + kk] as f64 * x[j * d.k + kk] as f64)
                .sum();
        }
    }
    y
}

/// (m, k, n): k below, at and across the 256 inner block, n across the 192 column block and
/// every column-tile remainder, n = 1.
const SHAPES: &[(usize, usize, usize)] = &[
    (16, 1, 1),
    (16, 7, 5),
    (32, 33, 13),
    (48, 256, 6),
    (64, 257, 1),
    (80, 300, 11),
    (16, 513, 193),
    (112, 700, 29),
    (32, 64, 385),
];

#[test]
fn packing_round_trips() {
    let mut rng = Lcg::new(1);
    let (m, k) = (48, 37);
    let w = rng.vec(m * k);
    let p = pack_panels(&w, m, k);
    // Panel 1, input 5, row 3 is W[19][5].
    assert_eq!(p[(k + 5) * 16 + 3], w[19 * k + 5]);
    assert_eq!(unpack_panels(&p, m, k), w);
}

/// The fused bias + ReLU store of every kernel gives exactly the plain product's values with
/// the bias added and ggml's relu (`v > 0 ? v : 0`) applied after.
#[test]
fn every_kernel_fuses_bias_and_relu_exactly() {
    let mut rng = Lcg::new(5);
    for &(m, k, n) in SHAPES {
        let d = Dims { m, k, n };
        let w = rng.vec(m * k);
        let x = rng.vec(n * k);
        let bias = rng.vec(m);
        let packed = pack_panels(&w, m, k);
        for &isa in &Isa::available() {
            let plain = gemm_packed(isa, &packed, &x, d);
            let want: Vec<f32> = plain
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let v = v + bias[i % m];
                    if v > 0.0 { v } else { 0.0 }
                })
                .collect();
            let got = gemm_packed_bias_relu(isa, &packed, &x, &bias, d);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} on {m}x{k}x{n}",
                isa.name()
            );
            assert!(want.contains(&0.0) || m * n < 8, "no clamped value");
        }
    }
}

#[test]
fn every_kernel_matches_f64_on_odd_shapes() {
    let kernels = Isa::available();
    println!(
        "kernels on this CPU: {:?} (best {})",
        kernels.iter().map(|k| k.name()).collect::<Vec<_>>(),
        Isa::best().name()
    );
    let mut rng = Lcg::new(7);
    for &(m, k, n) in SHAPES {
        let d = Dims { m, k, n };
        let w = rng.vec(m * k);
        let x = rng.vec(n * k);
        let want = reference(&w, &x, d);
        let packed = pack_panels(&w, m, k);
        for &isa in &kernels {
            let got = gemm_packed(isa, &packed, &x, d);
            let err = rel_err(&got, &want);
            assert!(
                err < REL_TOL,
                "{} on {m}x{k}x{n}: rel err {err:.2e}",
                isa.name()
            );
        }
    }
}

#[test]
fn graph_linear_on_packed_weights_matches_f64_on_1_to_3_threads() {
    backend::silence_ggml_logs();
    let mut rng = Lcg::new(11);
    for &(m, k, n) in &[(48, 300, 13), (16, 9, 1), (96, 130, 200), (528, 257, 37)] {
        let d = Dims { m, k, n };
        let w = rng.vec(m * k);
        let b = rng.vec(m);
        let x = rng.vec(n * k);
        let mut want = reference(&w, &x, d);
        for (i, v) in want.iter_mut().enumerate() {
            *v += b[i % m] as f64;
        }
        let mut hw = HostWeights::new();
        hw.push_panel16("lin.weight", m, k, &w);
        hw.push("lin.bias", &[m], b.clone());
        let weights = hw.realize().unwrap();
        let (wt, bt) = (&weights["lin.weight"], &weights["lin.bias"]);
        assert_eq!(wt.layout(), Layout::Panel16);
        assert_eq!(wt.shape(), [k, m, 1, 1]);
        assert_eq!(wt.to_host_f32(), w, "to_host_f32 unpacks");
        for threads in 1..=3 {
            let mut be = Backend::cpu(threads).unwrap();
            let got = be
                .compute(|g| {
                    let xt = g.input_f32(&x, &[k, n]);
                    Ok(g.linear(xt, wt, Some(bt)))
                })
                .unwrap();
            assert_eq!(got.shape, [m, n, 1, 1]);
            let err = rel_err(&got.output, &want);
            assert!(
                err < REL_TOL,
                "{m}x{k}x{n} on {threads} threads: rel err {err:.2e}"
            );
        }
    }
}

/// One random [m, k] linear as "packed.weight" (panel16) and "plain.weight", with "lin.bias".
fn packed_and_plain(
    rng: &mut Lcg,
    m: usize,
    k: usize,
) -> std::collections::HashMap<String, parakeet::backend::Weight> {
    let (w, b) = (rng.vec(m * k), rng.vec(m));
    let mut hw = HostWeights::new();
    hw.push_panel16("packed.weight", m, k, &w);
    hw.push("plain.weight", &[k, m], w);
    hw.push("lin.bias", &[m], b);
    hw.realize().unwrap()
}

/// `linear_residual` (`r + scale * (x W^T + b)` in the GEMM node) gives the bits of a linear,
/// a `scale` and an `add` node, on 1-3 threads, with and without a bias; on a plain weight it
/// falls back to those nodes.
#[test]
fn graph_linear_residual_is_linear_scale_add() {
    backend::silence_ggml_logs();
    let mut rng = Lcg::new(12);
    for &(m, k, n) in &[(48, 300, 13), (16, 9, 1), (528, 257, 37)] {
        let weights = packed_and_plain(&mut rng, m, k);
        let x = rng.vec(n * k);
        let r = rng.vec(n * m);
        let bias = &weights["lin.bias"];
        for threads in 1..=3 {
            let mut be = Backend::cpu(threads).unwrap();
            for (scale, with_bias) in [(0.5, true), (1.0, false)] {
                let b = with_bias.then_some(bias);
                let mut run = |name: &str, fused: bool| {
                    be.compute(|g| {
                        let (xt, rt) = (g.input_f32(&x, &[k, n]), g.input_f32(&r, &[m, n]));
                        let w = &weights[name];
                        if fused {
                            return Ok(g.linear_residual(xt, w, b, rt, scale));
                        }
                        let y = g.linear(xt, w, b);
                        let y = if scale == 1.0 { y } else { g.scale(y, scale) };
                        Ok(g.add(rt, y))
                    })
                    .unwrap()
                    .output
                };
                let separate = run("packed.weight", false);
                assert!(
                    run("packed.weight", true) == separate,
                    "{m}x{k}x{n}, {threads} threads, scale {scale}: fused differs"
                );
                let plain = run("plain.weight", true);
                let want: Vec<f64> = separate.iter().map(|&v| v as f64).collect();
                let err = rel_err(&plain, &want);
                assert!(err < REL_TOL, "plain weight fallback: rel err {err:.2e}");
            }
        }
    }
}

/// `silu_linear` (the SiLU applied as the input is packed) against a SiLU node and a linear,
/// on packed and plain weights, 1-3 threads, with and without a residual.
#[test]
fn graph_silu_linear_matches_silu_then_linear() {
    backend::silence_ggml_logs();
    let mut rng = Lcg::new(13);
    for &(m, k, n) in &[(48, 300, 13), (16, 9, 1), (528, 257, 37)] {
        let weights = packed_and_plain(&mut rng, m, k);
        let x: Vec<f32> = rng.vec(n * k).iter().map(|v| v * 6.0).collect();
        let r = rng.vec(n * m);
        let bias = &weights["lin.bias"];
        for threads in 1..=3 {
            let mut be = Backend::cpu(threads).unwrap();
            for with_residual in [false, true] {
                let mut run = |name: &str, fused: bool| {
                    be.compute(|g| {
                        let (xt, rt) = (g.input_f32(&x, &[k, n]), g.input_f32(&r, &[m, n]));
                        let w = &weights[name];
                        let residual = with_residual.then_some((rt, 0.5));
                        if fused {
                            return Ok(g.silu_linear(xt, w, Some(bias), residual));
                        }
                        let h = g.silu(xt);
                        Ok(match residual {
                            Some((rt, s)) => g.linear_residual(h, w, Some(bias), rt, s),
                            None => g.linear(h, w, Some(bias)),
                        })
                    })
                    .unwrap()
                    .output
                };
                let want: Vec<f64> = run("packed.weight", false)
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                for name in ["packed.weight", "plain.weight"] {
                    let err = rel_err(&run(name, true), &want);
                    assert!(
                        err < REL_TOL,
                        "{name} {m}x{k}x{n}, {threads} threads: rel err {err:.2e}"
                    );
                }
            }
        }
    }
}

/// The panel queue of the threaded GEMM hands out every panel exactly once, in ranges that
/// start on a pair and shrink towards the end; one thread gets everything in one claim.
#[test]
fn panel_queue_covers_every_panel_once() {
    use parakeet::kernels::panel::PanelQueue;
    use std::sync::atomic::AtomicUsize;
    for threads in 1..=4 {
        for panels in [1, 2, 7, 64, 256, 257] {
            let next = AtomicUsize::new(0);
            let queue = PanelQueue {
                next: &next,
                panels,
                threads,
            };
            let mut ranges = Vec::new();
            while let Some(r) = queue.claim() {
                ranges.push(r);
            }
            let mut expect = 0;
            for r in &ranges {
                assert_eq!(
                    r.start, expect,
                    "{threads} threads, {panels} panels: {ranges:?}"
                );
                assert!(r.start % 2 == 0 && !r.is_empty(), "{ranges:?}");
                expect = r.end;
            }
            assert_eq!(expect, panels, "{ranges:?}");
            assert!(
                ranges.windows(2).all(|w| w[1].len() <= w[0].len()),
                "{ranges:?}"
            );
            if threads == 1 {
                assert_eq!(ranges.len(), 1);
            } else if panels >= 64 {
                assert!(ranges.last().unwrap().len() <= 2, "{ranges:?}");
            }
        }
    }
}
