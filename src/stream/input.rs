//! Where live audio comes from: a WAV or raw PCM stream (standard input, a pipe or a file), any
//! file the audio room decodes, or the default microphone. Every source hands out mono pieces at
//! its own rate as they arrive; resampling to the transcriber's rate is the pump's job.

use crate::audio;
use crate::audio::decode::{MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
use crate::error::{Context, Result};
use crate::{bail, err};
use std::fs::File;
use std::io::{self, BufReader, Cursor, Read};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::Duration;

/// Audio that arrives a piece at a time.
pub trait AudioSource {
    /// Names the input in messages (`<stdin>`, the file's path, the microphone's name).
    fn name(&self) -> &str;
    /// The rate of the samples [`AudioSource::next_piece`] returns.
    fn sample_rate(&self) -> u32;
    /// The next mono samples, waiting until some arrive; `None` at the end of the input.
    fn next_piece(&mut self) -> Result<Option<Vec<f32>>>;
    /// Whether the audio comes at the speaker's pace by itself (a microphone): pacing it again
    /// (`--realtime`) would only add delay.
    fn is_live(&self) -> bool {
        false
    }
}

/// Layout of headerless samples (`--raw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RawFormat {
    /// Signed 16-bit little-endian integers (`ffmpeg -f s16le`, `arecord -t raw -f S16_LE`).
    S16le,
    /// 32-bit little-endian floats (`ffmpeg -f f32le`).
    F32le,
}

impl RawFormat {
    fn bytes(self) -> usize {
        match self {
            RawFormat::S16le => 2,
            RawFormat::F32le => 4,
        }
    }
}

/// Frames per piece a reader hands out: 20 ms, short against any model's chunk (80 ms and up),
/// so reading adds no noticeable delay.
fn piece_frames(rate: u32) -> usize {
    (rate as usize / 50).max(1)
}

/// Refuses a sample rate the resampler cannot take, naming the input.
fn check_rate(name: &str, rate: u32, what: &str) -> Result<()> {
    if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
        bail!(
            Audio,
            "{name}: {what} sample rate {rate} Hz is outside the supported {MIN_SAMPLE_RATE}..={MAX_SAMPLE_RATE} Hz"
        );
    }
    Ok(())
}

/// More channels than any speech recording has (the audio room's limit for WAV).
const MAX_CHANNELS: u16 = 32;

fn check_channels(name: &str, channels: u16) -> Result<()> {
    if channels == 0 || channels > MAX_CHANNELS {
        bail!(
            Audio,
            "{name}: {channels} channels (1..={MAX_CHANNELS} supported)"
        );
    }
    Ok(())
}

/// Mixes interleaved frames down to mono: f32 sum, then divide, as the audio room's decoders.
fn mix_to_mono(interleaved: &[f32], channels: usize, out: &mut Vec<f32>) {
    if channels == 1 {
        out.extend_from_slice(interleaved);
        return;
    }
    out.extend(
        interleaved
            .chunks_exact(channels)
            .map(|frame| frame.iter().sum::<f32>() / channels as f32),
    );
}

/// Reads into `buf` until it is full or the input ends; returns the bytes read. Unlike
/// `read_exact`, a short read at the end is not an error, and unlike one `read`, a pipe's
/// small writes are gathered into a whole piece.
fn read_up_to(reader: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Headerless PCM (`--raw`): its format, rate and channels come from the command line.
pub struct RawStream<R> {
    reader: R,
    name: String,
    format: RawFormat,
    rate: u32,
    channels: usize,
    bytes: Vec<u8>,
    frame: Vec<f32>,
    /// Whether any whole frame came: an input with none is refused like an empty WAV.
    received: bool,
}

impl<R: Read> RawStream<R> {
    pub fn new(reader: R, name: &str, format: RawFormat, rate: u32, channels: u16) -> Result<Self> {
        check_rate(name, rate, "the --rate")?;
        check_channels(name, channels)?;
        let frame_bytes = format.bytes() * usize::from(channels);
        Ok(Self {
            reader,
            name: name.to_string(),
            format,
            rate,
            channels: usize::from(channels),
            bytes: vec![0; piece_frames(rate) * frame_bytes],
            frame: Vec::new(),
            received: false,
        })
    }
}

impl<R: Read> AudioSource for RawStream<R> {
    fn name(&self) -> &str {
        &self.name
    }

    fn sample_rate(&self) -> u32 {
        self.rate
    }

    fn next_piece(&mut self) -> Result<Option<Vec<f32>>> {
        let n = read_up_to(&mut self.reader, &mut self.bytes)
            .with_context(|| format!("{}: cannot read audio", self.name))?;
        // A partial frame can only be the end of the input (a writer cut short): dropped.
        let frame_bytes = self.format.bytes() * self.channels;
        let whole = n - n % frame_bytes;
        if whole == 0 {
            if !self.received {
                bail!(Audio, "{}: no audio (the input is empty)", self.name);
            }
            return Ok(None);
        }
        self.received = true;
        self.frame.clear();
        let data = &self.bytes[..whole];
        match self.format {
            RawFormat::S16le => self.frame.extend(
                data.chunks_exact(2)
                    .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0),
            ),
            RawFormat::F32le => {
                for b in data.chunks_exact(4) {
                    let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if !v.is_finite() || v.abs() > audio::decode::MAX_SAMPLE_MAGNITUDE {
                        bail!(
                            Audio,
                            "{}: sample {v} in the f32le stream is not audio (is the input really --raw f32le?)",
                            self.name,
                        );
                    }
                    self.frame.push(v);
                }
            }
        }
        let mut mono = Vec::with_capacity(self.frame.len() / self.channels);
        mix_to_mono(&self.frame, self.channels, &mut mono);
        Ok(Some(mono))
    }
}

