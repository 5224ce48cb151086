//! `parakeet`: speech to text with NVIDIA Parakeet models on ggml.

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use parakeet::audio;
use parakeet::backend::KernelChoice;
// Exit codes: 0 all good, 1 some inputs of a batch failed (or an internal error), 2 the
// user's error (flags, options, model, the one input given): `cli::Outcome`'s rule.
use parakeet::cli::{EXIT_FAILED_INPUTS, EXIT_USAGE, Outcome, signals};
use parakeet::convert::{OutType, convert_with_progress};
use parakeet::decoding_flags::{BeamArgs, BoostArgs, ConfidenceArgs};
use parakeet::diar::{DEFAULT_MODEL as DEFAULT_DIAR_MODEL, Diarizer};
use parakeet::encoder::AttentionChoice;
use parakeet::hparams::Attention;
use parakeet::kernels::cpu::Isa;
use parakeet::layout::Layout;
use parakeet::model::{LoadOptions, Model};
use parakeet::output::{self, Format, OutputMeta};
use parakeet::session::pipeline::{self, Input, Limits};
use parakeet::session::{DecodeOptions, DecodeRequest, DecoderChoice, DeviceArg, Session, Threads};
use parakeet::stream::input::{self, AudioSource, RawFormat, RawLayout};
use parakeet::stream::open::{LiveKind, LiveOptions, LiveRequest, open_live};
use parakeet::stream::pump::{PumpOptions, pump};
use parakeet::stream::render::{EventFormat, EventWriter};
use parakeet::stream::speakers;
use parakeet::stream::turns::{TurnParams, VadTurns};
use parakeet::transcript::{StageTimes, Transcript};
use parakeet::vad::VadModel;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
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
        #[arg(long = "type", value_name = "TYPE", value_enum, default_value = "f32")]
        ty: OutType,
    },
    /// List the converted models in the cache (PARAKEET_CACHE, else
    /// $XDG_CACHE_HOME/parakeet, else ~/.cache/parakeet), or remove some.
    Models {
        /// Remove this model's files from the cache (a name as listed, or one file's name);
        /// repeat for several.
        #[arg(long, value_name = "NAME")]
        remove: Vec<String>,
        /// Remove the extra copies of each model (one checkpoint converted from two places,
        /// e.g. two clones of a repository), keeping one.
        #[arg(long)]
        prune: bool,
    },
    /// Transcribe live audio as it arrives: the default microphone when no INPUT is given, `-`
    /// for standard input, or a file. A cache-aware model streams with its encoder caches, any
    /// other model with NeMo's buffered streaming (each chunk encoded with left and right
    /// context).
    Stream(StreamArgs),
    /// Who speaks when: speaker turns with a Sortformer diarization model, as NeMo's lines
    /// (txt), RTTM or JSON. A streaming model (v2) streams, as NeMo's inference example does.
    Diarize(parakeet::cli::diarize::DiarizeArgs),
    /// Serve the OpenAI transcription API (POST /v1/audio/transcriptions, and live
    /// transcription over a WebSocket at /v1/realtime) over one loaded model.
    // Each flag's help under it, as the other commands' long help shows theirs (their value
    // lists with help give them that layout; serve has none).
    #[command(next_line_help = true)]
    Serve(parakeet::server::ServeArgs),
    /// Find speech in audio files (Silero VAD, built in): segments as the silero-vad package's
    /// get_speech_timestamps gives them, as text, JSON, RTTM or SRT.
    Vad(parakeet::cli::vad::VadArgs),
    /// Describe a model: architecture, hyperparameters, tensors by type; or, with `--system`,
    /// this machine: CPU features found, the kernels chosen (ours and ggml's), and the devices
    /// ggml's registry has (with their memory) and the GPU backends this build has.
    Info {
        /// A .gguf, a .nemo (converted once into the cache) or a hub id (owner/name).
        #[arg(required_unless_present = "system")]
        model: Option<PathBuf>,
        /// Describe this machine and build instead of a model.
        #[arg(long, conflicts_with = "model")]
        system: bool,
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
    /// Transcribe only shard K of N (1 <= K <= N) of the inputs: a stable split by a hash of each
    /// file's path below its directory argument, so N machines given the same tree take disjoint
    /// parts with no coordination (e.g. a Slurm array `--array=1-N` with `--shard
    /// $SLURM_ARRAY_TASK_ID/N`); `--skip-existing` resumes a shard.
    #[arg(long, value_name = "K/N")]
    shard: Option<Shard>,
    /// Print word timings with the text.
    #[arg(long)]
    timestamps: bool,
    /// No progress bar or per-file lines on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// Print where the time went (stage table) on stderr.
    #[arg(long)]
    profile: bool,
    /// Which ops compute the graphs: `auto` (our CPU kernels) or `ggml` (ggml's built-in ops
    /// only, over weights unpacked at load: what every ggml backend runs; a diagnostic, slower
    /// on a CPU).
    #[arg(long, value_name = "auto|ggml", default_value = "auto")]
    kernels: KernelChoice,
    /// Encoder self-attention: `auto` (the model's own; for full-attention models full
    /// attention up to 2 min, NeMo's local [128,128] above), `full`, or a local window `L,R`
    /// in encoder frames of 80 ms (NeMo's rel_pos_local_attn, e.g. 128,128). The whole file is
    /// always encoded in one pass.
    #[arg(long, value_name = "auto|full|L,R", default_value = "auto")]
    att_context: AttentionChoice,
    /// Write every encoder layer's output as .npy (named like NeMo's reference dumps).
    #[arg(long, value_name = "DIR")]
    dump_layers: Option<PathBuf>,
    /// Who spoke each word, by a Sortformer diarization model: speakers in JSON words and
    /// segments, `[speaker_0]` in SRT, `<v speaker_0>` in VTT, a TSV column; cues split where
    /// the speaker changes.
    #[arg(long)]
    diarize: bool,
    /// The Sortformer for --diarize (implies it): .gguf, .nemo or hub id (default:
    /// nvidia/diar_streaming_sortformer_4spk-v2, which streams, so memory stays bounded on long
    /// recordings).
    #[arg(long, value_name = "MODEL")]
    diar_model: Option<PathBuf>,
    #[command(flatten)]
    confidence: ConfidenceArgs,
    #[command(flatten)]
    boost: BoostArgs,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    beam: BeamArgs,
    /// Transcribe only speech: Silero VAD (built in) finds it, as the silero-vad package's
    /// get_speech_timestamps does with the speech-detection flags below, and each speech
    /// segment is transcribed on its own; times stay the input's, and cues never span two
    /// segments. Silence is not encoded.
    #[arg(long)]
    vad: bool,
    /// With --vad: a Silero VAD GGUF to use instead of the built-in model (v6.2).
    #[arg(long, value_name = "FILE", requires = "vad")]
    vad_model: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Speech detection (with --vad)")]
    speech: parakeet::cli::vad::SpeechArgs,
}

