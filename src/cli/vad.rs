//! `parakeet vad`: speech segments of audio files as the `silero-vad` package's
//! `get_speech_timestamps` makes them, as text, JSON, RTTM or SRT.

use super::{Outcome, shown};
use crate::audio;
use crate::error::{Context, Result};
use crate::output::{self, OutputKind};
use crate::session::{SpeechRequest, Threads};
use crate::stream::turns::TurnParams;
use crate::vad::detect::{Detection, audio_or_empty, detect};
use crate::vad::{SpeechParams, Vad, VadModel};
use crate::{bail, err};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The parameters speech detection shares with the streaming `VADIterator` (`stream --vad`),
/// with the package's defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct TurnArgs {
    /// A window at or above this speech probability is speech.
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub threshold: f64,
    /// Silence shorter than this does not end speech.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "MS",
        default_value_t = 100.0
    )]
    pub min_silence_ms: f64,
    /// Added to both ends of every speech segment (in segments, a gap shorter than twice this
    /// is split in the middle).
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "MS",
        default_value_t = 30.0
    )]
    pub speech_pad_ms: f64,
}

impl TurnArgs {
    /// The checked parameters of the streaming `VADIterator`.
    pub fn params(&self) -> Result<TurnParams> {
        let p = TurnParams {
            threshold: self.threshold,
            min_silence_ms: self.min_silence_ms,
            speech_pad_ms: self.speech_pad_ms,
        };
        p.validate(["threshold", "min-silence-ms", "speech-pad-ms"])
            .map_err(|e| err!(Options, "--{e:#}"))?;
        Ok(p)
    }
}

/// The parameters of `get_speech_timestamps`, with the package's defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct SpeechArgs {
    #[command(flatten)]
    pub turn: TurnArgs,
    /// Speech ends below this probability [default: threshold - 0.15, at least 0.01].
    #[arg(long, allow_negative_numbers = true)]
    pub neg_threshold: Option<f64>,
    /// Speech shorter than this is dropped.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "MS",
        default_value_t = 250.0
    )]
    pub min_speech_ms: f64,
    /// Speech longer than this is cut, at the longest silence in it where there is one
    /// [default: no limit].
    #[arg(long, allow_negative_numbers = true, value_name = "S")]
    pub max_speech_s: Option<f64>,
    /// A silence at least this long is a place where --max-speech-s may cut.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "MS",
        default_value_t = 98.0
    )]
    pub min_silence_at_max_speech_ms: f64,
    /// At --max-speech-s, cut at the last long silence instead of the longest (the package's
    /// use_max_poss_sil_at_max_speech=False).
    #[arg(long)]
    pub legacy_max_speech_split: bool,
}

impl SpeechArgs {
    /// The checked parameters.
    pub fn params(&self) -> Result<SpeechParams> {
        let p = SpeechParams {
            threshold: self.turn.threshold,
            neg_threshold: self.neg_threshold,
            min_speech_ms: self.min_speech_ms,
            max_speech_s: self.max_speech_s.unwrap_or(f64::INFINITY),
            min_silence_ms: self.turn.min_silence_ms,
            speech_pad_ms: self.turn.speech_pad_ms,
            min_silence_at_max_speech_ms: self.min_silence_at_max_speech_ms,
            use_max_poss_sil_at_max_speech: !self.legacy_max_speech_split,
        };
        p.validate().map_err(|e| err!(Options, "--{e:#}"))?;
        Ok(p)
    }
}

/// `transcribe --vad`'s request: `None` without `--vad` (and then none of the
/// speech-detection flags may differ from their defaults: they would do nothing), else the
/// checked parameters and the `--vad-model` file's model.
pub fn speech_request(
    vad: bool,
    args: &SpeechArgs,
    model: Option<&Path>,
) -> Result<Option<SpeechRequest>> {
    let params = args.params()?;
    if !vad {
        if params != SpeechParams::default() {
            bail!(
                Options,
                "the speech-detection flags (--threshold, --min-silence-ms, ...) need --vad"
            );
        }
        return Ok(None);
    }
    Ok(Some(SpeechRequest {
        params,
        model: model.map(VadModel::open).transpose()?,
    }))
}