/// A WAV read as it arrives (`arecord -t wav`, `ffmpeg -f wav -`, or a file), through hound.
/// A writer that cannot seek back leaves the `data` length at 0 or `u32::MAX`; such a stream
/// is read to its end.
pub struct WavStream<R: Read> {
    samples: WavSamples<R>,
    name: String,
    rate: u32,
    channels: usize,
    /// Whether the input ending before the declared length just means the writer stopped (a
    /// pipe, or a placeholder length) rather than a truncated file.
    open_ended: bool,
    frame: Vec<f32>,
}

type WavInput<R> = BufReader<io::Chain<Cursor<Vec<u8>>, R>>;

enum WavSamples<R: Read> {
    Int(hound::WavIntoSamples<WavInput<R>, i32>, f32),
    Float(hound::WavIntoSamples<WavInput<R>, f32>),
}

/// The most header bytes read looking for the `data` chunk (a WAV's metadata chunks come before
/// it; anything this long is not a recording's header).
const MAX_WAV_HEADER: usize = 1 << 20;

impl<R: Read> WavStream<R> {
    /// Reads the header (and nothing past it). `pipe`: the input is a pipe or a device, whose
    /// end is the end of the recording whatever the header says.
    pub fn new(mut reader: R, name: &str, pipe: bool) -> Result<Self> {
        let (header, open_ended) = read_wav_header(&mut reader, name)?;
        Self::from_header(header, open_ended, reader, name, pipe)
    }

    /// The stream of a header [`read_wav_header`] read and the rest of its input.
    fn from_header(
        header: Vec<u8>,
        open_ended: bool,
        reader: R,
        name: &str,
        pipe: bool,
    ) -> Result<Self> {
        let input = BufReader::new(Cursor::new(header).chain(reader));
        let wav = hound::WavReader::new(input)
            .map_err(|e| err!(Audio, "{name}: invalid WAV header: {e}"))?;
        let spec = wav.spec();
        check_channels(name, spec.channels).map_err(|e| err!(Audio, "invalid WAV header: {e}"))?;
        check_rate(name, spec.sample_rate, "the WAV header's")?;
        let samples = match spec.sample_format {
            hound::SampleFormat::Float => WavSamples::Float(wav.into_samples()),
            hound::SampleFormat::Int => {
                // The audio room's exact scale: i16 / 32768, i24 / 2^23, ...
                let scale = 2f32.powi(1 - i32::from(spec.bits_per_sample));
                WavSamples::Int(wav.into_samples(), scale)
            }
        };
        Ok(Self {
            samples,
            name: name.to_string(),
            rate: spec.sample_rate,
            channels: usize::from(spec.channels),
            open_ended: open_ended || pipe,
            frame: Vec::new(),
        })
    }

    fn next_sample(&mut self) -> Option<hound::Result<f32>> {
        match &mut self.samples {
            WavSamples::Int(it, scale) => it.next().map(|s| s.map(|s| s as f32 * *scale)),
            WavSamples::Float(it) => it.next(),
        }
    }
}

impl<R: Read> AudioSource for WavStream<R> {
    fn name(&self) -> &str {
        &self.name
    }

    fn sample_rate(&self) -> u32 {
        self.rate
    }

