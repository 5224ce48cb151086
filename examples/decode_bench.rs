//! What confidence, phrase boosting and beam search cost against greedy decoding, measured in
//! one process over one encoder pass: every variant decodes the same encoder output REPS times,
//! interleaved, and the median decoder time is reported. Free of the noise a whole CLI run adds
//! (process start, loading, the encoder), so a few percent show.
//!
//! With phrases, boosting runs twice: at alpha 1, and at alpha 1e-6 ("same path"), where the
//! tree is walked and every bonus computed and added exactly as at alpha 1 but the bonus is too
//! small to change a decision, so the decoder takes greedy's path. On a random-weight model the
//! blank/token margins are tiny and alpha 1 changes the path (many more tokens, each a
//! prediction-net step); the same-path variant measures what boosting itself costs.
//!
//! Usage: cargo run --release --example decode_bench -- MODEL.gguf FILE.wav [PHRASES.txt]
//!   env: THREADS=2 REPS=31 BEAM=4

use anyhow::{Context, Result};
use parakeet::audio::{load_audio, resample_to_16k};
use parakeet::decoder::boosting::BoostingConfig;
use parakeet::decoder::confidence::ConfidenceConfig;
use parakeet::session::{BeamRequest, DecodeOptions, DecodeRequest, Session, Threads};
use std::path::PathBuf;
use std::time::Instant;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_seconds;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, file) = match &args[..] {
        [m, f, ..] => (PathBuf::from(m), PathBuf::from(f)),
        _ => anyhow::bail!("usage: decode_bench MODEL.gguf FILE.wav [PHRASES.txt]"),
    };
    let (threads, reps, beam) = (env_or("THREADS", 2), env_or("REPS", 31), env_or("BEAM", 4));
    parakeet::backend::silence_ggml_logs();
    let mut session = Session::load(&model, Threads::new(threads)?)?;
    let samples = resample_to_16k(load_audio(&file)?)?;
    let features = session.features(&samples);
    let encoded = session.encode(&features, false)?;

    let phrases: Option<Vec<String>> = match args.get(2) {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| path.clone())?
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(String::from)
                .collect(),
        ),
        None => None,
    };
    let options = |confidence: bool, alpha: Option<f32>, beamed: bool| -> Result<DecodeOptions> {
        let boost = alpha.and_then(|alpha| {
            phrases.clone().map(|phrases| BoostingConfig {
                phrases,
                alpha,
                ..BoostingConfig::default()
            })
        });
        let request = DecodeRequest {
            confidence: confidence.then(ConfidenceConfig::default),
            boost,
            beam: beamed.then(|| BeamRequest::new(beam)),
            ..DecodeRequest::default()
        };
        let built = Instant::now();
        let opts = DecodeOptions::new(session.model(), &request)?;
        if let Some(tree) = opts.boosting() {
            println!(
                "boosting tree: {} phrases, {} states, {} arcs, built in {:.1} ms",
                tree.phrases(),
                tree.states().len(),
                tree.arcs().len(),
                built.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(opts)
    };

    // (name, options)
    let mut variants: Vec<(&str, DecodeOptions)> = vec![
        ("greedy", options(false, None, false)?),
        ("greedy+confidence", options(true, None, false)?),
    ];
    if phrases.is_some() {
        variants.push(("greedy+boost", options(false, Some(1.0), false)?));
        variants.push(("greedy+boost same path", options(false, Some(1e-6), false)?));
    }
    variants.push(("beam", options(false, None, true)?));
    if phrases.is_some() {
        variants.push(("beam+boost", options(false, Some(1.0), true)?));
    }
    let mut times = vec![Vec::new(); variants.len()];
    let mut cpu = vec![Vec::new(); variants.len()];
    let mut tokens = vec![Vec::new(); variants.len()];
    for _ in 0..reps {
        for (i, (_, opts)) in variants.iter().enumerate() {
            let (start, start_cpu) = (Instant::now(), cpu_seconds());
            let decoded = session.decode(&encoded, opts)?;
            times[i].push(start.elapsed().as_secs_f64() * 1e3);
            cpu[i].push((cpu_seconds() - start_cpu) * 1e3);
            tokens[i] = decoded
                .tokens
                .iter()
                .map(|t| (t.id, t.frame, t.duration))
                .collect();
        }
    }
    println!(
        "{}, {} frames, {threads} threads, {reps} reps interleaved, median decoder ms (wall; process CPU)",
        file.display(),
        encoded.frames
    );
    let (base, base_cpu) = (median(times[0].clone()), median(cpu[0].clone()));
    for (i, (name, ..)) in variants.iter().enumerate() {
        let (m, c) = (median(times[i].clone()), median(cpu[i].clone()));
        let path = if tokens[i] == tokens[0] {
            "greedy's path"
        } else {
            "another path"
        };
        println!(
            "{name:<24} wall {m:>9.3} ms {:>6.3}x   cpu {c:>9.3} ms {:>6.3}x  ({} tokens, {path})",
            m / base,
            c / base_cpu,
            tokens[i].len()
        );
    }
    Ok(())
}
