//! Sortformer diarization's cost against transcription's on the same audio, at 2 threads: the
//! offline v1 shape over the whole recording, the streaming v2 shape streamed with NeMo's
//! inference sizes (chunks of 6 frames, 0.48 s, with 1 / 7 frames of context, FIFO and speaker
//! cache 188 frames) and its cost per chunk against the chunk's 0.48 s, and the ASR model's
//! transcription (features, encoder, greedy decoding) of the same samples.
//!
//! `cargo run --release --example diar_bench ASR.gguf V1.gguf V2.gguf WAV [REPEAT] [RUNS]`:
//! WAV 16 kHz mono, tiled REPEAT times (default 1); each time is the best of RUNS (default 3)
//! after a warm-up. The full-size Sortformer shapes: `scripts/synth_sortformer.py`.

use parakeet::diar::Diarizer;
use parakeet::session::{DecodeOptions, DecodeRequest, Session, Threads};
use std::path::PathBuf;
use std::time::Instant;

#[path = "common/cpu_time.rs"]
mod cpu_time;

const THREADS: usize = 2;

/// Best wall time of `runs` calls of `f` after one warm-up, and the CPU seconds of that run.
fn best_of(runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    f()?;
    let mut best = (f64::INFINITY, 0.0);
    for _ in 0..runs {
        let (t, c) = (Instant::now(), cpu_time::cpu_seconds());
        f()?;
        let wall = t.elapsed().as_secs_f64();
        if wall < best.0 {
            best = (wall, cpu_time::cpu_seconds() - c);
        }
    }
    Ok(best)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        args.len() >= 4,
        "usage: diar_bench ASR.gguf V1.gguf V2.gguf WAV [REPEAT] [RUNS]"
    );
    let (asr, v1, v2, wav) = (
        PathBuf::from(&args[0]),
        PathBuf::from(&args[1]),
        PathBuf::from(&args[2]),
        &args[3],
    );
    let repeat: usize = args.get(4).map_or(Ok(1), |s| s.parse())?;
    let runs: usize = args.get(5).map_or(Ok(3), |s| s.parse())?;
    let audio = parakeet::audio::load_audio(wav.as_ref())?;
    anyhow::ensure!(audio.sample_rate == 16000, "{wav}: needs 16 kHz audio");
    let samples: Vec<f32> = audio.samples.repeat(repeat);
    let seconds = samples.len() as f64 / 16000.0;
    println!("audio: {wav} x {repeat} = {seconds:.1} s, {THREADS} threads, best of {runs}");

    let mut session = Session::load(&asr, Threads::new(THREADS)?)?;
    let options = DecodeOptions::new(session.model(), &DecodeRequest::default())?;
    let mut stages = (0.0, 0.0);
    let (asr_s, asr_cpu) = best_of(runs, || {
        let t = session.transcribe(samples.clone(), &options)?;
        stages = (
            (t.times.features + t.times.encoder).as_secs_f64(),
            t.times.decoder.as_secs_f64(),
        );
        Ok(())
    })?;
    println!(
        "transcription ({}): {:.1} ms (cpu {:.1} s), RTF {:.4}; features + encoder {:.1} ms, \
         decoder {:.1} ms (last run)",
        asr.display(),
        asr_s * 1e3,
        asr_cpu,
        asr_s / seconds,
        stages.0 * 1e3,
        stages.1 * 1e3
    );

    let mut d1 = Diarizer::load(&v1, THREADS)?;
    let (v1_s, v1_cpu) = best_of(runs, || d1.diarize_offline(&samples).map(|_| ()))?;
    println!(
        "v1 offline diarization ({}): {:.1} ms (cpu {:.1} s), RTF {:.4}, {:.3}x the transcription, \
         {:.3}x its features + encoder",
        v1.display(),
        v1_s * 1e3,
        v1_cpu,
        v1_s / seconds,
        v1_s / asr_s,
        v1_s / stages.0
    );

    // Where v1's time goes: one more pass with every graph node timed by kind.
    d1.set_op_timing(true);
    d1.diarize_offline(&samples)?;
    println!("v1 offline, one pass:");
    parakeet::cli::profile::print_backend(d1.stats());

    let mut d2 = Diarizer::load(&v2, THREADS)?;
    let settings = d2.params().streaming.inference_defaults();
    let mut trace = Vec::new();
    d2.diarize_streaming_traced(&samples, &settings, &mut trace)?;
    let chunks = trace.len();
    let (v2_s, v2_cpu) = best_of(runs, || {
        d2.diarize_streaming(&samples, &settings).map(|_| ())
    })?;
    let chunk_s = settings.chunk_len as f64 * d2.frame_seconds();
    let per_chunk = v2_s / chunks as f64;
    println!(
        "v2 streaming diarization ({}): {:.1} ms (cpu {:.1} s), RTF {:.4}, {:.3}x the transcription; \
         {chunks} chunks of {chunk_s:.2} s: {:.1} ms per chunk ({:.1} % of the chunk's {chunk_s:.2} s)",
        v2.display(),
        v2_s * 1e3,
        v2_cpu,
        v2_s / seconds,
        v2_s / asr_s,
        per_chunk * 1e3,
        100.0 * per_chunk / chunk_s
    );
    let (v2_off, _) = best_of(runs, || d2.diarize_offline(&samples).map(|_| ()))?;
    println!(
        "v2 full context (one pass): {:.1} ms, {:.3}x the transcription",
        v2_off * 1e3,
        v2_off / asr_s
    );
    Ok(())
}
