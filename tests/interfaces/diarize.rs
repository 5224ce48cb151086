//! `parakeet diarize` end to end: NeMo's lines, RTTM and JSON for the tiny Sortformers, a
//! streaming model streamed, the published post-processing by name, and bad input.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

fn diarize(args: &[&str], cache: &Path) -> Output {
    run_parakeet(&[&["diarize"][..], args].concat(), cache)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn clip() -> PathBuf {
    reference("").join("speech_10s.wav")
}

/// NeMo's lines for `model` on speech_10s: `section` (offline, streaming) and parameter set,
/// in time order (NeMo lists them speaker by speaker; we list turns as they come: by start,
/// then end, then speaker).
fn nemo_lines(model: &str, section: &str, set: &str) -> Vec<String> {
    let path = fixtures().join(format!("diar/{model}_diar/speech_10s/result.json"));
    let mut lines: Vec<String> = json(&path)[section]["postprocessing"][set]["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    let key = |l: &String| {
        let f: Vec<&str> = l.split(' ').collect();
        let n = |s: &str| s.parse::<f64>().unwrap();
        (n(f[0]), n(f[1]), f[2].to_string())
    };
    lines.sort_by(|a, b| key(a).partial_cmp(&key(b)).unwrap());
    lines
}

fn lines(out: &Output) -> Vec<String> {
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn offline_model_prints_nemo_lines_with_every_parameter_choice() {
    let cache = scratch_dir("diarize", "offline");
    let model = nemo("tiny_sortformer");
    let (clip, model) = (clip(), model.to_str().unwrap().to_string());
    let clip = clip.to_str().unwrap();
    let out = diarize(&[clip, "-m", &model], &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines(&out),
        nemo_lines("tiny_sortformer", "offline", "default")
    );
    let out = diarize(&[clip, "-m", &model, "--diar-params", "callhome"], &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let callhome = "sortformer_diar_4spk-v1_callhome-part1";
    assert_eq!(
        lines(&out),
        nemo_lines("tiny_sortformer", "offline", callhome)
    );
    // The same set flag by flag.
    let flags = [
        "--onset",
        "0.53",
        "--offset",
        "0.49",
        "--pad-onset",
        "0.23",
        "--pad-offset",
        "0.01",
        "--min-duration-on",
        "0.42",
        "--min-duration-off",
        "0.34",
    ];
    let out = diarize(&[&[clip, "-m", &model][..], &flags].concat(), &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines(&out),
        nemo_lines("tiny_sortformer", "offline", callhome)
    );
}

#[test]
fn writes_rttm_and_json_files() {
    let cache = scratch_dir("diarize", "files-cache");
    let dir = scratch_dir("diarize", "files");
    let model = nemo("tiny_sortformer");
    let out = diarize(
        &[
            clip().to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "-f",
            "rttm,json",
            "--probabilities",
            "-o",
            dir.to_str().unwrap(),
        ],
        &cache,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let want = nemo_lines("tiny_sortformer", "offline", "default");
    let rttm = std::fs::read_to_string(dir.join("speech_10s.diar.rttm")).unwrap();
    let rttm: Vec<&str> = rttm.lines().collect();
    assert_eq!(rttm.len(), want.len());
    for (line, nemo) in rttm.iter().zip(&want) {
        let f: Vec<&str> = line.split(' ').collect();
        let n: Vec<&str> = nemo.split(' ').collect();
        assert_eq!(
            (f[0], f[1], f[2], f[7]),
            ("SPEAKER", "speech_10s", "1", n[2])
        );
        let (start, end): (f64, f64) = (n[0].parse().unwrap(), n[1].parse().unwrap());
        assert_eq!(f[3], n[0], "{line}");
        assert_eq!(f[4], format!("{:.3}", end - start), "{line}");
    }
    let v = json(&dir.join("speech_10s.diar.json"));
    let segs = v["segments"].as_array().unwrap();
    assert_eq!(segs.len(), want.len());
    // The JSON's turns are the lines', their times NeMo's values as written (`1.44`, never the
    // f32's widening `1.440000057220459`).
    let raw = std::fs::read_to_string(dir.join("speech_10s.diar.json")).unwrap();
    for (seg, nemo) in segs.iter().zip(&want) {
        let n: Vec<&str> = nemo.split(' ').collect();
        assert_eq!(seg["speaker"], n[2], "{nemo}");
        for (t, want) in [(&seg["start"], n[0]), (&seg["end"], n[1])] {
            assert_eq!(t.as_f64(), Some(want.parse::<f64>().unwrap()), "{nemo}");
        }
    }
    assert!(!raw.contains("00000"), "float noise in {raw}");
    assert_eq!(v["frame_shift"].as_f64().unwrap(), 0.08);
    let probs = v["probabilities"].as_array().unwrap();
    let (_, nemo) = npy(&fixtures().join("diar/tiny_sortformer_diar/speech_10s/preds.npy"));
    assert_eq!(probs.len() * 4, nemo.len());
    for (row, want) in probs.iter().zip(nemo.chunks(4)) {
        for (p, w) in row.as_array().unwrap().iter().zip(want) {
            assert!((p.as_f64().unwrap() - *w as f64).abs() < 1e-4);
        }
    }
}

#[test]
fn streaming_model_streams_with_its_sizes_as_flags() {
    let cache = scratch_dir("diarize", "stream");
    let model = nemo("tiny_sortformer_stream");
    let out = diarize(
        &[
            clip().to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "--spkcache-len",
            "24",
            "--spkcache-update-period",
            "12",
            "--fifo-len",
            "16",
        ],
        &cache,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines(&out),
        nemo_lines("tiny_sortformer_stream", "streaming", "default")
    );
    let full = diarize(
        &[
            clip().to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "--full-context",
        ],
        &cache,
    );
    assert!(full.status.success(), "{}", text(&full.stderr));
    assert_eq!(
        lines(&full),
        nemo_lines("tiny_sortformer_stream", "offline_full_context", "default")
    );
}

/// `--profile` leaves the output as it is and prints the stages, then the graph nodes by kind:
/// one fused attention node per layer, the encoder's (rel-pos) and the Transformer's (plain),
/// two of each in the tiny model.
#[test]
fn profile_shows_the_stages_and_the_attention_kernels() {
    let cache = scratch_dir("diarize", "profile");
    let model = nemo("tiny_sortformer");
    let out = diarize(
        &[
            clip().to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "--profile",
        ],
        &cache,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        lines(&out),
        nemo_lines("tiny_sortformer", "offline", "default")
    );
    let err = text(&out.stderr);
    for stage in [
        "model load",
        "features",
        "encoder",
        "transformer + head",
        "total",
    ] {
        assert!(err.lines().any(|l| l.starts_with(stage)), "{stage}: {err}");
    }
    let table = profile_node_rows(&err);
    for kind in ["rel_pos_attention", "dot_product_attention"] {
        let row: Vec<&&str> = table
            .iter()
            .filter(|l| l.ends_with(&format!("  {kind}")))
            .collect();
        assert_eq!(row.len(), 1, "{kind}: {err}");
        assert!(row[0].contains(" 2 x  "), "{kind}: {err}");
    }
}

#[test]
fn bad_input_is_one_clear_error() {
    let cache = scratch_dir("diarize", "bad");
    let dir = scratch_dir("diarize", "bad-files");
    let sortformer = nemo("tiny_sortformer");
    let sortformer = sortformer.to_str().unwrap();
    let clip = clip();
    let clip = clip.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![clip, "-m", sortformer, "--onset", "1.5"], "onset 1.5"),
        (vec![clip, "-m", sortformer, "--onset", "0"], "onset 0"),
        (
            vec![clip, "-m", sortformer, "--min-duration-on", "-0.1"],
            "min-duration-on -0.1",
        ),
        (
            vec![clip, "-m", sortformer, "--pad-onset", "-1"],
            "pad-onset -1",
        ),
        (vec![clip, "-m", sortformer, "--diar-params", "ami"], "ami"),
    ];
    for (args, says) in cases {
        let out = diarize(&args, &cache);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    // An ASR model given to diarize, a Sortformer given to transcribe.
    let asr = nemo("tiny_tdt");
    let out = diarize(&[clip, "-m", asr.to_str().unwrap()], &cache);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a Sortformer"),
        "{}",
        text(&out.stderr)
    );
    let out = run_parakeet(&["transcribe", clip, "-m", sortformer], &cache);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("diarization model"),
        "{}",
        text(&out.stderr)
    );
    // Audio too short for one frame: the user's input (2), nothing written.
    let short = dir.join("short.wav");
    write_wav(&short, &[0.1; 100]);
    let out = diarize(
        &[short.to_str().unwrap(), "-m", sortformer, "-f", "rttm"],
        &cache,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("too short"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("short.diar.rttm").exists());
    // Silence: no error.
    let silence = dir.join("silence.wav");
    write_wav(&silence, &vec![0.0; 32000]);
    let out = diarize(&[silence.to_str().unwrap(), "-m", sortformer], &cache);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

pub(crate) fn write_wav(path: &Path, samples: &[f32]) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for &s in samples {
        w.write_sample((s * 32767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}
