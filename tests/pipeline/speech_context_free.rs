//! `transcribe --vad` against plain `transcribe` of the same audio, token for token, on the
//! long speech files and on a recording that is half silence.
//!
//! A trained model's text depends on all of its input (per-feature normalisation over the
//! file, full self-attention), and random weights amplify that, so no model of ours can have
//! the same text with and without `--vad`. What can be shown is that our part is exact: the
//! speech segments hold the speech, and each is transcribed from exactly its samples with
//! every token put at its time in the file. So these tests use a context-free CTC model: the
//! tiny CTC model with normalisation off and the self-attention and convolution modules'
//! outputs zeroed (each conformer layer is then its feed-forward modules and norms, frame by
//! frame), so that an encoder frame depends only on the samples under the subsampling's
//! receptive field (checked first, directly). Every token of a speech segment's interior
//! (frames that see only the segment's samples) must then be the plain run's token at that
//! frame, with the same id and time; only tokens near a segment's edges may differ.
//!
//! The plain run an interior token is compared with is on the segment's frame grid: a
//! segment starts anywhere, not at a multiple of the 80 ms encoder frame, and features on
//! another grid see other samples. So the plain transcript is of the file from its first
//! sample `r` on, `r` the segment's start modulo a frame (0 to 79 ms), its times shifted by
//! `r`; for a segment on the file's own grid that is the plain transcript of the file.

use crate::common::rewrite::rewrite_gguf;
use crate::common::*;
use parakeet::convert::OutType;
use parakeet::gguf::MetaValue;
use parakeet::hparams::keys;
use parakeet::session::{DecodeOptions, DecodeRequest, DecoderChoice, Session, SpeechRequest};
use parakeet::transcript::Transcript;
use parakeet::vad::SpeechParams;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const RATE: usize = 16000;
/// Samples per encoder frame: a 10 ms hop, 8x subsampling.
const FRAME: usize = 1280;
/// How far from an encoder frame's centre (samples) its output may look: three stride-2,
/// kernel-3 convolutions reach 7 feature frames (of 160 samples) either side, a feature
/// frame's 400-sample window 200 more, and the pre-emphasis one more sample back.
const REACH: usize = 7 * 160 + 200 + 1;

/// The long files and the shorter real speech the package's VAD outputs cover.
const CLIPS: [&str; 5] = [
    "sonnet1_librivox_16k",
    "ls_1272-128104-0000",
    "librivox_sns_0870",
    "librivox_sns_0890",
    "librivox_sns_0920",
];

/// The tiny CTC model made context-free (see the module's note).
fn context_free_ctc() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dst = scratch_dir("speech_context_free", "model").join("ctc.gguf");
            let mut zeroed = Vec::new();
            rewrite_gguf(
                &gguf("tiny_ctc", OutType::F32),
                &dst,
                |key| (key == keys::NORMALIZE).then(|| MetaValue::Str("NA".into())),
                |name, values| {
                    let module = [".self_attn.linear_out.", ".conv.pointwise_conv2."];
                    if module.iter().any(|m| name.contains(m)) {
                        values.fill(0.0);
                        zeroed.push(name.to_owned());
                    }
                },
            );
            // Weight and bias of both modules' output in each of the two layers.
            assert_eq!(zeroed.len(), 8, "{zeroed:?}");
            dst
        })
        .clone()
}

fn load(name: &str) -> Vec<f32> {
    let path = fixtures().join("vad/audio").join(format!("{name}.wav"));
    let audio = parakeet::audio::load_audio(&path).unwrap();
    assert_eq!(audio.sample_rate, RATE as u32);
    audio.samples
}

/// Whether the output of encoder frame `f` of a `len`-sample segment sees only the
/// segment's samples.
fn inside(f: usize, len: usize) -> bool {
    f * FRAME >= REACH && f * FRAME + REACH <= len
}

/// Whether frame `f`'s token is the segment's alone: CTC's greedy decoding also reads the
/// frame before (a repeated label is merged).
fn interior(f: usize, len: usize) -> bool {
    f >= 1 && inside(f - 1, len) && inside(f, len)
}

