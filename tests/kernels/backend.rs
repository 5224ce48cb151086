//! The ggml backend against plain Rust: real numbers for matmul, softmax, LayerNorm and the
//! three convolutions; captures; a steady compute buffer over 10,000 computes; inputs written
//! after allocation; thread/device reporting; shape errors that panic instead of aborting.
//!
//! Every reference is computed in f64 by straightforward loops. The convolution bounds are
//! f32-level (< 1e-5 absolute on values of order 1): an f16 round trip anywhere in the path would
//! show up as ~1e-3.

use crate::common::{Lcg, rel_err_f64 as rel_err};
use parakeet::backend::{self, Backend, HostWeights};
use parakeet::kernels::FusedOps;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Worst relative error (‖ours − ref‖ / ‖ref‖) allowed for matmul/softmax/LayerNorm in f32.
const REL_TOL: f64 = 1e-5;
/// Worst absolute error allowed for the convolutions (f16 rounding would give ~1e-3).
const ABS_TOL: f64 = 1e-5;

fn backend(threads: usize) -> Backend {
    backend::silence_ggml_logs();
    Backend::cpu(threads).expect("CPU backend")
}

fn max_abs_err(ours: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "length mismatch");
    ours.iter()
        .zip(reference)
        .map(|(&a, &b)| (a as f64 - b).abs())
        .fold(0.0, f64::max)
}

// ---- plain-Rust references -------------------------------------------------------------------

/// `w` [k, m] (ggml order, so row `j` of m is `w[j*k..][..k]`), `x` [k, n] -> [m, n].
fn matmul_ref(w: &[f32], x: &[f32], k: usize, m: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for c in 0..n {
        for j in 0..m {
            out[c * m + j] = (0..k)
                .map(|i| w[j * k + i] as f64 * x[c * k + i] as f64)
                .sum();
        }
    }
    out
}

/// Softmax of `scale * x` over rows of length `len`.
fn softmax_ref(x: &[f32], len: usize, scale: f64) -> Vec<f64> {
    x.chunks(len)
        .flat_map(|row| {
            let s: Vec<f64> = row.iter().map(|&v| v as f64 * scale).collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / sum)
        })
        .collect()
}

/// LayerNorm without affine parameters over rows of length `len` (population variance).
fn norm_ref(x: &[f32], len: usize, eps: f64) -> Vec<f64> {
    x.chunks(len)
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter().map(move |&v| (v as f64 - mean) * inv)
        })
        .collect()
}

fn conv_out(size: usize, k: usize, stride: usize, pad: usize) -> usize {
    (size + 2 * pad - k) / stride + 1
}

/// Input position `o * stride + k - pad`, or None when it falls in the zero padding.
fn src_pos(o: usize, k: usize, stride: usize, pad: usize, size: usize) -> Option<usize> {
    (o * stride + k).checked_sub(pad).filter(|&p| p < size)
}

struct Conv2dCase {
    kw: usize,
    kh: usize,
    cin: usize,
    cout: usize,
    w: usize,
    h: usize,
    stride: usize,
    pad: usize,
}

/// torch Conv2d (cross-correlation), no bias. `kernel` torch [Cout, Cin, KH, KW] row-major
/// (= ggml [KW, KH, Cin, Cout]); `x` [W, H, Cin] (W fastest). Result channels fastest:
/// index `co + Cout * (ow + W' * oh)`.
fn conv2d_ref(c: &Conv2dCase, kernel: &[f32], x: &[f32]) -> Vec<f64> {
    let (ow_n, oh_n) = (
        conv_out(c.w, c.kw, c.stride, c.pad),
        conv_out(c.h, c.kh, c.stride, c.pad),
    );
    let mut out = vec![0.0; c.cout * ow_n * oh_n];
    for oh in 0..oh_n {
        for ow in 0..ow_n {
            for co in 0..c.cout {
                let mut sum = 0.0f64;
                for ci in 0..c.cin {
                    for kh in 0..c.kh {
                        let Some(ih) = src_pos(oh, kh, c.stride, c.pad, c.h) else {
                            continue;
                        };
                        for kw in 0..c.kw {
                            let Some(iw) = src_pos(ow, kw, c.stride, c.pad, c.w) else {
                                continue;
                            };
                            let kv = kernel[((co * c.cin + ci) * c.kh + kh) * c.kw + kw];
                            let xv = x[(ci * c.h + ih) * c.w + iw];
                            sum += kv as f64 * xv as f64;
                        }
                    }
                }
                out[co + c.cout * (ow + ow_n * oh)] = sum;
            }
        }
    }
    out
}

/// Depthwise 2-D conv of channel `ch` at output (ow, oh). `kernel(ch, kw, kh)` and
/// `x(ch, iw, ih)` read the host data in whatever layout the caller uses.
fn dw_point(
    kernel: impl Fn(usize, usize, usize) -> f32,
    x: impl Fn(usize, usize, usize) -> f32,
    (ch, ow, oh): (usize, usize, usize),
    (kw_n, kh_n): (usize, usize),
    (w, h): (usize, usize),
    stride: usize,
    pad: usize,
) -> f64 {
    let mut sum = 0.0f64;
    for kh in 0..kh_n {
        let Some(ih) = src_pos(oh, kh, stride, pad, h) else {
            continue;
        };
        for kw in 0..kw_n {
            let Some(iw) = src_pos(ow, kw, stride, pad, w) else {
                continue;
            };
            sum += kernel(ch, kw, kh) as f64 * x(ch, iw, ih) as f64;
        }
    }
    sum
}