/// How `parakeet vad` writes segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VadFormat {
    /// `start end` in seconds, a segment a line (`text` is another name for it).
    #[value(name = "txt", alias = "text")]
    Text,
    /// `{"segments": [{start, end, start_sample, end_sample}], "sample_rate", "duration"}`.
    Json,
    /// NIST RTTM, a SPEAKER line per segment (speaker `speech`).
    Rttm,
    /// SubRip cues, one per segment.
    Srt,
}

/// `talk.wav` -> `talk.vad.srt`: the command's name in the extension, so that speech segments
/// never replace a transcript or subtitles of the same audio (`transcribe`'s `talk.srt`).
impl OutputKind for VadFormat {
    fn extension(self) -> &'static str {
        match self {
            VadFormat::Text => "vad.txt",
            VadFormat::Json => "vad.json",
            VadFormat::Rttm => "vad.rttm",
            VadFormat::Srt => "vad.srt",
        }
    }
}

#[derive(clap::Args)]
pub struct VadArgs {
    /// Audio files or directories (walked recursively); `-` reads WAV/FLAC from standard input.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    #[command(flatten)]
    pub speech: SpeechArgs,
    /// Output formats (comma-separated or repeated): txt, json, rttm, srt.
    #[arg(
        short = 'f',
        long = "format",
        value_enum,
        value_delimiter = ',',
        default_value = "txt"
    )]
    pub formats: Vec<VadFormat>,
    /// With `-f json`: every window's speech probability too (one per 32 ms).
    #[arg(long)]
    pub probabilities: bool,
    /// Write `<input>.vad.<ext>` files under this directory (mirroring directory arguments;
    /// standard input is `stdin.vad.<ext>`) instead of printing to standard output.
    #[arg(short, long)]
    pub output_dir: Option<PathBuf>,
    /// A Silero VAD GGUF to use instead of the built-in model (v6.2).
    #[arg(long, value_name = "FILE")]
    pub vad_model: Option<PathBuf>,
    /// Threads for the compute backend (default: available cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Say on stderr when audio is resampled for the model.
    #[arg(short, long)]
    pub verbose: bool,
    /// No per-file lines or summary on standard error.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Runs `parakeet vad` over `inputs` (each file with the directory argument it was found
/// under; `non_audio` files were passed over in the directories). Returns the exit code by
/// [`Outcome`]'s rule.
pub fn run(args: &VadArgs, inputs: &[(PathBuf, Option<PathBuf>)], non_audio: usize) -> Result<u8> {
    let params = args.speech.params()?;
    let mut formats: Vec<VadFormat> = Vec::new();
    for f in &args.formats {
        if !formats.contains(f) {
            formats.push(*f);
        }
    }
    if args.probabilities && !formats.contains(&VadFormat::Json) {
        bail!(Options, "--probabilities needs -f json");
    }
    let (threads, warning) = Threads::resolve(args.threads)?;
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    // Every file's output decided before any work, by transcribe's rule.
    let outputs = match &args.output_dir {
        Some(dir) => {
            let planned: Vec<(&Path, Option<&Path>)> = inputs
                .iter()
                .map(|(p, root)| (p.as_path(), root.as_deref()))
                .collect();
            output::plan_outputs(&planned, Some(dir), &formats)?
        }
        None => vec![Vec::new(); inputs.len()],
    };
    let started = std::time::Instant::now();
    let model = VadModel::load(args.vad_model.as_deref())?;
    let mut vad = Vad::new(model, threads)?;
    let several = inputs.len() > 1;
    let mut outcome = Outcome::default();
    let mut audio_seconds = 0.0;
    let stdout = std::io::stdout();
    for ((path, _), outputs) in inputs.iter().zip(&outputs) {
        let result = detect_file(&mut vad, path, &params, args.verbose).and_then(|d| {
            audio_seconds += seconds(d.n_samples, d.rate.hz());
            let named = several && args.output_dir.is_none();
            if outputs.is_empty() {
                let mut out = stdout.lock();
                for f in &formats {
                    out.write_all(render(*f, args.probabilities, &d, path, named).as_bytes())
                        .context("standard output")?;
                }
                return out.flush().context("standard output");
            }
            for (f, file) in outputs {
                let text = render(*f, args.probabilities, &d, path, false);
                output::write_planned(file, path, text.as_bytes())?;
                if !args.quiet {
                    eprintln!(
                        "{}: {} speech segments -> {}",
                        shown(path),
                        d.segments.len(),
                        file.display()
                    );
                }
            }
            Ok(())
        });
        outcome.record(path, result)?;
    }
    if several && !args.quiet {
        let wall = started.elapsed().as_secs_f64();
        eprintln!("{}", outcome.summary(non_audio, audio_seconds, wall));
    }
    Ok(outcome.code(inputs.len()))
}

