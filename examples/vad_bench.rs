//! Silero VAD's speed on one thread: our ggml implementation's real-time factor, and the
//! silero-vad package's ONNX model on the same audio in the same run (scripts/vad_onnx_bench.py
//! under the Python given, with onnxruntime), and the ratio of the two times.
//!
//! `cargo run --release --example vad_bench [WAV] [PYTHON]`: WAV a 16 kHz mono 16-bit file
//! (default: the 53 s sonnet clip of the tests), PYTHON one with silero-vad (--no-deps) and
//! onnxruntime installed (default `python3`; without it only our numbers are printed).

use parakeet::vad::{SampleRate, Vad, VadModel};
use std::process::Command;
use std::time::Instant;

const RUNS: usize = 20;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let wav = args.next().unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/vad/audio/sonnet1_librivox_16k.wav"
        )
        .to_string()
    });
    let python = args.next().unwrap_or_else(|| "python3".into());
    let audio = parakeet::audio::load_audio(wav.as_ref())?;
    anyhow::ensure!(audio.sample_rate == 16000, "{wav}: needs 16 kHz audio");
    let seconds = audio.samples.len() as f64 / 16000.0;
    let mut vad = Vad::new(VadModel::builtin()?, parakeet::session::Threads::ONE)?;
    // Warm-up: the compute buffer's first touch.
    let probs = vad.probabilities(&audio.samples, SampleRate::Hz16000)?;
    let mut best = f64::INFINITY;
    for _ in 0..RUNS {
        let t = Instant::now();
        vad.probabilities(&audio.samples, SampleRate::Hz16000)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let sum: f64 = probs.iter().map(|&p| p as f64).sum();
    println!("audio: {wav} ({seconds:.2} s, {} windows)", probs.len());
    println!(
        "parakeet vad (ggml, 1 thread): {:.3} ms, {:.0}x real time, {:.2} us/window (best of {RUNS}); probability sum {sum:.6}",
        best * 1e3,
        seconds / best,
        best * 1e6 / probs.len() as f64
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/vad_onnx_bench.py");
    let out = Command::new(&python).args([script, &wav, "5"]).output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let onnx: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("seconds "))
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("unexpected output from {script}: {text}"))?;
            let check = text
                .lines()
                .find(|l| l.starts_with("windows"))
                .unwrap_or("");
            println!(
                "silero-vad ONNX (onnxruntime, 1 thread): {:.3} ms, {:.0}x real time, {:.2} us/window (best of 5); {check}",
                onnx * 1e3,
                seconds / onnx,
                onnx * 1e6 / probs.len() as f64
            );
            println!("ours / ONNX time: {:.3}x", best / onnx);
        }
        Ok(o) => println!(
            "ONNX run skipped: {python} {script} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => println!("ONNX run skipped: cannot run {python}: {e}"),
    }
    Ok(())
}
