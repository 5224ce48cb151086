//! Offline models through the live front ends (NeMo's buffered streaming): `parakeet stream`
//! on a file and a raw pipe, and the WebSocket endpoint, give NeMo's finals
//! (tests/fixtures/buffered, NeMo 3.0's BufferedRNNTPipeline / BufferedCTCPipeline); bad sizes
//! and the other kind's flags are one clear error.

use crate::common::*;
use parakeet::convert::OutType;
use parakeet::model::Model;
use parakeet::server::realtime::TranscriberFactory;
use parakeet::stream::open::{LiveOptions, open_live};
use serde_json::Value;
use std::process::Output;
use std::sync::Arc;

/// NeMo's final texts for a fixture (`<model>_buffered_<head>_<setting>`, the 10 s clip).
fn nemo_finals(name: &str) -> Vec<String> {
    let v = json_file(&fixtures().join("buffered").join(format!("{name}.json")));
    v["final"]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["text"].as_str().unwrap().trim().to_owned())
        .collect()
}

fn json_file(path: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `parakeet stream ARGS -m MODEL --format jsonl -t 1`, with `stdin` piped in when given.
pub(crate) fn stream_cmd(model: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let model = gguf(model, OutType::F32);
    let mut all = vec!["stream"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "-m",
        model.to_str().unwrap(),
        "--format",
        "jsonl",
        "-t",
        "1",
    ]);
    // A GGUF model needs no conversion: the cache stays empty.
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    match stdin {
        Some(bytes) => run_parakeet_stdin(&all, cache, bytes),
        None => run_parakeet(&all, cache),
    }
}

/// The finals of a successful `parakeet stream --format jsonl` run, and its standard error.
fn finals_of(out: &Output) -> (Vec<String>, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let finals = String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "final")
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect();
    (finals, stderr)
}

#[test]
fn an_offline_model_streams_by_buffers_with_nemos_finals() {
    let wav = fixtures().join("audio/speech_10s.wav");
    let wav = wav.to_str().unwrap();
    // NeMo's defaults, said with --verbose.
    let (finals, stderr) = finals_of(&stream_cmd("tiny_tdt", &[wav, "--verbose"], None));
    assert_eq!(finals, nemo_finals("tiny_tdt_buffered_rnnt_c4.8_l1.6_r1.6"));
    assert!(
        stderr.contains("buffered streaming") && stderr.contains("chunk 4.8 s"),
        "{stderr}"
    );
    // Other sizes, and two utterances.
    let args = [
        wav,
        "--chunk-secs",
        "1.6",
        "--left-secs",
        "1.6",
        "--right-secs",
        "1.6",
    ];
    let (finals, _) = finals_of(&stream_cmd("tiny_tdt", &args, None));
    assert_eq!(finals, nemo_finals("tiny_tdt_buffered_rnnt_c1.6_l1.6_r1.6"));
    // Phrases change the finals (the pipeline tests check them against the offline decode),
    // and --confidence puts a confidence on every word.
    let boosted = [
        &args[..],
        &[
            "--boost",
            "data",
            "--boost",
            "the cat",
            "--confidence",
            "entropy_tsallis_exp",
        ],
    ]
    .concat();
    let out = stream_cmd("tiny_tdt", &boosted, None);
    let (boosted_finals, _) = finals_of(&out);
    assert_ne!(boosted_finals, finals);
    let events = String::from_utf8(out.stdout).unwrap();
    for line in events.lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        for w in e["words"].as_array().unwrap() {
            let c = w["confidence"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&c), "{line}");
        }
    }
    // A raw pipe; a hybrid's CTC head.
    let raw = ["-", "--raw", "s16le", "--rate", "16000"];
    let (finals, _) = finals_of(&stream_cmd(
        "tiny_rnnt",
        &raw,
        Some(&crate::live_nemo::clip_s16le()),
    ));
    assert_eq!(
        finals,
        nemo_finals("tiny_rnnt_buffered_rnnt_c4.8_l1.6_r1.6")
    );
    let (finals, _) = finals_of(&stream_cmd(
        "tiny_tdt_ctc",
        &[wav, "--decoder", "ctc"],
        None,
    ));
    // To the end: NeMo's CTC decodes the last buffer's frames past the audio too.
    assert_eq!(
        finals,
        nemo_finals("tiny_tdt_ctc_buffered_ctc_c4.8_l1.6_r1.6")
    );
}

