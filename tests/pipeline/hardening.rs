//! Hostile-but-realistic use: every case refused with one clear error naming the file
//! and the problem, or handled right, never an abort, a hang or a silently lost result.

use crate::common::rewrite::set_meta;
use crate::common::*;
use parakeet::convert::OutType;
use parakeet::gguf::{GgufFile, GgufWriter};
use parakeet::model::Model;
use parakeet::output::{self, Format};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn scratch(name: &str) -> PathBuf {
    scratch_dir("hardening", name)
}

fn parakeet(args: &[&str], cache: &Path) -> Output {
    run_parakeet(args, cache)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn nemo_text(dir: &str) -> String {
    json(&reference(dir).join("result.json"))["greedy_batch"]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

fn load_err(path: &Path) -> String {
    match Model::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// A metadata value to put in place of a key's.
enum Set<'a> {
    U32(u32),
    F32(f32),
    Str(&'a str),
    Bytes(Vec<u8>),
}

/// Copy of `src` with the metadata `overrides` applied (everything else as it was).
fn rewrite(src: &Path, dst: &Path, overrides: &[(&str, Set)]) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    let mut keys: Vec<_> = f.metadata().iter().collect();
    keys.sort_by(|a, b| a.0.cmp(b.0));
    for (k, v) in keys {
        if let Some((_, set)) = overrides.iter().find(|(key, _)| key == k) {
            match set {
                Set::U32(x) => w.set_u32(k, *x),
                Set::F32(x) => w.set_f32(k, *x),
                Set::Str(x) => w.set_str(k, x),
                Set::Bytes(x) => w.set_bytes(k, x),
            }
            .unwrap();
            continue;
        }
        set_meta(&mut w, k, v);
    }
    let mut data = Vec::new();
    for name in f.tensor_names() {
        let t = f.any_weight(name).unwrap();
        let shape = t.shape();
        let rank = shape.iter().rposition(|&v| v != 1).map_or(1, |i| i + 1);
        w.add_tensor(name, &shape[..rank], t.dtype()).unwrap();
        data.push(t.to_host_f32());
    }
    w.write(dst, |i| Ok(std::mem::take(&mut data[i]))).unwrap();
}

fn tdt() -> PathBuf {
    gguf("tiny_tdt", OutType::F32)
}

// ---------------------------------------------------------------------------------------------
// GGUF: hyperparameters range-checked at load, naming key, value and what is supported

/// A damaged text normalisation table is refused at load, naming the file; before, the model
/// loaded and tokenised boosting phrases wrongly.
#[test]
fn a_corrupt_normalisation_table_is_refused_at_load() {
    let dir = scratch("charsmap");
    let key = "parakeet.tokenizer.normalizer.precompiled_charsmap";
    let table = GgufFile::open(&tdt()).unwrap().bytes(key).unwrap();
    assert!(
        table.len() > 1000,
        "nmt_nfkc's table: {} bytes",
        table.len()
    );
    let mut cut = table.clone();
    cut.truncate(table.len() / 2);
    let mut noise = table.clone();
    let mut x = 0x9e37_79b9u32;
    for b in &mut noise[4..] {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    for (name, bytes, why) in [("cut", cut, "but the table holds"), ("noise", noise, "")] {
        let path = dir.join(format!("{name}.gguf"));
        rewrite(&tdt(), &path, &[(key, Set::Bytes(bytes))]);
        let e = load_err(&path);
        assert!(
            e.contains(&format!(
                "{}: the tokenizer's SentencePiece model",
                path.display()
            )) && e.contains("(nmt_nfkc, precompiled_charsmap) is corrupt: ")
                && e.contains(why),
            "{e}"
        );
    }
}

/// A .nemo without its SentencePiece model converts (the vocabulary is enough to transcribe),
/// and the conversion says then that boosting will be unavailable and why; the converted
/// model's boosting error is the one the warning announced.
#[test]
fn a_nemo_without_its_tokenizer_model_converts_with_a_warning() {
    let dir = scratch("no-tokenizer-model");
    let stripped = dir.join("stripped.nemo");
    let mut out = tar::Builder::new(std::fs::File::create(&stripped).unwrap());
    let mut archive = tar::Archive::new(std::fs::File::open(nemo("tiny_tdt")).unwrap());
    let mut dropped = 0;
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        if path.to_string_lossy().ends_with("tokenizer.model") {
            dropped += 1;
            continue;
        }
        let header = entry.header().clone();
        out.append_data(&mut header.clone(), &path, &mut entry)
            .unwrap();
    }
    out.finish().unwrap();
    drop(out);
    assert_eq!(dropped, 1);
    let converted = dir.join("stripped.gguf");
    let report = parakeet::convert::convert(&stripped, &converted, OutType::F32).unwrap();
    assert_eq!(
        report.warnings,
        [format!(
            "{}: the archive holds no *tokenizer.model member, so only the vocabulary is \
             stored: phrase boosting (--boost, which tokenises phrases with the SentencePiece \
             model) will be unavailable with this model",
            stripped.display()
        )]
    );
    // The whole archive converts without one.
    let whole =
        parakeet::convert::convert(&nemo("tiny_tdt"), &dir.join("whole.gguf"), OutType::F32);
    assert!(whole.unwrap().warnings.is_empty());
    // The command line prints it.
    let cli = parakeet(&["convert", s(&stripped), s(&dir.join("cli.gguf"))], &dir);
    assert!(cli.status.success(), "{}", text(&cli.stderr));
    assert!(
        text(&cli.stderr).contains("warning: ") && text(&cli.stderr).contains("phrase boosting"),
        "{}",
        text(&cli.stderr)
    );
}

#[test]
fn hyperparameters_out_of_range_are_refused_by_key_and_value() {
    let dir = scratch("hparams");
    let cases: Vec<(&str, Set, &str)> = vec![
        (
            "parakeet.encoder.n_layers",
            Set::U32(u32::MAX),
            "parakeet.encoder.n_layers = 4294967295 is not supported (1..=512)",
        ),
        (
            "parakeet.encoder.n_layers",
            Set::U32(3),
            "parakeet.encoder.n_layers = 3, but the file has weights for 2 encoder layers",
        ),
        (
            "parakeet.preprocessor.sample_rate",
            Set::U32(0),
            "parakeet.preprocessor.sample_rate = 0 is not supported (16000 only)",
        ),
        (
            "parakeet.preprocessor.sample_rate",
            Set::U32(1),
            "parakeet.preprocessor.sample_rate = 1 is not supported (16000 only)",
        ),
        (
            "parakeet.preprocessor.preemph",
            Set::F32(f32::NAN),
            "parakeet.preprocessor.preemph = NaN is not supported (0 <= preemph < 1)",
        ),
        (
            "parakeet.preprocessor.preemph",
            Set::F32(f32::INFINITY),
            "parakeet.preprocessor.preemph = inf is not supported",
        ),
        (
            "parakeet.preprocessor.log_zero_guard_value",
            Set::F32(f32::NAN),
            "parakeet.preprocessor.log_zero_guard_value = NaN is not supported (a finite value > 0)",
        ),
        (
            "parakeet.preprocessor.log_zero_guard_value",
            Set::F32(f32::NEG_INFINITY),
            "log_zero_guard_value = -inf is not supported",
        ),
        (
            "parakeet.preprocessor.normalize",
            Set::Str("all_features"),
            "parakeet.preprocessor.normalize = all_features is not supported (per_feature or NA)",
        ),
        (
            "parakeet.preprocessor.hop_length",
            Set::U32(100_000),
            "parakeet.preprocessor.hop_length = 100000 is not supported (1..=400)",
        ),
        (
            "parakeet.vocab_size",
            Set::U32(u32::MAX),
            "parakeet.vocab_size = 4294967295 is not supported",
        ),
        (
            "parakeet.decoder.pred_rnn_layers",
            Set::U32(1 << 30),
            "parakeet.decoder.pred_rnn_layers = 1073741824 is not supported (1..=16)",
        ),
        (
            "parakeet.decoding.max_symbols",
            Set::U32(0),
            "parakeet.decoding.max_symbols = 0 is not supported (1..=1000)",
        ),
    ];
    for (i, (key, set, want)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("case{i}.gguf"));
        rewrite(&tdt(), &path, &[(key, set)]);
        let e = load_err(&path);
        assert!(
            e.contains(&format!("case{i}.gguf")) && e.contains(want),
            "{key}: {e}"
        );
    }
}

#[test]
fn the_rewritten_model_still_loads() {
    // Guards the helper: a rewrite with no overrides is a good model.
    let path = scratch("identity").join("same.gguf");
    rewrite(&tdt(), &path, &[]);
    let m = Model::load(&path).unwrap();
    assert_eq!(m.hparams().encoder.n_layers, 2);
    let g = m.hparams().geometry();
    assert_eq!((g.samples_per_frame(), g.frame_seconds()), (1280, 0.08));
}

#[test]
fn gguf_defects_name_the_field_and_offset() {
    let good = std::fs::read(tdt()).unwrap();
    let dir = scratch("defects");
    let header = parakeet::gguf::header::check_header(&good).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        load_err(&p)
    };
    // Version.
    let mut b = good.clone();
    b[4..8].copy_from_slice(&7u32.to_le_bytes());
    let e = write("version.gguf", &b);
    assert!(
        e.contains("version.gguf: malformed GGUF: version at byte 4: 7"),
        "{e}"
    );
    // A tensor count that cannot fit in the file.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = write("count.gguf", &b);
    assert!(
        e.contains("tensor count at byte 8: 1099511627776 does not fit"),
        "{e}"
    );
    // The first key's length runs past the end of the file.
    let mut b = good.clone();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = write("key.gguf", &b);
    assert!(e.contains("metadata key 0 at byte 24: string of"), "{e}");
    // No tensors at all (found by the fuzzer: ggml aborted on the unaligned data section).
    let mut b = good.clone();
    b[8..16].copy_from_slice(&0u64.to_le_bytes());
    let e = write("no-tensors.gguf", &b);
    assert!(
        e.contains("no-tensors.gguf: the GGUF holds no tensors"),
        "{e}"
    );
    // Two tensor names that ggml reads as one C string (found by the fuzzer: ggml aborted when
    // the second was placed on the same tensor).
    let mut b = good.clone();
    // Strings follow their u64 length (high byte 0); the tensor infos come after the metadata,
    // so the last two such "encoder." strings are tensor names.
    let names: Vec<usize> = b[..header.data_offset as usize]
        .windows(8)
        .enumerate()
        .filter(|(i, w)| *i > 0 && b[i - 1] == 0 && *w == b"encoder.")
        .map(|(i, _)| i)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .take(2)
        .collect();
    assert_eq!(names.len(), 2, "two tensor names in the header");
    for &at in &names {
        b[at] = 0;
    }
    let e = write("nul-names.gguf", &b);
    assert!(
        e.contains("nul-names.gguf: malformed GGUF: tensor") && e.contains("NUL byte in the name"),
        "{e}"
    );
    // Tensor data cut off.
    let e = write("cut.gguf", &good[..header.data_end as usize - 100]);
    assert!(e.contains("data at byte") && e.contains("truncated"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Audio

/// A mono WAV: 16-bit PCM, or 32-bit float when `float` is set.
fn wav_bytes(rate: u32, samples: &[f32], float: bool) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: if float { 32 } else { 16 },
        sample_format: if float {
            hound::SampleFormat::Float
        } else {
            hound::SampleFormat::Int
        },
    };
    let mut cursor = std::io::Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
        for &x in samples {
            if float {
                w.write_sample(x).unwrap();
            } else {
                w.write_sample((x * 32767.0) as i16).unwrap();
            }
        }
        w.finalize().unwrap();
    }
    cursor.into_inner()
}