#[derive(Args)]
// The VAD's flags are shared with `vad`; the padding means something else in a stream.
#[command(mut_arg("speech_pad_ms", |a| a.help(
    "With --vad: each utterance's audio starts this long before the speech the VAD heard, \
     and its end waits this long after it (VADIterator's speech_pad_ms)"
)))]
struct StreamArgs {
    /// Audio to transcribe: `-` reads standard input (a WAV stream, or headerless samples with
    /// --raw), a path reads a file; none listens to the default microphone.
    input: Option<PathBuf>,
    /// Model (.gguf, .nemo or hub id): a cache-aware streaming model, or an offline one
    /// (streamed by buffers).
    #[arg(short, long, env = "PARAKEET_MODEL")]
    model: PathBuf,
    /// Offline models: seconds of new audio per step (NeMo's default 4.8; a multiple of the
    /// 80 ms encoder frame).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    chunk_secs: Option<f64>,
    /// Offline models: seconds of audio before the chunk encoded with it (default 1.6).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    left_secs: Option<f64>,
    /// Offline models: seconds of audio after the chunk encoded with it, the latency it adds
    /// (default 1.6).
    #[arg(long, value_name = "S", allow_negative_numbers = true)]
    right_secs: Option<f64>,
    /// Say on standard error how the model streams and with which settings.
    #[arg(short, long)]
    verbose: bool,
    /// The input is headerless samples in this layout (needs --rate).
    #[arg(long, value_enum, requires = "rate")]
    raw: Option<RawFormat>,
    /// Sample rate of --raw input, in Hz.
    #[arg(long, value_name = "HZ", requires = "raw")]
    rate: Option<u32>,
    /// Interleaved channels of --raw input (mixed down to mono).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "raw")]
    channels: u16,
    /// Feed a file at the speaker's pace instead of as fast as possible.
    #[arg(long)]
    realtime: bool,
    /// Output format (one: both go to standard output): txt, finished utterances one a line
    /// (on a terminal the current one grows in place); jsonl, every partial and final as a
    /// JSON object a line.
    #[arg(short = 'f', long = "format", value_enum, default_value = "txt")]
    format: EventFormat,
    /// Cache-aware models: one of the model's lookaheads, `L,R` in encoder frames (default:
    /// NeMo's for the model).
    #[arg(long, value_name = "L,R", value_parser = parse_att_context)]
    att_context: Option<[usize; 2]>,
    /// Decoder head: the model's transducer (default) or a hybrid model's CTC head.
    #[arg(long, value_enum, default_value = "auto")]
    decoder: DecoderChoice,
    /// Threads for the compute backend (default: available cores).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Which ops compute the graphs: `auto` (our CPU kernels) or `ggml` (ggml's built-in ops
    /// only, over weights unpacked at load: what every ggml backend runs; a diagnostic, slower
    /// on a CPU).
    #[arg(long, value_name = "auto|ggml", default_value = "auto")]
    kernels: KernelChoice,
    /// Stop after this many seconds of audio: the utterance under way ends with a final, then
    /// the command fails (exit 1) saying the stream was cut.
    #[arg(long, value_name = "S")]
    max_seconds: Option<f64>,
    /// An utterance that runs this long without the model ending it (a model without an
    /// end-of-utterance token, or a long monologue) is finished at its last word start and the
    /// next one goes on from there; 0: never cut.
    #[arg(long, value_name = "S", default_value_t = parakeet::stream::DEFAULT_MAX_UTTERANCE_SECONDS)]
    max_utterance_seconds: f64,
    #[command(flatten)]
    device: DeviceArg,
    #[command(flatten)]
    boost: BoostArgs,
    /// Word confidence in jsonl events (offline models): as `transcribe --confidence`.
    #[command(flatten)]
    confidence: ConfidenceArgs,
    /// End each utterance where Silero VAD (built in) finds the end of speech, as the
    /// silero-vad package's VADIterator does; the silence between utterances is not transcribed.
    #[arg(long)]
    vad: bool,
    #[command(flatten)]
    turn: parakeet::cli::vad::TurnArgs,
    /// With --vad: a Silero VAD GGUF to use instead of the built-in model (v6.2).
    #[arg(long, value_name = "FILE", requires = "vad")]
    vad_model: Option<PathBuf>,
    /// Who speaks: a streaming Sortformer runs beside the model as the audio arrives (NeMo's
    /// inference sizes, about 1 s behind), and each final's words carry their speaker
    /// (`"speaker"` in jsonl words, `[speaker_0]` before each speaker's words in text).
    #[arg(long)]
    diarize: bool,
    /// The streaming Sortformer for --diarize (implies it): .gguf, .nemo or hub id (default:
    /// nvidia/diar_streaming_sortformer_4spk-v2).
    #[arg(long, value_name = "MODEL")]
    diar_model: Option<PathBuf>,
}

