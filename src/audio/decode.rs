//! Audio decoding to mono f32: PCM/float WAV through `hound` (simple, exact integer scaling),
//! everything else (FLAC, MP3, Ogg Vorbis, AIFF, CAF, MP4/AAC/ALAC, and WAV flavours `hound` does
//! not read: μ-law, A-law, 64-bit float, ...) through `symphonia`.
//!
//! Integer PCM is scaled by `2^-(bits-1)` (16-bit: `i16 / 32768`), the same as NeMo's reader
//! (libsndfile), so 16-bit input reaches the features bit-exact. Channels are averaged to mono.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, Cursor, Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Context, Error, Fault, Result, is_users_io};
use crate::{bail, err};
use symphonia::core::codecs::audio::{AudioDecoder, AudioDecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;

/// Decoded audio, mixed down to mono at its original sample rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Mono samples in [-1, 1].
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// Channel count of the source, before the mixdown.
    pub channels_in: u16,
    pub duration_s: f64,
}

/// Sample rates accepted from a header. Telephony's 8 kHz and below down to 1 kHz still
/// resample sensibly; above 768 kHz no real recorder exists, and a corrupt header's huge rate
/// would make the resampler's filter (one input block per output block) gigabytes long.
pub const MIN_SAMPLE_RATE: u32 = 1_000;
pub const MAX_SAMPLE_RATE: u32 = 768_000;

/// Largest sample magnitude accepted. Integer PCM decodes to [-1, 1]; float files may exceed it
/// (headroom, or floats written at integer scale, up to 32768), but values near f32's range
/// turn into inf and NaN inside the resampler's FFT and the STFT.
pub const MAX_SAMPLE_MAGNITUDE: f32 = 1e6;

/// Refuses a header's sample rate outside [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`], before
/// any sample is decoded.
pub(crate) fn check_sample_rate(rate: u32) -> Result<()> {
    if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
        bail!(
            Audio,
            "sample rate {rate} Hz is outside the supported {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz \
             (corrupt header?)"
        );
    }
    Ok(())
}

/// Refuses a sample that is not finite or beyond [`MAX_SAMPLE_MAGNITUDE`]: one NaN would
/// spread through the per-feature normalisation into every frame, and a finite value near
/// f32's limit overflows the resampler's FFT (found by the fuzzer). `first` is the index of
/// `samples[0]` in the whole audio (a stream checks it piece by piece), for the message.
pub fn check_samples(samples: &[f32], first: u64, sample_rate: u32) -> Result<()> {
    if let Some(i) = samples
        .iter()
        .position(|s| !s.is_finite() || s.abs() > MAX_SAMPLE_MAGNITUDE)
    {
        let v = samples[i];
        let value = if v.is_finite() {
            format!("{v:e}, beyond +-{MAX_SAMPLE_MAGNITUDE:e}")
        } else {
            v.to_string()
        };
        let i = first + i as u64;
        bail!(
            Audio,
            "sample {i} (at {:.3} s) is {value}: the audio data is corrupt",
            i as f64 / f64::from(sample_rate),
        );
    }
    Ok(())
}

/// Audio that decodes to no samples at all (a WAV with an empty `data` chunk): an error for
/// transcription, zero speech for voice activity detection, which finds it in the error chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSamples {
    /// The rate the header declares.
    pub sample_rate: u32,
}

impl std::fmt::Display for NoSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("contains no audio samples")
    }
}

impl NoSamples {
    /// The empty audio `e` reports, if that is its failure.
    pub fn find(e: &Error) -> Option<NoSamples> {
        match e {
            Error::NoSamples { sample_rate, .. } => Some(NoSamples {
                sample_rate: *sample_rate,
            }),
            _ => None,
        }
    }
}

impl Audio {
    fn new(samples: Vec<f32>, sample_rate: u32, channels_in: u16) -> Result<Self> {
        check_sample_rate(sample_rate)?;
        if samples.is_empty() {
            return Err(Error::NoSamples {
                message: NoSamples { sample_rate }.to_string(),
                sample_rate,
            });
        }
        check_samples(&samples, 0, sample_rate)?;
        let duration_s = samples.len() as f64 / f64::from(sample_rate);
        Ok(Self {
            samples,
            sample_rate,
            channels_in,
            duration_s,
        })
    }
}