/// Offset of the `data` chunk's size field.
fn data_size_offset(wav: &[u8]) -> usize {
    wav.windows(4).position(|w| w == b"data").unwrap() + 4
}

#[test]
fn absurd_sample_rates_are_refused_before_decoding() {
    let dir = scratch("rates");
    let wav = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    for rate in [u32::MAX, 0x8000_3E80, 800_000, 999] {
        let mut b = wav.clone();
        b[24..28].copy_from_slice(&rate.to_le_bytes());
        let path = dir.join(format!("rate-{rate}.wav"));
        std::fs::write(&path, &b).unwrap();
        let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
        assert!(
            e.contains(&format!("rate-{rate}.wav"))
                && e.contains(&format!("sample rate {rate} Hz is outside the supported")),
            "{e}"
        );
    }
}

#[test]
fn a_nan_sample_is_a_clear_error() {
    let dir = scratch("nan");
    let mut samples = vec![0.1f32; 33_707];
    samples[20_000] = f32::NAN;
    let path = dir.join("nan.wav");
    std::fs::write(&path, wav_bytes(16_000, &samples, true)).unwrap();
    let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
    assert!(
        e.contains("nan.wav") && e.contains("sample 20000 (at 1.250 s) is NaN"),
        "{e}"
    );
    samples[20_000] = f32::INFINITY;
    std::fs::write(&path, wav_bytes(16_000, &samples, true)).unwrap();
    let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
    assert!(e.contains("is inf"), "{e}");
}