/// `stream --att-context`: a lookahead `L,R`, read by the one attention grammar
/// (`transcribe --att-context`'s), which also takes `auto` and `full`.
fn parse_att_context(s: &str) -> Result<[usize; 2], String> {
    match s.parse::<AttentionChoice>()? {
        AttentionChoice::Local { left, right } => Ok([left, right]),
        _ => Err(format!(
            "'{s}': a stream takes a lookahead L,R in encoder frames (e.g. 70,1)"
        )),
    }
}

fn main() -> ExitCode {
    // First of all: the compiler and ggml may use any instruction of the build's baseline
    // anywhere, so on an older CPU the next line of code could die of SIGILL.
    let missing = parakeet::kernels::cpu::missing_baseline();
    if !missing.is_empty() {
        eprintln!(
            "error: this CPU lacks {} which this parakeet build requires; use a build for an older CPU (see README, Install)",
            missing.join(", ")
        );
        return ExitCode::from(EXIT_USAGE);
    }
    parakeet::backend::openmp::bound_spinning();
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
        // clap: a model, or --system and no model.
        Command::Info {
            model: Some(model), ..
        } => info(&model).map(|_| 0),
        Command::Info { model: None, .. } => system_info().map(|_| 0),
        Command::Models { remove, prune } => {
            if remove.is_empty() && !prune {
                list_models().map(|_| 0)
            } else {
                tidy_models(&remove, prune).map(|_| 0)
            }
        }
        Command::Stream(args) => stream(args),
        Command::Serve(args) => parakeet::server::serve(args).map(|_| 0).map_err(Into::into),
        Command::Diarize(args) => audio_inputs(&args.inputs).and_then(|(jobs, non_audio)| {
            let jobs: Vec<_> = jobs.into_iter().map(|j| (j.path, j.root)).collect();
            Ok(parakeet::cli::diarize::run(args, &jobs, non_audio)?)
        }),
        Command::Vad(args) => audio_inputs(&args.inputs).and_then(|(jobs, non_audio)| {
            let jobs: Vec<_> = jobs.into_iter().map(|j| (j.path, j.root)).collect();
            Ok(parakeet::cli::vad::run(&args, &jobs, non_audio)?)
        }),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader went away (`| head -1`): nothing left to say, like ripgrep.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Whether `e` is a write to a closed pipe, anywhere in its chain.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<parakeet::error::Error>()
                .is_some_and(parakeet::error::Error::is_broken_pipe)
    })
}

/// The exit code of a failed command: the library's errors by whose they are (the user's:
/// 2, ours: 1); the command line's own (flags, files) are the user's.
fn exit_code(e: &anyhow::Error) -> u8 {
    let ours = e.chain().any(|c| {
        c.downcast_ref::<parakeet::error::Error>()
            .is_some_and(|e| e.blame() == parakeet::error::Blame::Ours)
    });
    if ours { EXIT_FAILED_INPUTS } else { EXIT_USAGE }
}

/// `println!` that returns the write error (a closed pipe) instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

