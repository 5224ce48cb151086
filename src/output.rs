//! What the CLI writes: plain text, JSON, SRT, WebVTT and TSV renderings of a [`Transcript`],
//! subtitle segmentation, the terminal `--timestamps` listing, and crash-safe file output.
//!
//! Every rendering works in whole milliseconds, so the formats agree with each other to the
//! millisecond and a file can be compared exactly with another rendering of the same transcript.

use crate::bail;
use crate::diar::words::speaker_name;
use crate::error::{Context, Result};
use crate::tokenizer::Word;
use crate::transcript::Transcript;
use serde::Serialize;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Characters per subtitle line: the common broadcast limit (Netflix, BBC use 37-42), short
/// enough to read at a glance.
pub const MAX_LINE_CHARS: usize = 42;
/// Lines per subtitle cue; a third line covers too much of the picture.
pub const MAX_LINES: usize = 2;
/// A silence longer than this between two words starts a new cue, so that a cue is not left
/// on screen over a pause.
pub const MAX_PAUSE_SECONDS: f64 = 1.0;

/// An output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Format {
    /// Plain text, one line.
    Txt,
    /// Text, tokens, words, segments and timings.
    Json,
    /// SubRip subtitles.
    Srt,
    /// WebVTT subtitles.
    Vtt,
    /// Tab-separated segments: start and end in milliseconds, text.
    Tsv,
}

impl Format {
    /// Every format, for `--format all`.
    pub const ALL: [Format; 5] = [
        Format::Txt,
        Format::Json,
        Format::Srt,
        Format::Vtt,
        Format::Tsv,
    ];

    /// The file extension (without the dot).
    pub fn extension(self) -> &'static str {
        match self {
            Format::Txt => "txt",
            Format::Json => "json",
            Format::Srt => "srt",
            Format::Vtt => "vtt",
            Format::Tsv => "tsv",
        }
    }

    /// Parses a comma-separated list of format names, where `all` stands for [`Format::ALL`];
    /// repeats are dropped, first mention kept.
    pub fn parse_list(spec: &str) -> Result<Vec<Format>, String> {
        use clap::ValueEnum;
        let mut out = Vec::new();
        for name in spec.split(',').map(str::trim) {
            let formats = if name.eq_ignore_ascii_case("all") {
                Format::ALL.to_vec()
            } else {
                vec![Format::from_str(name, true).map_err(|_| {
                    format!("unknown format {name:?} (expected txt, json, srt, vtt, tsv or all)")
                })?]
            };
            for f in formats {
                if !out.contains(&f) {
                    out.push(f);
                }
            }
        }
        Ok(out)
    }
}

/// A kind of output file, by its extension. Each command has its own kinds (`transcribe`'s
/// [`Format`], `vad`'s and `diarize`'s), and [`plan_outputs`] names every command's files by
/// one rule.
pub trait OutputKind: Copy {
    /// The file extension, without the leading dot (`srt`, `vad.json`).
    fn extension(self) -> &'static str;
}

impl OutputKind for Format {
    fn extension(self) -> &'static str {
        Format::extension(self)
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.extension())
    }
}

/// What the JSON output records besides the transcript itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputMeta {
    /// The model (file) that transcribed.
    pub model: String,
    /// The input audio as given.
    pub audio_path: String,
    pub audio_seconds: f64,
    /// (stage, seconds) in pipeline order.
    pub timings: Vec<(String, f64)>,
}

/// One subtitle cue.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Segment {
    /// Seconds, whole milliseconds.
    pub start: f64,
    /// Seconds, whole milliseconds; at least 1 ms after `start`, at most the next start.
    pub end: f64,
    /// The words, separated by single spaces.
    pub text: String,
    /// The lowest word confidence in the cue, when confidence was computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f32>,
    /// Who speaks the cue (every word of it), when the audio was diarized: `speaker_<k>`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_speaker"
    )]
    pub speaker: Option<usize>,
}

