//! Seeded mutation fuzzing, on stable Rust, of every parser that reads untrusted bytes: the
//! GGUF reader (our header walk, then ggml's reader and the model loader for what passes), the
//! `.nemo` reader (whole archives: tar, zip, pickle, YAML; and the checkpoint zip, the pickle
//! and the YAML config on their own, in memory, for speed) and the audio decoders.
//!
//! ```sh
//! cargo run --release --example fuzz -- all 1000000        # every target, 1M inputs each
//! cargo run --release --example fuzz -- wav 100000 7       # one target, its count, a seed
//! cargo run --release --example fuzz -- gguf 1 7 123456    # replay input 123456 of seed 7
//! cargo run --release --example fuzz -- all 1000000 1 0 300 # at most 300 s per target
//! ```
//!
//! Inputs are mutated copies of the real fixtures in `tests/fixtures` (bit flips, interesting
//! integers, truncation, splices). Input `i` of seed `s` depends on nothing else, so any input
//! can be regenerated from its number. A panic is caught, its input saved under
//! `target/fuzz-crashes/` and counted; an abort kills the run, and the last progress line
//! (and, for the slow file-based targets, `target/fuzz-crashes/<target>-current.bin`) names
//! the input to replay. Results are recorded in docs/FUZZING.md.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parakeet::convert::{self, OutType};