    fn next_piece(&mut self) -> Result<Option<Vec<f32>>> {
        let want = piece_frames(self.rate) * self.channels;
        self.frame.clear();
        while self.frame.len() < want {
            match self.next_sample() {
                None => break,
                Some(Ok(s)) => self.frame.push(s),
                // hound reports the input ending inside its declared length as an `Other` I/O
                // error; on a pipe that is just where the writer stopped.
                Some(Err(hound::Error::IoError(e)))
                    if self.open_ended
                        && matches!(
                            e.kind(),
                            io::ErrorKind::UnexpectedEof | io::ErrorKind::Other
                        ) =>
                {
                    break;
                }
                Some(Err(e)) => bail!(
                    Audio,
                    "{}: truncated or unreadable WAV data ({e})",
                    self.name
                ),
            }
        }
        // A partial frame at the end (the writer stopped mid-frame) is dropped.
        let whole = self.frame.len() - self.frame.len() % self.channels;
        if whole == 0 {
            return Ok(None);
        }
        let mut mono = Vec::with_capacity(whole / self.channels);
        mix_to_mono(&self.frame[..whole], self.channels, &mut mono);
        Ok(Some(mono))
    }
}

/// Reads a RIFF/WAVE header up to and including the `data` chunk's header. A placeholder
/// `data` length (0 or `u32::MAX`, from a writer that cannot seek) is replaced by the largest
/// whole number of frames, so hound reads on until the input ends. Returns the header and
/// whether the length was such a placeholder.
fn read_wav_header(reader: &mut dyn Read, name: &str) -> Result<(Vec<u8>, bool)> {
    let mut head = vec![0u8; 12];
    let n = read_up_to(reader, &mut head).with_context(|| format!("{name}: cannot read"))?;
    if n == 0 {
        bail!(Audio, "{name}: no audio (the input is empty)");
    }
    if n < 12 || &head[..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        bail!(
            Audio,
            "{name}: not a WAV stream (it starts with {:02x?}); give a WAV (`arecord -t wav`, `ffmpeg -f wav -`) or headerless samples with --raw s16le|f32le --rate HZ",
            &head[..n.min(8)]
        );
    }
    let mut block_align = 0u32;
    loop {
        let at = head.len();
        head.resize(at + 8, 0);
        if read_up_to(reader, &mut head[at..])? < 8 {
            bail!(
                Audio,
                "{name}: invalid WAV header: the input ends before the `data` chunk"
            );
        }
        let size = u32::from_le_bytes(head[at + 4..at + 8].try_into().expect("4 bytes"));
        if &head[at..at + 4] == b"data" {
            let placeholder = size == 0 || size == u32::MAX;
            if placeholder {
                if block_align == 0 {
                    bail!(
                        Audio,
                        "{name}: invalid WAV header: no `fmt ` chunk before `data`"
                    );
                }
                let frames = u32::MAX - u32::MAX % block_align;
                head[at + 4..at + 8].copy_from_slice(&frames.to_le_bytes());
            }
            return Ok((head, placeholder));
        }
        // Chunks are padded to an even length.
        let body = size as usize + (size as usize & 1);
        if at + 8 + body > MAX_WAV_HEADER {
            bail!(
                Audio,
                "{name}: invalid WAV header: no `data` chunk in its first {MAX_WAV_HEADER} bytes"
            );
        }
        let start = head.len();
        head.resize(start + body, 0);
        if read_up_to(reader, &mut head[start..])? < body {
            bail!(
                Audio,
                "{name}: invalid WAV header: the input ends inside a chunk"
            );
        }
        if &head[at..at + 4] == b"fmt " && body >= 14 {
            block_align = u32::from(u16::from_le_bytes([head[start + 12], head[start + 13]]));
        }
    }
}

/// A file the audio room decodes whole (FLAC, MP3, Ogg, ...), handed out in pieces.
pub struct DecodedFile {
    name: String,
    audio: audio::Audio,
    at: usize,
}

impl AudioSource for DecodedFile {
    fn name(&self) -> &str {
        &self.name
    }

    fn sample_rate(&self) -> u32 {
        self.audio.sample_rate
    }

    fn next_piece(&mut self) -> Result<Option<Vec<f32>>> {
        let samples = &self.audio.samples;
        if self.at >= samples.len() {
            return Ok(None);
        }
        let end = (self.at + piece_frames(self.audio.sample_rate)).min(samples.len());
        let piece = samples[self.at..end].to_vec();
        self.at = end;
        Ok(Some(piece))
    }
}

/// How the samples of a stream are laid out when they come without a header.
#[derive(Clone, Copy, Debug)]
pub struct RawLayout {
    pub format: RawFormat,
    pub rate: u32,
    pub channels: u16,
}

/// Opens standard input: a WAV stream, or headerless samples in `raw`'s layout.
pub fn open_stdin(raw: Option<RawLayout>) -> Result<Box<dyn AudioSource>> {
    open_reader(io::stdin(), "<stdin>", raw, true)
}

/// [`open_stdin`] whose input ends as soon as `stop` turns true, even while the writer is
/// silent (Ctrl-C while reading a slow pipe).
pub fn open_stdin_until(
    raw: Option<RawLayout>,
    stop: &'static AtomicBool,
) -> Result<Box<dyn AudioSource>> {
    open_reader(
        StoppableReader::new(io::stdin(), stop),
        "<stdin>",
        raw,
        true,
    )
}

