//! The default microphone, through cpal (feature `mic`). The device's callback thread mixes each
//! buffer to mono and sends it over a channel; [`Microphone::next_piece`] waits on that channel.

use super::input::AudioSource;
use crate::error::{Error, Result};
use crate::{bail, err};
use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{FromSample, SampleFormat, SizedSample};
use std::sync::mpsc::{Receiver, Sender, channel};

/// A running capture from the default input device.
pub struct Microphone {
    name: String,
    rate: u32,
    pieces: Receiver<Result<Vec<f32>, String>>,
    /// Capture stops when the stream is dropped.
    _stream: cpal::Stream,
}

impl Microphone {
    /// Opens the default input device at its default configuration and starts capturing.
    pub fn open() -> Result<Self> {
        let host = cpal::default_host();
        let Some(device) = host.default_input_device() else {
            return Err(Error::Io {
                message: format!(
                    "no microphone: the audio system ({}) has no default input device; {ELSE}",
                    host.id().name()
                ),
                kind: std::io::ErrorKind::NotFound,
            });
        };
        let name = device.description().map_or_else(
            |_| "the default microphone".to_string(),
            |d| d.name().to_string(),
        );
        let config = device
            .default_input_config()
            .map_err(|e| device_error(&name, "cannot read its configuration", &e))?;
        let (tx, rx) = channel();
        let stream = match config.sample_format() {
            SampleFormat::F32 => build::<f32>(&device, config.config(), tx),
            SampleFormat::I16 => build::<i16>(&device, config.config(), tx),
            SampleFormat::I32 => build::<i32>(&device, config.config(), tx),
            SampleFormat::U16 => build::<u16>(&device, config.config(), tx),
            SampleFormat::U8 => build::<u8>(&device, config.config(), tx),
            other => bail!(
                Internal,
                "microphone {name}: its sample format {other} is not supported"
            ),
        }
        .map_err(|e| device_error(&name, "cannot open it", &e))?;
        stream
            .play()
            .map_err(|e| device_error(&name, "cannot start capturing", &e))?;
        Ok(Self {
            name,
            rate: config.sample_rate(),
            pieces: rx,
            _stream: stream,
        })
    }
}

/// What to do without a microphone.
const ELSE: &str = "give a file, or pipe audio to `-`";

/// A failure of the microphone `name` while doing `what`. A device that is not there or not
/// permitted is the user's machine, reported as a missing or forbidden file is (exit 2): no
/// microphone to listen to; any other failure is ours.
fn device_error(name: &str, what: &str, e: &cpal::Error) -> Error {
    use cpal::ErrorKind as K;
    use std::io::ErrorKind as Io;
    let kind = match e.kind() {
        K::DeviceNotAvailable | K::HostUnavailable => Io::NotFound,
        K::PermissionDenied => Io::PermissionDenied,
        _ => return err!(Internal, "microphone {name}: {what}: {e}"),
    };
    Error::Io {
        message: format!("no microphone: {name}: {what}: {e}; {ELSE}"),
        kind,
    }
}

fn build<T>(
    device: &cpal::Device,
    config: cpal::StreamConfig,
    tx: Sender<Result<Vec<f32>, String>>,
) -> Result<cpal::Stream, cpal::Error>
where
    T: SizedSample,
    f32: FromSample<T>,
{
    let channels = usize::from(config.channels.max(1));
    let errors = tx.clone();
    device.build_input_stream::<T, _, _>(
        config,
        move |data: &[T], _| {
            let mono = data
                .chunks_exact(channels)
                .map(|frame| {
                    frame.iter().map(|&s| s.to_sample::<f32>()).sum::<f32>() / channels as f32
                })
                .collect();
            // The reader gone means the stream is being shut down.
            let _ = tx.send(Ok(mono));
        },
        move |e| {
            let _ = errors.send(Err(e.to_string()));
        },
        None,
    )
}

impl AudioSource for Microphone {
    fn name(&self) -> &str {
        &self.name
    }

    fn sample_rate(&self) -> u32 {
        self.rate
    }

    fn next_piece(&mut self) -> Result<Option<Vec<f32>>> {
        match self.pieces.recv() {
            Ok(Ok(piece)) => Ok(Some(piece)),
            Ok(Err(e)) => bail!(Internal, "microphone {}: {e}", self.name),
            Err(_) => Ok(None),
        }
    }

    fn is_live(&self) -> bool {
        true
    }
}