// ---- 1. matmul ---------------------------------------------------------------------------------

#[test]
fn matmul_matches_plain_rust() {
    let mut be = backend(2);
    let mut rng = Lcg::new(1);
    // Odd sizes (no SIMD-friendly multiples) and one long inner dimension; the last three are
    // large enough for the packed-GEMM path (>= 2^20 multiply-adds), with row counts that do
    // not split evenly over the threads.
    for &(k, m, n) in &[
        (67, 45, 13),
        (512, 64, 8),
        (1, 3, 2),
        (640, 17, 1),
        (300, 203, 41),
        (1024, 37, 29),
        (9, 256, 1000),
    ] {
        let w = rng.vec(k * m);
        let x = rng.vec(k * n);
        let got = be
            .compute(|g| {
                let wt = g.input_f32(&w, &[k, m]);
                let xt = g.input_f32(&x, &[k, n]);
                Ok(g.matmul(wt, xt))
            })
            .unwrap();
        assert_eq!(
            got.shape,
            [m, n, 1, 1],
            "matmul shape for k={k} m={m} n={n}"
        );
        let err = rel_err(&got.output, &matmul_ref(&w, &x, k, m, n));
        println!("matmul k={k} m={m} n={n}: rel err {err:.2e}");
        assert!(err < REL_TOL, "matmul k={k} m={m} n={n}: rel err {err:.3e}");
    }
}

#[test]
fn batched_matmul_broadcasts_weight_batches() {
    // w [k, m, 2], x [k, n, 4]: x batch b uses w batch b / 2 (ggml's broadcast rule).
    let mut be = backend(2);
    let mut rng = Lcg::new(2);
    let (k, m, n) = (33, 7, 5);
    let w = rng.vec(k * m * 2);
    let x = rng.vec(k * n * 4);
    let got = be
        .compute(|g| {
            let wt = g.input_f32(&w, &[k, m, 2]);
            let xt = g.input_f32(&x, &[k, n, 4]);
            Ok(g.matmul(wt, xt))
        })
        .unwrap();
    assert_eq!(got.shape, [m, n, 4, 1]);
    let reference: Vec<f64> = (0..4)
        .flat_map(|b| {
            let wb = &w[(b / 2) * k * m..][..k * m];
            let xb = &x[b * k * n..][..k * n];
            matmul_ref(wb, xb, k, m, n)
        })
        .collect();
    let err = rel_err(&got.output, &reference);
    println!("batched matmul: rel err {err:.2e}");
    assert!(err < REL_TOL, "batched matmul: rel err {err:.3e}");
}

#[test]
fn linear_with_host_weights_matches_plain_rust() {
    // A torch Linear(in=96, out=40): weight [out, in] in torch = ggml [in, out], plus bias.
    let mut be = backend(2);
    let mut rng = Lcg::new(3);
    let (k, m, n) = (96, 40, 11);
    let w = rng.vec(k * m);
    let b = rng.vec(m);
    let x = rng.vec(k * n);
    let mut hw = HostWeights::new();
    hw.push("lin.weight", &[k, m], w.clone());
    hw.push("lin.bias", &[m], b.clone());
    let weights = hw.realize().unwrap();
    let (wt, bt) = (&weights["lin.weight"], &weights["lin.bias"]);
    assert_eq!(wt.shape(), [k, m, 1, 1]);
    assert_eq!(wt.to_host_f32(), w, "HostWeights round trip");
    let got = be
        .compute(|g| {
            let xt = g.input_f32(&x, &[k, n]);
            Ok(g.linear(xt, wt, Some(bt)))
        })
        .unwrap();
    assert_eq!(got.shape, [m, n, 1, 1]);
    let mut reference = matmul_ref(&w, &x, k, m, n);
    for (i, r) in reference.iter_mut().enumerate() {
        *r += b[i % m] as f64;
    }
    let err = rel_err(&got.output, &reference);
    println!("linear (HostWeights, bias): rel err {err:.2e}");
    assert!(err < REL_TOL, "linear: rel err {err:.3e}");
}

// ---- 2. softmax, LayerNorm, elementwise ----------------------------------------------------------

#[test]
fn softmax_with_scale_matches_plain_rust() {
    let mut be = backend(2);
    let mut rng = Lcg::new(4);
    let (len, rows) = (37, 11);
    // Spread the logits so the softmax is far from uniform.
    let x: Vec<f32> = rng.vec(len * rows).iter().map(|v| v * 8.0).collect();
    for &scale in &[1.0f32, 0.125, 3.0] {
        let got = be
            .compute(|g| {
                let xt = g.input_f32(&x, &[len, rows]);
                Ok(g.softmax(xt, scale))
            })
            .unwrap();
        assert_eq!(got.shape, [len, rows, 1, 1]);
        let err = rel_err(&got.output, &softmax_ref(&x, len, scale as f64));
        println!("softmax scale={scale}: rel err {err:.2e}");
        assert!(err < REL_TOL, "softmax scale={scale}: rel err {err:.3e}");
        for row in got.output.chunks(len) {
            let s: f32 = row.iter().sum();
            assert!((s - 1.0).abs() < 1e-5, "softmax row sums to {s}");
        }
    }
}

