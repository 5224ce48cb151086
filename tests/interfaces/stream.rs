//! The `stream` front end: sources read as audio arrives, resampled to the transcriber's rate,
//! the events rendered as text or JSON lines (with the counting test double as transcriber),
//! and the command's errors on bad input.

use crate::common::*;
use crate::live_double::{CountingTranscriber, RATE};
use parakeet::stream::StreamEvent;
use parakeet::stream::input::{self, AudioSource, RawFormat, RawLayout};
use parakeet::stream::pump::{PumpOptions, pump};
use parakeet::stream::render::{EventFormat, EventWriter};
use std::io::Read;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A pipe that hands out at most `step` bytes a read and counts what it gave.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    step: usize,
    given: Arc<AtomicUsize>,
}

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        self.given.store(self.at, Ordering::SeqCst);
        Ok(n)
    }
}

fn s16le(samples: &[i16]) -> Vec<u8> {
    samples.iter().flat_map(|s| s.to_le_bytes()).collect()
}

fn raw(format: RawFormat, rate: u32, channels: u16) -> Option<RawLayout> {
    Some(RawLayout {
        format,
        rate,
        channels,
    })
}

/// Pumps `source` through the double (a word every 1600 samples), returning the events.
fn events_of(source: &mut dyn AudioSource, options: &PumpOptions) -> Vec<StreamEvent> {
    let mut transcriber = CountingTranscriber::new(1600, None);
    let mut events = Vec::new();
    pump(source, &mut transcriber, options, &mut |e| {
        events.push(e.clone());
        Ok(())
    })
    .unwrap();
    events
}

fn texts(events: &[StreamEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            StreamEvent::Partial(u) => format!("partial {}", u.text),
            StreamEvent::Final(u) => format!("final {}", u.text),
        })
        .collect()
}

#[test]
fn a_raw_pipe_is_transcribed_while_it_arrives() {
    // 1 s at 8 kHz, given 1000 bytes a read: resampled to 16 kHz, a word every 0.1 s.
    let given = Arc::new(AtomicUsize::new(0));
    let data = s16le(&vec![1000; 8000]);
    let total = data.len();
    let pipe = Trickle {
        data,
        at: 0,
        step: 1000,
        given: given.clone(),
    };
    let mut source =
        input::open_reader(pipe, "<pipe>", raw(RawFormat::S16le, 8000, 1), true).unwrap();
    let mut transcriber = CountingTranscriber::new(1600, None);
    let mut seen = Vec::new();
    let mut first_at = None;
    pump(
        source.as_mut(),
        &mut transcriber,
        &PumpOptions::default(),
        &mut |e| {
            first_at.get_or_insert(given.load(Ordering::SeqCst));
            seen.push(e.clone());
            Ok(())
        },
    )
    .unwrap();
    let words: Vec<String> = (1..=10).map(|k| format!("s{}", k * 1600)).collect();
    let mut expected: Vec<String> = (1..=10)
        .map(|k| format!("partial {}", words[..k].join(" ")))
        .collect();
    expected.push(format!("final {}", words.join(" ")));
    assert_eq!(texts(&seen), expected);
    // The first word came while most of the pipe was still unread.
    let first_at = first_at.unwrap();
    assert!(
        first_at < total / 2,
        "first event after {first_at} of {total} bytes"
    );
}

