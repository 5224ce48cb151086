//! `parakeet`: speech to text with NVIDIA Parakeet models on ggml.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use parakeet::audio;
use parakeet::convert::{OutType, convert_with_progress};
use parakeet::model::Model;
use parakeet::output::{self, Format, OutputMeta};
use parakeet::transcribe::{DecoderChoice, StageTimes, Transcriber, Transcript};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "parakeet",
    version,
    about = "Speech to text with NVIDIA Parakeet models (ggml, CPU)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Transcribe audio files and directories (walked recursively).
    Transcribe(TranscribeArgs),
    /// Convert a NeMo checkpoint (.nemo) to GGUF.
    Convert {
        /// Input .nemo file.
        input: PathBuf,
        /// Output .gguf file.
        output: PathBuf,
        /// Storage type of the large matmul weights (everything else stays f32).
        #[arg(long = "type", value_enum, default_value = "f32")]
        ty: OutType,
    },
    /// List the converted models in the cache.
    Models,
    /// Describe a model: architecture, hyperparameters, tensors by type.
    Info {
        /// A .gguf, a .nemo (converted once into the cache) or a hub id (owner/name).
        model: PathBuf,
    },
}

#[derive(Args)]
struct TranscribeArgs {
    /// Audio files or directories; `-` reads WAV/FLAC from standard input.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Model: a .gguf file, a .nemo file (converted once into the cache), or a Hugging Face hub
    /// id such as nvidia/parakeet-tdt-0.6b-v2 (downloaded, converted and cached once).
    #[arg(short, long, env = "PARAKEET_MODEL")]
    model: PathBuf,
    /// Threads for the compute backend (default: available cores).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Decoder head: the model's transducer (default) or its CTC head.
    #[arg(long, value_enum, default_value = "auto")]
    decoder: DecoderChoice,
    /// Output formats (comma-separated or repeated): txt, json, srt, vtt, tsv, all.
    #[arg(
        short = 'f',
        long = "format",
        value_delimiter = ',',
        default_value = "txt"
    )]
    formats: Vec<String>,
    /// Write outputs under this directory, mirroring the input tree.
    #[arg(short, long)]
    output_dir: Option<PathBuf>,
    /// Skip inputs whose outputs all exist already (resume a batch).
    #[arg(long)]
    skip_existing: bool,
    /// Print word timings with the text.
    #[arg(long)]
    timestamps: bool,
    /// No progress bar or per-file lines on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// Print where the time went (stage table) on stderr.
    #[arg(long)]
    profile: bool,
    /// Longest piece of audio encoded at once; longer audio is cut at quiet points (full
    /// attention memory grows with the square of the length).
    #[arg(long, value_name = "SECONDS", default_value_t = parakeet::transcribe::DEFAULT_MAX_CHUNK_SECONDS)]
    max_chunk_seconds: f64,
    /// Write every encoder layer's output as .npy (named like NeMo's reference dumps).
    #[arg(long, value_name = "DIR")]
    dump_layers: Option<PathBuf>,
}

