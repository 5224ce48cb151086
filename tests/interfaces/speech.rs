//! `parakeet transcribe --vad` as a user runs it: the speech segments in the JSON are the
//! silero-vad package's (and `parakeet vad`'s), words and cues stay inside them, `--profile`
//! has a `vad` line, silence and empty audio give an empty transcript, and bad speech-detection
//! flags are one clear error, exit 2, nothing written.

use crate::common::{fixtures, json, nemo, run_parakeet, scratch_dir};
use crate::vad::audio;
use std::path::{Path, PathBuf};

fn run(args: &[&str], cache: &Path) -> (i32, String, String) {
    let out = run_parakeet(args, cache);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `parakeet transcribe -m tiny_tdt --vad ARGS...`
fn transcribe(args: &[&str], cache: &Path) -> (i32, String, String) {
    let model = nemo("tiny_tdt");
    let all = [
        &["transcribe", "-m", model.to_str().unwrap(), "-q"][..],
        args,
    ]
    .concat();
    run(&all, cache)
}

fn pairs(v: &serde_json::Value, a: &str, b: &str) -> Vec<(f64, f64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| (s[a].as_f64().unwrap(), s[b].as_f64().unwrap()))
        .collect()
}

/// A 16 kHz WAV with no samples at all.
pub(crate) fn zero_samples(dir: &Path) -> PathBuf {
    let path = dir.join("zero.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    hound::WavWriter::create(&path, spec)
        .unwrap()
        .finalize()
        .unwrap();
    path
}

#[test]
fn json_speech_is_the_package_s_and_words_and_cues_stay_inside() {
    let dir = scratch_dir("speech-cli", "json");
    let cache = dir.join("cache");
    let clip = audio("speech_long_silence.wav");
    let out = dir.join("out");
    let (code, _, err) = transcribe(
        &[
            "--vad",
            "-f",
            "json,srt",
            "-o",
            out.to_str().unwrap(),
            &clip,
        ],
        &cache,
    );
    assert_eq!(code, 0, "{err}");
    let v = json(&out.join("speech_long_silence.json"));
    let speech = pairs(&v["speech"], "start", "end");
    // The package's segments, in seconds to the millisecond.
    let reference = json(&fixtures().join("vad/speech_long_silence/segments.json"));
    let want: Vec<(f64, f64)> = pairs(
        &reference["segments"]["default"]["segments"],
        "start",
        "end",
    )
    .iter()
    .map(|&(s, e)| {
        let ms = |x: f64| (x / 16.0).round() / 1000.0;
        (ms(s), ms(e))
    })
    .collect();
    assert_eq!(speech, want);
    // And `parakeet vad`'s.
    let (code, vad, _) = run(&["vad", "-f", "json", &clip], &cache);
    assert_eq!(code, 0);
    let vad: serde_json::Value = serde_json::from_str(vad.trim()).unwrap();
    let ms = |x: f64| (x * 1000.0).round() / 1000.0;
    let from_vad: Vec<(f64, f64)> = pairs(&vad["segments"], "start", "end")
        .iter()
        .map(|&(s, e)| (ms(s), ms(e)))
        .collect();
    assert_eq!(speech, from_vad);

    let words = pairs(&v["words"], "start", "end");
    assert!(words.len() > 5, "{v}");
    let inside = |t: f64| speech.iter().position(|&(s, e)| s <= t && t < e);
    for &(s, _) in &words {
        assert!(inside(s).is_some(), "word at {s} outside {speech:?}");
    }
    // Every cue starts inside a speech segment and ends before the next one starts.
    let cues = pairs(&v["segments"], "start", "end");
    assert!(cues.len() >= speech.len(), "{cues:?}");
    for &(s, e) in &cues {
        let k = inside(s).unwrap_or_else(|| panic!("cue at {s} outside {speech:?}"));
        if let Some(&(next, _)) = speech.get(k + 1) {
            assert!(e <= next, "cue {s}..{e} runs into segment {}", k + 1);
        }
    }
    let srt = std::fs::read_to_string(out.join("speech_long_silence.srt")).unwrap();
    assert_eq!(srt.matches(" --> ").count(), cues.len());
    assert!(
        v["timings"]["vad"].as_f64().unwrap() > 0.0,
        "{}",
        v["timings"]
    );

    // The text on standard output is the JSON's, and --profile has a vad line.
    let (code, text, err) = transcribe(&["--vad", "--profile", &clip], &cache);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text.trim_end(), v["text"].as_str().unwrap());
    assert!(err.lines().any(|l| l.starts_with("vad ")), "{err}");
}