/// ‖a − b‖∞ / ‖b‖∞ over frames `frames` of `[T][width]` rows `a` and the rows `shift`
/// later of `b`.
fn rows_err(a: &[f32], b: &[f32], width: usize, frames: &[usize], shift: usize) -> f64 {
    let (mut err, mut size) = (0.0f64, 0.0f64);
    for &f in frames {
        let x = &a[f * width..(f + 1) * width];
        let y = &b[(f + shift) * width..(f + shift + 1) * width];
        err = err.max(max_abs_err(x, y));
        size = y.iter().fold(size, |m, v| m.max(v.abs() as f64));
    }
    err / size
}

/// The encoder output and CTC logits of slices of the sonnet clip against the whole clip's:
/// (frames compared, worst relative error of the two).
fn slice_error(model: &Path) -> (usize, f64) {
    let samples = load("sonnet1_librivox_16k");
    let samples = &samples[..20 * RATE];
    let mut session = Session::load(model, threads(2)).unwrap();
    let whole = session.encode(&session.features(samples), false).unwrap();
    let vocab = whole.ctc_logits.as_ref().unwrap().len() / whole.frames;
    let (mut frames, mut worst) = (0, 0.0f64);
    for (start, seconds) in [(3, 3), (40, 5), (101, 2)] {
        let piece = &samples[start * FRAME..start * FRAME + seconds * RATE];
        let part = session.encode(&session.features(piece), false).unwrap();
        let fs: Vec<usize> = (0..part.frames)
            .filter(|&f| inside(f, piece.len()))
            .collect();
        assert!(
            fs.len() + 4 >= part.frames,
            "{} of {}",
            fs.len(),
            part.frames
        );
        let d = whole.d_model;
        worst = worst.max(rows_err(&part.output, &whole.output, d, &fs, start));
        let logits = |e: &parakeet::encoder::Encoded| e.ctc_logits.clone().unwrap();
        worst = worst.max(rows_err(&logits(&part), &logits(&whole), vocab, &fs, start));
        frames += fs.len();
    }
    (frames, worst)
}

#[test]
fn the_context_free_model_sees_only_its_receptive_field() {
    let (frames, err) = slice_error(&context_free_ctc());
    println!("context-free: {frames} frames, worst relative error {err:.2e}");
    assert!(
        frames >= 100 && err < 1e-5,
        "{frames} frames, error {err:.3e}"
    );
    // The tiny model itself sees the whole input: the check can fail.
    let (_, err) = slice_error(&gguf("tiny_ctc", OutType::F32));
    println!("tiny_ctc: worst relative error {err:.2e}");
    assert!(
        err > 1e-2,
        "the tiny CTC model should see beyond its frame: {err:.3e}"
    );
}

/// A token: encoder frame in a plain run's grid, id, start and end in seconds of the file.
type Timed = (usize, usize, f64, f64);

/// Tokens of the speech segment `[s, e)` (samples) of the `--vad` run `vad` and of the plain
/// run on its grid, those whose frames see only the segment's samples; `tokens` are the
/// segment's indices in `vad`, each `(id, start s, end s, frame)`, and `plain` the plain
/// run's of the file from sample `s % FRAME` on.
fn interior_tokens(
    (s, e): (usize, usize),
    vad: impl Iterator<Item = (usize, f64, f64, usize)>,
    plain: impl Iterator<Item = (usize, f64, f64, usize)>,
) -> (Vec<Timed>, Vec<Timed>) {
    let (r, m, len) = (s % FRAME, s / FRAME, e - s);
    let shift = r as f64 / RATE as f64;
    let ours = vad
        .filter(|t| interior(t.3, len))
        .map(|(id, a, b, f)| (f + m, id, a, b))
        .collect();
    let theirs = plain
        .filter(|t| t.3 >= m && interior(t.3 - m, len))
        .map(|(id, a, b, f)| (f, id, a + shift, b + shift))
        .collect();
    (ours, theirs)
}