const TARGETS: [&str; 9] = [
    "gguf",
    "nemo",
    "checkpoint",
    "pickle",
    "yaml",
    "wav",
    "audio",
    "stream",
    "realtime",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = args.first().map_or("all", String::as_str);
    let count: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let seed: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let first: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
    let limit = Duration::from_secs(args.get(4).and_then(|s| s.parse().ok()).unwrap_or(u64::MAX));
    parakeet::backend::silence_ggml_logs();
    // Panics are caught and reported per input; the default hook's message would flood. They
    // are counted, for the server's tasks (tokio catches those).
    std::panic::set_hook(Box::new(|_| {
        PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    let targets: Vec<&str> = if target == "all" {
        TARGETS.to_vec()
    } else if TARGETS.contains(&target) {
        vec![target]
    } else {
        eprintln!("unknown target {target}; one of {TARGETS:?} or all");
        std::process::exit(2);
    };
    let work = std::env::temp_dir().join(format!("parakeet-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("scratch directory");
    let mut failed = false;
    for t in targets {
        let report = run(t, count, seed, first, limit, &work);
        println!("{report}");
        failed |= report.crashes > 0;
    }
    let _ = std::fs::remove_dir_all(&work);
    std::process::exit(i32::from(failed));
}

struct Report {
    target: String,
    seed: u64,
    runs: u64,
    accepted: u64,
    crashes: u64,
    elapsed: Duration,
    slowest: (Duration, u64),
    errors: HashMap<String, u64>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{}: {} inputs (seed {}) in {:.1} s ({:.0}/s): {} accepted, {} refused with an error, \
             {} crashes; slowest input #{} took {:.1} ms",
            self.target,
            self.runs,
            self.seed,
            self.elapsed.as_secs_f64(),
            self.runs as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.accepted,
            self.runs - self.accepted - self.crashes,
            self.crashes,
            self.slowest.1,
            self.slowest.0.as_secs_f64() * 1e3
        )?;
        let mut errors: Vec<_> = self.errors.iter().collect();
        errors.sort_by(|a, b| b.1.cmp(a.1));
        for (e, n) in errors.iter().take(8) {
            writeln!(f, "    {n:>8}  {e}")?;
        }
        Ok(())
    }
}

/// A fixture to mutate, and where in it mutations matter most (the rest is mostly sample or
/// weight data, which no parser interprets).
struct Seed {
    name: String,
    bytes: Vec<u8>,
    hot: std::ops::Range<usize>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Panics anywhere in the process, the server's tasks included.
static PANICS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

const MODELS: [&str; 4] = ["tiny_tdt", "tiny_tdt_ctc", "tiny_rnnt", "tiny_ctc"];

fn seeds(target: &str, work: &Path) -> Vec<Seed> {
    let whole = |name: String, bytes: Vec<u8>| {
        let n = bytes.len();
        Seed {
            name,
            bytes,
            hot: 0..n,
        }
    };
    match target {
        "gguf" => MODELS
            .iter()
            .map(|m| {
                let out = work.join(format!("{m}.gguf"));
                convert::convert(&fixtures().join(format!("{m}.nemo")), &out, OutType::Q8_0)
                    .expect("converting a fixture");
                let bytes = std::fs::read(&out).expect("reading a fixture");
                let header = parakeet::gguf::header::check_header(&bytes)
                    .expect("fixture GGUF is valid")
                    .data_offset as usize;
                Seed {
                    name: format!("{m}.gguf"),
                    bytes,
                    hot: 0..header,
                }
            })
            .collect(),
        "nemo" => MODELS
            .iter()
            .map(|m| {
                let bytes = std::fs::read(fixtures().join(format!("{m}.nemo"))).expect("fixture");
                // Tar headers, the config and the zip's directory and pickle sit in the first
                // and last few KiB of these archives; the middle is tensor data.
                let n = bytes.len();
                Seed {
                    name: format!("{m}.nemo"),
                    bytes,
                    hot: 0..n,
                }
            })
            .collect(),
        "checkpoint" | "pickle" | "yaml" => MODELS
            .iter()
            .map(|m| {
                let (config, ckpt, pkl) = nemo_members(&fixtures().join(format!("{m}.nemo")));
                match target {
                    "yaml" => whole(format!("{m}/model_config.yaml"), config),
                    "pickle" => whole(format!("{m}/data.pkl"), pkl),
                    _ => whole(format!("{m}/model_weights.ckpt"), ckpt),
                }
            })
            .collect(),
        "stream" => {
            // What `parakeet stream -` reads: WAV pipes (the reference clips), and headerless
            // samples (`--raw`), named by their layout.
            let mut out = seeds("wav", work);
            let clip = std::fs::read(fixtures().join("reference/speech_2s.wav")).expect("fixture");
            let data = clip[44..].to_vec();
            let floats: Vec<u8> = data
                .chunks_exact(2)
                .flat_map(|b| (f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0).to_le_bytes())
                .take(64_000)
                .collect();
            out.push(whole("raw-s16le-16000-1".into(), data[..32_000].to_vec()));
            out.push(whole("raw-s16le-44100-2".into(), data[..32_000].to_vec()));
            out.push(whole("raw-f32le-8000-1".into(), floats));
            out
        }
        "realtime" => {
            let audio = std::fs::read(fixtures().join("reference/speech_2s.wav")).expect("fixture");
            let audio = base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                &audio[44..44 + 3200],
            );
            [
                r#"{"type":"session.update","session":{"type":"transcription","audio":{"input":{"format":{"type":"audio/pcm","rate":16000}}}}}"#.to_string(),
                r#"{"type":"transcription_session.update","session":{"input_audio_format":"pcm16"}}"#.to_string(),
                format!(r#"{{"type":"input_audio_buffer.append","audio":"{audio}","event_id":"e1"}}"#),
                r#"{"type":"input_audio_buffer.commit","event_id":"e2"}"#.to_string(),
                r#"{"type":"input_audio_buffer.clear"}"#.to_string(),
                r#"{"type":"session.update","session":{"input_audio_format":"pcm16","audio":{"input":{"format":{"type":"audio/pcm","rate":24000}}}}}"#.to_string(),
            ]
            .into_iter()
            .enumerate()
            .map(|(i, text)| whole(format!("event{i}"), text.into_bytes()))
            .collect()
        }
        "wav" | "audio" => {
            let mut out = Vec::new();
            let dirs = [
                fixtures().join("audio/formats"),
                fixtures().join("reference"),
            ];
            for dir in dirs {
                let mut entries: Vec<_> = std::fs::read_dir(&dir)
                    .expect("fixture directory")
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| parakeet::audio::is_audio_path(p))
                    .collect();
                entries.sort();
                for p in entries {
                    let is_wav = p.extension().is_some_and(|e| e == "wav");
                    if is_wav != (target == "wav") {
                        continue;
                    }
                    let bytes = std::fs::read(&p).expect("fixture");
                    // The 10 s clip is 320 KB of samples: the first 4 KiB holds every header.
                    let hot = 0..bytes.len().min(4096);
                    out.push(Seed {
                        name: p.file_name().unwrap().to_string_lossy().into_owned(),
                        bytes,
                        hot,
                    });
                }
            }
            out
        }
        _ => unreachable!("checked in main"),
    }
}

/// `model_config.yaml`, `model_weights.ckpt` and its `data.pkl` from a `.nemo`.
fn nemo_members(path: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    use std::io::Read;
    let mut tar = tar::Archive::new(std::fs::File::open(path).expect("fixture"));
    let (mut config, mut ckpt) = (Vec::new(), Vec::new());
    for entry in tar.entries().expect("fixture tar") {
        let mut entry = entry.expect("fixture tar entry");
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        if name.ends_with("model_config.yaml") {
            entry.read_to_end(&mut config).unwrap();
        } else if name.ends_with("model_weights.ckpt") {
            entry.read_to_end(&mut ckpt).unwrap();
        }
    }
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&ckpt)).expect("fixture zip");
    let pkl_name = zip
        .file_names()
        .filter_map(|n| n.ok())
        .find(|n| n.ends_with("data.pkl"))
        .expect("data.pkl")
        .into_owned();
    let mut pkl = Vec::new();
    zip.by_name(&pkl_name)
        .unwrap()
        .read_to_end(&mut pkl)
        .unwrap();
    (config, ckpt, pkl)
}

fn run(target: &str, count: u64, seed: u64, first: u64, limit: Duration, work: &Path) -> Report {
    let seeds = seeds(target, work);
    // Tensor shapes of each model, for the YAML target (the config is checked against them).
    let shapes: Vec<Vec<(String, Vec<usize>)>> = if target == "yaml" {
        MODELS
            .iter()
            .map(|m| {
                let a = convert::NemoArchive::open(&fixtures().join(format!("{m}.nemo")))
                    .expect("fixture");
                a.tensors()
                    .iter()
                    .map(|t| (t.name.clone(), t.shape().to_vec()))
                    .collect()
            })
            .collect()
    } else {
        Vec::new()
    };
    let crash_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-crashes");
    let file = work.join(format!("input-{target}"));
    let mut report = Report {
        target: target.to_string(),
        seed,
        runs: 0,
        accepted: 0,
        crashes: 0,
        elapsed: Duration::ZERO,
        slowest: (Duration::ZERO, 0),
        errors: HashMap::new(),
    };
    let start = Instant::now();
    let mut last_progress = Instant::now();
    for i in first..first + count {
        if start.elapsed() > limit {
            break;
        }
        let mut rng = Rng::new(seed, i);
        let which = rng.below(seeds.len() as u64) as usize;
        let s = &seeds[which];
        let input = mutate(&mut rng, &s.bytes, &s.hot);
        let file_based = matches!(target, "gguf" | "nemo");
        if file_based {
            let _ = std::fs::create_dir_all(&crash_dir);
            let _ = std::fs::write(crash_dir.join(format!("{target}-current.bin")), &input);
        }
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            exec(target, &input, &s.name, &file, shapes.get(which))
        }));
        let took = t0.elapsed();
        if took > report.slowest.0 {
            report.slowest = (took, i);
        }
        report.runs += 1;
        match outcome {
            Ok(Ok(())) => report.accepted += 1,
            Ok(Err(e)) => *report.errors.entry(error_kind(&e)).or_default() += 1,
            Err(panic) => {
                report.crashes += 1;
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let _ = std::fs::create_dir_all(&crash_dir);
                let saved = crash_dir.join(format!("{target}-seed{seed}-{i}.bin"));
                let _ = std::fs::write(&saved, &input);
                eprintln!(
                    "CRASH {target} input #{i} (from {}): {msg}; saved {}",
                    s.name,
                    saved.display()
                );
            }
        }
        if last_progress.elapsed() > Duration::from_secs(30) {
            last_progress = Instant::now();
            eprintln!(
                "  {target}: input #{i}, {} run, {} crashes, {:.0}/s",
                report.runs,
                report.crashes,
                report.runs as f64 / start.elapsed().as_secs_f64()
            );
        }
    }
    report.elapsed = start.elapsed();
    report
}