#[test]
fn silence_is_an_empty_transcript_and_empty_audio_an_error() {
    let dir = scratch_dir("speech-cli", "empty");
    let cache = dir.join("cache");
    let zero = zero_samples(&dir);
    let silence = audio("silence_5s.wav");
    let input = silence.as_str();
    let (code, out, err) = transcribe(&["--vad", input], &cache);
    assert_eq!((code, out.as_str()), (0, "\n"), "{input}: {err}");
    let o = dir.join("json");
    let (code, _, err) = transcribe(
        &["--vad", "-f", "json", "-o", o.to_str().unwrap(), input],
        &cache,
    );
    assert_eq!(code, 0, "{err}");
    let name = Path::new(input).with_extension("json");
    let v = json(&o.join(name.file_name().unwrap()));
    assert_eq!(v["text"], "");
    assert_eq!(v["speech"], serde_json::json!([]));
    assert_eq!(v["words"], serde_json::json!([]));
    // `parakeet vad` too: no segments, exit 0.
    let (code, out, err) = run(&["vad", zero.to_str().unwrap()], &cache);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    let (code, out, err) = run(&["vad", "-f", "json", zero.to_str().unwrap()], &cache);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (&v["segments"], &v["duration"], &v["sample_rate"]),
        (
            &serde_json::json!([]),
            &serde_json::json!(0.0),
            &serde_json::json!(16000)
        )
    );
    // Empty audio is an error to transcribe, with --vad or without (the user's: 2).
    for vad in [&[][..], &["--vad"][..]] {
        let args = [vad, &[zero.to_str().unwrap()]].concat();
        let (code, _, err) = transcribe(&args, &cache);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("no audio samples"), "{err}");
    }
}

#[test]
fn bad_speech_flags_are_one_clear_error_and_nothing_written() {
    let dir = scratch_dir("speech-cli", "bad");
    let cache = dir.join("cache");
    let corrupt = dir.join("corrupt.gguf");
    let mut bytes = std::fs::read(audio("jfk.wav")).unwrap();
    bytes.truncate(4000);
    std::fs::write(&corrupt, bytes).unwrap();
    let clip = audio("jfk.wav");
    let out = dir.join("out");
    for (args, says) in [
        (vec!["--vad", "--threshold", "1.5"], "--threshold 1.5"),
        (vec!["--vad", "--threshold", "0"], "--threshold 0"),
        (
            vec!["--vad", "--neg-threshold", "0.7"],
            "--neg-threshold 0.7: must not be above",
        ),
        (
            vec!["--vad", "--min-silence-ms", "-5"],
            "--min-silence-ms -5",
        ),
        (vec!["--vad", "--max-speech-s", "-1"], "--max-speech-s -1"),
        (
            vec!["--vad", "--vad-model", corrupt.to_str().unwrap()],
            "corrupt.gguf: not a Silero VAD model",
        ),
        (vec!["--threshold", "0.6"], "need --vad"),
        (vec!["--vad-model", corrupt.to_str().unwrap()], "--vad"),
        (vec!["--vad", "--beam", "4", "--nbest", "2"], "--nbest 2"),
    ] {
        let all = [
            &args[..],
            &["-f", "json", "-o", out.to_str().unwrap(), &clip],
        ]
        .concat();
        let (code, stdout, err) = transcribe(&all, &cache);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(!out.join("jfk.json").exists(), "{args:?}: wrote output");
    }
}
