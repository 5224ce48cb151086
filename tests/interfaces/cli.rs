//! The `parakeet` binary end to end: single files, batches with bad inputs, exit codes, outputs.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    scratch_dir("cli", name)
}

fn parakeet(args: &[&str], cache: &Path) -> Output {
    run_parakeet(args, cache)
}

/// `parakeet transcribe INPUT -m MODEL EXTRA...`
fn transcribe(input: &Path, model: &Path, extra: &[&str], cache: &Path) -> Output {
    let args = [
        &[
            "transcribe",
            input.to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
        ][..],
        extra,
    ]
    .concat();
    parakeet(&args, cache)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn nemo_text(dir: &str) -> String {
    json(&reference(dir).join("result.json"))["greedy_batch"]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn transcribes_a_clip_like_nemo_from_a_nemo_file() {
    let cache = scratch("cache-single");
    let clip = reference("").join("speech_10s.wav");
    let model = nemo("tiny_tdt");
    let out = transcribe(&clip, &model, &[], &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt"));
    // The .nemo was converted once into the cache and is reused.
    let cached: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(cached.len(), 1);
    let again = transcribe(&clip, &model, &[], &cache);
    assert_eq!(text(&again.stdout), text(&out.stdout));
    assert!(
        !text(&again.stderr).contains("converting"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn batch_goes_on_past_bad_files_and_reports_them() {
    let root = scratch("batch");
    let input = root.join("in");
    std::fs::create_dir_all(input.join("sub")).unwrap();
    std::fs::copy(reference("").join("speech_2s.wav"), input.join("good.wav")).unwrap();
    std::fs::copy(
        reference("").join("speech_10s.wav"),
        input.join("sub/long.wav"),
    )
    .unwrap();
    std::fs::write(input.join("empty.wav"), b"").unwrap();
    std::fs::write(
        input.join("garbage.flac"),
        b"fLaC but then nothing sensible at all",
    )
    .unwrap();
    let wav = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    std::fs::write(input.join("cut.wav"), &wav[..30]).unwrap();
    std::fs::write(input.join("notes.txt"), b"not audio").unwrap();
    let out_dir = root.join("out");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let args = [
        "transcribe",
        input.to_str().unwrap(),
        "-m",
        model.to_str().unwrap(),
        "-f",
        "txt,json,srt,vtt",
        "-o",
        out_dir.to_str().unwrap(),
    ];
    let out = parakeet(&args, &root);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for bad in ["empty.wav", "garbage.flac", "cut.wav"] {
        assert_eq!(
            err.lines()
                .filter(|l| l.starts_with("error:") && l.contains(bad))
                .count(),
            1,
            "{bad}: {err}"
        );
    }
    assert!(err.contains("2 done, 3 failed"), "{err}");
    assert!(err.contains("1 non-audio"), "{err}");
    // Outputs mirror the input tree; the good files' text is NeMo's.
    let long = std::fs::read_to_string(out_dir.join("sub/long.txt")).unwrap();
    assert_eq!(long.trim_end(), nemo_text("tiny_tdt"));
    let short = std::fs::read_to_string(out_dir.join("good.txt")).unwrap();
    assert_eq!(short.trim_end(), nemo_text("tiny_tdt_2s"));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("sub/long.json")).unwrap())
            .unwrap();
    assert_eq!(j["text"].as_str().unwrap(), nemo_text("tiny_tdt"));
    assert!(out_dir.join("good.srt").exists() && out_dir.join("good.vtt").exists());
    assert!(
        !out_dir.join("empty.txt").exists(),
        "no output for a failed input"
    );

    // Resume: everything done is skipped, failures are retried (and fail again).
    let again = parakeet(&[&args[..], &["--skip-existing"]].concat(), &root);
    assert!(
        text(&again.stderr).contains("0 done, 3 failed, 2 skipped"),
        "{}",
        text(&again.stderr)
    );
}

#[test]
fn model_errors_exit_2_with_one_line() {
    let root = scratch("model-errors");
    let garbage = root.join("model.gguf");
    std::fs::write(&garbage, b"nope").unwrap();
    let clip = reference("").join("speech_2s.wav");
    let out = transcribe(&clip, &garbage, &[], &root);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error:") && err.contains("model.gguf"),
        "{err}"
    );
    // A usage error is 2 as well.
    let out = parakeet(&["transcribe"], &root);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn ctc_head_of_a_hybrid_and_info() {
    let root = scratch("ctc");
    let model = gguf("tiny_tdt_ctc", parakeet::convert::OutType::F32);
    let clip = reference("").join("speech_10s.wav");
    let out = parakeet(
        &[
            "transcribe",
            clip.to_str().unwrap(),
            "-m",
            model.to_str().unwrap(),
            "--decoder",
            "ctc",
        ],
        &root,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let nemo = json(&reference("tiny_tdt_ctc").join("result.json"))["ctc"]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(text(&out.stdout).trim_end(), nemo);
    let info = parakeet(&["info", model.to_str().unwrap()], &root);
    let s = text(&info.stdout);
    assert!(
        s.contains("tdt_ctc") && s.contains("80 mels") && s.contains("48 pieces"),
        "{s}"
    );
}

/// `info` shows the storage of each type, the int8 kernel's repacked layout included.
#[test]
fn info_shows_quantized_layouts() {
    let root = scratch("info-q");
    // 2 layers x (4 ff + 5 attention + 2 pointwise) encoder matrices, pre_encode.out, joint.enc,
    // the 2-layer LSTM's 4 matrices and joint.pred are repacked; joint_net.2 (48 + 1 + 5 rows)
    // stays on ggml's layout.
    for (ty, other, repacked, plain) in [
        (parakeet::convert::OutType::Q8_0, "q4_0", "q8_0x8", "q8_0 "),
        (parakeet::convert::OutType::Q4_0, "q8_0", "q4_0x8", "q4_0 "),
    ] {
        let model = gguf("tiny_tdt", ty);
        let s = text(&parakeet(&["info", model.to_str().unwrap()], &root).stdout);
        let line = |ty: &str| s.lines().find(|l| l.trim_start().starts_with(ty));
        assert!(!s.contains(other), "{s}");
        assert!(
            line(repacked).is_some_and(|l| l.contains(" 29 tensors")),
            "{s}"
        );
        assert!(line(plain).is_some_and(|l| l.contains(" 1 tensors")), "{s}");
    }
}

/// `info --system`: the build's baseline, and ggml compiled for that baseline and no more (a
/// portable binary: ggml's CPU code must not use an extension the baseline lacks, or the binary
/// dies of SIGILL on older CPUs).
#[test]
fn system_info_shows_the_baseline_and_ggml_built_for_it() {
    let root = scratch("info-system");
    let out = parakeet(&["info", "--system"], &root);
    assert!(out.status.success(), "{out:?}");
    let s = text(&out.stdout);
    let field = |key: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {s}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (baseline, ggml) = (field("baseline:"), field("ggml cpu:"));
    #[cfg(target_arch = "x86_64")]
    for (ours, theirs) in [
        ("sse3", "SSE3"),
        ("ssse3", "SSSE3"),
        ("avx", "AVX"),
        ("avx2", "AVX2"),
    ] {
        assert_eq!(
            baseline.iter().any(|f| f == ours),
            ggml.iter().any(|f| f == theirs),
            "{ours} in the baseline and {theirs} in ggml differ:\n{s}"
        );
    }
    // Every baseline extension is on this CPU (the test runs) and ours are named.
    assert!(
        baseline.iter().all(|f| field("cpu has:").contains(f)),
        "{s}"
    );
    assert!(s.contains("best int8:") && s.contains("portable"), "{s}");
    // A model and --system are exclusive; neither is a usage error.
    for args in [&["info", "--system", "m.gguf"][..], &["info"][..]] {
        assert_eq!(parakeet(args, &root).status.code(), Some(2), "{args:?}");
    }
}

/// libgomp starts once (the program does not run itself again) with the bounded barrier spin
/// count, unless the user chose a spin count or a wait policy; libgomp itself reports what it
/// read (`OMP_DISPLAY_ENV=verbose`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn openmp_spinning_is_bounded_in_one_start() {
    let spin_count = |env: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_parakeet"));
        command
            .arg("--version")
            .env("OMP_DISPLAY_ENV", "verbose")
            .env_remove("GOMP_SPINCOUNT")
            .env_remove("OMP_WAIT_POLICY")
            .env_remove("OMP_WAIT_POLICY_ALL")
            .envs(env.iter().copied());
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let err = text(&out.stderr);
        assert_eq!(
            err.matches("OPENMP DISPLAY ENVIRONMENT BEGIN").count(),
            1,
            "{env:?}: libgomp started more than once:\n{err}"
        );
        err.lines()
            .find_map(|l| l.trim().strip_prefix("GOMP_SPINCOUNT = "))
            .unwrap_or_else(|| panic!("{env:?}: no spin count in\n{err}"))
            .trim_matches('\'')
            .to_owned()
    };
    assert_eq!(
        spin_count(&[]),
        parakeet::backend::openmp::SPIN_COUNT,
        "the default"
    );
    assert_eq!(spin_count(&[("GOMP_SPINCOUNT", "1000")]), "1000");
    // libgomp's own rule for a passive policy: no spinning.
    assert_eq!(spin_count(&[("OMP_WAIT_POLICY", "passive")]), "0");
}

#[test]
fn stdin_and_unreadable_entries() {
    let root = scratch("stdin");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    // WAV on standard input.
    let wav = std::fs::read(reference("").join("speech_2s.wav")).unwrap();
    let piped = |args: &[&str], input: &[u8]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_parakeet"))
            .args(args)
            .env("GGML_NO_BACKTRACE", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input).unwrap();
        }
        child.wait_with_output().unwrap()
    };
    let out = piped(&["transcribe", "-", "-m", model.to_str().unwrap()], &wav);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt_2s"));

    // With -o, standard input's outputs are named `stdin` there, as the README says.
    let out_dir = root.join("from-stdin");
    let m = model.to_str().unwrap();
    let o = out_dir.to_str().unwrap();
    let out = piped(&["transcribe", "-", "-m", m, "-q", "-o", o], &wav);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(out_dir.join("stdin.txt")).unwrap();
    assert_eq!(written.trim_end(), nemo_text("tiny_tdt_2s"));
    assert!(!out_dir.join("-.txt").exists());
    // Empty standard input fails as an input, like an empty file: the user's (2).
    let out = piped(&["transcribe", "-", "-m", m, "-q"], b"");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("<stdin>"),
        "{}",
        text(&out.stderr)
    );

    // A dangling link in a directory (root reads everything, so a broken link is the entry
    // that cannot be read) fails on its own; the good file is still transcribed.
    let dir = root.join("in");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(reference("").join("speech_2s.wav"), dir.join("a.wav")).unwrap();
    std::os::unix::fs::symlink(root.join("missing.wav"), dir.join("b.wav")).unwrap();
    let out = transcribe(&dir, &model, &[], &root);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("b.wav") && err.contains("1 done, 1 failed"),
        "{err}"
    );
    assert!(text(&out.stdout).contains(&nemo_text("tiny_tdt_2s")));
}

