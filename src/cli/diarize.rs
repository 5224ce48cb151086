//! `parakeet diarize`: who speaks when in audio files, directories and standard input, with a
//! Sortformer (`diar`), as NeMo's output lines, RTTM or JSON.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Outcome;
use crate::bail;
use crate::error::Result;

use crate::diar::postprocess::{Generation, PostProcessing, Segment, nemo_line, segments};
use crate::diar::stream::StreamSettings;
use crate::diar::{Activity, Diarizer};
use crate::output::{self, OutputKind};
use crate::session::Threads;
use crate::session::pipeline::{Input, Limits, load_samples};

/// The output formats of `diarize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiarFormat {
    /// NeMo's lines, `start end speaker_k` (to standard output unless -o is given).
    Txt,
    /// RTTM: `SPEAKER <file> 1 <start> <duration> <NA> <NA> speaker_k <NA> <NA>`.
    Rttm,
    /// `{"segments": [{"speaker", "start", "end"}], "frame_shift", ...}`.
    Json,
}

/// `talk.wav` -> `talk.diar.rttm`: the command's name in the extension, so that speaker turns
/// never replace a transcript of the same audio (`transcribe`'s `talk.txt`, `talk.json`) or
/// `vad`'s segments.
impl OutputKind for DiarFormat {
    fn extension(self) -> &'static str {
        match self {
            DiarFormat::Txt => "diar.txt",
            DiarFormat::Rttm => "diar.rttm",
            DiarFormat::Json => "diar.json",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct DiarizeArgs {
    /// Audio files or directories (walked recursively); `-` reads WAV/FLAC from standard input.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// A Sortformer diarization model: .gguf, .nemo (converted once into the cache) or hub id
    /// (e.g. nvidia/diar_sortformer_4spk-v1).
    #[arg(short, long)]
    pub model: PathBuf,
    /// Threads for the compute backend (default: available cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Which ops compute the graphs: `auto` (our CPU kernels) or `ggml` (ggml's built-in ops
    /// only, over weights unpacked at load: what every ggml backend runs; a diagnostic, slower
    /// on a CPU).
    #[arg(long, value_name = "auto|ggml", default_value = "auto")]
    pub kernels: crate::backend::KernelChoice,
    #[command(flatten)]
    pub device: crate::session::DeviceArg,
    /// Output formats (comma-separated or repeated): txt, rttm, json.
    #[arg(
        short = 'f',
        long = "format",
        value_enum,
        value_delimiter = ',',
        default_value = "txt"
    )]
    pub formats: Vec<DiarFormat>,
    /// Write `<name>.diar.<format>` files under this directory, mirroring directory arguments
    /// (default: txt to standard output, other formats beside each input; standard input is
    /// `stdin.diar.<format>`).
    #[arg(short, long)]
    pub output_dir: Option<PathBuf>,
    /// JSON: include every speaker's probability in every 80 ms frame.
    #[arg(long)]
    pub probabilities: bool,
    /// NeMo's published post-processing: `dihard3` or `callhome` (tuned for the model's
    /// generation; `v1-`/`v2-` before the name picks one). Default: NeMo's defaults
    /// (thresholds 0.5, no padding or filtering). The flags below override single values.
    #[arg(long, value_name = "NAME")]
    pub diar_params: Option<String>,
    /// A speaker turn starts where its probability rises above this (0 to 1).
    #[arg(long, allow_negative_numbers = true)]
    pub onset: Option<f64>,
    /// A turn ends where its probability falls below this.
    #[arg(long, allow_negative_numbers = true)]
    pub offset: Option<f64>,
    /// Seconds added before each turn.
    #[arg(long, allow_negative_numbers = true)]
    pub pad_onset: Option<f64>,
    /// Seconds added after each turn.
    #[arg(long, allow_negative_numbers = true)]
    pub pad_offset: Option<f64>,
    /// Turns shorter than this (seconds) are dropped.
    #[arg(long, allow_negative_numbers = true)]
    pub min_duration_on: Option<f64>,
    /// Pauses shorter than this (seconds) within a speaker's turns are filled.
    #[arg(long, allow_negative_numbers = true)]
    pub min_duration_off: Option<f64>,
    /// A streaming model: run the whole file at once instead of streaming it.
    #[arg(long)]
    pub full_context: bool,
    #[command(flatten)]
    pub stream: StreamSettings,
    /// No per-file lines on standard error.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the time of each stage and of each kind of graph node to standard error.
    #[arg(long)]
    pub profile: bool,
}

