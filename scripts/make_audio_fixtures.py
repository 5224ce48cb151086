#!/usr/bin/env python3
"""Writes the small audio-format fixtures of tests/pipeline/audio.rs and their reference decodings.

Each fixture is a short deterministic test signal written by libsndfile (through the
`soundfile` package) in one container/codec; `<fixture>.npy` next to it is libsndfile's own
decoding of that file as float32, averaged to mono. libsndfile is what NeMo reads audio with, so
these references also pin the sample scaling (int16 / 32768, etc.).

Usage: pip install numpy soundfile && python3 scripts/make_audio_fixtures.py
"""
from pathlib import Path

import numpy as np
import soundfile as sf

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "audio" / "formats"

# name, sample rate, channels, duration (s), soundfile format, subtype
FIXTURES = [
    ("s16_stereo_22050_info.wav", 22050, 2, 0.25, "WAV", "PCM_16"),
    ("u8_mono_8000.wav", 8000, 1, 0.25, "WAV", "PCM_U8"),
    ("s24_stereo_44100_ext.wav", 44100, 2, 0.1, "WAVEX", "PCM_24"),
    ("s32_mono_48000.wav", 48000, 1, 0.1, "WAV", "PCM_32"),
    ("f32_stereo_22050.wav", 22050, 2, 0.1, "WAV", "FLOAT"),
    ("f64_mono_22050.wav", 22050, 1, 0.1, "WAV", "DOUBLE"),
    ("ulaw_mono_8000.wav", 8000, 1, 0.25, "WAV", "ULAW"),
    ("alaw_mono_8000.wav", 8000, 1, 0.25, "WAV", "ALAW"),
    ("s16_3ch_16000.wav", 16000, 3, 0.1, "WAVEX", "PCM_16"),
    ("s24_stereo_44100.flac", 44100, 2, 0.1, "FLAC", "PCM_24"),
    ("s16_stereo_22050.aiff", 22050, 2, 0.25, "AIFF", "PCM_16"),
    ("mono_22050.mp3", 22050, 1, 0.5, "MP3", "MPEG_LAYER_III"),
    ("stereo_22050.ogg", 22050, 2, 0.5, "OGG", "VORBIS"),
]


def signal(rate: int, channels: int, seconds: float) -> np.ndarray:
    """Tones, a chirp and a little noise, different in each channel, peak < 0.9."""
    t = np.arange(int(rate * seconds)) / rate
    rng = np.random.default_rng(rate + channels)
    chans = []
    for c in range(channels):
        f0 = 220.0 * (c + 1)
        x = 0.4 * np.sin(2 * np.pi * f0 * t + c)
        x += 0.2 * np.sin(2 * np.pi * (300 + 0.4 * rate * t / seconds) * t)  # chirp
        x += 0.05 * rng.standard_normal(len(t))
        chans.append(x * np.minimum(1.0, 20 * t))  # short fade-in
    return np.stack(chans, axis=1)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rate, channels, seconds, fmt, subtype in FIXTURES:
        path = OUT / name
        with sf.SoundFile(path, "w", rate, channels, subtype, format=fmt) as f:
            if name.endswith("_info.wav"):
                f.title = "fixture with a LIST/INFO chunk"
            f.write(signal(rate, channels, seconds))
        decoded, _ = sf.read(path, dtype="float32", always_2d=True)
        mono = decoded.mean(axis=1, dtype=np.float32)
        np.save(path.with_name(name + ".npy"), mono.astype("<f4"))
        print(f"{name}: {path.stat().st_size} bytes, {len(mono)} frames")


if __name__ == "__main__":
    main()