#[test]
fn events_render_as_text_or_json_lines() {
    let audio = s16le(&[0; 4800]);
    let run = |format: EventFormat, terminal: bool| {
        let mut source = input::open_reader(
            std::io::Cursor::new(audio.clone()),
            "<stdin>",
            raw(RawFormat::S16le, RATE, 1),
            true,
        )
        .unwrap();
        let mut writer = EventWriter::new(Vec::new(), format, terminal);
        let mut transcriber = CountingTranscriber::new(1600, None);
        pump(
            source.as_mut(),
            &mut transcriber,
            &PumpOptions::default(),
            &mut |e| Ok(writer.write(e)?),
        )
        .unwrap();
        writer.close().unwrap();
        String::from_utf8(writer.into_inner()).unwrap()
    };
    assert_eq!(run(EventFormat::Text, false), "s1600 s3200 s4800\n");
    assert_eq!(
        run(EventFormat::Text, true),
        "\r\x1b[2Ks1600\r\x1b[2Ks1600 s3200\r\x1b[2Ks1600 s3200 s4800\r\x1b[2Ks1600 s3200 s4800\n"
    );
    let jsonl = run(EventFormat::Jsonl, false);
    let lines: Vec<&str> = jsonl.lines().collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(
        lines[0],
        r#"{"type":"partial","text":"s1600","start":0.0,"end":0.1,"words":[{"word":"s1600","start":0.0,"end":0.1}]}"#
    );
    assert_eq!(
        lines[3],
        r#"{"type":"final","text":"s1600 s3200 s4800","start":0.0,"end":0.3,"words":[{"word":"s1600","start":0.0,"end":0.1},{"word":"s3200","start":0.1,"end":0.2},{"word":"s4800","start":0.2,"end":0.3}]}"#
    );
}

/// A WAV header for a stream of `channels` x s16 at `rate`, its lengths set to `data_len`.
fn wav_header(rate: u32, channels: u16, data_len: u32) -> Vec<u8> {
    wav_header_of(1, 16, rate, channels, data_len)
}

/// A WAV header of format tag `tag` (1 integer PCM, 3 IEEE float) with `bits` per sample.
fn wav_header_of(tag: u16, bits: u16, rate: u32, channels: u16, data_len: u32) -> Vec<u8> {
    let block = bits / 8 * channels;
    let mut h = Vec::new();
    h.extend_from_slice(b"RIFF");
    h.extend_from_slice(&data_len.wrapping_add(36).to_le_bytes());
    h.extend_from_slice(b"WAVEfmt ");
    h.extend_from_slice(&16u32.to_le_bytes());
    h.extend_from_slice(&tag.to_le_bytes());
    h.extend_from_slice(&channels.to_le_bytes());
    h.extend_from_slice(&rate.to_le_bytes());
    h.extend_from_slice(&(rate * u32::from(block)).to_le_bytes());
    h.extend_from_slice(&block.to_le_bytes());
    h.extend_from_slice(&bits.to_le_bytes());
    h.extend_from_slice(b"data");
    h.extend_from_slice(&data_len.to_le_bytes());
    h
}

/// Every sample `source` gives, to its end.
fn all_samples(source: &mut dyn AudioSource) -> Vec<f32> {
    let mut all = Vec::new();
    while let Some(piece) = source.next_piece().unwrap() {
        all.extend(piece);
    }
    all
}

#[test]
fn a_piped_wav_without_a_length_is_read_to_its_end_and_mixed_to_mono() {
    // arecord's and ffmpeg's pipes: the data length is 0 or u32::MAX. Stereo (0.5, -0.25).
    let frames = 4801;
    for placeholder in [0, u32::MAX] {
        let mut bytes = wav_header(48_000, 2, placeholder);
        bytes.extend(s16le(&[16384, -8192].repeat(frames)));
        bytes.push(0); // half a sample: the writer stopped mid-frame
        let mut source =
            input::open_reader(std::io::Cursor::new(bytes), "<stdin>", None, true).unwrap();
        assert_eq!(source.sample_rate(), 48_000);
        let mono = all_samples(source.as_mut());
        assert_eq!(mono.len(), frames, "placeholder {placeholder:#x}");
        assert!(mono.iter().all(|&s| s == 0.125));
    }
}

#[test]
fn a_wav_file_streams_like_a_pipe() {
    let dir = scratch_dir("stream", "wav-file");
    let path = dir.join("ramp.wav");
    let mut bytes = wav_header(16_000, 1, 9600);
    bytes.extend(s16le(&[0; 4800]));
    std::fs::write(&path, bytes).unwrap();
    let mut source = input::open_file(&path, None).unwrap();
    let events = events_of(source.as_mut(), &PumpOptions::default());
    assert_eq!(texts(&events).last().unwrap(), "final s1600 s3200 s4800");
}