/// Asserts the two token lists equal (frames and ids; times within `tol` seconds).
fn assert_same(ours: &[Timed], theirs: &[Timed], tol: f64, what: &str) {
    let ids = |v: &[Timed]| v.iter().map(|t| (t.0, t.1)).collect::<Vec<_>>();
    assert_eq!(
        ids(ours),
        ids(theirs),
        "{what}: (frame, id) of interior tokens"
    );
    for (a, b) in ours.iter().zip(theirs) {
        assert!(
            (a.2 - b.2).abs() <= tol && (a.3 - b.3).abs() <= tol,
            "{what}: token {a:?} with --vad, {b:?} without"
        );
    }
}

fn transcript_tokens(
    t: &Transcript,
    range: std::ops::Range<usize>,
) -> Vec<(usize, f64, f64, usize)> {
    range
        .map(|i| {
            let (a, b) = t.token_times(i);
            (t.tokens[i].id, a, b, t.tokens[i].frame)
        })
        .collect()
}

/// The samples of `samples` with `extra` samples of quiet noise (about -60 dBFS, 16-bit
/// values) inserted in the middle of each pause between the package's speech `segments`:
/// as much inserted silence as audio, no word cut.
fn half_silence(samples: &[f32], segments: &[(usize, usize)]) -> Vec<f32> {
    let cuts: Vec<usize> = segments.windows(2).map(|w| (w[0].1 + w[1].0) / 2).collect();
    let extra = samples.len() / cuts.len();
    let mut noise = Lcg::new(7);
    let mut out = Vec::with_capacity(samples.len() + extra * cuts.len());
    let mut prev = 0;
    for c in cuts {
        out.extend_from_slice(&samples[prev..c]);
        out.extend((0..extra).map(|_| (noise.next() * 32.0).round() / 32768.0));
        prev = c;
    }
    out.extend_from_slice(&samples[prev..]);
    out
}

/// The package's speech segments of `clip` with its default parameters (samples).
fn package_segments(clip: &str) -> Vec<(usize, usize)> {
    let v = json(&fixtures().join("vad").join(clip).join("segments.json"));
    v["segments"]["default"]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let at = |k: &str| s[k].as_u64().unwrap() as usize;
            (at("start"), at("end"))
        })
        .collect()
}

/// Compares `transcribe` with speech detection on `samples` with plain transcripts on each
/// segment's grid: (tokens compared, tokens with --vad).
fn compare(session: &mut Session, samples: &[f32], name: &str) -> (usize, usize) {
    let request = DecodeRequest::with_decoder(DecoderChoice::Ctc);
    let plain_opts = DecodeOptions::new(session.model(), &request).unwrap();
    let speech = DecodeRequest {
        speech: Some(SpeechRequest {
            params: SpeechParams::default(),
            model: None,
        }),
        ..request
    };
    let vad_opts = DecodeOptions::new(session.model(), &speech).unwrap();
    let vad = session.transcribe(samples.to_vec(), &vad_opts).unwrap();
    let spans = vad.speech.clone().unwrap();
    assert!(!spans.is_empty(), "{name}: no speech");
    let mut plain: HashMap<usize, Transcript> = HashMap::new();
    let mut compared = 0;
    for (k, span) in spans.iter().enumerate() {
        let at = |x: f64| (x * RATE as f64).round() as usize;
        let (s, e) = (at(span.start), at(span.end));
        let p = plain.entry(s % FRAME).or_insert_with(|| {
            let from = samples[s % FRAME..].to_vec();
            session.transcribe(from, &plain_opts).unwrap()
        });
        let next = spans.get(k + 1).map_or(vad.tokens.len(), |n| n.first_token);
        let (ours, theirs) = interior_tokens(
            (s, e),
            transcript_tokens(&vad, span.first_token..next).into_iter(),
            transcript_tokens(p, 0..p.tokens.len()).into_iter(),
        );
        assert_same(&ours, &theirs, 1e-9, &format!("{name} segment {k}"));
        compared += ours.len();
    }
    println!(
        "{name}: {} speech segments, {compared} of {} tokens compared, {} plain runs",
        spans.len(),
        vad.tokens.len(),
        plain.len()
    );
    (compared, vad.tokens.len())
}