fn run_convert(input: &Path, output: &Path, ty: OutType) -> Result<()> {
    // Every failure of a conversion is about the files the user named (the checkpoint, the
    // output, even a full device there): exit 2, as before the errors were typed.
    let r = convert_with_progress(input, output, ty, |_, _| {})
        .map_err(|e| anyhow::Error::msg(e.to_string()))?;
    eprintln!(
        "{} -> {}: {:?} ({} tensors, {:.1}M params; f32 {} ({} panel-packed), f16 {}, q8_0 {} ({} as q8_0x8), q4_0 {} ({} as q4_0x8)), {:.1} MiB in {:.2} s",
        input.display(),
        output.display(),
        r.model_type,
        r.tensors,
        r.params as f64 / 1e6,
        r.f32_tensors,
        r.panel16_tensors,
        r.f16_tensors,
        r.q8_0_tensors,
        r.repacked_tensors,
        r.q4_0_tensors,
        r.repacked_q4_tensors,
        r.bytes as f64 / (1 << 20) as f64,
        r.elapsed.as_secs_f64()
    );
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

fn list_models() -> Result<()> {
    let dir = parakeet::model_source::cache_dir();
    let models = parakeet::model_source::list_cached()?;
    if models.is_empty() {
        outln!("no converted models in {}", dir.display())?;
    }
    for m in models {
        let copies = match m.copies.len() {
            0 => String::new(),
            n => format!(
                "; {n} more cop{} with the same bytes: `parakeet models --prune` removes them",
                if n == 1 { "y" } else { "ies" }
            ),
        };
        let desc = Model::load(&m.path)
            .map(|model| {
                let hp = model.hparams();
                format!(
                    "{} {} x {}, {} mels",
                    hp.model_type.name(),
                    hp.encoder.n_layers,
                    hp.encoder.d_model,
                    hp.preprocessor.n_mels
                )
            })
            .unwrap_or_else(|e| format!("unreadable: {e:#}"));
        outln!(
            "{:>9.1} MiB  {:<20} {}  ({desc}{copies})",
            m.bytes as f64 / (1 << 20) as f64,
            m.name(),
            m.path.display()
        )?;
    }
    Ok(())
}

/// `models --remove NAME` / `--prune`: each file removed, on standard error.
fn tidy_models(remove: &[String], prune: bool) -> Result<()> {
    let mut removed = Vec::new();
    for name in remove {
        removed.extend(parakeet::model_source::remove_cached(name)?);
    }
    if prune {
        removed.extend(parakeet::model_source::prune_cached()?);
    }
    for path in &removed {
        eprintln!("removed {}", path.display());
    }
    if removed.is_empty() {
        eprintln!("nothing to remove");
    }
    Ok(())
}

/// `info --system`: the CPU, the instruction sets this build assumes and this CPU has, and the
/// kernels chosen at run time (ours, and what ggml's CPU backend was compiled for).
fn system_info() -> Result<()> {
    use parakeet::kernels::cpu;
    outln!(
        "parakeet {} for {}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    )?;
    outln!(
        "cpu:          {}",
        cpu::brand().unwrap_or_else(|| "(no model name)".into())
    )?;
    let exts = cpu::extensions();
    let names = |keep: &dyn Fn(&cpu::Extension) -> bool| {
        let v: Vec<_> = exts.iter().filter(|e| keep(e)).map(|e| e.name).collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(" ")
        }
    };
    outln!("baseline:     {}", names(&|e| e.in_baseline))?;
    outln!("cpu has:      {}", names(&|e| e.present))?;
    outln!("cpu lacks:    {}", names(&|e| !e.present))?;
    let ggml: Vec<String> = parakeet::backend::ggml_cpu_features()
        .into_iter()
        .map(|(k, v)| if v == "1" { k } else { format!("{k}={v}") })
        .collect();
    outln!("ggml cpu:     {}", ggml.join(" "))?;
    outln!("{}", cpu::report().trim_end())?;
    print_devices()
}

/// The GPU backends this binary was built with, every device of ggml's registry with its
/// memory, and what `--device auto` takes.
fn print_devices() -> Result<()> {
    use parakeet::backend::device;
    let built: Vec<&str> = device::built_apis().iter().map(|a| a.name()).collect();
    outln!(
        "gpu backends: {} (cargo features vulkan, cuda, metal)",
        if built.is_empty() {
            "none".to_string()
        } else {
            built.join(" ")
        }
    )?;
    outln!("devices:")?;
    for d in device::registry() {
        let (free, total) = d.memory();
        outln!(
            "  {:<10} {:<5} {}, {} free of {}",
            d.name(),
            d.kind(),
            d.description(),
            device::mib(free),
            device::mib(total)
        )?;
    }
    let auto = parakeet::session::DeviceRequest::Auto.resolve()?;
    outln!("--device auto: {}", auto.describe())?;
    Ok(())
}

fn info(model: &Path) -> Result<()> {
    let m = parakeet::model_source::load(model, &mut |line| eprintln!("{line}"))?;
    let hp = &m.hparams();
    let e = &hp.encoder;
    outln!("model:        {} ({})", m.name(), m.path().display())?;
    outln!("type:         {}", hp.model_type.name())?;
    outln!(
        "front end:    {} Hz, {} mels, n_fft {}, window {}, hop {}",
        hp.preprocessor.sample_rate,
        hp.preprocessor.n_mels,
        hp.preprocessor.n_fft,
        hp.preprocessor.win_length,
        hp.preprocessor.hop_length
    )?;
    outln!(
        "encoder:      {} layers x d_model {}, {} heads, ff {}, conv kernel {}, subsampling x{} ({} ch), xscaling {}, attention {}",
        e.n_layers,
        e.d_model,
        e.n_heads,
        e.ff_dim(),
        e.conv_kernel,
        e.subsampling_factor,
        e.subsampling_channels,
        e.xscaling,
        e.attention
    )?;
    if !hp.preprocessor.normalize_per_feature {
        outln!("features:     raw log-mel (normalize NA)")?;
    }
    if hp.model_type.is_asr() {
        outln!("live:         {}", LiveKind::of(&m).describe())?;
    }
    for (i, &context) in e.att_context_sizes.iter().enumerate() {
        let Some(s) = e.streaming(context) else {
            continue;
        };
        let ms = |feature_frames: usize| {
            feature_frames as f64 * hp.preprocessor.hop_length as f64 * 1000.0
                / hp.preprocessor.sample_rate as f64
        };
        outln!(
            "streaming:    att_context [{}, {}]{}: chunk {} ms ({}/{} mel frames, shift {}/{}), {} \
             encoder frames a chunk, attention cache {} frames, conv cache {}, pre-encode cache \
             {} mel frames, drop_extra_pre_encoded {}",
            context[0],
            context[1],
            if i == 0 { " (default)" } else { "" },
            ms(s.shift_size[1]),
            s.chunk_size[0],
            s.chunk_size[1],
            s.shift_size[0],
            s.shift_size[1],
            s.valid_out_len,
            s.last_channel_cache_size,
            s.last_time_cache_size,
            s.pre_encode_cache_size,
            s.drop_extra_pre_encoded
        )?;
    }
    if let Some(t) = &hp.transducer {
        outln!(
            "decoder:      LSTM {} x {}, joint {}, max symbols {}{}",
            t.pred_layers,
            t.pred_hidden,
            t.joint_hidden,
            hp.max_symbols,
            if hp.model_type.is_tdt() {
                format!(", TDT durations {:?}", t.durations)
            } else {
                String::new()
            }
        )?;
    }
    outln!(
        "vocabulary:   {} pieces (blank id {})",
        hp.vocab_size,
        hp.blank_id()
    )?;
    let mut by_type: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
    let names = m.file().tensor_names();
    for name in names {
        if let Some(w) = m.file().any_weight(name) {
            let kind = match w.layout() {
                Layout::Plain => w.dtype().name().to_string(),
                Layout::Panel16 => format!("{} panel16", w.dtype().name()),
                Layout::Q8_0x8 | Layout::Q4_0x8 => w.layout().name().to_string(),
            };
            let entry = by_type.entry(kind).or_default();
            entry.0 += 1;
            entry.1 += w.bytes();
        }
    }
    let total: usize = by_type.values().map(|v| v.1).sum();
    outln!(
        "tensors:      {} ({:.1} MiB)",
        names.len(),
        total as f64 / (1 << 20) as f64
    )?;
    for (ty, (n, bytes)) in by_type {
        outln!(
            "  {ty:<13} {n:>5} tensors {:>10.1} MiB",
            bytes as f64 / (1 << 20) as f64
        )?;
    }
    outln!("f32 kernel:   {} (panel16 GEMM)", Isa::best().name())?;
    Ok(())
}

/// `--shard K/N`: which part of a split batch this process takes.
#[derive(Clone, Copy, Debug)]
struct Shard {
    /// 1-based.
    index: u64,
    count: u64,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("`{s}` is not K/N with 1 <= K <= N (e.g. 1/4)");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            k.trim().parse::<u64>().map_err(|_| bad())?,
            n.trim().parse::<u64>().map_err(|_| bad())?,
        );
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// Whether `job` falls in this shard. The key is the path below the directory argument (the
    /// path as given for a file argument), so the split does not depend on where the tree is
    /// mounted; its hash is FNV-1a 64, fixed by its definition (std's hasher may change between
    /// Rust releases, and every machine of a job array must agree).
    fn takes(&self, job: &Job) -> bool {
        let key = job
            .root
            .as_deref()
            .and_then(|root| job.path.strip_prefix(root).ok())
            .unwrap_or(&job.path);
        let hash = key
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
            });
        hash % self.count == self.index - 1
    }
}

