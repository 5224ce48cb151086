//! `--device` at every door: a backend this build lacks, a device that is absent, an index out
//! of range and a malformed value are each one line naming what was asked for, exit 2, before
//! any model is loaded; `info --system` lists the registry's devices; `--profile` names the
//! device that ran.

use crate::common::*;

/// Every GPU API this build lacks, with a request for it.
fn missing_apis() -> Vec<&'static str> {
    [
        ("vulkan", cfg!(feature = "vulkan")),
        ("cuda", cfg!(feature = "cuda")),
        ("metal", cfg!(feature = "metal")),
    ]
    .into_iter()
    .filter(|(_, built)| !built)
    .map(|(name, _)| name)
    .collect()
}

#[test]
fn a_backend_this_build_lacks_is_refused_at_every_door() {
    let cache = scratch_dir("device", "lacks");
    let model = fixtures().join("tiny_tdt.nemo");
    let clip = fixtures().join("reference/speech_2s.wav");
    let (m, c) = (model.to_str().unwrap(), clip.to_str().unwrap());
    let missing = missing_apis();
    if missing.is_empty() {
        println!("skipped: this build has every GPU backend");
        return;
    }
    for api in missing {
        for args in [
            vec!["transcribe", c, "-m", m, "--device", api],
            vec!["stream", c, "-m", m, "--device", api],
            vec!["diarize", c, "-m", m, "--device", api],
            vec!["serve", "-m", m, "--port", "0", "--device", api],
        ] {
            let out = run_parakeet(&args, &cache);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains(&format!("--features {api}")) && err.lines().count() <= 2,
                "{args:?}: {err}"
            );
        }
    }
}

#[test]
fn malformed_devices_are_usage_errors() {
    let cache = scratch_dir("device", "malformed");
    let model = fixtures().join("tiny_tdt.nemo");
    let clip = fixtures().join("reference/speech_2s.wav");
    for bad in ["gpu", "vulkan:x", "cpu:1", "cuda:-1"] {
        let args = [
            "transcribe",
            clip.to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "--device",
            bad,
        ];
        let out = run_parakeet(&args, &cache);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(bad), "{bad}: {err}");
    }
}

#[test]
fn the_cpu_device_runs_and_says_so() {
    let cache = scratch_dir("device", "cpu");
    let model = fixtures().join("tiny_tdt.nemo");
    let clip = fixtures().join("reference/speech_2s.wav");
    let (m, c) = (model.to_str().unwrap(), clip.to_str().unwrap());
    let plain = run_parakeet(&["transcribe", c, "-m", m], &cache);
    let cpu = run_parakeet(
        &["transcribe", c, "-m", m, "--device", "cpu", "--profile"],
        &cache,
    );
    assert!(
        cpu.status.success(),
        "{}",
        String::from_utf8_lossy(&cpu.stderr)
    );
    assert_eq!(plain.stdout, cpu.stdout, "--device cpu changed the text");
    let err = String::from_utf8_lossy(&cpu.stderr);
    assert!(err.contains("device CPU"), "{err}");

    let info = run_parakeet(&["info", "--system"], &cache);
    let out = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success());
    assert!(
        out.contains("devices:") && out.contains("--device auto:"),
        "{out}"
    );
    let cpu_line = out.lines().find(|l| l.trim_start().starts_with("CPU"));
    assert!(
        cpu_line.is_some_and(|l| l.contains("cpu") && l.contains("MiB")),
        "{out}"
    );
}