/// A reader read on a thread of its own, so that a stop request ends it at once: a read from
/// a pipe blocks until the writer writes, and a signal does not interrupt it.
pub struct StoppableReader {
    chunks: Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
    stop: &'static AtomicBool,
}

/// How often a reader waiting for data looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

impl StoppableReader {
    pub fn new<R: Read + Send + 'static>(mut reader: R, stop: &'static AtomicBool) -> Self {
        // A few chunks ahead at most: the reading thread waits for the stream as the pump does.
        let (tx, chunks) = sync_channel(4);
        let spawned = std::thread::Builder::new()
            .name("input".into())
            .spawn(move || {
                loop {
                    let mut chunk = vec![0; 64 << 10];
                    let sent = match reader.read(&mut chunk) {
                        Ok(0) => break,
                        Ok(n) => {
                            chunk.truncate(n);
                            tx.send(Ok(chunk))
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => tx.send(Err(e)),
                    };
                    if sent.is_err() {
                        break;
                    }
                }
            });
        let chunks = match spawned {
            Ok(_) => chunks,
            Err(e) => {
                // No thread to read on: the error is what the stream reads.
                let (tx, rx) = sync_channel(1);
                let _ = tx.send(Err(e));
                rx
            }
        };
        StoppableReader {
            chunks,
            chunk: Vec::new(),
            at: 0,
            stop,
        }
    }
}

impl Read for StoppableReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(0);
            }
            match self.chunks.recv_timeout(STOP_POLL) {
                Ok(chunk) => {
                    self.chunk = chunk?;
                    self.at = 0;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Opens any reader as a stream (WAV unless `raw` says how its samples are laid out).
pub fn open_reader<R: Read + 'static>(
    reader: R,
    name: &str,
    raw: Option<RawLayout>,
    pipe: bool,
) -> Result<Box<dyn AudioSource>> {
    Ok(match raw {
        Some(l) => Box::new(RawStream::new(reader, name, l.format, l.rate, l.channels)?),
        None => open_wav(reader, name, pipe)?,
    })
}

/// A WAV read as it arrives when hound reads its encoding (PCM, 32-bit float); any other
/// (mu-law, A-law, 64-bit float, ADPCM) is read to its end and decoded whole by the audio room,
/// as `transcribe` decodes it.
fn open_wav<R: Read + 'static>(
    mut reader: R,
    name: &str,
    pipe: bool,
) -> Result<Box<dyn AudioSource>> {
    let (header, open_ended) = read_wav_header(&mut reader, name)?;
    if hound::WavReader::new(Cursor::new(&header[..])).is_ok() {
        return Ok(Box::new(WavStream::from_header(
            header, open_ended, reader, name, pipe,
        )?));
    }
    let mut bytes = header;
    reader
        .read_to_end(&mut bytes)
        .with_context(|| format!("{name}: cannot read"))?;
    let audio = audio::decode_bytes(&bytes, name)?;
    Ok(Box::new(DecodedFile {
        name: name.to_string(),
        audio,
        at: 0,
    }))
}

/// Opens a file: raw samples with `raw`; a WAV is read as it is needed (a FIFO like a pipe);
/// any other format is decoded whole by the audio room, then handed out in pieces.
pub fn open_file(path: &Path, raw: Option<RawLayout>) -> Result<Box<dyn AudioSource>> {
    open_file_until(path, raw, None)
}

/// [`open_file`] whose input ends as soon as `stop` turns true, even while a named pipe's
/// writer is silent.
pub fn open_file_until(
    path: &Path,
    raw: Option<RawLayout>,
    stop: Option<&'static AtomicBool>,
) -> Result<Box<dyn AudioSource>> {
    let name = path.display().to_string();
    let mut file = File::open(path).with_context(|| format!("cannot open {name}"))?;
    let pipe = !file.metadata().map(|m| m.is_file()).unwrap_or(false);
    if raw.is_some() || pipe {
        return match stop {
            Some(stop) if pipe => open_reader(StoppableReader::new(file, stop), &name, raw, pipe),
            _ => open_reader(file, &name, raw, pipe),
        };
    }
    let mut magic = [0u8; 12];
    let n = read_up_to(&mut file, &mut magic).with_context(|| format!("cannot read {name}"))?;
    let rest = Cursor::new(magic[..n].to_vec()).chain(file);
    if n == 12 && &magic[..4] == b"RIFF" && &magic[8..] == b"WAVE" {
        return open_wav(rest, &name, false);
    }
    drop(rest);
    let audio = audio::load_audio(path)?;
    Ok(Box::new(DecodedFile { name, audio, at: 0 }))
}