#[test]
fn softmax_of_a_transposed_view_matches_plain_rust() {
    // Non-contiguous input: softmax must make it contiguous first.
    let mut be = backend(1);
    let mut rng = Lcg::new(5);
    let (a, b) = (6, 9);
    let x = rng.vec(a * b);
    let got = be
        .compute(|g| {
            let xt = g.input_f32(&x, &[a, b]);
            let t = g.transpose(xt); // [b, a]
            Ok(g.softmax(t, 0.5))
        })
        .unwrap();
    assert_eq!(got.shape, [b, a, 1, 1]);
    let xt: Vec<f32> = (0..a)
        .flat_map(|i| (0..b).map(move |j| (i, j)))
        .map(|(i, j)| x[j * a + i])
        .collect();
    let err = rel_err(&got.output, &softmax_ref(&xt, b, 0.5));
    println!("softmax of transposed view: rel err {err:.2e}");
    assert!(err < REL_TOL, "softmax (transposed): rel err {err:.3e}");
}

#[test]
fn layer_norm_matches_plain_rust() {
    let mut be = backend(2);
    let mut rng = Lcg::new(6);
    let (len, rows, eps) = (80, 7, 1e-5f32);
    // Offset and scale per row so mean/variance matter.
    let rows_of = |rng: &mut Lcg, len: usize, rows: usize| -> Vec<f32> {
        rng.vec(len * rows)
            .iter()
            .enumerate()
            .map(|(i, v)| v * (1.0 + (i / len) as f32) + (i / len) as f32 - 3.0)
            .collect()
    };
    let x = rows_of(&mut rng, len, rows);
    let got = be
        .compute(|g| {
            let xt = g.input_f32(&x, &[len, rows]);
            Ok(g.norm(xt, eps))
        })
        .unwrap();
    assert_eq!(got.shape, [len, rows, 1, 1]);
    let err = rel_err(&got.output, &norm_ref(&x, len, eps as f64));
    println!("norm: rel err {err:.2e}");
    assert!(err < REL_TOL, "norm: rel err {err:.3e}");

    // The affine torch LayerNorm (one fused node), weights realised once: against the f64
    // reference, and against ggml's own norm -> mul -> add chain within two ulps (its sums
    // round differently), over odd widths and 1-3 threads.
    for (len, rows, threads) in [(80, 7, 2), (83, 13, 1), (1037, 5, 3)] {
        let mut be = backend(threads);
        let x = rows_of(&mut rng, len, rows);
        let w = rng.vec(len);
        let b = rng.vec(len);
        let mut hw = HostWeights::new();
        hw.push("ln.weight", &[len], w.clone());
        hw.push("ln.bias", &[len], b.clone());
        let ws = hw.realize().unwrap();
        let (lw, lb) = (&ws["ln.weight"], &ws["ln.bias"]);
        let got = be
            .compute(|g| {
                let xt = g.input_f32(&x, &[len, rows]);
                Ok(g.layer_norm(xt, lw, lb, eps))
            })
            .unwrap();
        assert_eq!(got.shape, [len, rows, 1, 1]);
        let reference: Vec<f64> = norm_ref(&x, len, eps as f64)
            .iter()
            .enumerate()
            .map(|(i, v)| v * w[i % len] as f64 + b[i % len] as f64)
            .collect();
        let err = rel_err(&got.output, &reference);
        println!("layer_norm {len} x {rows}, {threads} threads: rel err {err:.2e}");
        assert!(err < REL_TOL, "layer_norm: rel err {err:.3e}");
        let chain = be
            .compute(|g| {
                let xt = g.input_f32(&x, &[len, rows]);
                let n = g.norm(xt, eps);
                let (wt, bt) = (g.weight(lw), g.weight(lb));
                let n = g.mul(n, wt);
                Ok(g.add(n, bt))
            })
            .unwrap()
            .output;
        for (i, (&a, &c)) in got.output.iter().zip(&chain).enumerate() {
            let scale = reference[i].abs().max(1.0) as f32;
            assert!(
                (a - c).abs() <= 2.0 * f32::EPSILON * scale,
                "layer_norm {len} x {rows}: [{i}] {a} against ggml's {c}"
            );
        }
    }
}