#[test]
fn vad_tokens_are_the_plain_run_s_on_the_long_files() {
    let mut session = Session::load(&context_free_ctc(), threads(2)).unwrap();
    let (mut compared, mut all) = (0, 0);
    for clip in CLIPS {
        let (c, a) = compare(&mut session, &load(clip), clip);
        (compared, all) = (compared + c, all + a);
    }
    println!("all: {compared} of {all} tokens compared");
    // Most tokens lie away from the segments' edges.
    assert!(
        compared >= 250 && 2 * compared >= all,
        "{compared} of {all}"
    );
}

/// `samples` as a 16-bit WAV file (they are 16-bit values: written exactly).
fn write_wav(path: &Path, samples: &[f32]) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: RATE as u32,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &x in samples {
        let v = x * 32768.0;
        assert_eq!(v, v.round(), "not a 16-bit sample: {x}");
        w.write_sample(v as i16).unwrap();
    }
    w.finalize().unwrap();
}

/// `parakeet ARGS` (expected to succeed) and its JSON output: standard output, or with
/// `input`, the `.json` file written beside it.
fn run_json(args: &[&str], cache: &Path, input: Option<&Path>) -> serde_json::Value {
    let out = run_parakeet(args, cache);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "parakeet {args:?}: {err}");
    let bytes = match input {
        Some(path) => std::fs::read(path.with_extension("json")).unwrap(),
        None => out.stdout,
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} of {v}"))
}

/// The JSON output's tokens as `(id, start, end, frame)`.
fn json_tokens(v: &serde_json::Value) -> Vec<(usize, f64, f64, usize)> {
    let at = |t: &serde_json::Value, k: &str| t[k].as_u64().unwrap() as usize;
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (at(t, "id"), num(t, "start"), num(t, "end"), at(t, "frame")))
        .collect()
}

/// The JSON output's words `(word, start, end)` that start in `[lo, hi]` seconds and end
/// before another word starts in it: words whose tokens all lie in the window.
fn words_within(v: &serde_json::Value, lo: f64, hi: f64, shift: f64) -> Vec<(String, f64, f64)> {
    let words: Vec<(String, f64, f64)> = v["words"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let text = w["word"].as_str().unwrap().to_owned();
            (text, num(w, "start") + shift, num(w, "end") + shift)
        })
        .collect();
    let inside = |t: f64| t >= lo - 5e-4 && t <= hi + 5e-4;
    words
        .windows(2)
        .filter(|w| inside(w[0].1) && inside(w[1].1))
        .map(|w| w[0].clone())
        .collect()
}