#[test]
fn a_stream_past_max_seconds_ends_with_a_final_and_says_so() {
    let bytes = s16le(&[0; 16_000]);
    let mut source = input::open_reader(
        std::io::Cursor::new(bytes),
        "<stdin>",
        raw(RawFormat::S16le, RATE, 1),
        true,
    )
    .unwrap();
    let mut transcriber = CountingTranscriber::new(1600, None);
    let mut events = Vec::new();
    let options = PumpOptions {
        realtime: false,
        max_seconds: Some(0.25),
        stop: None,
    };
    let summary = pump(source.as_mut(), &mut transcriber, &options, &mut |e| {
        events.push(e.clone());
        Ok(())
    })
    .unwrap();
    assert!(summary.cut_at_limit);
    assert_eq!(summary.audio_seconds, 0.25);
    assert_eq!(
        texts(&events),
        [
            "partial s1600",
            "partial s1600 s3200",
            "final s1600 s3200 s4000"
        ]
    );
}

#[test]
fn realtime_paces_a_file_at_the_speakers_pace() {
    let bytes: Vec<u8> = [0.0f32; 4800]
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .collect();
    let open = || {
        input::open_reader(
            std::io::Cursor::new(bytes.clone()),
            "<stdin>",
            raw(RawFormat::F32le, RATE, 1),
            true,
        )
        .unwrap()
    };
    let start = Instant::now();
    let events = events_of(
        open().as_mut(),
        &PumpOptions {
            realtime: true,
            max_seconds: None,
            stop: None,
        },
    );
    let paced = start.elapsed().as_secs_f64();
    assert!(
        paced >= 0.28,
        "0.3 s of audio took {paced:.3} s with --realtime"
    );
    assert_eq!(events, events_of(open().as_mut(), &PumpOptions::default()));
}

fn parakeet_stdin(args: &[&str], stdin: &[u8]) -> Output {
    // A cache of its own per call: tests run in parallel threads, and a shared one was emptied
    // by one call's scratch_dir while another's conversion was renaming its file into it.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let cache = scratch_dir("stream", &format!("cache-{call}"));
    run_parakeet_stdin(args, &cache, stdin)
}