impl Audio {
    /// Audio handed over as samples instead of a file (the Python package's arrays):
    /// `channels` interleaved channels at `sample_rate` Hz, mixed down to mono and checked as
    /// a decoded file's samples are (rate range, finite values in range). Errors say what is
    /// wrong with the samples, with no file to name.
    pub fn from_interleaved(samples: &[f32], channels: usize, sample_rate: u32) -> Result<Audio> {
        if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&sample_rate) {
            bail!(
                Audio,
                "sample rate {sample_rate} Hz is outside the supported {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz"
            );
        }
        if channels == 0 || channels > usize::from(MAX_WAV_CHANNELS) {
            bail!(
                Audio,
                "{channels} channels (1..={MAX_WAV_CHANNELS} supported)"
            );
        }
        let mono = samples.chunks_exact(channels).map(mean).collect();
        // At most 32 channels: the cast cannot truncate.
        Audio::new(mono, sample_rate, channels as u16)
    }
}

/// Decodes an audio file of any supported format. Pipes, FIFOs and devices (`<(cat x.wav)`)
/// cannot seek, and a WAV from a streaming writer has no length in its header: both are read
/// into memory first and decoded like standard input.
pub fn decode_file(path: &Path) -> Result<Audio> {
    if let Some(device) = super::windows_device(path) {
        bail!(
            Audio,
            "cannot decode audio file {}: {device} is a Windows device name, not a file",
            path.display()
        );
    }
    let decode = || {
        let mut file = File::open(path)?;
        let regular = file.metadata()?.is_file();
        if regular && !is_streamed_wav(&mut file)? {
            return decode_source(file, extension(path));
        }
        let bytes = read_recognised(&mut file, extension(path))?;
        decode_source(
            Cursor::new(with_streamed_wav_length(&bytes)),
            extension(path),
        )
    };
    decode()
        .map_err(audio_unless_users_io)
        .with_context(|| format!("cannot decode audio file {}", path.display()))
}

/// How much of a stream (a pipe, a device, standard input) is read before its format must be
/// recognised: every container's header fits, and an endless device (`/dev/zero`) named by
/// mistake is refused after this instead of read for ever.
const HEAD_BYTES: u64 = 1 << 20;

/// All of a stream that is audio: its first [`HEAD_BYTES`] must start a WAV or a container
/// symphonia recognises (`ext` hints which), else it is refused before the rest is read.
pub(crate) fn read_recognised(reader: &mut impl Read, ext: Option<&str>) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader.by_ref().take(HEAD_BYTES).read_to_end(&mut bytes)?;
    let riff = bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WAVE";
    if !riff && bytes.len() as u64 == HEAD_BYTES && !probe_recognises(&bytes, ext) {
        bail!(
            Audio,
            "not a recognised audio format (no known container in its first {} MiB)",
            HEAD_BYTES >> 20
        );
    }
    reader.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether symphonia finds a container at the start of `head` (one cut short by the end of
/// `head` counts as found: the rest of the stream holds the remainder).
fn probe_recognises(head: &[u8], ext: Option<&str>) -> bool {
    let stream = MediaSourceStream::new(Box::new(Cursor::new(head.to_vec())), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = ext {
        hint.with_extension(ext);
    }
    // As decode_symphonia_guarded: a corrupt header must not take the process down.
    let probed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        symphonia::default::get_probe()
            .probe(
                &hint,
                stream,
                FormatOptions::default(),
                MetadataOptions::default(),
            )
            .map(|_| ())
    }));
    match probed {
        Ok(Ok(())) => true,
        Ok(Err(SymphoniaError::IoError(e))) => e.kind() == io::ErrorKind::UnexpectedEof,
        Ok(Err(_)) | Err(_) => false,
    }
}

/// Whether the file is a WAV whose `data` size is a streaming placeholder (rewinds the file).
fn is_streamed_wav(file: &mut File) -> io::Result<bool> {
    let len = file.metadata()?.len();
    let mut head = Vec::with_capacity(4096);
    file.by_ref().take(1 << 16).read_to_end(&mut head)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(streamed_data_chunk(&head, len).is_some())
}

/// Decodes an in-memory audio file (e.g. read from stdin). `name` names it in errors, and its
/// extension, if any, hints the container format.
pub fn decode_bytes(bytes: &[u8], name: &str) -> Result<Audio> {
    let bytes = with_streamed_wav_length(bytes);
    decode_source(Cursor::new(bytes), extension(Path::new(name)))
        .map_err(audio_unless_users_io)
        .with_context(|| format!("cannot decode audio from {name}"))
}