#[test]
fn the_cli_json_tokens_and_words_are_the_plain_run_s() {
    let dir = scratch_dir("speech_context_free", "cli");
    let clip = "sonnet1_librivox_16k";
    let samples = half_silence(&load(clip), &package_segments(clip));
    let wav = dir.join("half_silence.wav");
    write_wav(&wav, &samples);
    let model = context_free_ctc();
    let (model, file) = (model.to_str().unwrap(), wav.to_str().unwrap());
    let segments: Vec<(usize, usize)> =
        run_json(&["vad", "-f", "json", file], &dir, None)["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    num(s, "start_sample") as usize,
                    num(s, "end_sample") as usize,
                )
            })
            .collect();
    let args = ["transcribe", "-m", model, "-f", "json", "--vad", file];
    let vad = run_json(&args, &dir, Some(&wav));
    let ms = |x: usize| (x as f64 / RATE as f64 * 1000.0).round() / 1000.0;
    let speech: Vec<(f64, f64)> = vad["speech"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (num(s, "start"), num(s, "end")))
        .collect();
    let want: Vec<(f64, f64)> = segments.iter().map(|&(s, e)| (ms(s), ms(e))).collect();
    assert_eq!(
        speech, want,
        "transcribe --vad's speech against parakeet vad's"
    );

    let tokens = json_tokens(&vad);
    let mut plain: HashMap<usize, serde_json::Value> = HashMap::new();
    let (mut compared, mut words) = (0, 0);
    for (k, &(s, e)) in segments.iter().enumerate() {
        let r = s % FRAME;
        let p = plain.entry(r).or_insert_with(|| {
            let path = dir.join(format!("from_{r}.wav"));
            write_wav(&path, &samples[r..]);
            let args = [
                "transcribe",
                "-m",
                model,
                "-f",
                "json",
                path.to_str().unwrap(),
            ];
            run_json(&args, &dir, Some(&path))
        });
        // The segment's tokens: those starting inside it.
        let (a, b) = speech[k];
        let mine = tokens.iter().copied().filter(|t| t.1 >= a && t.1 < b);
        let (ours, theirs) = interior_tokens((s, e), mine, json_tokens(p).into_iter());
        // Times are whole milliseconds in JSON.
        assert_same(&ours, &theirs, 1.001e-3, &format!("JSON segment {k}"));
        compared += ours.len();
        let Some((first, last)) = ours.first().zip(ours.last()) else {
            continue;
        };
        let (lo, hi) = (first.2, last.2);
        let shift = r as f64 / RATE as f64;
        let mine = words_within(&vad, lo, hi, 0.0);
        let theirs = words_within(p, lo, hi, shift);
        assert_eq!(
            mine.len(),
            theirs.len(),
            "segment {k}: {mine:?} vs {theirs:?}"
        );
        for (w, x) in mine.iter().zip(&theirs) {
            assert!(
                w.0 == x.0 && (w.1 - x.1).abs() < 1.001e-3 && (w.2 - x.2).abs() < 1.001e-3,
                "segment {k}: {w:?} with --vad, {x:?} without"
            );
        }
        words += mine.len();
    }
    // Each cue lies in one speech segment, starting inside it.
    for cue in vad["segments"].as_array().unwrap() {
        let (a, b) = (num(cue, "start"), num(cue, "end"));
        let span = speech.iter().find(|s| a >= s.0 && a < s.1);
        let (_, end) = span.unwrap_or_else(|| panic!("cue {cue} outside the speech"));
        assert!(
            b <= end + 0.08 + 1e-3,
            "cue {cue} past its segment's end {end}"
        );
    }
    println!(
        "JSON: {} speech segments, {compared} of {} tokens and {words} of {} words compared, {} plain runs",
        segments.len(),
        tokens.len(),
        vad["words"].as_array().unwrap().len(),
        plain.len()
    );
    assert!(
        compared >= 150 && words >= 20,
        "{compared} tokens, {words} words"
    );
}

#[test]
fn the_half_silence_recording_keeps_all_the_speech() {
    // The speech segments of the half-silence recording, taken back to the clip's time, are
    // the package's segments of the clip: inserting silence loses no speech.
    let clip = "sonnet1_librivox_16k";
    let samples = load(clip);
    let package = package_segments(clip);
    let half = half_silence(&samples, &package);
    let extra = samples.len() / (package.len() - 1);
    let model = parakeet::vad::VadModel::load(None).unwrap();
    let mut vad = parakeet::vad::Vad::new(model, threads(2)).unwrap();
    let rate = parakeet::vad::SampleRate::from_hz(RATE as u32).unwrap();
    let probs = vad.probabilities(&half, rate).unwrap();
    let params = SpeechParams::default();
    let found =
        parakeet::vad::speech_segments(&probs, half.len(), RATE as u32, rate.window(), &params);
    let back: Vec<(usize, usize)> = found
        .iter()
        .enumerate()
        .map(|(i, s)| (s.start - i * extra, s.end - i * extra))
        .collect();
    assert_eq!(back.len(), package.len(), "{back:?}\n{package:?}");
    // The VAD's 512-sample windows fall elsewhere in the speech (the inserted silence is no
    // whole number of windows): each end within one window.
    for (k, (a, b)) in back.iter().zip(&package).enumerate() {
        let off = |x: usize, y: usize| x.abs_diff(y);
        assert!(
            off(a.0, b.0) <= 512 && off(a.1, b.1) <= 512,
            "segment {k}: {a:?} in the half-silence recording, {b:?} in the clip"
        );
    }
}