/// Runs `parakeet stream - -m tiny_tdt EXTRA...` on `stdin`; returns the exit code and stderr.
fn stream_stdin(extra: &[&str], stdin: &[u8]) -> (i32, String) {
    let model = nemo("tiny_tdt");
    let args = [&["stream", "-", "-m", model.to_str().unwrap()][..], extra].concat();
    let out = parakeet_stdin(&args, stdin);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_on_stdin_is_one_clear_error() {
    let cases: [(&[&str], Vec<u8>, &str); 7] = [
        (
            &[],
            b"hello, not audio".to_vec(),
            "<stdin>: not a WAV stream",
        ),
        (&[], Vec::new(), "<stdin>: no audio (the input is empty)"),
        // Empty headerless samples: the same rule as an empty WAV.
        (
            &["--raw", "s16le", "--rate", "16000"],
            Vec::new(),
            "<stdin>: no audio (the input is empty)",
        ),
        (
            &[],
            wav_header(0, 1, 0),
            "<stdin>: the WAV header's sample rate 0 Hz",
        ),
        (
            &[],
            b"RIFF\0\0\0\0WAVEfmt ".to_vec(),
            "<stdin>: invalid WAV header",
        ),
        (
            &["--raw", "s16le", "--rate", "0"],
            vec![0; 64],
            "<stdin>: the --rate sample rate 0 Hz",
        ),
        (&["--raw", "s16le"], vec![0; 64], "--rate"),
    ];
    for (extra, stdin, message) in cases {
        let (code, stderr) = stream_stdin(extra, &stdin);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(message), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// Boosting weights and confidence alphas outside their ranges are refused as `transcribe`
/// refuses them (the same words), before any audio is read.
#[test]
fn decoding_weights_out_of_range_are_refused_as_transcribe_refuses_them() {
    let raw = ["--raw", "s16le", "--rate", "16000"];
    for (flags, says) in [
        (
            &["--boost", "data", "--boost-alpha", "1e37"][..],
            "--boost-alpha 10000000000000000000000000000000000000: takes 0 to 10",
        ),
        (
            &["--boost", "data", "--boost-context-score", "3e38"][..],
            "--boost-context-score",
        ),
        (
            &[
                "--confidence",
                "entropy_gibbs_lin",
                "--confidence-alpha",
                "2",
            ][..],
            "--confidence-alpha 2: entropy_gibbs_lin takes",
        ),
        (
            &["--confidence", "max_prob", "--confidence-alpha", "1e6"][..],
            "--confidence-alpha 1000000: max_prob takes 0.0100 to 10.0000",
        ),
    ] {
        let (code, stderr) = stream_stdin(&[&raw[..], flags].concat(), &[0; 3200]);
        assert_eq!(code, 2, "{flags:?}: {stderr}");
        // One error (the model's one-time conversion may be reported before it).
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{flags:?}: {stderr}");
        assert!(errors[0].contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn a_cache_aware_flag_on_an_offline_model_is_refused_by_kind() {
    let (code, stderr) = stream_stdin(
        &[
            "--raw",
            "s16le",
            "--rate",
            "16000",
            "--att-context",
            "70,13",
        ],
        &[0; 3200],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("offline model"), "{stderr}");
    assert!(stderr.contains("cache-aware"), "{stderr}");
}

/// A mono f32 WAV at `rate` of a quiet ramp with `bad` at sample 5000.
fn float_wav_with(rate: u32, bad: f32) -> Vec<u8> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut bytes = std::io::Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut bytes, spec).unwrap();
    for i in 0..rate {
        let s = if i == 5000 {
            bad
        } else {
            (i % 100) as f32 / 1000.0
        };
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
    bytes.into_inner()
}

/// Pumps `source` through the double; the error, if it fails.
fn pump_error(mut source: Box<dyn AudioSource>) -> Option<String> {
    let mut transcriber = CountingTranscriber::new(1600, None);
    pump(
        source.as_mut(),
        &mut transcriber,
        &PumpOptions::default(),
        &mut |_| Ok(()),
    )
    .err()
    .map(|e| format!("{e:#}"))
}

/// NaN, inf and huge samples are refused as `transcribe` refuses them (the same message), at
/// any rate, before the resampler sees them; empty headerless input is refused as an empty WAV.
#[test]
fn corrupt_samples_and_empty_raw_input_are_refused() {
    for rate in [16_000, 22_050] {
        for (bad, shown) in [
            (f32::NAN, "is NaN"),
            (f32::INFINITY, "is inf"),
            (3.3e38, "is 3.3e38, beyond"),
        ] {
            let wav = float_wav_with(rate, bad);
            let source =
                input::open_reader(std::io::Cursor::new(wav), "bad.wav", None, true).unwrap();
            let e = pump_error(source).unwrap_or_else(|| panic!("{rate} Hz, {bad}: accepted"));
            assert!(
                e.starts_with("bad.wav: sample 5000 (at ") && e.contains(shown),
                "{rate} Hz, {bad}: {e}"
            );
            assert!(e.ends_with("the audio data is corrupt"), "{e}");
        }
    }
    let empty = input::open_reader(
        std::io::Cursor::new(Vec::new()),
        "<stdin>",
        raw(RawFormat::S16le, 16_000, 1),
        true,
    )
    .unwrap();
    assert_eq!(
        pump_error(empty).as_deref(),
        Some("<stdin>: no audio (the input is empty)")
    );
}

/// Every WAV `transcribe` decodes streams too (mu-law, A-law, 64-bit float: through the audio
/// room), from a file or a pipe, sample for sample as the audio room decodes it.
#[test]
fn wavs_hound_cannot_read_stream_through_the_audio_room() {
    for name in [
        "ulaw_mono_8000.wav",
        "alaw_mono_8000.wav",
        "f64_mono_22050.wav",
    ] {
        let path = fixtures().join("audio/formats").join(name);
        let (_, want) = npy(&path.with_extension("wav.npy"));
        let want_rate = parakeet::audio::load_audio(&path).unwrap().sample_rate;
        let from_file = input::open_file(&path, None).unwrap();
        let piped =
            input::open_reader(std::fs::File::open(&path).unwrap(), name, None, true).unwrap();
        for mut source in [from_file, piped] {
            assert_eq!(source.sample_rate(), want_rate, "{name}");
            let got = all_samples(source.as_mut());
            assert_eq!(got.len(), want.len(), "{name}");
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-6, "{name}: off by {worst}");
        }
    }
    // 96 kHz 64-bit float (an IEEE-float `fmt ` chunk hound refuses), piped: every sample as
    // written (multiples of 1/1024, exact in f32) at the file's rate.
    let want: Vec<f32> = (0..9600)
        .map(|i| ((i % 2048) as f32 - 1024.0) / 1024.0)
        .collect();
    let mut wav = wav_header_of(3, 64, 96_000, 1, want.len() as u32 * 8);
    for s in &want {
        wav.extend_from_slice(&f64::from(*s).to_le_bytes());
    }
    let mut source =
        input::open_reader(std::io::Cursor::new(wav), "f64_96k.wav", None, true).unwrap();
    assert_eq!(source.sample_rate(), 96_000);
    assert_eq!(all_samples(source.as_mut()), want);
}

/// `stream --att-context` reads lookaheads with `transcribe --att-context`'s grammar: the same
/// words for a malformed value, spaces around the numbers accepted, and a clear refusal of the
/// forms only a whole file can take (`auto`, `full`).
#[test]
fn att_context_has_one_grammar() {
    let raw = ["--raw", "s16le", "--rate", "16000"];
    let malformed = "'7O,1': expected auto, full, or L,R (e.g. 128,128)";
    for (value, message) in [
        ("7O,1", malformed),
        ("70", "'70': expected auto, full, or L,R"),
        ("0,0", "'0,0': the window must have 1 to 1048576 frames"),
        ("full", "'full': a stream takes a lookahead L,R"),
        // Read as a lookahead: the offline model then refuses it by its kind.
        (" 70 , 13 ", "offline model"),
    ] {
        let (code, stderr) =
            stream_stdin(&[&raw[..], &["--att-context", value]].concat(), &[0; 3200]);
        assert_eq!(code, 2, "{value:?}: {stderr}");
        assert!(stderr.contains(message), "{value:?}: {stderr}");
    }
    let clip = reference("").join("speech_2s.wav");
    let model = nemo("tiny_tdt");
    let out = parakeet_stdin(
        &[
            "transcribe",
            clip.to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "--att-context",
            "7O,1",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(malformed));
}

/// No input and no microphone (ALSA given an empty configuration, so no machine's sound card
/// is opened): the user's environment, one clear error, exit 2, before any model is loaded.
#[test]
fn no_microphone_is_the_users_error() {
    let dir = scratch_dir("stream", "no-mic");
    let config = dir.join("empty-alsa.conf");
    std::fs::write(&config, "").unwrap();
    let model = nemo("tiny_tdt");
    let out = parakeet_command(&["stream", "-m", model.to_str().unwrap()], &dir)
        .env("ALSA_CONFIG_PATH", &config)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].starts_with("error: no microphone: "), "{stderr}");
    assert!(
        errors[0].ends_with("give a file, or pipe audio to `-`"),
        "{stderr}"
    );
    // The model was not converted into the cache (nor loaded).
    let cached: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
}