#[test]
fn every_audio_format_fixture_transcribes() {
    let root = scratch("formats");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let dir = fixtures().join("audio/formats");
    let out = transcribe(&dir, &model, &[], &root);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let n_audio = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| parakeet::audio::is_audio_path(&e.as_ref().unwrap().path()))
        .count();
    assert!(n_audio >= 13, "{n_audio}");
    assert!(err.contains(&format!("{n_audio} done, 0 failed")), "{err}");
    assert_eq!(text(&out.stdout).lines().count(), n_audio);
}

/// `--profile` prints the stage table, then the graph nodes' time by kind: the encoder's
/// attention (one node per layer of the 2-layer tiny model), its linears and the decoder's
/// LSTM are each one row, and the shares sum to the whole.
#[test]
fn profile_shows_where_the_time_went() {
    let cache = scratch("cache-profile");
    let clip = reference("").join("speech_2s.wav");
    let out = transcribe(&clip, &nemo("tiny_tdt"), &["--profile"], &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt_2s"));
    let err = text(&out.stderr);
    for stage in ["model load", "features", "encoder", "decoder", "total"] {
        assert!(err.lines().any(|l| l.starts_with(stage)), "{stage}: {err}");
    }
    let table = profile_node_rows(&err);
    for kind in [
        "rel_pos_attention",
        "lstm_pointwise",
        "linear (panel16 gemm)",
    ] {
        assert_eq!(
            table
                .iter()
                .filter(|l| l.ends_with(&format!("  {kind}")))
                .count(),
            1,
            "{kind}: {err}"
        );
    }
    assert!(
        table.iter().any(|l| l.ends_with(" 2 x  rel_pos_attention")),
        "{err}"
    );
    let shares: f64 = table
        .iter()
        .map(|l| l.split_whitespace().nth(2).unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(
        (shares - 100.0).abs() < 0.5,
        "shares sum to {shares}: {err}"
    );
}

/// `--kernels ggml` runs ggml's built-in ops only: `--profile` says so, and no node of ours
/// (a custom op) is in its node table; the text is NeMo's. A value it does not know exits 2.
#[test]
fn kernels_ggml_runs_only_ggml_ops_and_transcribes_as_nemo() {
    let cache = scratch("cache-kernels");
    let clip = reference("").join("speech_2s.wav");
    let out = transcribe(
        &clip,
        &nemo("tiny_tdt"),
        &["--kernels", "ggml", "--profile"],
        &cache,
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt_2s"));
    assert!(err.contains("ops: ggml"), "{err}");
    let table = profile_node_rows(&err);
    for ours in [
        "rel_pos_attention",
        "lstm_pointwise",
        "layer_norm",
        "linear (panel16 gemm)",
        "pack activations (panel16 gemm)",
        "glu",
        "conv1d_dw + silu",
        "conv stem (conv.0 + conv.2)",
        "depthwise conv 3x3 stride 2",
        "matvec (f32)",
        "quantize (q8_0)",
    ] {
        assert!(
            !table.iter().any(|l| l.ends_with(&format!("  {ours}"))),
            "{ours}: {err}"
        );
    }
    for ggml in ["softmax", "matmul", "norm"] {
        assert!(
            table.iter().any(|l| l.ends_with(&format!("  {ggml}"))),
            "{ggml}: {err}"
        );
    }
    let default = transcribe(&clip, &nemo("tiny_tdt"), &["--profile"], &cache);
    assert!(text(&default.stderr).contains("ops: kernels"));
    let bad = transcribe(&clip, &nemo("tiny_tdt"), &["--kernels", "gpu"], &cache);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("--kernels"),
        "{}",
        text(&bad.stderr)
    );
}

/// The decoder row names what decoded: the CTC head's greedy decoding or its beam search.
#[test]
fn profile_names_the_ctc_decoding() {
    let cache = scratch("cache-profile-ctc");
    let clip = reference("").join("speech_2s.wav");
    for (flags, says) in [
        (&["--decoder", "ctc"][..], "(CTC greedy)"),
        (
            &["--decoder", "ctc", "--beam", "4"][..],
            "(CTC beam search)",
        ),
    ] {
        let args = [&["--profile"][..], flags].concat();
        let out = transcribe(&clip, &nemo("tiny_tdt_ctc"), &args, &cache);
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        let decoder = err.lines().find(|l| l.starts_with("decoder ")).unwrap();
        assert!(decoder.ends_with(says), "{flags:?}: {decoder}");
    }
}

/// A file named twice is transcribed once, and its later naming is reported on stderr as
/// skipped, on one line with its path (given twice, or as itself after its directory).
#[test]
fn a_repeated_input_is_named_as_skipped() {
    let root = scratch("repeated");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let dir = root.join("in");
    std::fs::create_dir_all(&dir).unwrap();
    let clip = dir.join("a.wav");
    std::fs::copy(reference("").join("speech_2s.wav"), &clip).unwrap();
    let (model, clip_arg) = (model.to_str().unwrap(), clip.to_str().unwrap());
    for inputs in [[clip_arg, clip_arg], [dir.to_str().unwrap(), clip_arg]] {
        let out = parakeet(&["transcribe", inputs[0], inputs[1], "-m", model], &root);
        let err = text(&out.stderr);
        assert!(out.status.success(), "{inputs:?}: {err}");
        // One file: its text alone, once.
        assert_eq!(text(&out.stdout).trim_end(), nemo_text("tiny_tdt_2s"));
        let skipped: Vec<&str> = err.lines().filter(|l| l.contains("skipped")).collect();
        assert_eq!(skipped.len(), 1, "{inputs:?}: {err}");
        assert!(skipped[0].contains(clip_arg), "{inputs:?}: {err}");
    }
}

#[test]
fn shards_split_a_tree_into_disjoint_stable_parts() {
    let root = scratch("shard");
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let dir = root.join("in");
    let names: Vec<String> = (0..8).map(|i| format!("talk{i}/clip.wav")).collect();
    for name in &names {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(reference("").join("speech_2s.wav"), &path).unwrap();
    }
    let (model, dir_arg) = (model.to_str().unwrap(), dir.to_str().unwrap());
    // The files each shard wrote (-o mirrors the tree), by relative path.
    let shard_outputs = |k: usize, out: &Path| -> Vec<String> {
        let spec = format!("{k}/3");
        let o = out.to_str().unwrap();
        let run = parakeet(
            &[
                "transcribe",
                dir_arg,
                "-m",
                model,
                "--shard",
                &spec,
                "-o",
                o,
            ],
            &root,
        );
        assert!(run.status.success(), "{spec}: {}", text(&run.stderr));
        let mut found: Vec<String> = walk_files(out)
            .iter()
            .map(|p| p.strip_prefix(out).unwrap().with_extension("wav"))
            .map(|p| p.to_string_lossy().replace('\\', "/"))
            .collect();
        found.sort();
        found
    };
    let mut union = Vec::new();
    for k in 1..=3 {
        let first = shard_outputs(k, &root.join(format!("out{k}")));
        // Stable: the same shard of the same tree again takes the same files.
        assert_eq!(first, shard_outputs(k, &root.join(format!("again{k}"))));
        union.extend(first);
    }
    union.sort();
    let mut expected = names.clone();
    expected.sort();
    // Disjoint and complete: every file in exactly one shard.
    assert_eq!(union, expected);

    for bad in ["0/3", "4/3", "3", "a/b"] {
        let out = parakeet(&["transcribe", dir_arg, "-m", model, "--shard", bad], &root);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            text(&out.stderr).contains("K/N"),
            "{bad}: {}",
            text(&out.stderr)
        );
    }
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk_files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Bad decoding flags: one line naming the problem, exit 2, and no output file.
#[test]
fn bad_decoding_flags_exit_2_and_write_nothing() {
    let root = scratch("bad-decoding-flags");
    let clip = reference("").join("speech_2s.wav");
    let model = gguf("tiny_tdt_ctc", parakeet::convert::OutType::F32);
    let not_utf8 = root.join("not-utf8.txt");
    std::fs::write(&not_utf8, b"data\n\xff\xfe name\n").unwrap();
    let missing = root.join("missing.txt");
    let out_dir = root.join("out");
    let cases: &[(&[&str], &str)] = &[
        (&["--boost", ""], "is empty"),
        (&["--boost", "\u{65e5}\u{672c}"], "spells nothing"),
        (
            &["--boost-file", not_utf8.to_str().unwrap()],
            "line 2 is not UTF-8",
        ),
        (&["--boost-file", missing.to_str().unwrap()], "missing.txt"),
        // Capped: read until memory ran out before.
        (
            &["--boost-file", "/dev/zero"],
            "--boost-file /dev/zero: larger than 16 MiB",
        ),
        (
            &["--boost-file", "/dev/urandom"],
            "--boost-file /dev/urandom: larger than 16 MiB",
        ),
        (&["--confidence", "entropy_shannon_lin"], "--confidence"),
        (&["--confidence-alpha", "0"], "--confidence-alpha"),
        (
            &["--confidence-aggregation", "median"],
            "--confidence-aggregation",
        ),
        (&["--beam", "0"], "--beam 0"),
        (&["--beam", "2", "--nbest", "3"], "--nbest 3"),
        (
            &["--beam", "2", "--beam-strategy", "tsd"],
            "does not run on a TDT",
        ),
        (
            &["--beam", "2", "--beam-strategy", "maes", "--boost", "data"],
            "cannot boost",
        ),
        (
            &["--beam", "2", "--confidence", "max_prob"],
            "greedy decoding only",
        ),
        // The beam's bound: no ggml assertion, no capacity error, no huge allocation.
        (
            &["--beam", "18446744073709551615"],
            "--beam 18446744073709551615: at most 256",
        ),
        (&["--beam", "4294967296"], "--beam 4294967296: at most 256"),
        (&["--beam", "100000"], "--beam 100000: at most 256"),
        (&["--beam", "4096"], "--beam 4096: at most 256"),
        (&["--nbest", "0"], "--nbest 0: keeps at least 1"),
        (
            &["--beam", "2", "--nbest", "0"],
            "--nbest 0: keeps at least 1",
        ),
        (
            &["--nbest", "2"],
            "--nbest 2: alternatives come from a beam search",
        ),
        (
            &["--decoder", "ctc", "--confidence-with-durations"],
            "--confidence-with-durations: the ctc decoder has no durations",
        ),
        (
            &[
                "--confidence",
                "entropy_gibbs_lin",
                "--confidence-alpha",
                "2",
            ],
            "--confidence-alpha 2: entropy_gibbs_lin takes",
        ),
        (
            &["--confidence", "max_prob", "--confidence-alpha", "1e6"],
            "--confidence-alpha 1000000: max_prob takes 0.0100 to 10.0000",
        ),
        (&["--confidence-alpha", "NaN"], "--confidence-alpha NaN"),
        (
            &["--boost", "data", "--boost-alpha", "1e37"],
            "--boost-alpha 10000000000000000000000000000000000000: takes 0 to 10",
        ),
        (
            &["--boost", "data", "--boost-context-score", "3e38"],
            "--boost-context-score",
        ),
        (
            &["--boost", "data", "--boost-alpha", "inf"],
            "--boost-alpha inf",
        ),
        (&["--threads", "0"], "--threads 0: at least 1 thread"),
    ];
    for &(flags, says) in cases {
        let mut extra = vec!["-f", "json", "-q", "-o", out_dir.to_str().unwrap()];
        extra.extend_from_slice(flags);
        let out = transcribe(&clip, &model, &extra, &root);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(says), "{flags:?}: {err}");
        assert!(!out_dir.exists(), "{flags:?} wrote {}", out_dir.display());
    }
}

/// A confidence flag is checked against the model even when the output (plain text) does not
/// show confidence: `--confidence-with-durations` on an RNN-T or CTC decoder is refused, not
/// ignored.
#[test]
fn confidence_flags_are_checked_when_the_output_hides_confidence() {
    let root = scratch("confidence-txt");
    let clip = reference("").join("speech_10s.wav");
    let cases = [
        ("tiny_rnnt", vec!["--confidence-with-durations"], "rnnt"),
        (
            "tiny_tdt_ctc",
            vec!["--decoder", "ctc", "--confidence-with-durations"],
            "ctc",
        ),
    ];
    for (name, flags, head) in cases {
        let model = gguf(name, parakeet::convert::OutType::F32);
        let out_dir = root.join(name);
        let mut extra = vec!["-f", "txt", "-q", "-o", out_dir.to_str().unwrap()];
        extra.extend(flags.iter().copied());
        let out = transcribe(&clip, &model, &extra, &root);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {flags:?}: {err}");
        assert!(
            err.contains(&format!(
                "--confidence-with-durations: the {head} decoder has no durations"
            )),
            "{name}: {err}"
        );
        assert!(!out_dir.exists(), "{name} wrote {}", out_dir.display());
    }
    // On a TDT model the same flag is taken, and the text is greedy decoding's as without it.
    let model = gguf("tiny_tdt", parakeet::convert::OutType::F32);
    let plain = transcribe(&clip, &model, &["-q"], &root);
    let with = transcribe(&clip, &model, &["-q", "--confidence-with-durations"], &root);
    assert_eq!(with.status.code(), Some(0), "{}", text(&with.stderr));
    assert_eq!(text(&with.stdout), text(&plain.stdout));
}

/// `--beam 4 --nbest 4` writes NeMo's N-best list (malsd_batch, the default transducer
/// search, boosted too) as the JSON's `alternatives`, best first, the first being the
/// transcript; the decoding block says what ran.
#[test]
fn beam_nbest_in_json_equals_nemo() {
    let root = scratch("beam-nbest");
    let clip = reference("").join("speech_10s.wav");
    let model = gguf("tiny_tdt_ctc", parakeet::convert::OutType::F32);
    let reference = json(&fixtures().join("decoding/beam.json"));
    let cases = [
        ("tdt:malsd_batch", vec![]),
        (
            "tdt:malsd_batch+boost:C_3plus|S1_a1_cs1_ds2",
            vec![
                "--boost", "data", "--boost", "date", "--boost", "dinner", "--boost", "the cat",
            ],
        ),
    ];
    for (case, flags) in cases {
        let out_dir = root.join(case.replace([':', '|', '+'], "_"));
        let mut extra = vec!["--beam", "4", "--nbest", "4", "-f", "json", "-q", "-o"];
        extra.push(out_dir.to_str().unwrap());
        extra.extend(flags.iter().copied());
        let out = transcribe(&clip, &model, &extra, &root);
        assert!(out.status.success(), "{case}: {}", text(&out.stderr));
        let ours = json(&out_dir.join("speech_10s.json"));
        let nemo = reference["tiny_tdt_ctc"][case]["clips"]["speech_10s.wav"]
            .as_array()
            .unwrap();
        let alternatives = ours["alternatives"].as_array().unwrap();
        assert_eq!(alternatives.len(), nemo.len().min(4), "{case}");
        for (a, n) in alternatives.iter().zip(nemo) {
            assert_eq!(a["tokens"], n["tokens"], "{case}");
            assert_eq!(a["text"], n["text"], "{case}");
            let (s, ns) = (a["score"].as_f64().unwrap(), n["score"].as_f64().unwrap());
            assert!(
                (s - ns).abs() <= 1e-4 * ns.abs().max(1.0),
                "{case}: {s} vs {ns}"
            );
        }
        assert_eq!(ours["text"], nemo[0]["text"], "{case}");
        assert_eq!(ours["decoding"]["strategy"], "malsd_batch");
        assert_eq!(ours["decoding"]["beam_size"], 4);
        assert_eq!(ours["decoding"]["boosted_phrases"], flags.len() / 2);
        assert!(ours["tokens"][0].get("confidence").is_none(), "{case}");
    }
}

/// `info` on a cache-aware streaming model lists every lookahead's schedule and caches (NeMo's
/// `streaming_cfg`: chunk 1+8R / 8(R+1) mel frames, 70-frame attention cache, 9 pre-encode
/// frames, 2 subsampled frames dropped).
#[test]
fn info_shows_the_streaming_parameters() {
    let root = scratch("info-stream");
    let model = gguf("tiny_stream_rnnt", parakeet::convert::OutType::F32);
    let s = text(&parakeet(&["info", model.to_str().unwrap()], &root).stdout);
    for want in [
        "attention chunked [70, 13]",
        "raw log-mel (normalize NA)",
        "att_context [70, 13] (default): chunk 1120 ms (105/112 mel frames, shift 105/112), 14 \
         encoder frames a chunk, attention cache 70 frames, conv cache 8, pre-encode cache 9 mel \
         frames, drop_extra_pre_encoded 2",
        "att_context [70, 0]: chunk 80 ms (1/8 mel frames",
    ] {
        assert!(s.contains(want), "{want}: {s}");
    }
}
