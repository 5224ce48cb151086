"""Speech detection from Python: ``parakeet.vad`` against the silero-vad package's reference
segments (tests/fixtures/vad, every parameter set, sample for sample), and
``Model.transcribe(vad=...)``: the package's segments, each transcribed as alone and shifted
to its start; empty and silent audio, and bad parameters.
"""

import json
import wave
from pathlib import Path

import numpy as np
import pytest

import parakeet

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
VAD = FIXTURES / "vad"
LONG_SILENCE = VAD / "audio" / "speech_long_silence.wav"
SETS = ["default", "sensitive", "split_max", "split_legacy"]


@pytest.fixture(scope="module")
def tdt(tmp_path_factory):
    import os

    os.environ.setdefault("PARAKEET_CACHE", str(tmp_path_factory.mktemp("cache")))
    return parakeet.Model(str(FIXTURES / "tiny_tdt.nemo"), threads=2, workers=1)


def package(clip, parameter_set):
    """The package's keywords and segments (samples) for a clip and parameter set."""
    ref = json.loads((VAD / clip / "segments.json").read_text())["segments"][parameter_set]
    p = ref["params"]
    kwargs = {
        "threshold": p["threshold"],
        "neg_threshold": p["neg_threshold"],
        "min_speech_ms": p["min_speech_duration_ms"],
        "max_speech_s": p["max_speech_duration_s"],
        "min_silence_ms": p["min_silence_duration_ms"],
        "speech_pad_ms": p["speech_pad_ms"],
        "min_silence_at_max_speech_ms": p["min_silence_at_max_speech"],
        "legacy_max_speech_split": not p["use_max_poss_sil_at_max_speech"],
    }
    return kwargs, [(s["start"], s["end"]) for s in ref["segments"]]


def samples(path):
    with wave.open(str(path)) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


@pytest.mark.parametrize("clip", ["jfk", "speech_long_silence", "sonnet1_librivox_16k"])
@pytest.mark.parametrize("parameter_set", SETS)
def test_segments_equal_the_package_s(clip, parameter_set):
    kwargs, want = package(clip, parameter_set)
    got = parakeet.vad(VAD / "audio" / f"{clip}.wav", **kwargs)
    assert [(s["start_sample"], s["end_sample"]) for s in got] == want
    assert [(s["start"], s["end"]) for s in got] == [(a / 16000, b / 16000) for a, b in want]


def test_arrays_and_8khz_equal_the_package_s():
    _, want = package("speech_long_silence", "default")
    data, rate = samples(LONG_SILENCE)
    for array in [data, data.astype(np.float32) / 32768]:
        got = parakeet.vad(array, sample_rate=rate)
        assert [(s["start_sample"], s["end_sample"]) for s in got] == want
    _, want = package("ldc93s1_8k_s16", "default")
    got = parakeet.vad(VAD / "audio" / "ldc93s1_8k_s16.wav")
    assert [(s["start_sample"], s["end_sample"]) for s in got] == want
    assert got[0]["start"] == want[0][0] / 8000


def test_transcribe_with_vad_is_each_segment_alone(tdt):
    _, want = package("speech_long_silence", "default")
    data, rate = samples(LONG_SILENCE)
    t = tdt.transcribe(LONG_SILENCE, vad=True)
    assert t.speech == [(a / 16000, b / 16000) for a, b in want]
    assert t.audio_seconds == len(data) / 16000
    assert "vad" in t.timings
    texts, words = [], []
    for a, b in want:
        alone = tdt.transcribe(data[a:b], sample_rate=rate)
        texts += [alone.text.strip()] if alone.text.strip() else []
        words += [(w.word, w.start + a / 16000, w.end + a / 16000) for w in alone.words]
    assert t.text == " ".join(texts)
    assert len(t.words) == len(words) > 5
    for w, (text, start, end) in zip(t.words, words):
        assert w.word == text
        assert w.start == pytest.approx(start, abs=1e-9)
        assert w.end == pytest.approx(end, abs=1e-9)
    # A dict of vad()'s keywords: the package's segments for those parameters.
    kwargs, want = package("speech_long_silence", "sensitive")
    t = tdt.transcribe(LONG_SILENCE, vad=kwargs)
    assert t.speech == [(a / 16000, b / 16000) for a, b in want]
    assert tdt.transcribe(LONG_SILENCE, vad=False).speech is None


def test_empty_and_silent_audio_have_no_speech(tdt):
    empty = np.zeros(0, np.float32)
    assert parakeet.vad(empty, sample_rate=16000) == []
    assert parakeet.vad(VAD / "audio" / "silence_5s.wav") == []
    t = tdt.transcribe(VAD / "audio" / "silence_5s.wav", vad=True)
    assert (t.text, t.speech, len(t.words)) == ("", [], 0)
    # Empty audio is an error to transcribe, with vad= or without: it holds nothing at all.
    for vad in [False, True]:
        with pytest.raises(ValueError, match="contains no audio samples"):
            tdt.transcribe(empty, sample_rate=16000, vad=vad)


def test_bad_parameters_are_value_errors(tdt, tmp_path):
    clip = VAD / "audio" / "jfk.wav"
    for kwargs, message in [
        ({"threshold": 1.5}, "threshold 1.5: must be between 0 and 1"),
        ({"threshold": 0}, "threshold 0"),
        ({"neg_threshold": 0.7}, "neg_threshold 0.7: must not be above the threshold"),
        ({"min_speech_ms": -1}, "min_speech_ms -1: must be a number of milliseconds from 0 to"),
        ({"max_speech_s": -2}, "max_speech_s -2"),
    ]:
        with pytest.raises(ValueError, match=message):
            parakeet.vad(clip, **kwargs)
        with pytest.raises(ValueError, match=message):
            tdt.transcribe(clip, vad=kwargs)
    with pytest.raises(TypeError, match="min_silence"):
        parakeet.vad(clip, min_silence=3)
    with pytest.raises(TypeError, match="vad= takes True, False or a dict"):
        tdt.transcribe(clip, vad="yes")
    with pytest.raises(ValueError, match="needs sample_rate="):
        parakeet.vad(np.zeros(16000, np.float32))
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(clip.read_bytes()[:4000])
    with pytest.raises(parakeet.ParakeetError, match="not a Silero VAD model"):
        parakeet.vad(clip, model=corrupt)
    with pytest.raises(FileNotFoundError):
        parakeet.vad(tmp_path / "missing.wav")
