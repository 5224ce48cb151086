//! Audio front end: decoding, resampling and NeMo-exact log-mel features.
//!
//! Fixtures (tests/fixtures/audio): the NeMo reference clips `speech_{2s,10s}.wav` with NeMo's
//! `features.npy` for a 128-mel (tiny_tdt) and an 80-mel (tiny_tdt_ctc) model, and `formats/`,
//! short files in each supported format with libsndfile's decoding of each
//! (`scripts/make_audio_fixtures.py`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use parakeet::audio::mel::{self, MelConfig};
use parakeet::audio::{self, Audio, resample};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = npy.shape().iter().map(|&d| d as usize).collect();
    (shape, npy.into_vec::<f32>().unwrap())
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

// ---------------------------------------------------------------------------------------------
// Features

/// Checkpoint front-end tensors: the window [400] and the filterbank [n_mels][257].
fn front_end(model: &str) -> (Vec<f32>, Vec<f32>, usize) {
    let nemo = parakeet::convert::read_nemo(&fixture(&format!("{model}.nemo"))).unwrap();
    let tensor = |name| {
        nemo.tensor(name)
            .unwrap_or_else(|| panic!("{model}: no {name}"))
    };
    let window = tensor("preprocessor.featurizer.window");
    let fb = tensor("preprocessor.featurizer.fb");
    assert_eq!(window.shape, [400]);
    assert_eq!(fb.shape[..1], [1]);
    assert_eq!(fb.shape[2], 257);
    (window.data.clone(), fb.data.clone(), fb.shape[1])
}