/// A failure to read the file the user named is I/O; any other reading failure (a truncated
/// stream, a seek a container cannot take) is the audio's.
pub(crate) fn audio_unless_users_io(e: Error) -> Error {
    match e {
        Error::Io { kind, .. } if is_users_io(kind) => e,
        Error::Io { message, .. } => Error::Audio(message),
        e => e,
    }
}

fn extension(path: &Path) -> Option<&str> {
    path.extension().and_then(|e| e.to_str())
}

/// Uses `hound` for RIFF/WAVE PCM and float, and falls back to `symphonia` for anything `hound`
/// rejects at the header (other codecs, 64-bit float, unusual `fmt` chunks) or that is not WAV.
fn decode_source<'a, S: MediaSource + 'a>(mut source: S, ext: Option<&str>) -> Result<Audio> {
    if source.byte_len() == Some(0) {
        bail!(Audio, "the file is empty");
    }
    if !is_riff_wave(&mut source)? {
        return decode_symphonia_guarded(source, ext).map_err(Symphonia::into_error);
    }
    let hound_err = match hound::WavReader::new(io::BufReader::new(&mut source)) {
        Ok(reader) => return decode_wav(reader),
        Err(e) => e,
    };
    source.seek(SeekFrom::Start(0))?;
    check_wav_channels(&mut source)?;
    // Symphonia reads the WAV flavours hound does not. When it cannot make sense of the header
    // either, hound's account of it is the one worth showing; past the header, symphonia's own
    // (one message, never both parsers').
    decode_symphonia_guarded(source, ext).map_err(|e| match e {
        Symphonia::Unrecognised(_) => err!(Audio, "invalid WAV header: {hound_err}"),
        Symphonia::Failed(e) => e,
    })
}

/// [`decode_symphonia`], with a panic inside symphonia made an error: its header arithmetic
/// overflows on some corrupt WAV and AIFF headers (found by fuzzing; a panic in builds with
/// overflow checks), and such a file is an error like any other.
fn decode_symphonia_guarded<'a, S: MediaSource + 'a>(
    source: S,
    ext: Option<&str>,
) -> Result<Audio, Symphonia> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode_symphonia(source, ext)
    }))
    .unwrap_or_else(|_| {
        Err(Symphonia::Unrecognised(
            "corrupt header (the decoder's arithmetic overflowed)".into(),
        ))
    })
}

/// More channels than any speech recording has; symphonia's channel-mask arithmetic overflows
/// on counts past 32 (found by fuzzing).
const MAX_WAV_CHANNELS: u16 = 32;