impl DiarizeArgs {
    /// The post-processing the flags ask for, checked.
    pub fn postprocessing(&self, generation: Generation) -> Result<PostProcessing> {
        let mut p = match &self.diar_params {
            Some(name) => PostProcessing::published(name, generation)?,
            None => PostProcessing::default(),
        };
        p.onset = self.onset.unwrap_or(p.onset);
        p.offset = self.offset.unwrap_or(p.offset);
        p.pad_onset = self.pad_onset.unwrap_or(p.pad_onset);
        p.pad_offset = self.pad_offset.unwrap_or(p.pad_offset);
        p.min_duration_on = self.min_duration_on.unwrap_or(p.min_duration_on);
        p.min_duration_off = self.min_duration_off.unwrap_or(p.min_duration_off);
        p.check()?;
        Ok(p)
    }
}

/// Diarizes `jobs` (files, `-` for standard input, each with the directory argument it was
/// found under; directories already walked by the caller, passing over `non_audio` files).
/// Returns the exit code by [`Outcome`]'s rule.
pub fn run(args: DiarizeArgs, jobs: &[(PathBuf, Option<PathBuf>)], non_audio: usize) -> Result<u8> {
    // Flags that need no model are checked before it is loaded.
    if let Some(name) = &args.diar_params {
        PostProcessing::published(name, Generation::V1)?;
    }
    args.postprocessing(Generation::V1)?;
    args.stream.check()?;
    let sizes = args.stream.given();
    if args.full_context && !sizes.is_empty() {
        bail!(
            Options,
            "{}: streaming sizes, but --full-context runs the whole file at once",
            sizes.join(" ")
        );
    }
    if args.probabilities && !args.formats.contains(&DiarFormat::Json) {
        bail!(Options, "--probabilities needs -f json");
    }
    let (threads, warning) = Threads::resolve(args.threads)?;
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    let device = args.device.resolve()?;
    let mut formats: Vec<DiarFormat> = Vec::new();
    for f in &args.formats {
        if !formats.contains(f) {
            formats.push(*f);
        }
    }
    // Every file's outputs decided before any work, by transcribe's rule: text goes to
    // standard output unless a file format or a directory is asked for.
    let to_files = args.output_dir.is_some() || formats.iter().any(|f| *f != DiarFormat::Txt);
    let outputs = match to_files {
        true => {
            let planned: Vec<(&Path, Option<&Path>)> = jobs
                .iter()
                .map(|(p, root)| (p.as_path(), root.as_deref()))
                .collect();
            output::plan_outputs(&planned, args.output_dir.as_deref(), &formats)?
        }
        false => vec![Vec::new(); jobs.len()],
    };
    let started = Instant::now();
    let load = crate::model::LoadOptions {
        lowering: args.kernels.resolve(),
        device: Some(device),
    };
    let model =
        crate::model_source::load_with(&args.model, &mut |line| eprintln!("{line}"), &load)?;
    let mut diarizer = Diarizer::new(Arc::new(model), threads)?;
    let mut profile = Profile {
        load: started.elapsed(),
        ..Profile::default()
    };
    diarizer.set_op_timing(args.profile);
    let params = diarizer.params().clone();
    if !params.streaming_mode && !sizes.is_empty() {
        bail!(
            Options,
            "{}: {} is an offline Sortformer, which does not stream; these sizes are for a \
             streaming one",
            sizes.join(" "),
            args.model.display()
        );
    }
    let post = args.postprocessing(Generation::of(params.streaming_mode))?;
    let streaming = params.streaming_mode && !args.full_context;
    let settings = args.stream.resolve(params.streaming);
    if streaming {
        diarizer.check_streaming(&settings)?;
    }
    let units = diarizer.model().hparams().encoder.subsampling_factor;
    let (mut outcome, single) = (Outcome::default(), jobs.len() == 1);
    for ((job, _), outputs) in jobs.iter().zip(&outputs) {
        let result = (|| -> Result<()> {
            let read = Instant::now();
            let samples = load_samples(Input::arg(job), Limits::default())?;
            let diarize = Instant::now();
            profile.read += diarize - read;
            let activity = match streaming {
                true => diarizer.diarize_streaming(&samples, &settings)?,
                false => diarizer.diarize_offline(&samples)?,
            };
            profile.diarize += diarize.elapsed();
            profile.audio_seconds += samples.len() as f64 / SAMPLE_RATE;
            let segs = in_time_order(segments(&activity, &post, units));
            if outputs.is_empty() {
                let mut out = std::io::stdout().lock();
                if !single {
                    writeln!(out, "== {} ==", job.display())?;
                }
                for f in &formats {
                    out.write_all(
                        render(*f, job, &segs, &activity, args.probabilities).as_bytes(),
                    )?;
                }
                return Ok(out.flush()?);
            }
            for (f, path) in outputs {
                let text = render(*f, job, &segs, &activity, args.probabilities);
                output::write_planned(path, job, text.as_bytes())?;
                if !args.quiet {
                    eprintln!(
                        "{}: {} segments -> {}",
                        job.display(),
                        segs.len(),
                        path.display()
                    );
                }
            }
            Ok(())
        })();
        outcome.record(job, result)?;
    }
    if !single && !args.quiet {
        let wall = started.elapsed().as_secs_f64();
        eprintln!(
            "{}",
            outcome.summary(non_audio, profile.audio_seconds, wall)
        );
    }
    if args.profile {
        profile.print(&diarizer, streaming, started.elapsed());
    }
    Ok(outcome.code(jobs.len()))
}