#[test]
fn info_says_how_a_model_streams() {
    let cache = scratch_dir("stream_buffered", "info");
    for (model, kind) in [
        ("tiny_tdt", "buffered streaming"),
        ("tiny_stream_rnnt", "cache-aware streaming"),
    ] {
        let path = gguf(model, OutType::F32);
        let out = run_parakeet(&["info", path.to_str().unwrap()], &cache);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        let line = stdout.lines().find(|l| l.starts_with("live:")).unwrap();
        assert!(line.contains(kind), "{model}: {line}");
    }
}

#[test]
fn bad_buffer_sizes_and_the_other_kinds_flags_are_one_clear_error() {
    let silence = vec![0u8; 3200];
    let raw = ["-", "--raw", "s16le", "--rate", "16000"];
    let cases: [(&str, &[&str], &[&str]); 9] = [
        (
            "tiny_tdt_ctc",
            &["--decoder", "ctc", "--boost", "data"],
            &["boosting in buffered streaming", "transducer"],
        ),
        (
            "tiny_stream_rnnt",
            &["--boost", "data"],
            &["cache-aware streaming model", "--boost"],
        ),
        (
            "tiny_tdt",
            &["--chunk-secs", "1.0"],
            &["--chunk-secs", "13 frames", "1.04 s"],
        ),
        ("tiny_tdt", &["--chunk-secs", "0"], &["more than 0"]),
        ("tiny_tdt", &["--left-secs", "-1.6"], &["0 or more"]),
        (
            "tiny_tdt",
            &["--right-secs", "0.1"],
            &["--right-secs", "2 frames"],
        ),
        (
            "tiny_tdt",
            &["--chunk-secs", "160"],
            &["buffer of 163.2 s", "attention"],
        ),
        (
            "tiny_tdt",
            &["--att-context", "70,13"],
            &["offline model", "--att-context", "--chunk-secs"],
        ),
        (
            "tiny_stream_rnnt",
            &["--chunk-secs", "1.6"],
            &["cache-aware streaming model", "--chunk-secs"],
        ),
    ];
    for (model, extra, messages) in cases {
        let args = [&raw[..], extra].concat();
        let out = stream_cmd(model, &args, Some(&silence));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        for m in messages {
            assert!(stderr.contains(m), "{extra:?}: {m:?} not in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn the_websocket_streams_an_offline_model_with_nemos_final() {
    let model = Arc::new(Model::load(&gguf("tiny_tdt", OutType::F32)).unwrap());
    let options = LiveOptions::defaults(&model, threads(1)).unwrap();
    let factory: TranscriberFactory = Arc::new(move || open_live(&model, &options));
    let (_, completed) = crate::realtime::transcribe_clip("tiny_tdt", factory);
    let nemo = nemo_finals("tiny_tdt_buffered_rnnt_c4.8_l1.6_r1.6");
    assert_eq!(completed, nemo.join(" "));
}

/// `parakeet serve` with an offline model streams it on its realtime endpoint by buffers: the
/// completed item is NeMo's buffered pipeline's text.
#[test]
fn parakeet_serve_streams_an_offline_model_in_realtime() {
    let model = gguf("tiny_tdt", OutType::F32);
    let server = crate::serve::Server::start_with(&model, &["--threads", "1"]);
    let (_, completed) = crate::realtime::transcribe_clip_at(server.addr.parse().unwrap());
    let nemo = nemo_finals("tiny_tdt_buffered_rnnt_c4.8_l1.6_r1.6");
    assert_eq!(completed, nemo.join(" "));
}

/// Every time of a `stream --format jsonl` run's events (utterances and words).
fn event_times(out: &Output) -> Vec<f64> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let mut times = Vec::new();
    for line in String::from_utf8(out.stdout.clone()).unwrap().lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        times.extend([&e["start"], &e["end"]].map(|t| t.as_f64().unwrap()));
        for w in e["words"].as_array().unwrap() {
            times.extend([&w["start"], &w["end"]].map(|t| t.as_f64().unwrap()));
        }
    }
    times
}

/// The 10 s clip cut or repeated to `samples` samples.
fn speech(samples: usize) -> Vec<f32> {
    let clip = clip_samples("speech_10s.wav");
    clip.iter().cycle().take(samples).copied().collect()
}

/// `stream` keeps every time inside the audio, where the last buffer's padding (decoded as
/// NeMo decodes it) and NeMo's timestamp rewriting put words after it: files of 1.0 s (speech
/// and silence), 10 s and 62.1 s, 3.12 s from standard input, on an offline model's buffered
/// streaming (transducer and CTC) and a cache-aware model.
#[test]
fn stream_times_stay_inside_the_audio() {
    let dir = scratch_dir("stream_buffered", "inside");
    let cases: [(&str, &str, Vec<f32>); 6] = [
        ("tiny_tdt", "speech_1s", speech(16000)),
        ("tiny_tdt", "silence_1s", vec![0.0; 16000]),
        ("tiny_ctc", "speech_10s", speech(160_000)),
        ("tiny_tdt", "speech_62.1s", speech(993_600)),
        ("tiny_stream_rnnt", "speech_1s", speech(16000)),
        ("tiny_stream_tdt_ctc", "speech_1s", speech(16000)),
    ];
    for (model, name, samples) in cases {
        let wav = dir.join(format!("{name}.wav"));
        crate::diarize::write_wav(&wav, &samples);
        let seconds = samples.len() as f64 / 16000.0;
        let times = event_times(&stream_cmd(model, &[wav.to_str().unwrap()], None));
        assert!(!times.is_empty(), "{model} {name}: no event");
        for t in times {
            assert!((0.0..=seconds).contains(&t), "{model} {name}: {t} s");
        }
    }
    // 3.12 s on standard input, both heads of the hybrid.
    let wav = dir.join("speech_3.12s.wav");
    crate::diarize::write_wav(&wav, &speech(49920));
    let bytes = std::fs::read(&wav).unwrap();
    for decoder in ["tdt", "ctc"] {
        let out = stream_cmd("tiny_tdt_ctc", &["-", "--decoder", decoder], Some(&bytes));
        for t in event_times(&out) {
            assert!((0.0..=3.12).contains(&t), "stdin {decoder}: {t} s");
        }
    }
}

/// Audio too short for one feature frame gets `transcribe`'s error from `stream` (the same
/// words, after the input's name), from a file and from a pipe, on both kinds of model, and no
/// event; the exit code is the user's (2), as for every bad input of `stream`.
#[test]
fn stream_refuses_audio_too_short_as_transcribe_does() {
    let dir = scratch_dir("stream_buffered", "too_short");
    let wav = dir.join("one_sample.wav");
    crate::diarize::write_wav(&wav, &[0.25]);
    let wav = wav.to_str().unwrap();
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let model = gguf("tiny_tdt", OutType::F32);
    let transcribe = run_parakeet(
        &["transcribe", wav, "-m", model.to_str().unwrap(), "-t", "1"],
        cache,
    );
    let said = String::from_utf8_lossy(&transcribe.stderr).into_owned();
    assert!(said.contains("audio too short"), "{said}");
    let reason = said
        .lines()
        .find(|l| l.contains("audio too short"))
        .unwrap()
        .split("audio too short")
        .nth(1)
        .unwrap()
        .to_owned();
    let bytes = std::fs::read(wav).unwrap();
    for model in ["tiny_tdt", "tiny_ctc", "tiny_stream_rnnt"] {
        for (name, out) in [
            (wav, stream_cmd(model, &[wav], None)),
            ("<stdin>", stream_cmd(model, &["-"], Some(&bytes))),
        ] {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{model}: {stderr}");
            assert!(
                stderr.contains(&format!("{name}: audio too short{reason}")),
                "{model}: {stderr} against transcribe's {said}"
            );
            assert!(
                out.stdout.is_empty(),
                "{model}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
}

/// The realtime endpoint: a commit of audio too short for one feature frame is an error event
/// (the connection stays usable), and the next buffer is transcribed as NeMo's pipeline does.
#[test]
fn the_websocket_refuses_a_commit_too_short_and_goes_on() {
    let model = Arc::new(Model::load(&gguf("tiny_tdt", OutType::F32)).unwrap());
    let options = LiveOptions::defaults(&model, threads(1)).unwrap();
    let factory: TranscriberFactory = Arc::new(move || open_live(&model, &options));
    let mut ws = crate::realtime::connect(crate::realtime::start_real("tiny_tdt", factory));
    crate::realtime::at_16k(&mut ws);
    crate::realtime::append(&mut ws, 1);
    crate::realtime::send(
        &mut ws,
        serde_json::json!({"type": "input_audio_buffer.commit"}),
    );
    let error = crate::realtime::until(&mut ws, "error").pop().unwrap();
    assert_eq!(
        error["error"]["code"], "input_audio_buffer_commit_empty",
        "{error}"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too short"),
        "{error}"
    );
    let (_, completed) = crate::realtime::commit_clip(&mut ws);
    let nemo = nemo_finals("tiny_tdt_buffered_rnnt_c4.8_l1.6_r1.6");
    assert_eq!(completed, nemo.join(" "));
}
