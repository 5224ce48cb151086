"""Diarization from Python against NeMo's reference outputs of the tiny Sortformers:
``parakeet.diarize`` (probabilities and NeMo's segments) and ``Model.transcribe(diarize=True)``
(every word's speaker as NeMo's probabilities give it), and bad input.
"""

import json
import wave
from pathlib import Path

import numpy as np
import pytest

import parakeet

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SPEECH = FIXTURES / "reference" / "speech_10s.wav"
JFK = FIXTURES / "diar" / "audio" / "jfk.wav"
OFFLINE = FIXTURES / "tiny_sortformer.nemo"
STREAMING = FIXTURES / "tiny_sortformer_stream.nemo"
# Probabilities within this of NeMo's.
PROB_TOL = 1e-4


def ref_dir(model, clip):
    return FIXTURES / "diar" / f"{model}_diar" / clip


def nemo_lines(model, section, params):
    result = json.loads((ref_dir(model, "speech_10s") / "result.json").read_text())
    return result[section]["postprocessing"][params]["lines"]


def lines(d):
    return [f"{s.start:.3f} {s.end:.3f} speaker_{s.speaker}" for s in d.segments]


def read_wav(path):
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


@pytest.fixture(scope="module")
def ctc():
    return parakeet.Model(FIXTURES / "tiny_ctc.nemo", threads=2, workers=1)


def test_offline_model_gives_nemos_probabilities_and_segments():
    d = parakeet.diarize(SPEECH, OFFLINE, threads=2)
    nemo = np.load(ref_dir("tiny_sortformer", "speech_10s") / "preds.npy")
    assert d.probabilities.shape == nemo.shape
    assert np.abs(d.probabilities - nemo).max() <= PROB_TOL
    assert d.frame_seconds == pytest.approx(0.08)
    assert lines(d) == nemo_lines("tiny_sortformer", "offline", "default")
    d = parakeet.diarize(SPEECH, OFFLINE, threads=2, params="callhome")
    assert lines(d) == nemo_lines(
        "tiny_sortformer", "offline", "sortformer_diar_4spk-v1_callhome-part1"
    )
    # The same set value by value.
    d = parakeet.diarize(
        SPEECH,
        OFFLINE,
        onset=0.53,
        offset=0.49,
        pad_onset=0.23,
        pad_offset=0.01,
        min_duration_on=0.42,
        min_duration_off=0.34,
    )
    assert lines(d) == nemo_lines(
        "tiny_sortformer", "offline", "sortformer_diar_4spk-v1_callhome-part1"
    )


def test_streaming_model_streams_with_nemos_sizes():
    samples, rate = read_wav(SPEECH)
    d = parakeet.diarize(samples, STREAMING, rate, threads=2)
    nemo = np.load(ref_dir("tiny_sortformer_stream", "speech_10s") / "stream_published_preds.npy")
    assert np.abs(d.probabilities - nemo).max() <= PROB_TOL
    assert lines(d) == nemo_lines(
        "tiny_sortformer_stream", "streaming_published_params", "default"
    )


def nemo_speaker(preds, start, end):
    """The speaker NeMo's probabilities make most active over [start, end]: each millisecond
    counts the frame (80 ms) it falls in; None when the top two are within 1e-3 (a tie our
    1e-4 probabilities could break either way)."""
    a, b = round(start * 1000), round(end * 1000)
    frames = np.minimum(np.arange(a, max(b, a + 1)) // 80, len(preds) - 1)
    score = preds[frames].astype(np.float64).sum(axis=0)
    best, second = np.sort(score)[::-1][:2]
    if best - second <= 1e-3 * best:
        return None
    return int(np.argmax(score))


@pytest.mark.parametrize(
    "sortformer, preds",
    [
        (OFFLINE, ref_dir("tiny_sortformer", "jfk") / "preds.npy"),
        (STREAMING, ref_dir("tiny_sortformer_stream", "jfk") / "stream_published_preds.npy"),
    ],
)
def test_words_get_the_speakers_nemos_probabilities_give_them(ctc, sortformer, preds):
    preds = np.load(preds)
    r = ctc.transcribe(JFK, diarize=True, diar_model=sortformer)
    assert len(r.words) >= 10
    compared = 0
    for w in r.words:
        want = nemo_speaker(preds, w.start, w.end)
        if want is not None:
            assert w.speaker == want, w
            compared += 1
    assert r.to_dict()["words"][0]["speaker"] == r.words[0].speaker
    assert compared >= 0.9 * len(r.words)
    assert len({w.speaker for w in r.words}) >= 2
    # Without diarize, no speakers.
    assert all(w.speaker is None for w in ctc.transcribe(JFK).words)


def test_bad_input_is_a_value_error(ctc):
    asr = FIXTURES / "tiny_ctc.nemo"
    with pytest.raises(ValueError, match="not a Sortformer diarization model"):
        ctc.transcribe(JFK, diar_model=asr)
    with pytest.raises(ValueError, match="not a Sortformer diarization model"):
        parakeet.diarize(JFK, asr)
    with pytest.raises(ValueError, match="onset"):
        parakeet.diarize(JFK, OFFLINE, onset=1.5)
    with pytest.raises(ValueError, match="ami"):
        parakeet.diarize(JFK, OFFLINE, params="ami")
    with pytest.raises(ValueError, match="too short"):
        parakeet.diarize(np.zeros(100, np.float32), OFFLINE, 16000)
    # The command line's thread rule, as Model's: 0 refused, beyond the cores capped.
    with pytest.raises(ValueError, match="--threads 0: at least 1 thread"):
        parakeet.diarize(JFK, OFFLINE, threads=0)
    with pytest.warns(UserWarning, match="more than the"):
        parakeet.diarize(JFK, OFFLINE, threads=10_000)