/// A speaker index as outputs name it (`speaker_<k>`).
fn serialize_speaker<S: serde::Serializer>(v: &Option<usize>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(k) => s.serialize_str(&speaker_name(*k)),
        None => s.serialize_none(),
    }
}

impl Segment {
    /// The text broken into at most [`MAX_LINES`] lines of at most [`MAX_LINE_CHARS`]
    /// characters (a single longer word keeps its own line), as even in length as possible.
    pub fn lines(&self) -> Vec<String> {
        balanced_wrap(&self.text, MAX_LINE_CHARS)
    }
}

/// Renders `t` in `format`: txt is the text (trimmed) and a newline; json everything, times
/// in seconds rounded to milliseconds; srt, vtt and tsv the cues of [`segments`].
pub fn render(format: Format, t: &Transcript, meta: &OutputMeta) -> String {
    match format {
        Format::Txt => format!("{}\n", t.text.trim()),
        Format::Json => render_json(t, meta),
        Format::Srt => render_srt(&transcript_segments(t)),
        Format::Vtt => render_vtt(&transcript_segments(t)),
        Format::Tsv => render_tsv(&transcript_segments(t)),
    }
}

/// A transcript's cues: [`segments`] of its words, and with speech detection never one across
/// two speech segments (a cue starts with each).
pub fn transcript_segments(t: &Transcript) -> Vec<Segment> {
    let starts: Vec<usize> = t.speech.iter().flatten().map(|s| s.first_word).collect();
    cues(&t.words, &starts)
}

/// Groups words into subtitle cues. A cue ends after a word that ends a sentence, before a
/// pause longer than [`MAX_PAUSE_SECONDS`], before a word of another speaker (diarized
/// transcripts), and before a word that would not fit in [`MAX_LINES`] lines of
/// [`MAX_LINE_CHARS`].
///
/// Times are whole milliseconds and well-formed for players whatever the word times are:
/// starts strictly increase, each cue lasts at least 1 ms, and a cue ends no later than the
/// next one starts (a word span can reach one frame past the next word's start).
pub fn segments(words: &[Word]) -> Vec<Segment> {
    cues(words, &[])
}

/// [`segments`], with a new cue at each word index of `starts` (ascending).
fn cues(words: &[Word], starts: &[usize]) -> Vec<Segment> {
    let groups = group_words(words, starts);
    let mut starts: Vec<u64> = Vec::with_capacity(groups.len());
    for g in &groups {
        let raw = g.iter().map(|w| to_ms(w.start)).min().unwrap_or(0);
        starts.push(match starts.last() {
            Some(&prev) => raw.max(prev + 1),
            None => raw,
        });
    }
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let start = starts[i];
            let raw_end = g.iter().map(|w| to_ms(w.end)).max().unwrap_or(start);
            let end = starts
                .get(i + 1)
                .map_or(raw_end, |&next| raw_end.min(next))
                .max(start + 1);
            Segment {
                start: start as f64 / 1000.0,
                end: end as f64 / 1000.0,
                text: join_words(g),
                confidence: g
                    .iter()
                    .map(|w| w.confidence)
                    .reduce(|a, b| Some(a?.min(b?)))
                    .flatten(),
                speaker: g.first().and_then(|w| w.speaker),
            }
        })
        .collect()
}

/// One `[HH:MM:SS.mmm --> HH:MM:SS.mmm] word` line per word, each ending in a newline.
pub fn format_timestamps_line(words: &[Word]) -> String {
    words
        .iter()
        .map(|w| {
            format!(
                "[{} --> {}] {}\n",
                timestamp(to_ms(w.start), '.'),
                timestamp(to_ms(w.end), '.'),
                w.text
            )
        })
        .collect()
}