fn exec(
    target: &str,
    input: &[u8],
    name: &str,
    file: &Path,
    shapes: Option<&Vec<(String, Vec<usize>)>>,
) -> anyhow::Result<()> {
    match target {
        "gguf" => {
            // Our walk first, as `GgufFile::open` does; only what it accepts reaches ggml.
            parakeet::gguf::header::check_header(input)?;
            std::fs::write(file, input)?;
            parakeet::model::Model::load(file)?;
        }
        "nemo" => {
            std::fs::write(file, input)?;
            let archive = convert::NemoArchive::open(file)?;
            let shapes: HashMap<&str, &[usize]> = archive
                .tensors()
                .iter()
                .map(|t| (t.name.as_str(), t.shape()))
                .collect();
            convert::ModelConfig::from_yaml(
                archive.config(),
                &shapes,
                archive.tokenizer_vocab(),
                archive.tokenizer_model(),
            )?;
            for t in archive.tensors() {
                archive.load(t)?;
            }
        }
        "checkpoint" => {
            convert::fuzz::checkpoint(input)?;
        }
        "pickle" => {
            convert::fuzz::pickle(input)?;
        }
        "yaml" => {
            let text = std::str::from_utf8(input)?;
            let config = convert::parse_config(text)?;
            let shapes: HashMap<&str, &[usize]> = shapes
                .expect("yaml shapes")
                .iter()
                .map(|(n, s)| (n.as_str(), s.as_slice()))
                .collect();
            convert::ModelConfig::from_yaml(&config, &shapes, None, None)?;
        }
        "wav" | "audio" => {
            let audio = parakeet::audio::decode_bytes(input, name)?;
            parakeet::audio::resample_to_16k(audio)?;
        }
        "stream" => stream(input, name)?,
        "realtime" => realtime(input)?,
        _ => unreachable!("checked in main"),
    }
    Ok(())
}