/// Found by the fuzzer (wav inputs 76909 and 17 others of seed 1): a finite float sample near
/// f32's limit in a 22.05 kHz file made the resampler's FFT produce NaN, and rubato panicked.
#[test]
fn a_huge_float_sample_is_a_clear_error() {
    let dir = scratch("huge");
    let mut samples = vec![0.1f32; 22_050];
    samples[11_025] = 3.3e38;
    let path = dir.join("huge.wav");
    std::fs::write(&path, wav_bytes(22_050, &samples, true)).unwrap();
    let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
    assert!(
        e.contains("huge.wav") && e.contains("sample 11025 (at 0.500 s) is 3.3e38, beyond +-1e6"),
        "{e}"
    );
    // Integer-scaled floats (up to 32768) are audio, not corruption.
    samples[11_025] = 32_767.0;
    std::fs::write(&path, wav_bytes(22_050, &samples, true)).unwrap();
    let audio = parakeet::audio::load_audio(&path).unwrap();
    assert!(parakeet::audio::resample_to_16k(audio).unwrap().len() > 15_000);
}

#[test]
fn streamed_wav_files_are_read_to_the_end() {
    let dir = scratch("streamed");
    let wav = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    let want = parakeet::audio::decode_bytes(&wav, "x.wav").unwrap();
    for placeholder in [0u32, u32::MAX] {
        let mut b = wav.clone();
        let at = data_size_offset(&b);
        b[at..at + 4].copy_from_slice(&placeholder.to_le_bytes());
        b[4..8].copy_from_slice(&placeholder.to_le_bytes());
        let path = dir.join(format!("streamed-{placeholder}.wav"));
        std::fs::write(&path, &b).unwrap();
        let got = parakeet::audio::load_audio(&path).unwrap();
        assert_eq!(got.samples, want.samples, "{placeholder:#x}");
    }
}