#[test]
fn elementwise_ops_match_plain_rust() {
    let mut be = backend(1);
    let mut rng = Lcg::new(7);
    let (a_n, rows) = (24, 5);
    let a: Vec<f32> = rng.vec(a_n * rows).iter().map(|v| v * 4.0).collect();
    let b = rng.vec(a_n); // broadcast over rows
    type Op = (&'static str, fn(f64, f64) -> f64);
    let ops: [Op; 8] = [
        ("add", |x, y| x + y),
        ("sub", |x, y| x - y),
        ("mul", |x, y| x * y),
        ("scale", |x, _| x * 0.37),
        ("relu", |x, _| x.max(0.0)),
        ("silu", |x, _| x / (1.0 + (-x).exp())),
        ("sigmoid", |x, _| 1.0 / (1.0 + (-x).exp())),
        ("tanh", |x, _| x.tanh()),
    ];
    for (name, f) in ops {
        let got = be
            .compute(|g| {
                let at = g.input_f32(&a, &[a_n, rows]);
                let bt = g.input_f32(&b, &[a_n]);
                Ok(match name {
                    "add" => g.add(at, bt),
                    "sub" => g.sub(at, bt),
                    "mul" => g.mul(at, bt),
                    "scale" => g.scale(at, 0.37),
                    "relu" => g.relu(at),
                    "silu" => g.silu(at),
                    "sigmoid" => g.sigmoid(at),
                    _ => g.tanh(at),
                })
            })
            .unwrap();
        let reference: Vec<f64> = a
            .iter()
            .enumerate()
            .map(|(i, &x)| f(x as f64, b[i % a_n] as f64))
            .collect();
        let err = max_abs_err(&got.output, &reference);
        println!("{name}: max abs err {err:.2e}");
        assert!(err < ABS_TOL, "{name}: max abs err {err:.3e}");
    }
}

// ---- 3. convolutions -----------------------------------------------------------------------------

fn check_conv2d(be: &mut Backend, c: &Conv2dCase, seed: u64) -> f64 {
    let mut rng = Lcg::new(seed);
    let kernel = rng.vec(c.kw * c.kh * c.cin * c.cout);
    let x = rng.vec(c.w * c.h * c.cin);
    let (ow, oh) = (
        conv_out(c.w, c.kw, c.stride, c.pad),
        conv_out(c.h, c.kh, c.stride, c.pad),
    );
    let got = be
        .compute(|g| {
            let k = g.input_f32(&kernel, &[c.kw, c.kh, c.cin, c.cout]);
            let xt = g.input_f32(&x, &[c.w, c.h, c.cin, 1]);
            Ok(g.conv2d(k, xt, c.stride, c.pad))
        })
        .unwrap();
    assert_eq!(got.shape, [c.cout, ow, oh, 1], "conv2d output shape");
    max_abs_err(&got.output, &conv2d_ref(c, &kernel, &x))
}

#[test]
fn conv2d_matches_plain_rust_in_f32() {
    let mut be = backend(2);
    let cases = [
        // The subsampling stem: 3x3, stride 2, pad 1.
        Conv2dCase {
            kw: 3,
            kh: 3,
            cin: 3,
            cout: 5,
            w: 11,
            h: 9,
            stride: 2,
            pad: 1,
        },
        // Several input channels, single output channel.
        Conv2dCase {
            kw: 3,
            kh: 3,
            cin: 4,
            cout: 1,
            w: 8,
            h: 8,
            stride: 2,
            pad: 1,
        },
        // Non-square kernel, stride 1, no padding.
        Conv2dCase {
            kw: 3,
            kh: 2,
            cin: 2,
            cout: 4,
            w: 7,
            h: 6,
            stride: 1,
            pad: 0,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let err = check_conv2d(&mut be, c, 10 + i as u64);
        println!(
            "conv2d {}x{} {}->{} on {}x{} s{} p{}: max abs err {err:.2e}",
            c.kw, c.kh, c.cin, c.cout, c.w, c.h, c.stride, c.pad
        );
        assert!(err < ABS_TOL, "conv2d case {i}: max abs err {err:.3e}");
    }
}

#[test]
fn conv2d_depthwise_whcn_matches_plain_rust_in_f32() {
    let mut be = backend(2);
    let mut rng = Lcg::new(20);
    let (c, w, h, kw, kh, s, p) = (19, 13, 10, 3, 3, 2, 1);
    // torch depthwise weight [C, 1, KH, KW] row-major = ggml [KW, KH, 1, C].
    let kernel = rng.vec(kw * kh * c);
    let x = rng.vec(w * h * c); // [W, H, C], W fastest
    let (ow, oh) = (conv_out(w, kw, s, p), conv_out(h, kh, s, p));
    let got = be
        .compute(|g| {
            let k = g.input_f32(&kernel, &[kw, kh, 1, c]);
            let xt = g.input_f32(&x, &[w, h, c, 1]);
            Ok(g.conv2d_depthwise(k, xt, s, p))
        })
        .unwrap();
    assert_eq!(got.shape, [ow, oh, c, 1]);
    let mut reference = vec![0.0; ow * oh * c];
    for ch in 0..c {
        for y in 0..oh {
            for xo in 0..ow {
                reference[xo + ow * (y + oh * ch)] = dw_point(
                    |ch, kx, ky| kernel[(ch * kh + ky) * kw + kx],
                    |ch, ix, iy| x[(ch * h + iy) * w + ix],
                    (ch, xo, y),
                    (kw, kh),
                    (w, h),
                    s,
                    p,
                );
            }
        }
    }
    let err = max_abs_err(&got.output, &reference);
    println!("conv2d_depthwise WHCN C={c} {w}x{h} s{s} p{p}: max abs err {err:.2e}");
    assert!(
        err < ABS_TOL,
        "conv2d_depthwise WHCN: max abs err {err:.3e}"
    );
}

#[test]
fn conv2d_depthwise_channels_contiguous_matches_plain_rust_in_f32() {
    // The encoder's layout (src/encoder/mod.rs `dw_pw_block`): activations [C, W, H] with
    // channels fastest, kernel stored [C, 1, KW, KH]; both permuted to logical WHCN views.
    let mut be = backend(2);
    let mut rng = Lcg::new(21);
    // C = 19: a SIMD-width multiple plus a scalar tail in ggml's CWHN kernel.
    let (c, w, h, kw, kh, s, p) = (19, 13, 10, 3, 3, 2, 1);
    let kernel = rng.vec(c * kw * kh); // memory [C, 1, KW, KH]: index ch + C * (kx + KW * ky)
    let x = rng.vec(c * w * h); // memory [C, W, H]: index ch + C * (ix + W * iy)
    let (ow, oh) = (conv_out(w, kw, s, p), conv_out(h, kh, s, p));
    let got = be
        .compute(|g| {
            let xt = g.input_f32(&x, &[c, w, h]);
            let whcn = g.permute(xt, [2, 0, 1, 3]); // logical [W, H, C], channels contiguous
            assert!(!whcn.is_contiguous());
            let k = g.input_f32(&kernel, &[c, 1, kw, kh]);
            let k = g.permute(k, [3, 2, 0, 1]); // logical [KW, KH, 1, C]
            let y = g.conv2d_depthwise(k, whcn, s, p);
            assert_eq!(y.shape(), [ow, oh, c, 1]);
            let y = g.permute(y, [1, 2, 0, 3]); // back to [C, W', H']
            assert!(
                y.is_contiguous(),
                "depthwise output keeps the channels-fastest layout"
            );
            Ok(y)
        })
        .unwrap();
    assert_eq!(got.shape, [c, ow, oh, 1]);
    let mut reference = vec![0.0; c * ow * oh];
    for y in 0..oh {
        for xo in 0..ow {
            for ch in 0..c {
                reference[ch + c * (xo + ow * y)] = dw_point(
                    |ch, kx, ky| kernel[ch + c * (kx + kw * ky)],
                    |ch, ix, iy| x[ch + c * (ix + w * iy)],
                    (ch, xo, y),
                    (kw, kh),
                    (w, h),
                    s,
                    p,
                );
            }
        }
    }
    let err = max_abs_err(&got.output, &reference);
    println!("conv2d_depthwise channels-contiguous C={c} {w}x{h} s{s} p{p}: max abs err {err:.2e}");
    assert!(
        err < ABS_TOL,
        "conv2d_depthwise CWHN: max abs err {err:.3e}"
    );
}

#[test]
fn conv1d_depthwise_same_matches_plain_rust_in_f32() {
    let mut be = backend(2);
    let mut rng = Lcg::new(30);
    for &(c, t, k, with_bias) in &[
        (24, 37, 9, true),
        (5, 4, 9, false),
        (8, 16, 31, true),
        (3, 10, 1, false),
        // One step: a thread with no steps, and every tap but the centre in the padding.
        (16, 1, 9, true),
    ] {
        let x = rng.vec(c * t); // [C, T], channels fastest
        let kernel = rng.vec(k * c); // [K, C]: torch depthwise Conv1d weight [C, 1, K]
        let bias = rng.vec(c);
        // The kernel and bias as realised weights, as the encoder uses them.
        let mut hw = HostWeights::new();
        hw.push("dw.weight", &[k, c], kernel.clone());
        hw.push("dw.bias", &[c], bias.clone());
        let ws = hw.realize().unwrap();
        let mut conv = |silu: bool| {
            be.compute(|g| {
                let xt = g.input_f32(&x, &[c, t]);
                let kt = g.weight(&ws["dw.weight"]);
                let bt = with_bias.then(|| g.weight(&ws["dw.bias"]));
                Ok(if silu {
                    g.conv1d_depthwise_same_silu(xt, kt, bt)
                } else {
                    g.conv1d_depthwise_same(xt, kt, bt)
                })
            })
            .unwrap()
        };
        let got = conv(false);
        assert_eq!(got.shape, [c, t, 1, 1]);
        let half = k / 2;
        let mut reference = vec![0.0; c * t];
        for ti in 0..t {
            for ch in 0..c {
                let taps: f64 = (0..k)
                    .filter_map(|j| {
                        let src = (ti + j).checked_sub(half).filter(|&s| s < t)?;
                        Some(kernel[j + k * ch] as f64 * x[ch + c * src] as f64)
                    })
                    .sum();
                reference[ch + c * ti] = taps + if with_bias { bias[ch] as f64 } else { 0.0 };
            }
        }
        let err = max_abs_err(&got.output, &reference);
        println!("conv1d_depthwise_same C={c} T={t} K={k}: max abs err {err:.2e}");
        assert!(
            err < ABS_TOL,
            "conv1d_depthwise_same C={c} T={t} K={k}: {err:.3e}"
        );
        // With the SiLU fused: the same sums, then x * sigmoid(x).
        let fused = conv(true);
        let silu: Vec<f64> = reference.iter().map(|&v| v / (1.0 + (-v).exp())).collect();
        let err = max_abs_err(&fused.output, &silu);
        assert!(
            err < ABS_TOL,
            "conv1d_depthwise_same_silu C={c} T={t} K={k}: {err:.3e}"
        );
    }
}

/// The fused GLU against f64, and within a few ulps of ggml's sigmoid and product nodes.
#[test]
fn glu_matches_f64_and_ggml_sigmoid_and_mul() {
    let mut be = backend(2);
    let mut rng = Lcg::new(31);
    for &(d, t) in &[(24, 37), (5, 1), (64, 3)] {
        let y: Vec<f32> = rng.vec(2 * d * t).iter().map(|v| v * 8.0).collect();
        let fused = be
            .compute(|g| {
                let yt = g.input_f32(&y, &[2 * d, t]);
                Ok(g.glu(yt))
            })
            .unwrap();
        let nodes = be
            .compute(|g| {
                let yt = g.input_f32(&y, &[2 * d, t]);
                let a = g.cols(yt, 0, d);
                let gate = g.cols(yt, d, d);
                let gate = g.sigmoid(gate);
                let a = g.cont(a);
                Ok(g.mul(a, gate))
            })
            .unwrap();
        assert_eq!(fused.shape, [d, t, 1, 1]);
        let want: Vec<f64> = (0..d * t)
            .map(|i| {
                let (step, ch) = (i / d, i % d);
                let (a, gate) = (y[step * 2 * d + ch] as f64, y[step * 2 * d + d + ch] as f64);
                a / (1.0 + (-gate).exp())
            })
            .collect();
        let rel = |got: &[f32]| {
            got.iter()
                .zip(&want)
                .map(|(&g, &w)| (g as f64 - w).abs() / w.abs().max(1e-6))
                .fold(0f64, f64::max)
        };
        assert!(
            rel(&fused.output) < 1e-6,
            "glu d={d} t={t}: {:e}",
            rel(&fused.output)
        );
        assert!(rel(&nodes.output) < 1e-6, "ggml's nodes d={d} t={t}");
    }
}

// ---- 4. captures ---------------------------------------------------------------------------------

#[test]
fn several_captures_read_back_with_values_and_shapes() {
    let mut be = backend(2);
    let mut rng = Lcg::new(40);
    let (n0, n1) = (6, 4);
    let a = rng.vec(n0 * n1);
    let b = rng.vec(n0 * n1);
    let got = be
        .compute(|g| {
            let at = g.input_f32(&a, &[n0, n1]);
            let bt = g.input_f32(&b, &[n0, n1]);
            g.capture("a_in", at);
            let sum = g.add(at, bt);
            g.capture("sum", sum);
            let prod = g.mul(at, bt);
            g.capture("prod", prod);
            let sum_t = g.transpose(sum); // a strided view: captured via a copy
            g.capture("sum_t", sum_t);
            let cols = g.cols(prod, 1, 3); // [3, n1] view
            g.capture("prod_cols", cols);
            let r = g.reshape(prod, &[n0 * n1]);
            g.capture("prod_flat", r);
            Ok(g.scale(sum, 2.0))
        })
        .unwrap();

    assert_eq!(got.shape, [n0, n1, 1, 1], "output shape");
    let names: Vec<&str> = got.captures.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["a_in", "sum", "prod", "sum_t", "prod_cols", "prod_flat"],
        "registration order"
    );
    assert!(got.capture("missing").is_none());

    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let prod: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    let sum_t: Vec<f32> = (0..n0)
        .flat_map(|i| (0..n1).map(move |j| (i, j)))
        .map(|(i, j)| sum[j * n0 + i])
        .collect();
    let cols: Vec<f32> = (0..n1)
        .flat_map(|j| (1..4).map(move |i| (i, j)))
        .map(|(i, j)| prod[j * n0 + i])
        .collect();
    let expect: [(&str, [usize; 4], &[f32]); 6] = [
        ("a_in", [n0, n1, 1, 1], &a),
        ("sum", [n0, n1, 1, 1], &sum),
        ("prod", [n0, n1, 1, 1], &prod),
        ("sum_t", [n1, n0, 1, 1], &sum_t),
        ("prod_cols", [3, n1, 1, 1], &cols),
        ("prod_flat", [n0 * n1, 1, 1, 1], &prod),
    ];
    for (name, shape, data) in expect {
        let c = got.capture(name).unwrap();
        assert_eq!(c.shape, shape, "{name}: shape");
        assert_eq!(c.data.len(), data.len(), "{name}: length");
        // Single f32 operations: bit-exact.
        assert_eq!(c.data, data, "{name}: values");
    }
    let doubled: Vec<f32> = sum.iter().map(|v| v * 2.0).collect();
    assert_eq!(got.output, doubled, "output values");
}

// ---- 5. a flat compute buffer over 10,000 computes -------------------------------------------------

#[test]
fn ten_thousand_small_computes_keep_the_compute_buffer_flat() {
    const ITERS: usize = 10_000;
    let (k, n) = (64, 4);
    let mut be = backend(2);
    let mut rng = Lcg::new(50);
    let w = rng.vec(k * k);
    let bias = rng.vec(k);
    let mut hw = HostWeights::new();
    hw.push("w", &[k, k], w.clone());
    hw.push("b", &[k], bias.clone());
    let ws = hw.realize().unwrap();
    let x0 = rng.vec(k * n);

    let run = |be: &mut Backend, x: &[f32]| {
        be.compute(|g| {
            let xt = g.input_f32(x, &[k, n]);
            let y = g.linear(xt, &ws["w"], Some(&ws["b"]));
            Ok(g.add(y, xt)) // residual: 64x64 matmul + two adds
        })
        .unwrap()
    };
    let reference = |x: &[f32]| -> Vec<f64> {
        let mut r = matmul_ref(&w, x, k, k, n);
        for (i, v) in r.iter_mut().enumerate() {
            *v += bias[i % k] as f64 + x[i] as f64;
        }
        r
    };

    let first = run(&mut be, &x0);
    assert!(rel_err(&first.output, &reference(&x0)) < REL_TOL);
    let after_first = be.stats().clone();
    assert_eq!(after_first.graphs_computed, 1);
    assert!(
        after_first.compute_buffer_bytes > 0,
        "a compute buffer was allocated"
    );
    assert_eq!(
        after_first.peak_compute_buffer_bytes,
        after_first.compute_buffer_bytes
    );

    let start = std::time::Instant::now();
    let mut x = x0.clone();
    for i in 0..ITERS {
        // Fresh data each call; checked fully every 1000 calls.
        x[i % (k * n)] = (i as f32 * 0.001).sin();
        let out = run(&mut be, &x);
        if i % 1000 == 999 {
            let err = rel_err(&out.output, &reference(&x));
            assert!(err < REL_TOL, "call {i}: rel err {err:.3e}");
        }
        assert_eq!(
            be.stats().compute_buffer_bytes,
            after_first.compute_buffer_bytes,
            "compute buffer changed size at call {i}"
        );
    }
    let elapsed = start.elapsed();
    let after = be.stats();
    println!(
        "{ITERS} computes: {:.1} us/call wall, compute buffer {} bytes throughout",
        elapsed.as_secs_f64() * 1e6 / ITERS as f64,
        after.compute_buffer_bytes
    );
    assert_eq!(after.graphs_computed, ITERS as u64 + 1);
    assert_eq!(after.compute_buffer_bytes, after_first.compute_buffer_bytes);
    assert_eq!(
        after.peak_compute_buffer_bytes,
        after_first.compute_buffer_bytes
    );
    assert!(after.compute_time > after_first.compute_time);
}

// ---- 6. inputs are written after allocation ---------------------------------------------------------

#[test]
fn inputs_written_after_allocation_are_what_the_graph_sees() {
    let mut be = backend(2);
    let (n0, n1) = (5, 3);
    for call in 0..6u32 {
        // Different data every call; same shapes, so the gallocr reuses the same addresses.
        let a: Vec<f32> = (0..n0 * n1)
            .map(|i| (call * 100 + i as u32) as f32)
            .collect();
        let b: Vec<f32> = (0..n0 * n1).map(|i| call as f32 - i as f32 * 0.5).collect();
        let got = be
            .compute(|g| {
                let at = g.input_f32(&a, &[n0, n1]);
                let bt = g.input_f32(&b, &[n0, n1]);
                let d = g.sub(at, bt);
                g.capture("diff", d);
                let m = g.mul(at, bt);
                Ok(g.add(m, d))
            })
            .unwrap();
        let diff: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y + (x - y)).collect();
        assert_eq!(
            got.capture("diff").unwrap().data,
            diff,
            "call {call}: a - b"
        );
        assert_eq!(got.output, want, "call {call}: a * b + (a - b)");
    }
    // A different graph in between (other shapes, other buffer layout), then the first again.
    let big = vec![7.0f32; 1000];
    let got = be
        .compute(|g| {
            let t = g.input_f32(&big, &[1000]);
            Ok(g.scale(t, 3.0))
        })
        .unwrap();
    assert!(got.output.iter().all(|&v| v == 21.0));
    let a = vec![1.5f32; n0 * n1];
    let b = vec![-2.0f32; n0 * n1];
    let got = be
        .compute(|g| {
            let at = g.input_f32(&a, &[n0, n1]);
            let bt = g.input_f32(&b, &[n0, n1]);
            Ok(g.add(at, bt))
        })
        .unwrap();
    assert!(got.output.iter().all(|&v| v == -0.5), "{:?}", got.output);
}