/// The error's first line with digits masked, so that similar refusals group together.
fn error_kind(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let text: String = text
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect();
    let mut out: String = text.chars().take(110).collect();
    if text.chars().count() > 110 {
        out.push('…');
    }
    out
}

/// splitmix64, seeded per input so that any input can be regenerated alone.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, input: u64) -> Rng {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ input);
        r.next();
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// Values that break size and count arithmetic.
const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
];

/// One to four mutations of `base`, positions mostly inside `hot`.
fn mutate(rng: &mut Rng, base: &[u8], hot: &std::ops::Range<usize>) -> Vec<u8> {
    let mut b = base.to_vec();
    let n = 1 + rng.below(4);
    for _ in 0..n {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let pos = if rng.below(4) > 0 && hot.end > hot.start && hot.end <= b.len() {
            hot.start + rng.below((hot.end - hot.start) as u64) as usize
        } else {
            rng.below(b.len() as u64) as usize
        };
        match rng.below(10) {
            0 | 1 => b[pos] ^= 1 << rng.below(8),
            2 => b[pos] = rng.next() as u8,
            3 | 4 => {
                // An interesting integer, 1/2/4/8 bytes, little endian.
                let v = INTERESTING[rng.below(INTERESTING.len() as u64) as usize];
                let width = 1usize << rng.below(4);
                let bytes = v.to_le_bytes();
                let end = (pos + width).min(b.len());
                b[pos..end].copy_from_slice(&bytes[..end - pos]);
            }
            5 => {
                let delta = (rng.below(33) as i64 - 16) as u8;
                b[pos] = b[pos].wrapping_add(delta);
            }
            6 => b.truncate(pos),
            7 => {
                let len = (rng.below(64) as usize + 1).min(b.len() - pos);
                b.drain(pos..pos + len);
            }
            8 => {
                let len = rng.below(64) as usize + 1;
                let fill: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                b.splice(pos..pos, fill);
            }
            _ => {
                // Copy a chunk from elsewhere in the file over this position.
                let from = rng.below(b.len() as u64) as usize;
                let len = (rng.below(32) as usize + 1)
                    .min(b.len() - from)
                    .min(b.len() - pos);
                let chunk = b[from..from + len].to_vec();
                b[pos..pos + len].copy_from_slice(&chunk);
            }
        }
    }
    b
}

/// One input as `parakeet stream -` reads it: a WAV pipe, or raw samples in the layout the
/// seed's name gives, through the pump (sample checks, resampling to 16 kHz) into a
/// transcriber that only counts what it is fed.
fn stream(input: &[u8], name: &str) -> anyhow::Result<()> {
    use parakeet::stream::input::{self, RawFormat, RawLayout};
    use parakeet::stream::pump::{PumpOptions, pump};
    let raw = name.strip_prefix("raw-").map(|layout| {
        let parts: Vec<&str> = layout.split('-').collect();
        RawLayout {
            format: match parts[0] {
                "s16le" => RawFormat::S16le,
                _ => RawFormat::F32le,
            },
            rate: parts[1].parse().expect("seed rate"),
            channels: parts[2].parse().expect("seed channels"),
        }
    });
    let mut source = input::open_reader(std::io::Cursor::new(input.to_vec()), "<fuzz>", raw, true)?;
    let mut counter = Counter(0);
    pump(
        source.as_mut(),
        &mut counter,
        &PumpOptions::default(),
        &mut |_| Ok(()),
    )?;
    Ok(())
}