/// One input to transcribe: the file, and the directory argument it was found under.
struct Job {
    path: PathBuf,
    root: Option<PathBuf>,
}

/// The audio files to transcribe, in argument order (directories walked, sorted), and how many
/// non-audio files were passed over. A file named twice (`a.wav a.wav`, `talks/ talks/a.wav`)
/// is transcribed once, and each later naming is reported on stderr as skipped.
fn collect_inputs(inputs: &[PathBuf]) -> Result<(Vec<Job>, usize)> {
    let (jobs, skipped) = walk_inputs(inputs)?;
    let mut seen = std::collections::HashSet::new();
    let jobs = jobs
        .into_iter()
        .filter(|j| {
            let first = j.path.as_os_str() == "-"
                || seen.insert(std::fs::canonicalize(&j.path).unwrap_or_else(|_| j.path.clone()));
            if !first {
                eprintln!(
                    "skipped {}: named more than once in the inputs",
                    j.path.display()
                );
            }
            first
        })
        .collect();
    Ok((jobs, skipped))
}

/// [`collect_inputs`], refusing inputs that hold no audio file at all (a run with nothing to
/// do is a mistaken argument).
fn audio_inputs(inputs: &[PathBuf]) -> Result<(Vec<Job>, usize)> {
    let (jobs, skipped) = collect_inputs(inputs)?;
    if jobs.is_empty() {
        bail!("no audio files found in the given inputs ({skipped} non-audio files skipped)");
    }
    Ok((jobs, skipped))
}