/// Speaker turns in time order (NeMo lists them speaker by speaker): by start, then end, then
/// speaker.
fn in_time_order(mut segs: Vec<Segment>) -> Vec<Segment> {
    segs.sort_by(|a, b| {
        (a.start, a.end, a.speaker)
            .partial_cmp(&(b.start, b.end, b.speaker))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    segs
}

/// A time NeMo computed in f32, as JSON shows it: the f32's shortest decimal (`1.44`, not the
/// f64 widening's `1.440000057220459`), as `vad` and `transcribe` print theirs.
fn json_seconds(x: f64) -> serde_json::Value {
    let shortest = (x as f32).to_string();
    serde_json::json!(shortest.parse::<f64>().unwrap_or(x))
}

/// The sample rate `load_samples` resamples to.
const SAMPLE_RATE: f64 = 16000.0;

/// Totals over the run, for `--profile`.
#[derive(Default)]
struct Profile {
    load: Duration,
    read: Duration,
    /// The diarizer's time (features, encoder, Transformer, a stream's state).
    diarize: Duration,
    audio_seconds: f64,
}

impl Profile {
    /// The stages (the encoder's time is the diarizer's less its features and Transformer),
    /// then the backend's counters and node times.
    fn print(&self, diarizer: &Diarizer, streaming: bool, wall: Duration) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let times = diarizer.times();
        let encoder = self
            .diarize
            .saturating_sub(times.features + times.transformer);
        let hp = diarizer.model().hparams();
        let shape = format!("{} layers x {}", hp.encoder.n_layers, hp.encoder.d_model);
        let p = diarizer.params();
        eprintln!("stage                  time (ms)");
        eprintln!("model load          {:>12.1}", ms(self.load));
        eprintln!("audio read+resample {:>12.1}", ms(self.read));
        // A stream computes its features as the audio arrives, between its chunks.
        match streaming {
            false => {
                eprintln!("features            {:>12.1}", ms(times.features));
                eprintln!("encoder             {:>12.1}   ({shape})", ms(encoder));
            }
            true => eprintln!(
                "features + encoder  {:>12.1}   ({shape}; with each chunk's pre-encode and the \
                 speaker cache and FIFO updates)",
                ms(encoder)
            ),
        }
        eprintln!(
            "transformer + head  {:>12.1}   ({} layers x {}, {} heads)",
            ms(times.transformer),
            p.tf_n_layers,
            p.tf_d_model,
            p.tf_n_heads
        );
        eprintln!("total               {:>12.1}", ms(wall));
        if self.audio_seconds > 0.0 {
            eprintln!(
                "audio {:.2} s, diarization real-time factor {:.4}, {} threads, ops: {}",
                self.audio_seconds,
                self.diarize.as_secs_f64() / self.audio_seconds,
                diarizer.threads(),
                diarizer.model().lowering().name()
            );
        }
        super::profile::print_backend(diarizer.stats());
    }
}

/// RTTM's file id: the input's stem (`stdin` for `-`).
fn file_id(input: &Path) -> String {
    match input.as_os_str() == "-" {
        true => "stdin".into(),
        false => input
            .file_stem()
            .map(|s| s.to_string_lossy().replace(' ', "_"))
            .unwrap_or_else(|| "audio".into()),
    }
}

/// One format's text for a recording.
pub fn render(
    format: DiarFormat,
    input: &Path,
    segs: &[Segment],
    activity: &Activity,
    probabilities: bool,
) -> String {
    match format {
        DiarFormat::Txt => segs.iter().map(|s| nemo_line(s) + "\n").collect(),
        DiarFormat::Rttm => {
            let id = file_id(input);
            segs.iter()
                .map(|s| {
                    format!(
                        "SPEAKER {id} 1 {:.3} {:.3} <NA> <NA> speaker_{} <NA> <NA>\n",
                        s.start,
                        s.end - s.start,
                        s.speaker
                    )
                })
                .collect()
        }
        DiarFormat::Json => {
            let segments: Vec<serde_json::Value> = segs
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "speaker": format!("speaker_{}", s.speaker),
                        "start": json_seconds(s.start),
                        "end": json_seconds(s.end),
                    })
                })
                .collect();
            let mut v = serde_json::json!({
                "segments": segments,
                "speakers": activity.n_spks,
                "frame_shift": activity.frame_seconds,
                "frames": activity.frames,
            });
            if probabilities {
                let rows: Vec<&[f32]> = activity.probs.chunks(activity.n_spks.max(1)).collect();
                v["probabilities"] = serde_json::json!(rows);
            }
            let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
            text.push('\n');
            text
        }
    }
}