/// Writes `contents` to `path` so that readers see either the old file or all of the new one,
/// never a partial write: a temporary file in the same directory (a rename is only atomic
/// within one file system), flushed to disk, then renamed over `path`. The new file has the
/// default permissions, and a symbolic link at `path` is replaced, not followed.
///
/// A FIFO or device at `path` (`/dev/null`, `/dev/stdout`) is written directly: renaming over it
/// would replace it with a regular file.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    // Windows: a device name (`aux.txt` beside `aux.wav`, `nul.json`) would send the text to
    // a device or nowhere, or fail at the rename.
    if let Some(device) = crate::audio::windows_device(path) {
        bail!(
            Options,
            "refusing to write {}: {device} is a Windows device name; choose another output name",
            path.display()
        );
    }
    if is_special_file(path) {
        return OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(contents))
            .with_context(|| format!("{}: cannot write", path.display()));
    }
    if path.file_name().is_none() {
        bail!(Options, "{}: not a file name", path.display());
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (tmp, file) = create_temp(dir)
        .with_context(|| format!("{}: cannot create a temporary file", path.display()))?;
    let written = fill_and_sync(file, contents).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = written {
        // Best effort: the write already failed, and a leftover temp file is only clutter.
        let _ = fs::remove_file(&tmp);
        forget_temp(&tmp);
        return Err(e).with_context(|| format!("{}: cannot write", path.display()));
    }
    forget_temp(&tmp);
    sync_dir(dir);
    Ok(())
}

/// Where the `format` output for `input` goes: `input`'s path below `input_root` (the
/// directory argument it was found under) or, without one, its file name, placed under
/// `out_dir`, with the format's extension in place of the audio one, so that players find
/// `talk.srt` beside `talk.mp4`.
pub fn output_path(
    input: &Path,
    input_root: Option<&Path>,
    out_dir: &Path,
    format: impl OutputKind,
) -> PathBuf {
    let relative = input_root
        .and_then(|root| input.strip_prefix(root).ok())
        .filter(|rel| !rel.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(input.file_name().unwrap_or(OsStr::new("audio"))));
    out_dir.join(relative).with_extension(format.extension())
}

/// Where the `format` output for `input` goes: under `out_dir` by [`output_path`]; without one,
/// beside the input; for standard input (`-`), `stdin.<ext>` in the current directory. With
/// `keep_audio_ext` the audio extension stays in the name (`talk.wav.srt`).
pub fn destination(
    input: &Path,
    input_root: Option<&Path>,
    out_dir: Option<&Path>,
    format: impl OutputKind,
    keep_audio_ext: bool,
) -> PathBuf {
    let base = match out_dir {
        // Standard input is named `stdin` wherever its outputs go.
        Some(dir) if input.as_os_str() == "-" => dir.join("stdin.txt"),
        Some(dir) => output_path(input, input_root, dir, Format::Txt),
        None if input.as_os_str() == "-" => PathBuf::from("stdin.txt"),
        None => input.with_extension("txt"),
    };
    if keep_audio_ext && input.as_os_str() != "-" {
        let mut name = base.with_extension("").into_os_string();
        if let Some(ext) = input.extension() {
            name.push(".");
            name.push(ext);
        }
        name.push(".");
        name.push(format.extension());
        PathBuf::from(name)
    } else {
        base.with_extension(format.extension())
    }
}

/// Decides every input's output files before any work, so that no result is silently
/// overwritten by another's. The rule (README, "Output names"): an output is named after its
/// input with the format's extension in place of the audio one (`talk.wav` -> `talk.srt`);
/// inputs that would share a name (`talk.wav` and `talk.flac` in one folder) keep their audio
/// extension instead (`talk.wav.srt`, `talk.flac.srt`); if names still clash (two `talk.wav`
/// from different folders into one `-o`), the run is refused, naming both inputs.
///
/// `inputs` are (path, directory argument it was found under); the result is parallel to it.
pub fn plan_outputs<F: OutputKind>(
    inputs: &[(&Path, Option<&Path>)],
    out_dir: Option<&Path>,
    formats: &[F],
) -> Result<Vec<Vec<(F, PathBuf)>>> {
    let plan = |keep: &[bool]| -> Vec<Vec<(F, PathBuf)>> {
        inputs
            .iter()
            .zip(keep)
            .map(|(&(input, root), &keep)| {
                formats
                    .iter()
                    .map(|&f| (f, destination(input, root, out_dir, f, keep)))
                    .collect()
            })
            .collect()
    };
    let mut keep = vec![false; inputs.len()];
    for (a, b, _) in clashes(&plan(&keep)) {
        keep[a] = true;
        keep[b] = true;
    }
    let planned = plan(&keep);
    if let Some((a, b, path)) = clashes(&planned).into_iter().next() {
        bail!(
            Options,
            "{} and {} would both be written to {}; refusing before any work (give them in \
             separate runs, into separate -o directories, or pass their common folder)",
            inputs[a].0.display(),
            inputs[b].0.display(),
            path.display()
        );
    }
    Ok(planned)
}