fn walk_inputs(inputs: &[PathBuf]) -> Result<(Vec<Job>, usize)> {
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

/// `-f` values (comma-separated and/or repeated): one list, repeats dropped.
fn parse_formats(list: &[String]) -> Result<Vec<Format>> {
    Format::parse_list(&list.join(",")).map_err(anyhow::Error::msg)
}

/// Per-stage totals over a batch, for `--profile`.
#[derive(Default)]
struct Profile {
    load: Duration,
    read: Duration,
    stages: StageTimes,
    audio_seconds: f64,
    /// The attention of each distinct kind used, in first-use order.
    attention: Vec<Attention>,
}

/// What `transcribe` runs, decided from its flags before any model or audio is touched
/// (a bad flag is one error and nothing is written).
struct TranscribePlan {
    jobs: Vec<Job>,
    /// Each job's output files (empty when the text goes to stdout).
    outputs: Vec<Vec<(Format, PathBuf)>>,
    to_files: bool,
    skipped_non_audio: usize,
    threads: Threads,
    /// The device `--device` named.
    device: parakeet::session::Device,
    /// The decoding options as given; checked against the model once it is loaded.
    request: DecodeRequest,
}

impl TranscribePlan {
    fn new(args: &TranscribeArgs) -> Result<TranscribePlan> {
        let formats = parse_formats(&args.formats)?;
        let shows_confidence = formats
            .iter()
            .any(|f| matches!(f, Format::Json | Format::Tsv));
        let beam = args.beam.request()?;
        // Confidence comes from greedy decoding's steps: a beam search has none to show.
        let confidence = args
            .confidence
            .resolve(shows_confidence && beam.is_none())?;
        let boost = args.boost.config(args.boost.phrases()?);
        let (threads, warning) = Threads::resolve(args.threads)?;
        let device = args.device.resolve()?;
        let speech =
            parakeet::cli::vad::speech_request(args.vad, &args.speech, args.vad_model.as_deref())?;
        let (mut jobs, skipped_non_audio) = audio_inputs(&args.inputs)?;
        if let Some(shard) = args.shard {
            let all = jobs.len();
            jobs.retain(|j| shard.takes(j));
            if !args.quiet {
                eprintln!(
                    "shard {}/{}: {} of {all} inputs",
                    shard.index,
                    shard.count,
                    jobs.len()
                );
            }
        }
        if let Some(w) = warning {
            eprintln!("warning: {w}");
        }
        // Text goes to stdout unless outputs are written to files.
        let to_files = args.output_dir.is_some() || formats.iter().any(|f| *f != Format::Txt);
        let outputs = if to_files {
            let inputs: Vec<(&Path, Option<&Path>)> = jobs
                .iter()
                .map(|j| (j.path.as_path(), j.root.as_deref()))
                .collect();
            output::plan_outputs(&inputs, args.output_dir.as_deref(), &formats)?
        } else {
            vec![Vec::new(); jobs.len()]
        };
        Ok(TranscribePlan {
            jobs,
            outputs,
            to_files,
            skipped_non_audio,
            threads,
            device,
            request: DecodeRequest {
                decoder: args.decoder,
                attention: args.att_context,
                confidence,
                boost,
                beam,
                speech,
            },
        })
    }
}

fn transcribe(args: TranscribeArgs) -> Result<u8> {
    let plan = TranscribePlan::new(&args)?;
    if plan.jobs.is_empty() {
        return Ok(0); // an empty shard
    }
    // Stopped mid-batch: the outputs written so far stay, the one being written goes.
    signals::on_signal(|code| {
        output::remove_unfinished_temps_then(|| parakeet::backend::exit_now(code.into()))
    })?;
    if args.skip_existing {
        let dirs: std::collections::BTreeSet<&Path> = plan
            .outputs
            .iter()
            .flatten()
            .filter_map(|(_, p)| p.parent())
            .map(|d| {
                if d.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    d
                }
            })
            .collect();
        for dir in dirs {
            output::remove_stale_temps(dir);
        }
    }
    let start = Instant::now();
    let load = LoadOptions {
        lowering: args.kernels.resolve(),
        device: Some(plan.device),
    };
    let model =
        parakeet::model_source::load_with(&args.model, &mut |line| eprintln!("{line}"), &load)?;
    // The first file's length, from its header: its compute buffer is readied during the load.
    let expect_seconds = plan
        .jobs
        .first()
        .filter(|j| j.path.as_os_str() != "-")
        .and_then(|j| audio::declared_seconds(&j.path));
    let mut session = Session::ready(model, plan.threads, expect_seconds)?;
    let options = DecodeOptions::new(session.model(), &plan.request)?.with_op_timing(args.profile);
    let mut diarizer = load_diarizer(args.diarize, &args.diar_model, plan.threads, &load)?;
    let mut profile = Profile {
        load: start.elapsed(),
        ..Default::default()
    };
    let single = plan.jobs.len() == 1;
    let progress = (!args.quiet && !single && std::io::stderr().is_terminal())
        .then(|| progress_bar(plan.jobs.len()));
    // One file: its stages and how far each is (a long file is minutes of work).
    let stage_bar = (!args.quiet && single && std::io::stderr().is_terminal()).then(stage_bar);
    let options = match &stage_bar {
        Some(bar) => {
            let bar = bar.clone();
            options.with_progress(Some(Arc::new(move |stage, done| {
                if bar.message() != stage {
                    bar.set_message(stage);
                }
                bar.set_position((done * 1000.0) as u64);
            })))
        }
        None => options,
    };
    let mut tally = Outcome::default();
    for (job, outputs) in plan.jobs.iter().zip(&plan.outputs) {
        if args.skip_existing && !outputs.is_empty() && outputs.iter().all(|(_, p)| p.exists()) {
            tally.skipped += 1;
        } else {
            let result = transcribe_one(
                &mut session,
                diarizer.as_mut(),
                job,
                &args,
                &options,
                &mut profile,
            )
            .and_then(|t| {
                if let Some(bar) = &stage_bar {
                    bar.finish_and_clear();
                }
                write_outputs(&t, job, outputs, session.model().name())?;
                Ok(t)
            });
            match result {
                Ok(t) => {
                    tally.done += 1;
                    if !plan.to_files {
                        print_transcript(&t, job, single, args.timestamps)?;
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
                    tally.fail(exit_code(&e));
                    let msg = format!("error: {e:#}");
                    match &progress {
                        Some(pb) => pb.println(msg),
                        None => eprintln!("{msg}"),
                    }
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
    if let Some(bar) = stage_bar {
        bar.finish_and_clear();
    }
    let wall = start.elapsed();
    if (!single || tally.skipped > 0) && !args.quiet {
        eprintln!(
            "{}",
            tally.summary(
                plan.skipped_non_audio,
                profile.audio_seconds,
                wall.as_secs_f64()
            )
        );
    }
    if args.profile {
        print_profile(&profile, &session, wall, options.beam().is_some());
    }
    Ok(tally.code(plan.jobs.len()))
}

/// Writes a transcript's planned output files (each atomically).
fn write_outputs(
    t: &Transcript,
    job: &Job,
    outputs: &[(Format, PathBuf)],
    model_name: &str,
) -> Result<()> {
    let meta = OutputMeta {
        model: model_name.to_owned(),
        audio_path: job.path.display().to_string(),
        audio_seconds: t.audio_seconds,
        timings: t
            .speech
            .as_ref()
            .map(|_| ("vad".to_string(), t.times.vad.as_secs_f64()))
            .into_iter()
            .chain([
                ("features".into(), t.times.features.as_secs_f64()),
                ("encoder".into(), t.times.encoder.as_secs_f64()),
                ("decoder".into(), t.times.decoder.as_secs_f64()),
            ])
            .chain(
                (t.words.iter().any(|w| w.speaker.is_some()))
                    .then(|| ("diarization".into(), t.times.diarization.as_secs_f64())),
            )
            .collect(),
    };
    for (format, path) in outputs {
        output::write_planned(
            path,
            &job.path,
            output::render(*format, t, &meta).as_bytes(),
        )?;
    }
    Ok(())
}

fn transcribe_one(
    session: &mut Session,
    diarizer: Option<&mut Diarizer>,
    job: &Job,
    args: &TranscribeArgs,
    options: &DecodeOptions,
    profile: &mut Profile,
) -> Result<Transcript> {
    let t0 = Instant::now();
    let input = Input::arg(&job.path);
    let shown = input.name();
    let samples = pipeline::load_samples(input, Limits::default())?;
    profile.read += t0.elapsed();
    if let Some(dir) = &args.dump_layers {
        dump_layers(session, &samples, options, dir)
            .with_context(|| format!("{shown}: dumping layers"))?;
    }
    let t = pipeline::transcribe_samples(session, diarizer, samples, options, &shown)?;
    profile.stages.add(&t.times);
    profile.audio_seconds += t.audio_seconds;
    if !profile.attention.contains(&t.attention) {
        profile.attention.push(t.attention);
    }
    Ok(t)
}

fn print_transcript(
    t: &Transcript,
    job: &Job,
    single: bool,
    timestamps: bool,
) -> std::io::Result<()> {
    if single {
        outln!("{}", t.text)?;
    } else {
        outln!("{}\t{}", job.path.display(), t.text)?;
    }
    if timestamps {
        use std::io::Write as _;
        write!(
            std::io::stdout().lock(),
            "{}",
            output::format_timestamps_line(&t.words)
        )?;
    }
    Ok(())
}

fn dump_layers(
    session: &mut Session,
    samples: &[f32],
    options: &DecodeOptions,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let features = session.features(samples);
    let enc = session.encode_with(&features, true, options.attention())?;
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

/// The stage bar of a single file: stage, how far, time spent.
fn stage_bar() -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(1000);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {msg:8} {bar:30} {percent:>3}%  {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_message("reading audio");
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

fn progress_bar(n: usize) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} files  {msg}  ETA {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb
}

/// The Sortformer of `--diarize` / `--diar-model` (the latter implies the former), if asked.
fn load_diarizer(
    diarize: bool,
    model: &Option<PathBuf>,
    threads: Threads,
    load: &LoadOptions,
) -> Result<Option<Diarizer>> {
    if !diarize && model.is_none() {
        return Ok(None);
    }
    let spec = model
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIAR_MODEL));
    let diarizer = parakeet::model_source::load_with(&spec, &mut |line| eprintln!("{line}"), load)
        .and_then(|m| Diarizer::new(Arc::new(m), threads));
    Ok(Some(diarizer.with_context(|| {
        format!("--diar-model {}", spec.display())
    })?))
}

/// `parakeet stream`: opens the input first (a bad header or a missing microphone is reported
/// before any model is loaded), then the model, then pumps until the input ends.
fn stream(args: StreamArgs) -> Result<u8> {
    let raw = match (args.raw, args.rate) {
        (Some(format), Some(rate)) => Some(RawLayout {
            format,
            rate,
            channels: args.channels,
        }),
        (None, None) => None,
        _ => bail!("--raw and --rate go together: headerless samples need their rate"),
    };
    // Ctrl-C ends the input: the utterance in progress is finished as a final, then the
    // command exits 130 (SIGTERM: 143).
    signals::on_signal(|_| {})?;
    let stop = signals::stop_flag();
    let mut source = match open_stream_input(args.input.as_deref(), raw, stop) {
        Err(_) if signals::received().is_some() => return Ok(signals::received().unwrap_or(0)),
        opened => opened?,
    };
    if let Some(s) = args.max_seconds
        && (s.is_nan() || s <= 0.0)
    {
        bail!("--max-seconds must be positive (got {s})");
    }
    let turns = stream_turns(&args)?;
    let (threads, warning) = Threads::resolve(args.threads)?;
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    let load = LoadOptions {
        lowering: args.kernels.resolve(),
        device: Some(args.device.resolve()?),
    };
    let model = Arc::new(parakeet::model_source::load_with(
        &args.model,
        &mut |line| eprintln!("{line}"),
        &load,
    )?);
    // Boosting and confidence checked and built as `transcribe` checks them (the ranges).
    let decoding = DecodeOptions::new(
        &model,
        &DecodeRequest {
            decoder: args.decoder,
            confidence: args.confidence.resolve(false)?,
            boost: args.boost.config(args.boost.phrases()?),
            ..DecodeRequest::default()
        },
    )?;
    let live = LiveRequest {
        att_context: args.att_context,
        chunk_secs: args.chunk_secs,
        left_secs: args.left_secs,
        right_secs: args.right_secs,
        threads,
        max_utterance_seconds: args.max_utterance_seconds,
    };
    let options = LiveOptions::new(&model, decoding, live)?;
    let mut transcriber = open_live(&model, &options)?;
    let turn_params = turns.as_ref().map(|(_, p)| *p);
    if let Some((vad, params)) = turns {
        transcriber = Box::new(VadTurns::new(transcriber, vad, params)?);
    }
    if let Some(diarizer) = load_diarizer(args.diarize, &args.diar_model, threads, &load)? {
        transcriber = speakers::diarized(transcriber, diarizer, args.diar_model.as_deref())?;
    }
    if args.verbose {
        eprintln!("{}: {}", model.name(), LiveKind::of(&model).describe());
        if let Some(p) = turn_params {
            eprintln!(
                "end of utterance: Silero VAD (VADIterator: threshold {}, min silence {} ms, pad {} ms)",
                p.threshold, p.min_silence_ms, p.speech_pad_ms
            );
        }
        if options.kind() == LiveKind::Buffered {
            let b = options.buffered();
            eprintln!(
                "buffered: chunk {} s, left {} s, right {} s ({:.1} s buffer a step), head {}",
                b.chunk_secs,
                b.left_secs,
                b.right_secs,
                b.chunk_secs + b.left_secs + b.right_secs,
                options.decoding().head().name()
            );
        }
    }
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let mut writer = EventWriter::new(stdout.lock(), args.format, terminal);
    let pumped = pump(
        source.as_mut(),
        transcriber.as_mut(),
        &PumpOptions {
            realtime: args.realtime,
            max_seconds: args.max_seconds,
            stop: Some(stop),
        },
        &mut |event| Ok(writer.write(event)?),
    );
    writer.close()?;
    if let Some(code) = signals::received() {
        return Ok(code);
    }
    let summary = pumped?;
    if summary.cut_at_limit {
        eprintln!(
            "error: {}: the stream is longer than --max-seconds {}; stopped there",
            source.name(),
            args.max_seconds.unwrap_or_default()
        );
        return Ok(EXIT_FAILED_INPUTS);
    }
    Ok(0)
}

/// `stream --vad`'s model and checked parameters (`None` without --vad, whose parameters it
/// refuses).
fn stream_turns(args: &StreamArgs) -> Result<Option<(Arc<VadModel>, TurnParams)>> {
    let params = args.turn.params()?;
    if !args.vad {
        let d = TurnParams::default();
        for (flag, given, default) in [
            ("--threshold", params.threshold, d.threshold),
            ("--min-silence-ms", params.min_silence_ms, d.min_silence_ms),
            ("--speech-pad-ms", params.speech_pad_ms, d.speech_pad_ms),
        ] {
            if given != default {
                bail!("{flag} {given} sets the VAD's end of utterance: it needs --vad");
            }
        }
        return Ok(None);
    }
    Ok(Some((VadModel::load(args.vad_model.as_deref())?, params)))
}

/// The `stream` command's input: a file, standard input (`-`) or the default microphone.
fn open_stream_input(
    input: Option<&Path>,
    raw: Option<RawLayout>,
    stop: &'static std::sync::atomic::AtomicBool,
) -> Result<Box<dyn AudioSource>> {
    match input {
        Some(p) if p.as_os_str() == "-" => Ok(input::open_stdin_until(raw, stop)?),
        Some(p) => Ok(input::open_file_until(p, raw, Some(stop))?),
        None if raw.is_some() => {
            bail!("--raw describes standard input or a file: give `-` or a path")
        }
        None => open_microphone(),
    }
}

#[cfg(feature = "mic")]
fn open_microphone() -> Result<Box<dyn AudioSource>> {
    let mic = parakeet::stream::mic::Microphone::open()?;
    eprintln!(
        "listening on {} ({} Hz); Ctrl-C stops",
        mic.name(),
        mic.sample_rate()
    );
    Ok(Box::new(mic))
}

#[cfg(not(feature = "mic"))]
fn open_microphone() -> Result<Box<dyn AudioSource>> {
    bail!(
        "no microphone: this build has no microphone support (built without the `mic` feature); give a file, or pipe audio to `-`"
    )
}

fn print_profile(p: &Profile, session: &Session, wall: Duration, beam: bool) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let stats = session.stats();
    let per_step = if p.stages.decoder_steps > 0 {
        format!(
            "{} steps, {} LSTM updates, {} graphs, {:.0} us/step",
            p.stages.decoder_steps,
            p.stages.predictor_steps,
            p.stages.decoder_graphs,
            p.stages.decoder.as_secs_f64() * 1e6 / p.stages.decoder_steps as f64
        )
    } else if p.stages.decoder_graphs > 0 {
        // A beam search (its steps serve several hypotheses: graphs are the comparable unit).
        format!("beam search, {} graphs", p.stages.decoder_graphs)
    } else if beam {
        String::from("CTC beam search")
    } else {
        String::from("CTC greedy")
    };
    eprintln!("stage                  time (ms)");
    eprintln!("model load          {:>12.1}", ms(p.load));
    eprintln!("audio read+resample {:>12.1}", ms(p.read));
    if !p.stages.vad.is_zero() {
        eprintln!("vad                 {:>12.1}", ms(p.stages.vad));
    }
    eprintln!("features            {:>12.1}", ms(p.stages.features));
    let attention: Vec<String> = p.attention.iter().map(|a| a.to_string()).collect();
    eprintln!(
        "encoder             {:>12.1}   (attention {})",
        ms(p.stages.encoder),
        attention.join(", ")
    );
    eprintln!(
        "decoder             {:>12.1}   ({per_step})",
        ms(p.stages.decoder)
    );
    eprintln!("total               {:>12.1}", ms(wall));
    if p.audio_seconds > 0.0 {
        eprintln!(
            "audio {:.2} s, real-time factor {:.4} ({:.1}x faster than real time), {} threads, {}, ops: {}",
            p.audio_seconds,
            wall.as_secs_f64() / p.audio_seconds,
            p.audio_seconds / wall.as_secs_f64(),
            session.threads(),
            session.device_name(),
            session.lowering().name()
        );
    }
    parakeet::cli::profile::print_backend(stats);
}