/// A FIFO at `path` fed `bytes` by a background writer.
fn fifo_with(path: &Path, bytes: Vec<u8>) -> std::thread::JoinHandle<()> {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success());
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let _ = f.write_all(&bytes);
    })
}

#[test]
fn non_seekable_paths_are_read_like_stdin() {
    let dir = scratch("fifo");
    let wav = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    let want = parakeet::audio::decode_bytes(&wav, "x.wav").unwrap();
    let fifo = dir.join("pipe.wav");
    let writer = fifo_with(&fifo, wav);
    let got = parakeet::audio::load_audio(&fifo).unwrap();
    writer.join().unwrap();
    assert_eq!(got.samples, want.samples);
    // The CLI with bash's process substitution, as a user types it.
    let model = tdt();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "'{}' transcribe <(cat '{}') -m '{}'",
            env!("CARGO_BIN_EXE_parakeet"),
            reference("").join("speech_2s.wav").display(),
            model.display()
        ))
        .env("PARAKEET_CACHE", &dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt_2s"));
}

#[test]
fn a_bad_wav_header_gives_one_message() {
    let dir = scratch("badwav");
    let mut b = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    // fmt chunk: audio format 0x1234 (no such codec).
    b[20..22].copy_from_slice(&0x1234u16.to_le_bytes());
    let path = dir.join("bad.wav");
    std::fs::write(&path, &b).unwrap();
    let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
    assert!(e.contains("bad.wav: invalid WAV header:"), "{e}");
    assert_eq!(e.matches("bad.wav").count(), 1, "{e}");
    assert!(!e.contains("not a recognised audio format"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// .nemo: the YAML config is bounded before parsing; its values are checked by key

#[test]
fn deeply_nested_yaml_is_refused_quickly() {
    let n = 100_000;
    let flow = format!("a: {}{}", "[".repeat(n), "]".repeat(n));
    let e = parakeet::convert::parse_config(&flow)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 1: a flow collection nests deeper than 64"),
        "{e}"
    );
    let seq = format!("{}x\n", "- ".repeat(n));
    let e = parakeet::convert::parse_config(&seq)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a block sequence nests deeper"), "{e}");
    let block: String = (0..1000)
        .map(|i| format!("{}k:\n", " ".repeat(i)))
        .collect();
    let e = parakeet::convert::parse_config(&block)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 514: indentation nests deeper"), "{e}");
    // A real config still parses.
    let ok = "preprocessor:\n  sample_rate: 16000\n  window: [1, [2, {a: 3}]]\n";
    assert!(parakeet::convert::parse_config(ok).is_ok());
}

#[test]
fn yaml_sample_rate_zero_is_named() {
    let archive = parakeet::convert::NemoArchive::open(&nemo("tiny_tdt")).unwrap();
    let shapes = archive
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.shape()))
        .collect();
    let mut config = archive.config().clone();
    config["preprocessor"]["sample_rate"] = serde_yaml::Value::from(0);
    let e = parakeet::convert::ModelConfig::from_yaml(
        &config,
        &shapes,
        archive.tokenizer_vocab(),
        archive.tokenizer_model(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("preprocessor.sample_rate 0 is not supported (16000 only)"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// Output names: decided before any work; a result is never silently lost

fn plan(inputs: &[(&str, Option<&str>)], out: Option<&str>) -> anyhow::Result<Vec<Vec<String>>> {
    let inputs: Vec<(&Path, Option<&Path>)> = inputs
        .iter()
        .map(|(p, r)| (Path::new(*p), r.map(Path::new)))
        .collect();
    let planned = output::plan_outputs(&inputs, out.map(Path::new), &[Format::Srt, Format::Txt])?;
    Ok(planned
        .into_iter()
        .map(|o| {
            o.into_iter()
                .map(|(_, p)| p.display().to_string())
                .collect()
        })
        .collect())
}

#[test]
fn output_names_follow_the_documented_rule() {
    // Distinct names: the audio extension is replaced.
    assert_eq!(
        plan(&[("d/a.wav", None), ("d/b.flac", None)], None).unwrap(),
        [["d/a.srt", "d/a.txt"], ["d/b.srt", "d/b.txt"]]
    );
    // a.wav and a.flac in one folder keep their audio extension; the others do not.
    assert_eq!(
        plan(
            &[
                ("d/a.wav", Some("d")),
                ("d/a.flac", Some("d")),
                ("d/c.mp3", Some("d"))
            ],
            Some("out")
        )
        .unwrap(),
        [
            ["out/a.wav.srt", "out/a.wav.txt"],
            ["out/a.flac.srt", "out/a.flac.txt"],
            ["out/c.srt", "out/c.txt"]
        ]
    );
    // Beside the inputs too, and across spellings of one folder.
    assert_eq!(
        plan(&[("d/a.wav", None), ("./d/a.flac", None)], None).unwrap(),
        [
            ["d/a.wav.srt", "d/a.wav.txt"],
            ["./d/a.flac.srt", "./d/a.flac.txt"]
        ]
    );
    // Same name from two folders into one -o: refused, naming both.
    let e = plan(&[("x/a.wav", None), ("y/a.wav", None)], Some("out"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("x/a.wav and y/a.wav would both be written to out/a.wav.srt"),
        "{e}"
    );
    let e = plan(
        &[("x/a.wav", Some("x")), ("y/a.wav", Some("y"))],
        Some("out"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("x/a.wav and y/a.wav would both be written"),
        "{e}"
    );
}

#[test]
fn colliding_outputs_get_distinct_names_end_to_end() {
    let root = scratch("collide");
    let input = root.join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::copy(reference("").join("speech_2s.wav"), input.join("a.wav")).unwrap();
    std::fs::copy(
        fixtures().join("audio/formats/s24_stereo_44100.flac"),
        input.join("a.flac"),
    )
    .unwrap();
    let model = tdt();
    // Next to the inputs.
    let out = parakeet(
        &["transcribe", s(&input), "-m", s(&model), "-f", "srt"],
        &root,
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("2 done, 0 failed"), "{err}");
    let (w, f) = (input.join("a.wav.srt"), input.join("a.flac.srt"));
    assert!(w.exists() && f.exists() && !input.join("a.srt").exists());
    assert_ne!(std::fs::read(&w).unwrap(), std::fs::read(&f).unwrap());
}

#[test]
fn same_names_from_two_folders_are_refused_before_any_work() {
    let root = scratch("refuse");
    for d in ["x", "y"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        std::fs::copy(
            reference("").join("speech_2s.wav"),
            root.join(d).join("a.wav"),
        )
        .unwrap();
    }
    let out_dir = root.join("out");
    // A model that would have to be converted first: refusal comes before that work.
    let model = nemo("tiny_tdt");
    for args in [
        vec![s(&root.join("x")), s(&root.join("y"))],
        vec![s(&root.join("x/a.wav")), s(&root.join("y/a.wav"))],
    ] {
        let out = parakeet(
            &[
                &["transcribe"][..],
                &args,
                &["-m", s(&model), "-o", s(&out_dir)],
            ]
            .concat(),
            &root,
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("would both be written to"), "{err}");
        assert!(!err.contains("converting"), "{err}");
        assert!(!out_dir.exists());
    }
}

#[test]
fn repeated_formats_are_written_once() {
    let root = scratch("formats");
    let clip = root.join("c.wav");
    std::fs::copy(reference("").join("speech_2s.wav"), &clip).unwrap();
    let model = tdt();
    let out = parakeet(
        &[
            "transcribe",
            s(&clip),
            s(&clip),
            "-m",
            s(&model),
            "-f",
            "srt,json,srt",
            "-f",
            "json",
        ],
        &root,
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Named twice, transcribed once; two formats, two files.
    assert!(err.contains("c.wav: 2.1 s of audio -> 2 file(s)"), "{err}");
    assert_eq!(err.matches("-> 2 file(s)").count(), 1, "{err}");
    assert!(root.join("c.srt").exists() && root.join("c.json").exists());
}

// ---------------------------------------------------------------------------------------------
// Command line

#[test]
fn too_many_threads_are_capped_with_a_warning() {
    let root = scratch("threads");
    let model = tdt();
    let clip = reference("").join("speech_2s.wav");
    let out = parakeet(
        &[
            "transcribe",
            s(&clip),
            "-m",
            s(&model),
            "--threads",
            "10000",
        ],
        &root,
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: --threads 10000 is more than the") && err.contains("; using "),
        "{err}"
    );
    assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt_2s"));
    let out = parakeet(
        &["transcribe", s(&clip), "-m", s(&model), "--threads", "0"],
        &root,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--threads 0: at least 1 thread"));
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let root = scratch("pipe");
    let model = tdt();
    let clip = reference("").join("speech_2s.wav");
    let mut child = Command::new(env!("CARGO_BIN_EXE_parakeet"))
        .args([
            "transcribe",
            s(&clip),
            s(&reference("").join("speech_10s.wav")),
        ])
        .args(["-m", s(&model), "-q"])
        .env("PARAKEET_CACHE", &root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -0`: the reader is gone before the first line.
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

#[test]
fn a_mistyped_model_path_is_no_such_file() {
    let root = scratch("hubid");
    let clip = reference("").join("speech_2s.wav");
    for m in ["models/tdt.gguf", "nvidia/parakeet.nemo"] {
        let out = parakeet(&["transcribe", s(&clip), "-m", m], &root);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("{m}: no such model file")), "{err}");
        assert!(!err.contains("from the hub"), "{err}");
    }
}

#[test]
fn a_nan_sample_fails_that_input_by_name() {
    let root = scratch("nan-cli");
    let mut samples = vec![0.1f32; 16_000];
    samples[5] = f32::NAN;
    let bad = root.join("bad.wav");
    std::fs::write(&bad, wav_bytes(16_000, &samples, true)).unwrap();
    let out = parakeet(&["transcribe", s(&bad), "-m", s(&tdt())], &root);
    let err = text(&out.stderr);
    // The one input given is corrupt: the user's error.
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.wav") && err.contains("sample 5"), "{err}");
}

#[test]
fn long_output_names_leave_room_for_temporary_files() {
    let root = scratch("long");
    // 251 + ".wav" = 255 bytes, the usual limit; its outputs are 255 bytes too.
    let stem = "n".repeat(251);
    let clip = root.join(format!("{stem}.wav"));
    std::fs::copy(reference("").join("speech_2s.wav"), &clip).unwrap();
    let out = parakeet(
        &[
            "transcribe",
            s(&clip),
            "-m",
            s(&tdt()),
            "-f",
            "txt,srt",
            "-o",
            s(&root.join("o")),
        ],
        &root,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(root.join("o").join(format!("{stem}.srt")).exists());
    let gguf_out = root.join(format!("{}.gguf", "g".repeat(250)));
    let out = parakeet(&["convert", s(&nemo("tiny_ctc")), s(&gguf_out)], &root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(Model::load(&gguf_out).is_ok());
}

#[test]
fn converting_onto_special_files_writes_through_them() {
    use std::os::unix::fs::FileTypeExt;
    let root = scratch("special");
    let src = nemo("tiny_ctc");
    let out = parakeet(&["convert", s(&src), "/dev/null"], &root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
    if Path::new("/dev/full").exists() {
        let out = parakeet(&["convert", s(&src), "/dev/full"], &root);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("/dev/full"));
        assert!(
            std::fs::metadata("/dev/full")
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }
    // A FIFO: the reader gets the whole GGUF, and the FIFO stays one.
    let fifo = root.join("model.gguf");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    let out = parakeet(&["convert", s(&src), s(&fifo)], &root);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let streamed = reader.join().unwrap();
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let regular = root.join("regular.gguf");
    let out = parakeet(&["convert", s(&src), s(&regular)], &root);
    assert!(out.status.success());
    assert_eq!(streamed, std::fs::read(&regular).unwrap());
}

// ---------------------------------------------------------------------------------------------
// Code shapes: typed capture handles

#[test]
fn captures_are_read_through_their_handles() {
    let mut backend = parakeet::backend::Backend::cpu(1).unwrap();
    let mut ids = Vec::new();
    let mut out = backend
        .compute(|g| {
            let a = g.input_f32(&[1.0, 2.0, 3.0], &[3]);
            let b = g.scale(a, 2.0);
            ids.push(g.capture("same-name", b));
            let c = g.scale(a, -1.0);
            ids.push(g.capture("same-name", c));
            Ok(a)
        })
        .unwrap();
    // Two captures under one label: the handles still tell them apart.
    assert_eq!(out.take(ids[1]).unwrap(), [-1.0, -2.0, -3.0]);
    assert_eq!(out.get(ids[0]).unwrap().data, [2.0, 4.0, 6.0]);
    let others = out.into_others(&[ids[1]]);
    assert_eq!(others.len(), 1);
    assert_eq!(others[0].data, [2.0, 4.0, 6.0]);
}

#[test]
fn transcripts_onto_a_device_write_through_it() {
    use std::os::unix::fs::FileTypeExt;
    output::write_atomic(Path::new("/dev/null"), b"text\n").unwrap();
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
    // A regular file is still replaced atomically, leaving no temporary file behind.
    let dir = scratch("atomic");
    let path = dir.join("t.txt");
    output::write_atomic(&path, b"one\n").unwrap();
    output::write_atomic(&path, b"two\n").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn fuzz_finds_in_wav_headers_are_errors() {
    // Found by `examples/fuzz.rs wav` (seed 1, inputs 2330 and 3042): channel counts that made
    // symphonia's header arithmetic overflow once hound had refused the header.
    let dir = scratch("fuzz-wav");
    let mut a = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    a[22..29].copy_from_slice(&[255, 255, 255, 255, 255, 255, 0]);
    a[29] = 127;
    a[935] = 0;
    let mut b = std::fs::read(fixtures().join("audio/formats/s16_3ch_16000.wav")).unwrap();
    b[22] = 181;
    for (name, bytes, channels) in [("a.wav", a, 65535), ("b.wav", b, 181)] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
        assert!(
            e.contains(&format!(
                "{name}: invalid WAV header: {channels} channels (1..=32 supported)"
            )),
            "{e}"
        );
    }
}

/// `dir/c.aiff`: the fuzzer's AIFF whose COMM chunk declares 61954 channels.
fn corrupt_aiff(dir: &Path) -> PathBuf {
    let mut b = std::fs::read(fixtures().join("audio/formats/s16_stereo_22050.aiff")).unwrap();
    b[20] = 242;
    let path = dir.join("c.aiff");
    std::fs::write(&path, b).unwrap();
    path
}

#[test]
fn fuzz_finds_in_aiff_headers_are_errors() {
    // `examples/fuzz.rs audio` (seed 1, input 26506): an AIFF COMM chunk with 61954 channels
    // overflowed symphonia's packet arithmetic (a panic in checked builds).
    let dir = scratch("fuzz-aiff");
    let path = corrupt_aiff(&dir);
    let e = format!("{:#}", parakeet::audio::load_audio(&path).unwrap_err());
    assert!(e.contains("c.aiff:"), "{e}");
}

/// The header probe that sizes the first file's compute buffer at load never panics or
/// consumes anything: a corrupt header gives no length (or a finite one), a WAV its own.
#[test]
fn the_duration_probe_survives_corrupt_headers() {
    let dir = scratch("probe");
    let path = corrupt_aiff(&dir);
    let probed = parakeet::audio::declared_seconds(&path);
    assert!(
        probed.is_none_or(|s| s.is_finite() && s >= 0.0),
        "{probed:?}"
    );
    let wav = reference("").join("speech_2s.wav");
    let samples = parakeet::audio::load_audio(&wav).unwrap().samples.len();
    assert_eq!(
        parakeet::audio::declared_seconds(&wav),
        Some(samples as f64 / 16000.0)
    );
    assert_eq!(parakeet::audio::declared_seconds(&dir), None, "a directory");
    // A batch led by the corrupt file: it fails alone, the WAV after it is transcribed.
    let out = Command::new(env!("CARGO_BIN_EXE_parakeet"))
        .args(["transcribe", path.to_str().unwrap(), wav.to_str().unwrap()])
        .args(["-m", tdt().to_str().unwrap()])
        .env("PARAKEET_CACHE", &dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains(&nemo_text("tiny_tdt_2s")),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("c.aiff"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_converted_nemo_is_named_as_given_not_as_its_cache_file() {
    // A speech recognition model given to `diarize` is refused; the refusal names the .nemo the
    // user gave, never the GGUF it was converted into in the cache.
    let root = scratch("nemo_named");
    let cache = root.join("cache");
    let src = nemo("tiny_ctc");
    let wav = reference("").join("speech_2s.wav");
    let out = parakeet(&["diarize", s(&wav), "-m", s(&src)], &cache);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        error.contains(&format!("{} is a", src.display())),
        "{error}"
    );
    assert!(
        !error.contains(s(&cache)) && !error.contains(".gguf"),
        "{error}"
    );
    let cached = std::fs::read_dir(&cache).unwrap().count();
    assert_eq!(cached, 1, "the .nemo was converted into the cache");
}