/// Writes one planned output of `input`: never over the input itself, its directory made
/// first, the file written atomically.
pub fn write_planned(path: &Path, input: &Path, contents: &[u8]) -> Result<()> {
    check_not_input(path, input)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create directory", dir.display()))?;
    }
    write_atomic(path, contents)
}

/// Pairs of inputs (first, later) whose planned outputs are the same file, with that file.
fn clashes<F>(planned: &[Vec<(F, PathBuf)>]) -> Vec<(usize, usize, PathBuf)> {
    let mut owner: std::collections::HashMap<PathBuf, usize> = Default::default();
    let mut out = Vec::new();
    for (i, outputs) in planned.iter().enumerate() {
        for (_, path) in outputs {
            match owner.entry(normalized(path)) {
                std::collections::hash_map::Entry::Occupied(e) if *e.get() != i => {
                    out.push((*e.get(), i, path.clone()));
                }
                std::collections::hash_map::Entry::Occupied(_) => {}
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(i);
                }
            }
        }
    }
    out
}

/// `path` made absolute with `.` and `..` resolved lexically, so that two spellings of one
/// output compare equal.
fn normalized(path: &Path) -> PathBuf {
    use std::path::Component;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// Fails if `out` is the file `input` (also through links or a different spelling), so that
/// an output never overwrites the audio it came from.
pub fn check_not_input(out: &Path, input: &Path) -> Result<()> {
    let (Ok(out_meta), Ok(in_meta)) = (fs::metadata(out), fs::metadata(input)) else {
        // A path that does not exist cannot be the other one.
        return Ok(());
    };
    if same_file(out, &out_meta, input, &in_meta) {
        bail!(
            Options,
            "refusing to write {}: it is the input file {}",
            out.display(),
            input.display()
        );
    }
    Ok(())
}

#[cfg(unix)]
fn same_file(_: &Path, a: &fs::Metadata, _: &Path, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(a: &Path, _: &fs::Metadata, b: &Path, _: &fs::Metadata) -> bool {
    matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(a), Ok(b)) if a == b)
}

/// Seconds -> whole milliseconds (negative and NaN -> 0).
pub fn to_ms(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1000.0).round() as u64
}

/// Seconds rounded to milliseconds, for JSON.
pub fn round_ms(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// `HH:MM:SS<sep>mmm` (SRT uses `,`, WebVTT `.`); hours grow past two digits if need be.
pub fn timestamp(ms: u64, sep: char) -> String {
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{sep}{ms:03}")
}

/// Words split into cues by the rules of [`segments`] and before each word index of
/// `starts`; words without text are skipped.
fn group_words<'a>(words: &'a [Word], starts: &[usize]) -> Vec<Vec<&'a Word>> {
    let mut groups: Vec<Vec<&Word>> = Vec::new();
    // Set when a start is passed, even on a skipped word; cleared by the next cue.
    let mut forced = false;
    for (i, w) in words.iter().enumerate() {
        forced |= starts.binary_search(&i).is_ok();
        if w.text.trim().is_empty() {
            continue;
        }
        let breaks = match groups.last().and_then(|g| g.last().map(|prev| (g, prev))) {
            None => true,
            Some((g, prev)) => {
                forced
                    || ends_sentence(&prev.text)
                    || w.speaker != prev.speaker
                    || w.start - prev.end > MAX_PAUSE_SECONDS
                    || !fits(&format!("{} {}", join_words(g), clean(&w.text)))
            }
        };
        forced = false;
        if breaks {
            groups.push(vec![w]);
        } else if let Some(g) = groups.last_mut() {
            g.push(w);
        }
    }
    groups
}