#[test]
fn features_match_nemo() {
    // The other 80-mel reference models share tiny_tdt_ctc's filterbank and features.
    for model in ["tiny_tdt", "tiny_tdt_ctc"] {
        let (window, fb, n_mels) = front_end(model);
        for clip in ["2s", "10s"] {
            let audio = audio::load_audio(&fixture(&format!("audio/speech_{clip}.wav"))).unwrap();
            assert_eq!((audio.sample_rate, audio.channels_in), (16_000, 1));

            let cfg = MelConfig::parakeet(n_mels);
            let start = Instant::now();
            let ours = mel::log_mel(&audio.samples, &window, &fb, &cfg);
            let elapsed = start.elapsed();

            let (shape, nemo) = read_npy(&fixture(&format!("audio/features_{model}_{clip}.npy")));
            let n_frames = audio.samples.len() / 160;
            assert_eq!((ours.n_mels, ours.n_frames), (n_mels, n_frames));
            // NeMo returns one extra, zeroed padding frame.
            assert_eq!(shape, [n_mels, n_frames + 1]);
            let err = (0..n_mels)
                .map(|m| {
                    let row = &nemo[m * (n_frames + 1)..(m + 1) * (n_frames + 1)];
                    assert_eq!(row[n_frames], 0.0);
                    max_abs_diff(ours.band(m), &row[..n_frames])
                })
                .fold(0.0, f32::max);
            println!(
                "{model} {clip}: {n_mels} mels x {n_frames} frames, max |ours - NeMo| = {err:.2e}, \
                 log_mel took {elapsed:.2?}"
            );
            assert!(err <= 1e-4, "{model} {clip}: max error {err:e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Fixture, sample rate, source channels, tolerance against libsndfile's decoding.
const FORMATS: &[(&str, u32, u16, f32)] = &[
    ("s16_stereo_22050_info.wav", 22_050, 2, 0.0),
    ("u8_mono_8000.wav", 8_000, 1, 0.0),
    ("s24_stereo_44100_ext.wav", 44_100, 2, 0.0),
    ("s32_mono_48000.wav", 48_000, 1, 0.0),
    ("f32_stereo_22050.wav", 22_050, 2, 0.0),
    ("f64_mono_22050.wav", 22_050, 1, 0.0),
    ("ulaw_mono_8000.wav", 8_000, 1, 0.0),
    ("alaw_mono_8000.wav", 8_000, 1, 0.0),
    ("s16_3ch_16000.wav", 16_000, 3, 0.0),
    ("s24_stereo_44100.flac", 44_100, 2, 0.0),
    ("s16_stereo_22050.aiff", 22_050, 2, 0.0),
    // Lossy codecs: two decoders of one bitstream agree to float rounding.
    ("mono_22050.mp3", 22_050, 1, 1e-5),
    ("stereo_22050.ogg", 22_050, 2, 1e-5),
];

#[test]
fn formats_match_reference_decoding() {
    for &(name, rate, channels, tolerance) in FORMATS {
        let path = fixture(&format!("audio/formats/{name}"));
        let audio = audio::load_audio(&path).unwrap_or_else(|e| panic!("{e:#}"));
        let (_, reference) = read_npy(&fixture(&format!("audio/formats/{name}.npy")));
        assert_eq!(
            (audio.sample_rate, audio.channels_in),
            (rate, channels),
            "{name}"
        );
        assert_eq!(audio.samples.len(), reference.len(), "{name}: length");
        let err = max_abs_diff(&audio.samples, &reference);
        println!(
            "{name}: {} frames, max |ours - libsndfile| = {err:.2e}",
            reference.len()
        );
        assert!(err <= tolerance, "{name}: max error {err:e}");
        let expected_duration = reference.len() as f64 / f64::from(rate);
        assert!((audio.duration_s - expected_duration).abs() < 1e-9);
    }
}

#[test]
fn wav_16bit_is_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all_values.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut writer = hound::WavWriter::create(&path, spec).unwrap();
    for v in i16::MIN..=i16::MAX {
        writer.write_sample(v).unwrap();
    }
    writer.finalize().unwrap();

    let audio = audio::load_audio(&path).unwrap();
    assert_eq!(audio.samples.len(), 65_536);
    for (v, &x) in (i16::MIN..=i16::MAX).zip(&audio.samples) {
        assert_eq!(
            x.to_bits(),
            (f32::from(v) / 32768.0).to_bits(),
            "sample {v}"
        );
    }
    // 16 kHz input goes through the resampler untouched.
    let resampled = audio::resample_to_16k(audio.clone()).unwrap();
    assert_eq!(resampled, audio.samples);
}

#[test]
fn decode_bytes_matches_decode_file() {
    for name in [
        "s24_stereo_44100.flac",
        "s16_stereo_22050_info.wav",
        "mono_22050.mp3",
    ] {
        let path = fixture(&format!("audio/formats/{name}"));
        let bytes = std::fs::read(&path).unwrap();
        // Stdin has no name: the format must be found from the content alone.
        let from_bytes = audio::decode_bytes(&bytes, "<stdin>").unwrap();
        assert_eq!(from_bytes, audio::load_audio(&path).unwrap(), "{name}");
    }
}

/// Byte offset of the size field of the `data` chunk (fixtures have it in the first 200 bytes).
fn data_size_offset(wav: &[u8]) -> usize {
    wav[..200].windows(4).position(|w| w == b"data").unwrap() + 4
}

#[test]
fn streamed_wav_with_placeholder_length_decodes_from_bytes() {
    let path = fixture("audio/speech_2s.wav");
    let expected = audio::load_audio(&path).unwrap();
    let wav = std::fs::read(&path).unwrap();
    for placeholder in [u32::MAX, 0] {
        let mut streamed = wav.clone();
        let at = data_size_offset(&streamed);
        streamed[at..at + 4].copy_from_slice(&placeholder.to_le_bytes());
        streamed[4..8].copy_from_slice(&placeholder.to_le_bytes()); // RIFF size too
        let audio = audio::decode_bytes(&streamed, "<stdin>").unwrap();
        assert_eq!(audio, expected, "data size {placeholder:#x}");
    }
}

/// Writes `bytes` as `name` in `dir` and returns the error message of decoding it.
fn decode_error(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    match audio::load_audio(&path) {
        Ok(a) => panic!(
            "{name}: decoded {} samples, expected an error",
            a.samples.len()
        ),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn bad_inputs_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let wav = std::fs::read(fixture("audio/speech_2s.wav")).unwrap();
    let flac = std::fs::read(fixture("audio/formats/s24_stereo_44100.flac")).unwrap();
    let ogg = std::fs::read(fixture("audio/formats/stereo_22050.ogg")).unwrap();
    let mp3 = std::fs::read(fixture("audio/formats/mono_22050.mp3")).unwrap();
    let header_end = data_size_offset(&wav) + 4;
    let mut zero_length = wav[..header_end].to_vec();
    zero_length[header_end - 4..].copy_from_slice(&0u32.to_le_bytes());
    let mut riff_garbage = wav[..12].to_vec();
    riff_garbage.extend((0..1000u32).map(|i| (i * 7919 % 251) as u8));

    // File name, content, what the error must say.
    let cases: &[(&str, &[u8], &str)] = &[
        ("empty.wav", b"", "empty"),
        (
            "text.txt",
            b"This is not audio.\n",
            "not a recognised audio format",
        ),
        (
            "text_named.mp3",
            b"This is not audio.\n",
            "not a recognised audio format",
        ),
        ("riff_garbage.wav", &riff_garbage, "WAV"),
        ("header_only.wav", &wav[..header_end], "truncated"),
        ("zero_length.wav", &zero_length, "no audio samples"),
        ("truncated.wav", &wav[..wav.len() / 2], "truncated"),
        ("truncated.flac", &flac[..flac.len() / 2], "truncated"),
        ("truncated.ogg", &ogg[..ogg.len() / 2], "truncated"),
        ("truncated.mp3", &mp3[..mp3.len() / 2], "truncated"),
    ];
    for (name, bytes, reason) in cases {
        let message = decode_error(dir.path(), name, bytes);
        println!("{name}: {message}");
        assert!(message.contains(name), "{name}: file not named: {message}");
        assert!(
            message.contains(reason),
            "{name}: expected {reason:?}: {message}"
        );
    }
    let missing = dir.path().join("missing.wav");
    let message = format!("{:#}", audio::load_audio(&missing).unwrap_err());
    assert!(message.contains("missing.wav"), "{message}");
    let message = format!("{:#}", audio::decode_bytes(b"", "<stdin>").unwrap_err());
    assert!(message.contains("<stdin>"), "{message}");
}

/// Deterministic xorshift, for reproducible corruption.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn corrupt_inputs_never_panic() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut names: Vec<String> = FORMATS.iter().map(|f| format!("formats/{}", f.0)).collect();
    names.push("speech_2s.wav".into());
    for name in &names {
        let bytes = std::fs::read(fixture(&format!("audio/{name}"))).unwrap();
        // Every truncation point in the headers, then a spread through the data.
        let cuts =
            (0..bytes.len().min(128)).chain((128..bytes.len()).step_by((bytes.len() / 23).max(1)));
        for cut in cuts {
            let _ = audio::decode_bytes(&bytes[..cut], name);
        }
        for _ in 0..20 {
            let mut corrupt = bytes.clone();
            for _ in 0..(bytes.len() / 100).max(4) {
                let i = xorshift(&mut rng) as usize % corrupt.len();
                corrupt[i] = xorshift(&mut rng) as u8;
            }
            let _ = audio::decode_bytes(&corrupt, name);
        }
    }
}

#[test]
fn audio_extensions_are_recognised() {
    assert!(audio::is_audio_path(Path::new("a/b/c.WAV")));
    assert!(audio::is_audio_path(Path::new("talk.flac")));
    assert!(!audio::is_audio_path(Path::new("notes.txt")));
    assert!(!audio::is_audio_path(Path::new("wav")));
    for format in FORMATS {
        assert!(audio::is_audio_path(Path::new(format.0)), "{}", format.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Resampling

fn sine(rate: u32, n: usize, freq: f64, amplitude: f64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (amplitude
                * (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate) + 0.3).sin())
                as f32
        })
        .collect()
}

#[test]
fn resampled_sines_keep_frequency_amplitude_and_phase() {
    // 44_101 Hz: reduced ratio 44101:16000, blocks of odd size unless made even.
    for rate in [
        8_000, 11_025, 22_050, 32_000, 44_100, 44_101, 48_000, 96_000,
    ] {
        for freq in [440.0, 3_000.0, 0.45 * f64::from(rate.min(16_000))] {
            let n = rate as usize; // 1 s
            let out = resample::resample(sine(rate, n, freq, 0.5), rate, 16_000).unwrap();
            assert_eq!(out.len(), 16_000, "{rate} Hz");
            // Time-aligned: output sample j is the sine at time j / 16000.
            let expected = sine(16_000, 16_000, freq, 0.5);
            let edge = 1_600; // filter ringing at the abrupt start and end of the tone
            let err = max_abs_diff(&out[edge..16_000 - edge], &expected[edge..16_000 - edge]);
            println!("{rate} Hz -> 16 kHz, {freq:.0} Hz sine: max error {err:.2e}");
            assert!(err < 1e-3, "{rate} Hz, {freq} Hz: error {err:e}");
        }
    }
}

#[test]
fn downsampling_removes_content_above_8khz() {
    for rate in [22_050, 44_100, 48_000] {
        let out =
            resample::resample(sine(rate, rate as usize, 9_000.0, 0.5), rate, 16_000).unwrap();
        let leak = out[1_600..14_400].iter().fold(0f32, |m, x| m.max(x.abs()));
        println!("{rate} Hz: 9 kHz tone leaks {leak:.2e} into 16 kHz output");
        assert!(leak < 1e-3, "{rate} Hz: aliasing {leak:e}");
    }
}

#[test]
fn resampled_length_is_rounded_ratio() {
    for (rate, n) in [
        (44_100, 12_345),
        (48_000, 2),
        (48_000, 1),
        (8_000, 7),
        (22_050, 100_003),
    ] {
        let out = resample::resample(vec![0.1; n], rate, 16_000).unwrap();
        let expected = (n as f64 * 16_000.0 / f64::from(rate)).round() as usize;
        assert_eq!(out.len(), expected, "{n} samples at {rate} Hz");
    }
    let audio = Audio {
        samples: vec![0.25; 441],
        sample_rate: 44_100,
        channels_in: 2,
        duration_s: 0.01,
    };
    assert_eq!(audio::resample_to_16k(audio).unwrap().len(), 160);
}