/// Exit codes: 0 all good, 1 some inputs failed, 2 usage or model errors.
const EXIT_FAILED_INPUTS: u8 = 1;
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    parakeet::backend::silence_ggml_logs();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Transcribe(args) => transcribe(args),
        Command::Convert { input, output, ty } => run_convert(&input, &output, ty).map(|_| 0),
        Command::Info { model } => info(&model).map(|_| 0),
        Command::Models => list_models().map(|_| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run_convert(input: &Path, output: &Path, ty: OutType) -> Result<()> {
    let r = convert_with_progress(input, output, ty, |_, _| {})?;
    eprintln!(
        "{} -> {}: {:?} ({} tensors, {:.1}M params; f32 {}, f16 {}, q8_0 {}), {:.1} MiB in {:.2} s",
        input.display(),
        output.display(),
        r.model_type,
        r.tensors,
        r.params as f64 / 1e6,
        r.f32_tensors,
        r.f16_tensors,
        r.q8_0_tensors,
        r.bytes as f64 / (1 << 20) as f64,
        r.elapsed.as_secs_f64()
    );
    Ok(())
}

fn resolve_model(model: &Path) -> Result<PathBuf> {
    parakeet::model_source::resolve(model, &mut |line| eprintln!("{line}"))
}

fn list_models() -> Result<()> {
    let dir = parakeet::model_source::cache_dir();
    let models = parakeet::model_source::list_cached()?;
    if models.is_empty() {
        println!("no converted models in {}", dir.display());
    }
    for m in models {
        let desc = Model::load(&m.path)
            .map(|model| {
                let hp = &model.hparams;
                format!(
                    "{} {} x {}, {} mels",
                    hp.model_type.name(),
                    hp.encoder.n_layers,
                    hp.encoder.d_model,
                    hp.preprocessor.n_mels
                )
            })
            .unwrap_or_else(|e| format!("unreadable: {e:#}"));
        println!(
            "{:>9.1} MiB  {}  ({desc})",
            m.bytes as f64 / (1 << 20) as f64,
            m.path.display()
        );
    }
    Ok(())
}

fn info(model: &Path) -> Result<()> {
    let path = resolve_model(model)?;
    let m = Model::load(&path)?;
    let hp = &m.hparams;
    let e = &hp.encoder;
    println!("model:        {} ({})", m.name, path.display());
    println!("type:         {}", hp.model_type.name());
    println!(
        "front end:    {} Hz, {} mels, n_fft {}, window {}, hop {}",
        hp.preprocessor.sample_rate,
        hp.preprocessor.n_mels,
        hp.preprocessor.n_fft,
        hp.preprocessor.win_length,
        hp.preprocessor.hop_length
    );
    println!(
        "encoder:      {} layers x d_model {}, {} heads, ff {}, conv kernel {}, subsampling x{} ({} ch), xscaling {}, attention context {:?}",
        e.n_layers,
        e.d_model,
        e.n_heads,
        e.ff_dim,
        e.conv_kernel,
        e.subsampling_factor,
        e.subsampling_channels,
        e.xscaling,
        e.att_context
    );
    if hp.model_type.has_transducer() {
        println!(
            "decoder:      LSTM {} x {}, joint {}, max symbols {}{}",
            hp.pred_layers,
            hp.pred_hidden,
            hp.joint_hidden,
            hp.max_symbols,
            if hp.durations.is_empty() {
                String::new()
            } else {
                format!(", TDT durations {:?}", hp.durations)
            }
        );
    }
    println!(
        "vocabulary:   {} pieces (blank id {})",
        hp.vocab_size,
        hp.blank_id()
    );
    let mut by_type: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    let names = m.file.tensor_names();
    for name in names {
        if let Some(w) = m.file.any_weight(name) {
            let entry = by_type.entry(w.dtype().name()).or_default();
            entry.0 += 1;
            entry.1 += w.bytes();
        }
    }
    let total: usize = by_type.values().map(|v| v.1).sum();
    println!(
        "tensors:      {} ({:.1} MiB)",
        names.len(),
        total as f64 / (1 << 20) as f64
    );
    for (ty, (n, bytes)) in by_type {
        println!(
            "  {ty:<5} {n:>5} tensors {:>10.1} MiB",
            bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}

/// One input to transcribe: the file, and the directory argument it was found under.
struct Job {
    path: PathBuf,
    root: Option<PathBuf>,
}

fn collect_inputs(inputs: &[PathBuf]) -> Result<(Vec<Job>, usize)> {
    let mut jobs = Vec::new();
    let mut skipped = 0;
    for input in inputs {
        if input.as_os_str() == "-" || !input.is_dir() {
            // Files are taken as given (a missing one fails on its own, in the batch).
            jobs.push(Job {
                path: input.clone(),
                root: None,
            });
            continue;
        }
        let mut found: Vec<PathBuf> = Vec::new();
        for entry in walkdir::WalkDir::new(input).follow_links(true) {
            match entry {
                Ok(e) if e.file_type().is_file() => {
                    if audio::is_audio_path(e.path()) {
                        found.push(e.into_path());
                    } else {
                        skipped += 1;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // An unreadable directory entry is reported as a failed input.
                    let path = e
                        .path()
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| input.clone());
                    found.push(path);
                }
            }
        }
        found.sort();
        jobs.extend(found.into_iter().map(|path| Job {
            path,
            root: Some(input.clone()),
        }));
    }
    Ok((jobs, skipped))
}

fn parse_formats(list: &[String]) -> Result<Vec<Format>> {
    let mut out = Vec::new();
    for f in list {
        if f.eq_ignore_ascii_case("all") {
            out.extend(Format::ALL);
            continue;
        }
        let fmt = <Format as clap::ValueEnum>::from_str(f, true)
            .map_err(|_| anyhow::anyhow!("unknown format '{f}' (txt, json, srt, vtt, tsv, all)"))?;
        out.push(fmt);
    }
    out.dedup();
    Ok(out)
}

/// Per-stage totals over a batch, for `--profile`.
#[derive(Default)]
struct Profile {
    load: Duration,
    read: Duration,
    stages: StageTimes,
    audio_seconds: f64,
}

fn transcribe(args: TranscribeArgs) -> Result<u8> {
    let formats = parse_formats(&args.formats)?;
    let (jobs, skipped_non_audio) = collect_inputs(&args.inputs)?;
    if jobs.is_empty() {
        bail!(
            "no audio files found in the given inputs ({skipped_non_audio} non-audio files skipped)"
        );
    }
    let start = Instant::now();
    let model_path = resolve_model(&args.model)?;
    let threads = args.threads.unwrap_or_else(default_threads);
    let mut tr = Transcriber::load(&model_path, threads)?;
    tr.set_max_chunk_seconds(args.max_chunk_seconds);
    let mut profile = Profile {
        load: start.elapsed(),
        ..Default::default()
    };
    let model_name = tr.model.name.clone();
    let single = jobs.len() == 1;
    // Text goes to stdout unless outputs are written to files.
    let to_files = args.output_dir.is_some() || formats.iter().any(|f| *f != Format::Txt);
    let progress = (!args.quiet && !single && std::io::stderr().is_terminal())
        .then(|| progress_bar(jobs.len()));

    let (mut done, mut failed, mut skipped) = (0usize, 0usize, 0usize);
    for job in &jobs {
        let outputs: Vec<(Format, PathBuf)> = if to_files {
            formats
                .iter()
                .map(|&f| (f, destination(job, args.output_dir.as_deref(), f)))
                .collect()
        } else {
            Vec::new()
        };
        if args.skip_existing && !outputs.is_empty() && outputs.iter().all(|(_, p)| p.exists()) {
            skipped += 1;
            if let Some(pb) = &progress {
                pb.inc(1);
            }
            continue;
        }
        let result = transcribe_one(&mut tr, job, &args, &mut profile).and_then(|t| {
            let meta = OutputMeta {
                model: model_name.clone(),
                audio_path: job.path.display().to_string(),
                audio_seconds: t.audio_seconds,
                timings: vec![
                    ("features".into(), t.times.features.as_secs_f64()),
                    ("encoder".into(), t.times.encoder.as_secs_f64()),
                    ("decoder".into(), t.times.decoder.as_secs_f64()),
                ],
            };
            for (format, path) in &outputs {
                output::check_not_input(path, &job.path)?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("{}: cannot create directory", dir.display()))?;
                }
                output::write_atomic(path, output::render(*format, &t, &meta).as_bytes())?;
            }
            Ok(t)
        });
        match result {
            Ok(t) => {
                done += 1;
                if !to_files {
                    print_transcript(&t, job, single, args.timestamps);
                } else if !args.quiet && progress.is_none() {
                    eprintln!(
                        "{}: {:.1} s of audio -> {} file(s)",
                        job.path.display(),
                        t.audio_seconds,
                        outputs.len()
                    );
                }
            }
            Err(e) => {
                failed += 1;
                let msg = format!("error: {e:#}");
                match &progress {
                    Some(pb) => pb.println(msg),
                    None => eprintln!("{msg}"),
                }
            }
        }
        if let Some(pb) = &progress {
            pb.inc(1);
            let wall = start.elapsed().as_secs_f64();
            pb.set_message(format!(
                "{:.2} h audio, {:.1}x real time",
                profile.audio_seconds / 3600.0,
                profile.audio_seconds / wall.max(1e-9)
            ));
        }
    }
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    let wall = start.elapsed();
    if !single && !args.quiet {
        eprintln!(
            "{done} done, {failed} failed, {skipped} skipped, {skipped_non_audio} non-audio files ignored; {:.1} s of audio in {:.1} s ({:.1}x real time)",
            profile.audio_seconds,
            wall.as_secs_f64(),
            profile.audio_seconds / wall.as_secs_f64().max(1e-9)
        );
    }
    if args.profile {
        print_profile(&profile, &tr, wall);
    }
    Ok(if failed > 0 { EXIT_FAILED_INPUTS } else { 0 })
}

fn transcribe_one(
    tr: &mut Transcriber,
    job: &Job,
    args: &TranscribeArgs,
    profile: &mut Profile,
) -> Result<Transcript> {
    let shown = job.path.display().to_string();
    let t0 = Instant::now();
    let decoded = if job.path.as_os_str() == "-" {
        audio::read_stdin()?
    } else {
        audio::load_audio(&job.path)?
    };
    let samples =
        audio::resample_to_16k(decoded).with_context(|| format!("{shown}: resampling"))?;
    profile.read += t0.elapsed();
    if let Some(dir) = &args.dump_layers {
        dump_layers(tr, &samples, dir).with_context(|| format!("{shown}: dumping layers"))?;
    }
    let t = tr
        .transcribe(&samples, args.decoder)
        .with_context(|| shown.clone())?;
    profile.stages.add(&t.times);
    profile.audio_seconds += t.audio_seconds;
    Ok(t)
}

fn print_transcript(t: &Transcript, job: &Job, single: bool, timestamps: bool) {
    if single {
        println!("{}", t.text);
    } else {
        println!("{}\t{}", job.path.display(), t.text);
    }
    if timestamps {
        print!("{}", output::format_timestamps_line(&t.words));
    }
}

fn destination(job: &Job, out_dir: Option<&Path>, format: Format) -> PathBuf {
    match out_dir {
        Some(dir) => output::output_path(&job.path, job.root.as_deref(), dir, format),
        None if job.path.as_os_str() == "-" => {
            PathBuf::from(format!("stdin.{}", format.extension()))
        }
        None => job.path.with_extension(format.extension()),
    }
}

fn dump_layers(tr: &mut Transcriber, samples: &[f32], dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let features = tr.features(samples);
    let enc = tr.encode(&features, true)?;
    use npyz::WriterBuilder;
    let mut all = enc.layers;
    all.push(("encoder_out_tc".to_string(), enc.output));
    for (name, data) in &all {
        let path = dir.join(format!("{name}.npy"));
        let mut bytes = Vec::new();
        {
            let mut w = npyz::WriteOptions::<f32>::new()
                .default_dtype()
                .shape(&[enc.frames as u64, (data.len() / enc.frames) as u64])
                .writer(&mut bytes)
                .begin_nd()?;
            w.extend(data.iter().copied())?;
            w.finish()?;
        }
        output::write_atomic(&path, &bytes)?;
    }
    Ok(())
}

fn progress_bar(n: usize) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} files  {msg}  ETA {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn print_profile(p: &Profile, tr: &Transcriber, wall: Duration) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let stats = tr.backend.stats();
    let per_step = if p.stages.decoder_steps > 0 {
        format!(
            "{} steps, {} LSTM updates, {} graphs, {:.0} us/step",
            p.stages.decoder_steps,
            p.stages.predictor_steps,
            p.stages.decoder_graphs,
            p.stages.decoder.as_secs_f64() * 1e6 / p.stages.decoder_steps as f64
        )
    } else {
        String::from("CTC greedy")
    };
    eprintln!("stage                  time (ms)");
    eprintln!("model load          {:>12.1}", ms(p.load));
    eprintln!("audio read+resample {:>12.1}", ms(p.read));
    eprintln!("features            {:>12.1}", ms(p.stages.features));
    eprintln!("encoder             {:>12.1}", ms(p.stages.encoder));
    eprintln!(
        "decoder             {:>12.1}   ({per_step})",
        ms(p.stages.decoder)
    );
    eprintln!("total               {:>12.1}", ms(wall));
    if p.audio_seconds > 0.0 {
        eprintln!(
            "audio {:.2} s, real-time factor {:.4} ({:.1}x faster than real time), {} threads, {}",
            p.audio_seconds,
            wall.as_secs_f64() / p.audio_seconds,
            p.audio_seconds / wall.as_secs_f64(),
            tr.backend.threads(),
            tr.backend.device_name()
        );
    }
    eprintln!(
        "graphs computed {}, peak compute buffer {:.1} MiB, peak RSS {}",
        stats.graphs_computed,
        stats.peak_compute_buffer_bytes as f64 / (1 << 20) as f64,
        peak_rss_bytes().map_or("n/a".into(), |b| format!(
            "{:.1} MiB",
            b as f64 / (1 << 20) as f64
        ))
    );
}