fn join_words(words: &[&Word]) -> String {
    words
        .iter()
        .map(|w| clean(&w.text))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A word with any inner whitespace (tabs, newlines) made single spaces, so that it cannot
/// break a cue or a TSV row.
fn clean(word: &str) -> String {
    word.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether a word ends a sentence: its last character, past closing quotes and brackets, is
/// a full stop, question or exclamation mark in any script. `⁇` is not one: the decoder
/// prints it for unknown tokens.
fn ends_sentence(word: &str) -> bool {
    let is_closer = |c: char| {
        matches!(
            c,
            '"' | '\'' | ')' | ']' | '}' | '»' | '’' | '”' | '」' | '』' | '）'
        )
    };
    word.trim_end_matches(is_closer)
        .chars()
        .last()
        .is_some_and(|c| {
            matches!(
                c,
                '.' | '!'
                    | '?'
                    | '…'
                    | '‼'
                    | '⁈'
                    | '⁉'
                    | '。'
                    | '．'
                    | '！'
                    | '？'
                    | '｡'
                    | '؟'
                    | '۔'
                    | '।'
                    | '॥'
                    | '։'
                    | '።'
                    | '\u{37e}' // Greek question mark
            )
        })
}

/// Whether `text` wraps into at most [`MAX_LINES`] lines of [`MAX_LINE_CHARS`].
fn fits(text: &str) -> bool {
    greedy_wrap(text, MAX_LINE_CHARS).len() <= MAX_LINES
}

fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// Fills lines word by word up to `width` characters: the fewest lines possible. A word
/// longer than `width` gets a line of its own.
fn greedy_wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if char_len(line) + 1 + char_len(word) <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// The greedy line count, but with lines as even as possible: the narrowest width that
/// still needs no more lines than `width` does. Two half lines read better than a full one
/// over a single word.
fn balanced_wrap(text: &str, width: usize) -> Vec<String> {
    let lines = greedy_wrap(text, width);
    if lines.len() < 2 {
        return lines;
    }
    // Fewer lines never come from a narrower width, so the narrowest width with the same
    // count is found by bisection.
    let (mut lo, mut hi) = (1, width);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if greedy_wrap(text, mid).len() <= lines.len() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    greedy_wrap(text, hi)
}

/// SubRip cues; a diarized cue starts with its speaker in brackets (`[speaker_0] `).
fn render_srt(segments: &[Segment]) -> String {
    segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let speaker = s
                .speaker
                .map(|k| format!("[{}] ", speaker_name(k)))
                .unwrap_or_default();
            format!(
                "{}\n{} --> {}\n{speaker}{}\n",
                i + 1,
                timestamp(to_ms(s.start), ','),
                timestamp(to_ms(s.end), ','),
                s.lines().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// WebVTT cues; a diarized cue is a voice span (`<v speaker_0>`).
fn render_vtt(segments: &[Segment]) -> String {
    let cues = segments
        .iter()
        .map(|s| {
            let lines: Vec<String> = s.lines().iter().map(|l| vtt_escape(l)).collect();
            let voice = s
                .speaker
                .map(|k| format!("<v {}>", speaker_name(k)))
                .unwrap_or_default();
            format!(
                "{} --> {}\n{voice}{}\n",
                timestamp(to_ms(s.start), '.'),
                timestamp(to_ms(s.end), '.'),
                lines.join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    format!("WEBVTT\n\n{cues}")
}

/// WebVTT cue text is markup: `&` and `<` start entities and tags, and `-->` (hence `>`)
/// must not appear.
fn vtt_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// whisper.cpp's TSV: a header, then start and end in milliseconds and the text; with
/// confidence, a column of the cue's lowest word confidence; diarized, a column of its speaker.
fn render_tsv(segments: &[Segment]) -> String {
    let all = |f: fn(&Segment) -> bool| !segments.is_empty() && segments.iter().all(f);
    let with_confidence = all(|s| s.confidence.is_some());
    let with_speaker = all(|s| s.speaker.is_some());
    let mut out = String::from("start\tend\ttext");
    if with_confidence {
        out.push_str("\tconfidence");
    }
    if with_speaker {
        out.push_str("\tspeaker");
    }
    out.push('\n');
    for s in segments {
        out.push_str(&format!("{}\t{}\t{}", to_ms(s.start), to_ms(s.end), s.text));
        if let (Some(c), true) = (s.confidence, with_confidence) {
            out.push_str(&format!("\t{c:.4}"));
        }
        if let (Some(k), true) = (s.speaker, with_speaker) {
            out.push_str(&format!("\t{}", speaker_name(k)));
        }
        out.push('\n');
    }
    out
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    text: &'a str,
    model: &'a str,
    audio: &'a str,
    duration: f64,
    /// The encoder's self-attention, in NeMo's terms.
    attention: JsonAttention,
    /// Which decoding ran.
    decoding: JsonDecoding<'a>,
    tokens: Vec<JsonToken<'a>>,
    words: Vec<JsonWord<'a>>,
    segments: Vec<Segment>,
    /// With speech detection, the speech segments transcribed (seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    speech: Option<Vec<JsonSpeech>>,
    /// A beam search's other hypotheses, best first (absent for greedy decoding).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    alternatives: Vec<JsonAlternative<'a>>,
    timings: JsonTimings<'a>,
}

#[derive(Serialize)]
struct JsonDecoding<'a> {
    head: &'a str,
    strategy: &'a str,
    beam_size: usize,
    /// Phrases boosted (0: no boosting) and their weight.
    boosted_phrases: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    boosting_alpha: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence: Option<JsonConfidence<'a>>,
}

#[derive(Serialize)]
struct JsonConfidence<'a> {
    /// NeMo's name (`max_prob`, `entropy_tsallis_exp`, ...).
    method: &'a str,
    alpha: f64,
    /// How tokens make a word's confidence.
    aggregation: &'a str,
}

#[derive(Serialize)]
struct JsonAlternative<'a> {
    text: &'a str,
    tokens: Vec<usize>,
    score: f32,
}

#[derive(Serialize)]
struct JsonAttention {
    self_attention_model: &'static str,
    att_context_size: [i64; 2],
}

#[derive(Serialize)]
struct JsonToken<'a> {
    id: usize,
    piece: &'a str,
    start: f64,
    end: f64,
    /// Seconds, `end - start`.
    duration: f64,
    /// Encoder frame of emission.
    frame: usize,
    /// The TDT duration as predicted, in frames (0 for RNN-T and CTC).
    duration_frames: usize,
    /// NeMo's token confidence in [0, 1], when computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence: Option<f32>,
}

#[derive(Serialize)]
struct JsonSpeech {
    start: f64,
    end: f64,
}

#[derive(Serialize)]
struct JsonWord<'a> {
    word: &'a str,
    start: f64,
    end: f64,
    /// NeMo's word confidence in [0, 1], when computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    confidence: Option<f32>,
    /// `speaker_<k>`, when the audio was diarized.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_speaker"
    )]
    speaker: Option<usize>,
}

