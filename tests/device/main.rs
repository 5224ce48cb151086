//! A ggml GPU backend (`--device`) against the CPU backend: graphs of ggml's built-in ops
//! computed on the device through ggml's scheduler, each compared with the same graph on the
//! CPU; a device's errors (out of memory) as our errors, never an abort.
//!
//! These need a device: `PARAKEET_TEST_DEVICE=vulkan` (or `cuda`, `vulkan:1`, ...) in a build
//! with that backend (scripts/ci_vulkan.sh runs them on Mesa's lavapipe; scripts/gpu_check.sh
//! on a CUDA GPU). Without it each test prints that it is skipped and returns.

#[path = "../common/mod.rs"]
mod common;

use common::Lcg;
use parakeet::backend::{self, Backend, Computed, DeviceRequest, Graph, Tensor};
use parakeet::error::Result;

/// The device under test, or `None` (with a skip line naming the test) when none was asked for.
fn device_backend(test: &str) -> Option<Backend> {
    backend::silence_ggml_logs();
    let Ok(asked) = std::env::var("PARAKEET_TEST_DEVICE") else {
        // Straight to stderr: the harness captures `println!`, and a skip must show.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: no device asked for (PARAKEET_TEST_DEVICE=vulkan, cuda, ...)"
        );
        return None;
    };
    let request: DeviceRequest = asked.parse().expect("PARAKEET_TEST_DEVICE");
    let device = request.resolve().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !device.is_cpu(),
        "PARAKEET_TEST_DEVICE={asked} resolved to the CPU"
    );
    println!("{test} on {}", device.describe());
    Some(Backend::new(device, 2).expect("device backend"))
}

/// Relative error ‖a − b‖ / ‖b‖ allowed for f32 ops: a GPU sums in another order than the
/// CPU (and ggml's f32 matmul may round its operands through f16 on some devices: the bound
/// is what f16 operands give on values of order 1, about 1e-3).
const REL_TOL: f64 = 2e-3;

/// The same graph on the device and on the CPU backend; returns the relative error of the
/// output and of every capture, and the device's result.
fn both<F>(dev: &mut Backend, build: F) -> (f64, Computed)
where
    F: for<'g> Fn(&mut Graph<'g>) -> Result<Tensor<'g>>,
{
    let on_dev = dev.compute(&build).expect("device compute");
    let on_cpu = Backend::cpu(2)
        .unwrap()
        .compute(&build)
        .expect("cpu compute");
    assert_eq!(on_dev.shape, on_cpu.shape);
    let mut worst = common::rel_err(&on_dev.output, &on_cpu.output);
    for (a, b) in on_dev.captures.iter().zip(&on_cpu.captures) {
        worst = worst.max(common::rel_err(&a.data, &b.data));
    }
    (worst, on_dev)
}

#[test]
fn matmul_softmax_and_norm_match_the_cpu() {
    let Some(mut dev) = device_backend("matmul_softmax_and_norm_match_the_cpu") else {
        return;
    };
    let (k, m, n) = (256, 96, 40);
    let mut r = Lcg::new(7);
    let (w, x) = (r.vec(k * m), r.vec(k * n));
    let (err, out) = both(&mut dev, |g| {
        let w = g.input_f32(&w, &[k, m]);
        let x = g.input_f32(&x, &[k, n]);
        let y = g.mul_mat(w, x);
        let s = g.softmax(y, 0.125);
        g.capture("softmax", s);
        let y = g.norm(y, 1e-5);
        let y = g.silu(y);
        Ok(g.add(y, s))
    });
    println!("matmul+softmax+norm+silu: rel err {err:.2e}");
    assert!(err < REL_TOL, "rel err {err:e}");
    assert_eq!(out.shape, [m, n, 1, 1]);
    let stats = dev.stats();
    assert!(stats.on_device && stats.graphs_computed == 1);
    assert!(
        stats.fallback_ops.is_empty(),
        "these ops fell back: {:?}",
        stats.fallback_ops
    );
}

#[test]
fn gathers_convolutions_and_views_match_the_cpu() {
    let Some(mut dev) = device_backend("gathers_convolutions_and_views_match_the_cpu") else {
        return;
    };
    let mut r = Lcg::new(11);
    let (d, vocab) = (64, 50);
    let table = r.vec(d * vocab);
    let ids = [3i32, 0, 49, 17, 3];
    let (c, w, h) = (16, 20, 6);
    let x = r.vec(w * h * c);
    let kernel = r.vec(9 * c);
    let (err, _) = both(&mut dev, |g| {
        let table = g.input_f32(&table, &[d, vocab]);
        let ids = g.input_i32(&ids, &[ids.len()]);
        let rows = g.get_rows(table, ids);
        g.capture("rows", rows);
        let x = g.input_f32(&x, &[w, h, c, 1]);
        let k = g.input_f32(&kernel, &[3, 3, 1, c]);
        let y = g.conv2d_depthwise(k, x, 1, 1);
        Ok(g.scale(y, 0.5))
    });
    println!("get_rows+depthwise conv: rel err {err:.2e}");
    assert!(err < REL_TOL, "rel err {err:e}");
}

#[test]
fn state_tensors_live_on_the_device_and_keep_their_values() {
    let Some(mut dev) = device_backend("state_tensors_live_on_the_device_and_keep_their_values")
    else {
        return;
    };
    let mut state = dev.state_tensors(&[[4, 3]]).expect("state");
    state.write_rows(0, 1, &[1.0, 2.0, 3.0, 4.0]);
    for round in 1..=2 {
        let got = dev
            .compute(|g| {
                let s = g.state(&state, 0);
                let row = g.rows(s, 1, 1);
                let doubled = g.scale(row, 2.0);
                let dst = g.rows(s, 2, 1);
                let w = g.write(doubled, dst);
                Ok(g.add(w, doubled))
            })
            .expect("compute");
        assert_eq!(got.output, [4.0, 8.0, 12.0, 16.0], "round {round}");
    }
    assert_eq!(state.read_rows(0, 2, 1), [2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn out_of_device_memory_is_an_error_naming_the_device() {
    let Some(dev) = device_backend("out_of_device_memory_is_an_error_naming_the_device") else {
        return;
    };
    let name = dev.device().name();
    // 2^40 bytes: more than any device has.
    let e = dev
        .state_tensors(&[[1 << 19, 1 << 19]])
        .expect_err("a terabyte of state");
    let m = e.to_string();
    println!("{m}");
    assert!(m.contains(&name) && m.contains("MiB"), "{m}");
}
