//! `parakeet diarize`: who speaks when in audio files, directories and standard input, with a
//! Sortformer (`diar`), as NeMo's output lines, RTTM or JSON.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::audio;
use crate::diar::postprocess::{Generation, PostProcessing, Segment, nemo_line, segments};
use crate::diar::stream::StreamSettings;
use crate::diar::{Activity, Diarizer};
use crate::output::write_atomic;

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

impl DiarFormat {
    fn extension(self) -> &'static str {
        match self {
            DiarFormat::Txt => "txt",
            DiarFormat::Rttm => "rttm",
            DiarFormat::Json => "json",
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
    /// Output formats (comma-separated or repeated): txt, rttm, json.
    #[arg(
        short = 'f',
        long = "format",
        value_enum,
        value_delimiter = ',',
        default_value = "txt"
    )]
    pub formats: Vec<DiarFormat>,
    /// Write `<name>.<format>` files into this directory (default: txt to standard output,
    /// other formats beside each input).
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
}

impl DiarizeArgs {
    /// The post-processing the flags ask for, checked.
    pub fn postprocessing(&self, generation: Generation) -> Result<PostProcessing> {
        let mut p = match &self.diar_params {
            Some(name) => PostProcessing::published(name, generation)?,
            None => PostProcessing::default(),
        };
        let set = |v: &mut f64, flag: Option<f64>| {
            if let Some(x) = flag {
                *v = x;
            }
        };
        set(&mut p.onset, self.onset);
        set(&mut p.offset, self.offset);
        set(&mut p.pad_onset, self.pad_onset);
        set(&mut p.pad_offset, self.pad_offset);
        set(&mut p.min_duration_on, self.min_duration_on);
        set(&mut p.min_duration_off, self.min_duration_off);
        p.check()?;
        Ok(p)
    }
}

/// Exit codes, as `transcribe`'s: 0 all good, 1 some inputs failed, 2 usage or model errors
/// (and every input failing).
const EXIT_SOME_FAILED: u8 = 1;
const EXIT_ALL_FAILED: u8 = 2;

/// Diarizes `jobs` (files, `-` for standard input; directories already walked by the caller).
pub fn run(args: DiarizeArgs, jobs: &[PathBuf]) -> Result<u8> {
    // Flags that need no model are checked before it is loaded.
    if let Some(name) = &args.diar_params {
        PostProcessing::published(name, Generation::V1)?;
    }
    args.postprocessing(Generation::V1)?;
    args.stream.check()?;
    if jobs.is_empty() {
        bail!("no audio files found in the given inputs");
    }
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let model_path = crate::model_source::resolve(&args.model, &mut |line| eprintln!("{line}"))?;
    let mut diarizer = Diarizer::load(&model_path, threads)?;
    let params = diarizer.params().clone();
    let post = args.postprocessing(Generation::of(params.streaming_mode))?;
    let streaming = params.streaming_mode && !args.full_context;
    let settings = args.stream.resolve(params.streaming);
    let units = diarizer.model().hparams().encoder.subsampling_factor;
    let to_stdout = args.output_dir.is_none() && args.formats == [DiarFormat::Txt];
    let (mut failed, single) = (0, jobs.len() == 1);
    for job in jobs {
        let result = (|| -> Result<()> {
            let samples = read_samples(job)?;
            let activity = match streaming {
                true => diarizer.diarize_streaming(&samples, &settings)?,
                false => diarizer.diarize_offline(&samples)?,
            };
            let segs = segments(&activity, &post, units);
            if to_stdout || job.as_os_str() == "-" {
                let mut out = std::io::stdout().lock();
                if !single {
                    writeln!(out, "== {} ==", job.display())?;
                }
                for f in &args.formats {
                    out.write_all(
                        render(*f, job, &segs, &activity, args.probabilities).as_bytes(),
                    )?;
                }
                return Ok(());
            }
            for f in &args.formats {
                let path = output_path(job, args.output_dir.as_deref(), *f)?;
                write_atomic(
                    &path,
                    render(*f, job, &segs, &activity, args.probabilities).as_bytes(),
                )?;
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
        if let Err(e) = result {
            failed += 1;
            eprintln!("error: {}: {e:#}", job.display());
        }
    }
    Ok(match failed {
        0 => 0,
        n if n == jobs.len() => EXIT_ALL_FAILED,
        _ => EXIT_SOME_FAILED,
    })
}

fn read_samples(job: &Path) -> Result<Vec<f32>> {
    let decoded = if job.as_os_str() == "-" {
        audio::read_stdin()?
    } else {
        audio::load_audio(job)?
    };
    audio::resample_to_16k(decoded).with_context(|| format!("{}: resampling", job.display()))
}

/// `<dir>/<stem>.<ext>`: the output directory, or the input's own.
fn output_path(input: &Path, dir: Option<&Path>, format: DiarFormat) -> Result<PathBuf> {
    let stem = input
        .file_stem()
        .with_context(|| format!("{}: no file name", input.display()))?;
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("{}: cannot create directory", d.display()))?;
            d.to_path_buf()
        }
        None => input.parent().unwrap_or(Path::new(".")).to_path_buf(),
    };
    let path = dir.join(stem).with_extension(format.extension());
    if path == input {
        bail!("{}: the output would overwrite the input", path.display());
    }
    Ok(path)
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
                        "start": s.start,
                        "end": s.end,
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