/// Stage timings as a JSON object in pipeline order (a map type would sort the keys).
struct JsonTimings<'a>(&'a [(String, f64)]);

impl Serialize for JsonTimings<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, round_ms(*v))))
    }
}

fn render_json(t: &Transcript, meta: &OutputMeta) -> String {
    let tokens = t
        .tokens
        .iter()
        .enumerate()
        .map(|(i, tok)| {
            // As the decoder times words (NeMo's token spans, within the audio).
            let (start, end) = t.token_times(i);
            JsonToken {
                id: tok.id,
                piece: t.pieces.get(i).map_or("", String::as_str),
                start: round_ms(start),
                end: round_ms(end),
                duration: round_ms(end - start),
                frame: tok.frame,
                duration_frames: tok.duration,
                confidence: t.token_confidence.as_ref().and_then(|c| c.get(i).copied()),
            }
        })
        .collect();
    let words = t
        .words
        .iter()
        .map(|w| JsonWord {
            word: &w.text,
            start: round_ms(w.start),
            end: round_ms(w.end),
            confidence: w.confidence,
            speaker: w.speaker,
        })
        .collect();
    let d = &t.decoding;
    let decoding = JsonDecoding {
        head: d.head,
        strategy: &d.strategy,
        beam_size: d.beam_size,
        boosted_phrases: d.boosted_phrases,
        boosting_alpha: (d.boosted_phrases > 0).then_some(d.boosting_alpha),
        confidence: d
            .confidence
            .as_ref()
            .map(|(method, alpha, aggregation)| JsonConfidence {
                method,
                alpha: *alpha,
                aggregation,
            }),
    };
    let alternatives = t
        .alternatives
        .iter()
        .map(|a| JsonAlternative {
            text: &a.text,
            tokens: a.tokens.iter().map(|t| t.id).collect(),
            score: a.score,
        })
        .collect();
    let out = JsonOutput {
        text: &t.text,
        model: &meta.model,
        audio: &meta.audio_path,
        duration: round_ms(meta.audio_seconds),
        attention: JsonAttention {
            self_attention_model: t.attention.nemo_name(),
            att_context_size: t.attention.context(),
        },
        decoding,
        tokens,
        words,
        segments: transcript_segments(t),
        speech: t.speech.as_ref().map(|spans| {
            spans
                .iter()
                .map(|s| JsonSpeech {
                    start: round_ms(s.start),
                    end: round_ms(s.end),
                })
                .collect()
        }),
        alternatives,
        timings: JsonTimings(&meta.timings),
    };
    // Serialising plain structs of strings and finite numbers cannot fail.
    let mut json = serde_json::to_string_pretty(&out).expect("JSON serialisation");
    json.push('\n');
    json
}