#[test]
fn an_input_the_result_does_not_use_is_skipped() {
    // Not reachable from the output, so the gallocr never allocates it: uploading it anyway
    // would be a ggml abort ("tensor buffer not set").
    let mut be = backend(1);
    let got = be
        .compute(|g| {
            let a = g.input_f32(&[1.0, 2.0, 3.0], &[3]);
            let _unused = g.input_f32(&[9.0; 8], &[8]);
            Ok(g.scale(a, -1.0))
        })
        .unwrap();
    assert_eq!(got.output, [-1.0, -2.0, -3.0]);
}

// ---- 7. threads and devices -----------------------------------------------------------------------

#[test]
fn threads_and_devices_are_reported() {
    let mut be = backend(0);
    assert_eq!(be.threads(), 1, "0 threads means 1");
    be.set_threads(3);
    assert_eq!(be.threads(), 3);
    be.set_threads(0);
    assert_eq!(be.threads(), 1);
    let name = be.device_name();
    assert!(!name.is_empty(), "device name");
    let devices = backend::devices();
    println!("backend {name}; devices: {devices:?}");
    assert!(
        devices
            .iter()
            .any(|d| d.kind == "cpu" && !d.name.is_empty()),
        "no CPU device in {devices:?}"
    );
    // And it still computes at 1 thread.
    let got = be
        .compute(|g| {
            let t = g.input_f32(&[1.0, 2.0], &[2]);
            Ok(g.scale(t, 2.0))
        })
        .unwrap();
    assert_eq!(got.output, [2.0, 4.0]);
}

