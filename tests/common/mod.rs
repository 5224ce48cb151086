//! Shared test helpers: fixture paths, .npy/.json readers, and tiny models converted once.
#![allow(dead_code)]

pub mod rewrite;
pub mod turns;

use parakeet::convert::{OutType, convert};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

pub const MODELS: [&str; 4] = ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"];
/// Reference output directories: each model on the 10 s clip and on the 2 s clip.
pub const CLIPS: [(&str, &str); 2] = [("", "speech_10s.wav"), ("_2s", "speech_2s.wav")];

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn reference(dir: &str) -> PathBuf {
    fixtures().join("reference").join(dir)
}

pub fn nemo(model: &str) -> PathBuf {
    fixtures().join(format!("{model}.nemo"))
}

/// The fixture model converted to GGUF (once per test process and type).
pub fn gguf(model: &str, ty: OutType) -> PathBuf {
    static DONE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let key = format!("{model}-{ty:?}");
    let mut done = DONE.get_or_init(Default::default).lock().unwrap();
    if let Some(p) = done.get(&key) {
        return p.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("models-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{key}.gguf"));
    convert(&nemo(model), &out, ty).unwrap_or_else(|e| panic!("converting {model}: {e:#}"));
    done.insert(key, out.clone());
    out
}

/// A .npy file as (shape, f32 data in C order). NeMo's transposed tensors are saved in
/// Fortran order; those are reordered here.
pub fn npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let arr = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape: Vec<usize> = arr.shape().iter().map(|&n| n as usize).collect();
    let fortran = arr.order() == npyz::Order::Fortran;
    let data = arr.into_vec::<f32>().unwrap();
    if !fortran || shape.len() < 2 {
        return (shape, data);
    }
    assert_eq!(
        shape.len(),
        2,
        "{}: Fortran-order arrays of rank > 2",
        path.display()
    );
    let (rows, cols) = (shape[0], shape[1]);
    let c_order = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| (r, c)))
        .map(|(r, c)| data[c * rows + r])
        .collect();
    (shape, c_order)
}

pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of non-negative integers (token ids, frames, durations).
pub fn ints(v: &serde_json::Value) -> Vec<usize> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

pub fn max_abs_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

/// The 16 kHz samples of a reference clip.
pub fn clip_samples(clip: &str) -> Vec<f32> {
    let audio = parakeet::audio::load_audio(&reference("").join(clip)).unwrap();
    assert_eq!(audio.sample_rate, 16000);
    audio.samples
}

/// A fresh, empty scratch directory `<cargo's test tmp>/<suite>-<pid>/<name>`.
pub fn scratch_dir(suite: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{suite}-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `parakeet` binary with `args` and its model cache in `cache`, not started.
pub fn parakeet_command(args: &[&str], cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_parakeet"));
    command
        .args(args)
        .env("PARAKEET_CACHE", cache)
        .env("GGML_NO_BACKTRACE", "1")
        .env_remove("PARAKEET_MODEL");
    command
}

/// Run the `parakeet` binary with `args` and its model cache in `cache`.
pub fn run_parakeet(args: &[&str], cache: &Path) -> Output {
    parakeet_command(args, cache).output().unwrap()
}

/// The rows of `--profile`'s table of graph nodes by kind in `stderr`.
pub fn profile_node_rows(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .skip_while(|l| !l.starts_with("graph nodes by kind"))
        .skip(1)
        .collect()
}

/// [`run_parakeet`] with `stdin` on its standard input.
pub fn run_parakeet_stdin(args: &[&str], cache: &Path, stdin: &[u8]) -> Output {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = parakeet_command(args, cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command may refuse before reading everything: a closed pipe is expected then.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// Deterministic values in [-1, 1) (a 64-bit LCG; no `rand` needed).
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // Top 24 bits -> [0, 1) exactly representable in f32.
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// ‖ours − reference‖ / ‖reference‖.
pub fn rel_err_f64(ours: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(ours.len(), reference.len(), "length mismatch");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&a, &b) in ours.iter().zip(reference) {
        num += (a as f64 - b).powi(2);
        den += b * b;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// A session over the fixture GGUF at `path` whose graphs run `lowering` (the weights
/// realized for it at load), whatever `PARAKEET_KERNELS` says.
pub fn session_on(
    path: &Path,
    threads: parakeet::session::Threads,
    lowering: parakeet::backend::Lowering,
) -> parakeet::session::Session {
    let options = parakeet::model::LoadOptions {
        lowering,
        ..parakeet::model::LoadOptions::from_env()
    };
    let model = parakeet::model::Model::load_with(path, &path.display().to_string(), &options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parakeet::session::Session::ready(model, threads, None).unwrap()
}

/// A Sortformer diarizer over the fixture GGUF at `path` running `lowering`.
pub fn diarizer_on(
    path: &Path,
    threads: usize,
    lowering: parakeet::backend::Lowering,
) -> parakeet::diar::Diarizer {
    let options = parakeet::model::LoadOptions {
        lowering,
        ..parakeet::model::LoadOptions::from_env()
    };
    let model = parakeet::model::Model::load_with(path, &path.display().to_string(), &options)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parakeet::diar::Diarizer::new(
        std::sync::Arc::new(model),
        parakeet::session::Threads::new(threads).unwrap(),
    )
    .unwrap()
}

/// `n` compute threads (at most the cores).
pub fn threads(n: usize) -> parakeet::session::Threads {
    parakeet::session::Threads::new(n).unwrap()
}

/// Greedy decoding by `decoder` on `session`'s model.
pub fn greedy(
    session: &parakeet::session::Session,
    decoder: parakeet::session::DecoderChoice,
) -> parakeet::session::DecodeOptions {
    let request = parakeet::session::DecodeRequest::with_decoder(decoder);
    parakeet::session::DecodeOptions::new(session.model(), &request).unwrap()
}