/// Whether `path` exists and is neither a regular file nor a link to be replaced: a FIFO, a
/// character or block device or a socket (a link to one counts as one).
pub fn is_special_file(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// A fresh `.parakeet-{pid}-{n}.tmp` beside the target: short, so that a target name near the
/// file system's limit still leaves room for it; `create_new` so that two writers (or a stale
/// leftover) never share one.
fn create_temp(dir: &Path) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // Held from creation to registration, so that no temp file escapes
    // `remove_unfinished_temps`.
    let mut live = live_temps();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            "{TEMP_PREFIX}{}-{n}{TEMP_SUFFIX}",
            std::process::id()
        ));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => {
                live.push(tmp.clone());
                return Ok((tmp, file));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

const TEMP_PREFIX: &str = ".parakeet-";
const TEMP_SUFFIX: &str = ".tmp";

/// The temp files of this process being written now.
fn live_temps() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    static LIVE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    // A writer that panicked left the list as it was: still the files to remove.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn forget_temp(tmp: &Path) {
    live_temps().retain(|p| p != tmp);
}

/// Removes the temp files being written now and runs `then` (the process's exit) with no new
/// one created meanwhile: for a process told to stop (SIGTERM, Ctrl-C) mid-write, so that
/// what was renamed into place is complete and nothing half-written is left behind.
pub fn remove_unfinished_temps_then<T>(then: impl FnOnce() -> T) -> T {
    let mut live = live_temps();
    for tmp in live.drain(..) {
        let _ = fs::remove_file(tmp);
    }
    let out = then();
    drop(live);
    out
}