/// Decodes `path` and finds its speech (see [`detect`]), saying so when it was resampled.
fn detect_file(
    vad: &mut Vad,
    path: &Path,
    params: &SpeechParams,
    verbose: bool,
) -> Result<Detection> {
    let decoded = audio_or_empty(if path.as_os_str() == "-" {
        audio::read_stdin()
    } else {
        audio::load_audio(path)
    })?;
    let d = detect(vad, decoded, params)?;
    if let (true, Some(hz)) = (verbose, d.resampled_from) {
        eprintln!(
            "{}: resampling {hz} Hz to 16000 Hz for the VAD model (it takes 8000 or 16000 Hz)",
            path.display()
        );
    }
    Ok(d)
}

fn seconds(samples: usize, rate: u32) -> f64 {
    samples as f64 / rate as f64
}

/// `hh:mm:ss,mmm` for SRT.
fn srt_time(s: f64) -> String {
    output::timestamp(output::to_ms(s), ',')
}

/// The file's rendering in `format` (with `probabilities` in JSON); `named` puts the input's
/// name in (several inputs on one stream).
fn render(
    format: VadFormat,
    probabilities: bool,
    d: &Detection,
    path: &Path,
    named: bool,
) -> String {
    let shown = if path.as_os_str() == "-" {
        "-".to_string()
    } else {
        path.display().to_string()
    };
    let mut out = String::new();
    match format {
        VadFormat::Text => {
            if named {
                let _ = writeln!(out, "# {shown}");
            }
            for s in &d.segments {
                let _ = writeln!(
                    out,
                    "{:.3} {:.3}",
                    seconds(s.start, d.rate.hz()),
                    seconds(s.end, d.rate.hz())
                );
            }
        }
        VadFormat::Json => {
            let segments: Vec<serde_json::Value> = d
                .segments
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "start": seconds(s.start, d.rate.hz()),
                        "end": seconds(s.end, d.rate.hz()),
                        "start_sample": s.start,
                        "end_sample": s.end,
                    })
                })
                .collect();
            let mut v = serde_json::json!({
                "segments": segments,
                "sample_rate": d.rate.hz(),
                "duration": seconds(d.n_samples, d.rate.hz()),
            });
            if probabilities {
                v["probabilities"] = serde_json::json!(d.probabilities);
            }
            if named {
                v["file"] = serde_json::json!(shown);
            }
            let _ = writeln!(out, "{v}");
        }
        VadFormat::Rttm => {
            let id: String = if path.as_os_str() == "-" {
                "stdin".into()
            } else {
                path.file_stem()
                    .map(|s| s.to_string_lossy().replace(char::is_whitespace, "_"))
                    .unwrap_or_else(|| "audio".into())
            };
            for s in &d.segments {
                let start = seconds(s.start, d.rate.hz());
                let dur = seconds(s.end - s.start, d.rate.hz());
                let _ = writeln!(
                    out,
                    "SPEAKER {id} 1 {start:.3} {dur:.3} <NA> <NA> speech <NA> <NA>"
                );
            }
        }
        VadFormat::Srt => {
            if named {
                let _ = writeln!(out, "# {shown}");
            }
            for (i, s) in d.segments.iter().enumerate() {
                let _ = write!(
                    out,
                    "{}\n{} --> {}\nspeech\n\n",
                    i + 1,
                    srt_time(seconds(s.start, d.rate.hz())),
                    srt_time(seconds(s.end, d.rate.hz()))
                );
            }
        }
    }
    out
}