/// Refuses a RIFF/WAVE `fmt ` chunk declaring 0 or more than [`MAX_WAV_CHANNELS`] channels
/// (rewinds the source).
fn check_wav_channels<S: Read + Seek>(source: &mut S) -> Result<()> {
    let mut head = Vec::with_capacity(4096);
    source.by_ref().take(4096).read_to_end(&mut head)?;
    source.seek(SeekFrom::Start(0))?;
    let mut pos = 12;
    while pos + 8 <= head.len() {
        let size = u32::from_le_bytes(head[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if &head[pos..pos + 4] == b"fmt " {
            if let Some(c) = head.get(pos + 10..pos + 12) {
                let channels = u16::from_le_bytes([c[0], c[1]]);
                if channels == 0 || channels > MAX_WAV_CHANNELS {
                    bail!(
                        Audio,
                        "invalid WAV header: {channels} channels (1..={MAX_WAV_CHANNELS} supported)"
                    );
                }
            }
            return Ok(());
        }
        pos = pos + 8 + size as usize + (size as usize & 1);
    }
    Ok(())
}

/// Why symphonia gave no audio: it could not read the container's header or find a codec for
/// it, or the audio it found is bad.
enum Symphonia {
    Unrecognised(String),
    Failed(Error),
}

impl From<Error> for Symphonia {
    fn from(e: Error) -> Symphonia {
        Symphonia::Failed(e)
    }
}

impl Symphonia {
    fn into_error(self) -> Error {
        match self {
            Symphonia::Unrecognised(m) => Error::Audio(m),
            Symphonia::Failed(e) => e,
        }
    }
}

/// Peeks at the first 12 bytes for `RIFF....WAVE`, then rewinds.
fn is_riff_wave<S: Read + Seek>(source: &mut S) -> io::Result<bool> {
    let mut header = [0u8; 12];
    let mut filled = 0;
    while filled < header.len() {
        match source.read(&mut header[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    source.seek(SeekFrom::Start(0))?;
    Ok(filled == header.len() && &header[..4] == b"RIFF" && &header[8..] == b"WAVE")
}

fn decode_wav<R: Read>(mut reader: hound::WavReader<R>) -> Result<Audio> {
    let spec = reader.spec();
    let channels = usize::from(spec.channels);
    if channels == 0 {
        bail!(Audio, "WAV header declares 0 channels");
    }
    check_sample_rate(spec.sample_rate)?;
    let declared = reader.len();
    let mono = match spec.sample_format {
        hound::SampleFormat::Float => read_mono(reader.samples::<f32>(), channels, declared)?,
        hound::SampleFormat::Int => {
            // Exact power-of-two scale: i16 / 32768, i24 / 2^23, ...
            let scale = 2f32.powi(1 - i32::from(spec.bits_per_sample));
            let scaled = reader.samples::<i32>().map(|s| s.map(|s| s as f32 * scale));
            read_mono(scaled, channels, declared)?
        }
    };
    Audio::new(mono, spec.sample_rate, spec.channels)
}

/// Mixes interleaved WAV samples down to mono as they are read, so a long multichannel file is
/// never held interleaved. A read error means the data ends before its declared length.
fn read_mono(
    samples: impl Iterator<Item = hound::Result<f32>>,
    channels: usize,
    declared: u32,
) -> Result<Vec<f32>> {
    // The header's length is untrusted: reserve at most 16 MiB up front, grow past that.
    let mut mono = Vec::with_capacity((declared as usize / channels).min(1 << 22));
    let mut frame = Vec::with_capacity(channels);
    for (read, sample) in samples.enumerate() {
        let sample = sample.map_err(|e| {
            err!(
                Audio,
                "truncated WAV data: {read} of {declared} declared samples ({e})"
            )
        })?;
        frame.push(sample);
        if frame.len() == channels {
            mono.push(mean(&frame));
            frame.clear();
        }
    }
    Ok(mono)
}

/// The mono mix of one frame: f32 sum, then divide (numpy's `mean` over 2 channels, as NeMo).
fn mean(frame: &[f32]) -> f32 {
    frame.iter().sum::<f32>() / frame.len() as f32
}

fn decode_symphonia<'a, S: MediaSource + 'a>(
    source: S,
    ext: Option<&str>,
) -> Result<Audio, Symphonia> {
    let stream = MediaSourceStream::new(Box::new(source), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = ext {
        hint.with_extension(ext);
    }
    let mut format = symphonia::default::get_probe()
        .probe(
            &hint,
            stream,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            SymphoniaError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Symphonia::Failed(err!(
                    Audio,
                    "truncated file (it ends while the container is being read)"
                ))
            }
            e => Symphonia::Unrecognised(format!("not a recognised audio format ({e})")),
        })?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| Symphonia::Unrecognised("no audio track".into()))?;
    let track_id = track.id;
    let declared_frames = track.num_frames;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| Symphonia::Unrecognised("audio track has no codec parameters".into()))?;
    if let Some(rate) = params.sample_rate {
        check_sample_rate(rate)?;
    }
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map_err(|e| Symphonia::Unrecognised(format!("unsupported codec ({e})")))?;

    let mut mixer = Mixer::default();
    decode_packets(format.as_mut(), decoder.as_mut(), track_id, &mut mixer)?;
    if let Some(declared) = declared_frames
        && (mixer.samples.len() as u64) < declared
    {
        return Err(Symphonia::Failed(err!(
            Audio,
            "truncated audio: decoded {} of {declared} frames",
            mixer.samples.len()
        )));
    }
    let channels = u16::try_from(mixer.channels).fault(Error::Audio, "too many channels")?;
    Ok(Audio::new(mixer.samples, mixer.sample_rate, channels)?)
}

/// The duration a file declares in its header (WAV, FLAC, ...), without decoding it; `None`
/// when it declares none or cannot be read (the decoder then says why). Regular files only: a
/// pipe's bytes would be consumed.
pub fn declared_seconds(path: &Path) -> Option<f64> {
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    // symphonia's header arithmetic can panic on corrupt files (see the decoder's guard).
    std::panic::catch_unwind(|| probe_seconds(path))
        .ok()
        .flatten()
        .filter(|s| s.is_finite() && *s >= 0.0)
}

fn probe_seconds(path: &Path) -> Option<f64> {
    let file = File::open(path).ok()?;
    let stream = MediaSourceStream::new(Box::new(file), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = extension(path) {
        hint.with_extension(ext);
    }
    let format = symphonia::default::get_probe()
        .probe(
            &hint,
            stream,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .ok()?;
    let track = format.default_track(TrackType::Audio)?;
    let rate = track.codec_params.as_ref()?.audio()?.sample_rate?;
    Some(track.num_frames? as f64 / rate.max(1) as f64)
}

fn decode_packets(
    format: &mut dyn FormatReader,
    decoder: &mut dyn AudioDecoder,
    track_id: u32,
    mixer: &mut Mixer,
) -> Result<()> {
    loop {
        let packet = match format.next_packet() {
            Ok(Some(packet)) => packet,
            // End of stream; for chained Ogg streams (`ResetRequired`), the first one.
            Ok(None) | Err(SymphoniaError::ResetRequired) => return Ok(()),
            Err(SymphoniaError::IoError(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                bail!(Audio, "truncated audio: the stream ends inside a packet")
            }
            Err(e) => bail!(Audio, "cannot read the container: {e}"),
        };
        if packet.track_id != track_id {
            continue;
        }
        let buffer = decoder
            .decode(&packet)
            .map_err(|e| err!(Audio, "corrupt audio data ({e})"))?;
        mixer.push(&buffer)?;
    }
}

/// Accumulates decoded buffers as mono, checking the stream keeps one rate and layout.
#[derive(Default)]
struct Mixer {
    samples: Vec<f32>,
    sample_rate: u32,
    channels: usize,
    planes: Vec<Vec<f32>>,
}

impl Mixer {
    fn push(&mut self, buffer: &symphonia::core::audio::GenericAudioBufferRef<'_>) -> Result<()> {
        if buffer.frames() == 0 {
            return Ok(());
        }
        let rate = buffer.spec().rate();
        let channels = buffer.spec().channels().count();
        if channels == 0 {
            bail!(Audio, "decoded audio has no channels");
        }
        if self.channels == 0 {
            (self.sample_rate, self.channels) = (rate, channels);
        } else if (rate, channels) != (self.sample_rate, self.channels) {
            bail!(Audio, "the sample rate or channel count changes mid-stream");
        }
        buffer.copy_to_vecs_planar::<f32>(&mut self.planes);
        let mut frame = Vec::with_capacity(channels);
        for i in 0..buffer.frames() {
            frame.clear();
            frame.extend(self.planes.iter().map(|plane| plane[i]));
            self.samples.push(mean(&frame));
        }
        Ok(())
    }
}

/// A WAV piped from a streaming writer (`ffmpeg ... -f wav -`) cannot go back to fill in its
/// lengths, so its `data` chunk says 0 or `u32::MAX`. For in-memory input the real length is
/// known: patch it in, so such streams decode instead of reading as empty or truncated.
fn with_streamed_wav_length(bytes: &[u8]) -> Cow<'_, [u8]> {
    let Some((size_at, data_len)) = streamed_data_chunk(bytes, bytes.len() as u64) else {
        return Cow::Borrowed(bytes);
    };
    let mut patched = bytes.to_vec();
    let len = u32::try_from(data_len).unwrap_or(u32::MAX);
    patched[size_at..size_at + 4].copy_from_slice(&len.to_le_bytes());
    Cow::Owned(patched)
}

/// Offset of the size field of a RIFF/WAVE `data` chunk whose size is a streaming placeholder,
/// and the number of bytes actually following it, from the file's first bytes (`bytes`, which
/// must reach the `data` chunk header) and its total length.
fn streamed_data_chunk(bytes: &[u8], total_len: u64) -> Option<(usize, u64)> {
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let mut pos = 12;
    while pos + 8 <= bytes.len() {
        let id = &bytes[pos..pos + 4];
        let size = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().ok()?);
        let body = pos + 8;
        if id == b"data" {
            let placeholder = size == 0 || size == u32::MAX;
            return placeholder.then_some((pos + 4, total_len.saturating_sub(body as u64)));
        }
        // Chunks are padded to an even length.
        pos = body
            .checked_add(size as usize)?
            .checked_add(size as usize & 1)?;
    }
    None
}