/// Removes the temp files in `dir` that processes no longer running left behind (killed
/// mid-write, or by SIGKILL); another running writer's files stay. Returns how many went.
/// Only where the system tells which processes run (Linux, Windows); elsewhere nothing is
/// removed.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TEMP_PREFIX)?.strip_suffix(TEMP_SUFFIX))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, n)| n.parse::<u64>().is_ok())
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let running = crate::backend::process_running(pid);
        if !running
            && entry.file_type().is_ok_and(|t| t.is_file())
            && fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

fn fill_and_sync(mut file: File, contents: &[u8]) -> io::Result<()> {
    file.write_all(contents)?;
    file.sync_all()
}

/// Makes the rename itself durable. Best effort: some file systems cannot sync a directory,
/// and the file is complete either way.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(text: &str, start: f64, end: f64) -> Word {
        Word {
            text: text.to_string(),
            start,
            end,
            confidence: None,
            speaker: None,
        }
    }

    #[test]
    fn timestamps_use_the_format_separator() {
        assert_eq!(timestamp(0, ','), "00:00:00,000");
        assert_eq!(timestamp(3_723_045, '.'), "01:02:03.045");
        assert_eq!(timestamp(100 * 3_600_000, ','), "100:00:00,000");
    }

    #[test]
    fn milliseconds_round_to_nearest() {
        assert_eq!(to_ms(1.2400000000000002), 1240);
        assert_eq!(to_ms(0.0805), 81);
        assert_eq!(to_ms(-0.5), 0);
        assert_eq!(to_ms(f64::NAN), 0);
        assert_eq!(round_ms(0.1 + 0.2), 0.3);
    }

    #[test]
    fn sentence_ends_in_any_script_and_past_quotes() {
        for w in [
            "end.",
            "why?",
            "no!",
            "so…",
            "終わり。",
            "ما؟",
            "है।",
            "said.\"",
            "(yes.)",
        ] {
            assert!(ends_sentence(w), "{w}");
        }
        for w in ["hello,", "3.5", "word", "⁇", "", "\""] {
            assert!(!ends_sentence(w), "{w}");
        }
    }

    #[test]
    fn wrap_balances_two_lines() {
        let text = "one two three four five six seven eight nine ten eleven";
        let greedy = greedy_wrap(text, MAX_LINE_CHARS);
        assert_eq!(
            greedy,
            ["one two three four five six seven eight", "nine ten eleven"]
        );
        let balanced = balanced_wrap(text, MAX_LINE_CHARS);
        assert_eq!(
            balanced,
            ["one two three four five six", "seven eight nine ten eleven"]
        );
        assert_eq!(balanced_wrap("short", MAX_LINE_CHARS), ["short"]);
        assert!(balanced_wrap("", MAX_LINE_CHARS).is_empty());
    }

    #[test]
    fn wrap_keeps_an_overlong_word_whole() {
        let long = "x".repeat(50);
        assert_eq!(
            greedy_wrap(&format!("a {long} b"), 42),
            ["a", long.as_str(), "b"]
        );
    }

    #[test]
    fn words_with_inner_whitespace_stay_on_one_line() {
        let segs = segments(&[word("a\tb\nc", 0.0, 0.5)]);
        assert_eq!(segs[0].text, "a b c");
    }

    #[test]
    fn blank_words_are_skipped() {
        let segs = segments(&[word(" ", 0.0, 0.1), word("hi", 0.2, 0.3)]);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].start, 0.2);
    }

    #[test]
    fn parse_list_expands_all_and_drops_repeats() {
        assert_eq!(Format::parse_list("all").unwrap(), Format::ALL);
        assert_eq!(
            Format::parse_list("srt, VTT,srt").unwrap(),
            [Format::Srt, Format::Vtt]
        );
        assert!(Format::parse_list("docx").unwrap_err().contains("docx"));
    }
}