/// A live transcriber that counts the samples it is fed and says nothing.
struct Counter(u64);

impl parakeet::stream::LiveTranscriber for Counter {
    fn sample_rate(&self) -> u32 {
        16_000
    }

    fn chunk_seconds(&self) -> f64 {
        0.08
    }

    fn accept(
        &mut self,
        samples: &[f32],
    ) -> parakeet::error::Result<Vec<parakeet::stream::StreamEvent>> {
        // The pump's checks come before the resampler: nothing else may reach a model.
        assert!(
            samples.iter().all(|s| s.is_finite()),
            "a sample past the resampler is not finite"
        );
        self.0 += samples.len() as u64;
        Ok(Vec::new())
    }

    fn finish(&mut self) -> parakeet::error::Result<Vec<parakeet::stream::StreamEvent>> {
        Ok(Vec::new())
    }
}

type Client = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>;

thread_local! {
    /// The fuzzer's connection to the realtime endpoint; a new one after the server closes it.
    static CLIENT: std::cell::RefCell<Option<Client>> = const { std::cell::RefCell::new(None) };
}

/// The realtime endpoint (`/v1/realtime`), served in this process on 127.0.0.1 with the
/// counting transcriber behind each connection.
fn realtime_server() -> std::net::SocketAddr {
    use parakeet::server::realtime::{RealtimeConfig, router};
    static ADDR: std::sync::OnceLock<std::net::SocketAddr> = std::sync::OnceLock::new();
    *ADDR.get_or_init(|| {
        let config = RealtimeConfig {
            model_name: "fuzz".into(),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            max_seconds: 1e9,
            max_streams: 4,
            drain: parakeet::server::conn::Drain::new().1,
        };
        let factory: parakeet::server::realtime::TranscriberFactory =
            std::sync::Arc::new(|| Ok(Box::new(Counter(0)) as Box<_>));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a local port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("its address");
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                use axum::serve::ListenerExt;
                let listener = tokio::net::TcpListener::from_std(listener)
                    .expect("listener")
                    .tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                axum::serve(listener, router(config, factory)).await
            })
        });
        addr
    })
}

/// One client event to the realtime endpoint, then a ping: every answer to the event comes
/// before the pong. An `error` event is the input refused; a server task that panicked, or
/// no pong within 10 s (a hang), is a crash.
fn realtime(input: &[u8]) -> anyhow::Result<()> {
    use tungstenite::Message;
    let addr = realtime_server();
    let panics = PANICS.load(std::sync::atomic::Ordering::SeqCst);
    let answer = CLIENT.with(|client| -> anyhow::Result<()> {
        let mut client = client.borrow_mut();
        if client.is_none() {
            let (ws, _) = tungstenite::connect(format!("ws://{addr}/v1/realtime"))?;
            if let tungstenite::stream::MaybeTlsStream::Plain(tcp) = ws.get_ref() {
                tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
                // An event and its ping are two small writes: no waiting for the first's ACK.
                tcp.set_nodelay(true)?;
            }
            *client = Some(ws);
        }
        let ws = client.as_mut().expect("connected");
        let tag = b"fuzz".to_vec();
        let sent = ws
            .send(Message::text(String::from_utf8_lossy(input).into_owned()))
            .and_then(|()| ws.send(Message::Ping(tag.clone().into())));
        let mut refused = None;
        let outcome = sent.and_then(|()| {
            loop {
                match ws.read()? {
                    Message::Pong(p) if p.as_ref() == tag.as_slice() => break Ok(()),
                    Message::Text(t) => {
                        let event: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                        if event["type"] == "error" {
                            refused =
                                Some(event["error"]["code"].as_str().unwrap_or("").to_string());
                        }
                    }
                    Message::Close(frame) => {
                        refused = Some(format!(
                            "closed: {}",
                            frame.map_or(String::new(), |f| f.reason.to_string())
                        ));
                        break Err(tungstenite::Error::ConnectionClosed);
                    }
                    _ => {}
                }
            }
        });
        match outcome {
            Ok(()) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("no answer from the realtime endpoint within 10 s");
            }
            Err(e) => {
                *client = None;
                refused.get_or_insert(format!("connection ended: {e}"));
            }
        }
        match refused {
            Some(code) => anyhow::bail!("error event {code}"),
            None => Ok(()),
        }
    });
    assert_eq!(
        PANICS.load(std::sync::atomic::Ordering::SeqCst),
        panics,
        "a server task panicked"
    );
    answer
}