// ---- 8. shape errors panic (and can be caught) ------------------------------------------------------

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn shape_errors_panic_instead_of_aborting() {
    let mut be = backend(1);
    let caught = catch_unwind(AssertUnwindSafe(|| {
        be.compute(|g| {
            let w = g.input_f32(&[0.0; 12], &[4, 3]);
            let x = g.input_f32(&[0.0; 10], &[5, 2]);
            Ok(g.matmul(w, x)) // inner dims 4 vs 5
        })
    }));
    let msg = panic_message(caught.expect_err("mismatched matmul must panic"));
    assert!(msg.contains("matmul"), "panic message: {msg}");

    let caught = catch_unwind(AssertUnwindSafe(|| {
        be.compute(|g| {
            let a = g.input_f32(&[0.0; 6], &[3, 2]);
            let b = g.input_f32(&[0.0; 4], &[4]);
            Ok(g.add(a, b)) // [4] does not broadcast into [3, 2]
        })
    }));
    let msg = panic_message(caught.expect_err("bad broadcast must panic"));
    assert!(msg.contains("add"), "panic message: {msg}");

    let caught = catch_unwind(AssertUnwindSafe(|| {
        be.compute(|g| {
            let a = g.input_f32(&[0.0; 6], &[3, 2]);
            Ok(g.reshape(a, &[4, 2]))
        })
    }));
    let msg = panic_message(caught.expect_err("bad reshape must panic"));
    assert!(msg.contains("reshape"), "panic message: {msg}");

    // The backend is still usable, and the failed builds did not count as computes.
    assert_eq!(be.stats().graphs_computed, 0);
    let got = be
        .compute(|g| {
            let w = g.input_f32(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
            let x = g.input_f32(&[1.0, 1.0], &[2, 1]);
            Ok(g.matmul(w, x))
        })
        .unwrap();
    assert_eq!(got.output, [3.0, 7.0]);
    assert_eq!(be.stats().graphs_computed, 1);
}

#[test]
fn a_build_error_is_returned_not_panicked() {
    let mut be = backend(1);
    let err = be
        .compute(|g| {
            let _ = g.input_f32(&[1.0], &[1]);
            parakeet::bail!(Internal, "caller gave up")
        })
        .unwrap_err();
    assert!(err.to_string().contains("caller gave up"));
    assert_eq!(be.stats().graphs_computed, 0);
}

/// The LSTM cell's pointwise node (gate order i, f, g, o) against the f64 cell, on 1-3 threads
/// and hidden sizes that leave scalar tails: its vectorised sigmoid and tanh are within f32
/// rounding of the exact functions.
#[test]
fn lstm_pointwise_matches_f64_cell() {
    let mut rng = Lcg::new(21);
    for h in [37usize, 640] {
        // Gate pre-activations over about [-8, 8], the cell over [-2, 2].
        let scaled = |rng: &mut Lcg, n: usize, s: f32| -> Vec<f32> {
            rng.vec(n).iter().map(|v| v * s).collect()
        };
        let (gx, gh) = (scaled(&mut rng, 4 * h, 4.0), scaled(&mut rng, 4 * h, 4.0));
        let (b_ih, b_hh) = (rng.vec(4 * h), rng.vec(4 * h));
        let c = scaled(&mut rng, h, 2.0);
        let mut hw = HostWeights::new();
        hw.push("b_ih", &[4 * h], b_ih.clone());
        hw.push("b_hh", &[4 * h], b_hh.clone());
        let ws = hw.realize().unwrap();
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let gate = |j: usize| ((gx[j] + b_ih[j]) + (gh[j] + b_hh[j])) as f64;
        let mut want = vec![0f64; 2 * h];
        for j in 0..h {
            let cell = sig(gate(h + j)) * c[j] as f64 + sig(gate(j)) * gate(2 * h + j).tanh();
            want[h + j] = cell;
            want[j] = sig(gate(3 * h + j)) * cell.tanh();
        }
        for threads in 1..=3 {
            let mut be = backend(threads);
            let got = be
                .compute(|g| {
                    let (a, b) = (g.input_f32(&gx, &[4 * h, 1]), g.input_f32(&gh, &[4 * h, 1]));
                    let ct = g.input_f32(&c, &[h, 1]);
                    Ok(g.lstm_pointwise(a, b, (&ws["b_ih"], &ws["b_hh"]), ct))
                })
                .unwrap();
            assert_eq!(got.shape, [h, 2, 1, 1]);
            let err = max_abs_err(&got.output, &want);
            assert!(
                err < 1e-6,
                "h {h}, {threads} threads: max abs err {err:.2e}"
            );
        }
    }
}
