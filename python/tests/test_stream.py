"""Live transcription from Python (``Model.stream``) against NeMo's streaming outputs: its
buffered pipelines for offline models (tests/fixtures/buffered: BufferedRNNTPipeline and
BufferedCTCPipeline, finals and word times within one 80 ms encoder frame) and its cache-aware
loop (tests/fixtures/reference/tiny_stream_tdt_ctc_stream: every partial and the final text);
event for event the same as ``parakeet stream --format jsonl`` (resampling, boosting,
confidence, VAD turns); pieces of any size as one; bad settings and samples.
"""

import json
import math
import os
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

import parakeet

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CLIP = FIXTURES / "audio" / "speech_10s.wav"
FRAME = 0.08


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    os.environ.setdefault("PARAKEET_CACHE", str(tmp_path_factory.mktemp("cache")))
    loaded = {}

    def get(name):
        if name not in loaded:
            loaded[name] = parakeet.Model(FIXTURES / f"{name}.nemo", threads=1, workers=1)
        return loaded[name]

    return get


def read_wav(path):
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


PCM, RATE = read_wav(CLIP)


def run(stream, samples, rate=RATE, pieces=None):
    """Every event of ``samples`` fed whole (or in pieces of these sizes, cycled), then finish."""
    events = []
    if pieces is None:
        events += stream.feed(samples, rate)
    else:
        at, i = 0, 0
        while at < len(samples):
            n = pieces[i % len(pieces)]
            events += stream.feed(samples[at : at + n], rate)
            at, i = at + n, i + 1
    return events + stream.finish()


def finals(events):
    return [e for e in events if e["type"] == "final"]


def within_a_frame(a, b):
    return abs(a - b) <= FRAME + 1e-9


# --- against NeMo ---------------------------------------------------------------------------

SETTINGS = {
    # NeMo's defaults: nothing given.
    "c4.8_l1.6_r1.6": {},
    "c1.6_l1.6_r1.6": {"chunk_secs": 1.6, "left_secs": 1.6, "right_secs": 1.6},
    "c0.8_l1.6_r0.8": {"chunk_secs": 0.8, "left_secs": 1.6, "right_secs": 0.8},
}


@pytest.mark.parametrize("model", ["tiny_tdt", "tiny_rnnt"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_an_offline_model_streams_by_buffers_with_nemos_finals(models, model, setting):
    nemo = json.loads((FIXTURES / "buffered" / f"{model}_buffered_rnnt_{setting}.json").read_text())
    stream = models(model).stream(**SETTINGS[setting])
    assert stream.kind == "buffered"
    ours = finals(run(stream, PCM))
    theirs = nemo["final"]["segments"]
    assert [f["text"] for f in ours] == [s["text"].strip() for s in theirs]
    # NeMo's times can lie past the audio its step had decoded (its last buffer decodes the
    # padding, its timestamp rewriting moves tokens later); ours are clamped there: to the end
    # of the step's chunk, or of the audio (the Rust tests check which step).
    chunk = SETTINGS[setting].get("chunk_secs", 4.8)
    end = len(PCM) / RATE

    def near(a, b):
        at_a_step_end = abs(a - end) < 1e-6 or abs(a / chunk - round(a / chunk)) < 1e-6
        return within_a_frame(a, b) or (a < b and at_a_step_end)

    for f, s in zip(ours, theirs):
        assert near(f["start"], s["start"]) and near(f["end"], s["end"]), (f, s)
    words = [w for f in ours for w in f["words"]]
    assert [w["word"] for w in words] == [w["text"].strip() for w in nemo["words"]]
    for w, n in zip(words, nemo["words"]):
        assert near(w["start"], n["start"]) and near(w["end"], n["end"]), (w, n)


@pytest.mark.parametrize("model", ["tiny_ctc", "tiny_tdt_ctc"])
def test_ctc_heads_stream_with_nemos_ctc_finals(models, model):
    nemo = json.loads((FIXTURES / "buffered" / f"{model}_buffered_ctc_c4.8_l1.6_r1.6.json").read_text())
    theirs = [s["text"].strip() for s in nemo["final"]["segments"]]
    ours = [f["text"] for f in finals(run(models(model).stream(decoder="ctc"), PCM))]
    # To the end: NeMo's CTC decodes its last buffer's frames past the audio too.
    assert len(ours) > 1
    assert ours == theirs


def test_a_cache_aware_model_gives_nemos_streaming_texts(models):
    ref = json.loads((FIXTURES / "reference" / "tiny_stream_tdt_ctc_stream" / "result.json").read_text())
    model = models("tiny_stream_tdt_ctc")
    for head, decoder in [("rnnt", "auto"), ("ctc", "ctc")]:
        nemo = ref["lookaheads"]["att_70_13"][head]["streaming"]
        stream = model.stream(att_context="70,13", decoder=decoder)
        assert stream.kind == "cache_aware"
        events = run(stream, PCM)
        assert [f["text"] for f in finals(events)] == [nemo["final"]["text"]], head
        if head == "rnnt":
            # A partial after every chunk that emitted tokens (CTC partials are folded again
            # across chunk borders; the Rust pipeline tests check them).
            partials = [e["text"] for e in events if e["type"] == "partial"]
            assert partials == [c["text"] for c in nemo["chunks"] if c["new_tokens"]]
    # The lookahead as a pair, and NeMo's default for the model, are the same stream.
    a = finals(run(model.stream(att_context=(70, 13)), PCM))
    b = finals(run(model.stream(), PCM))
    assert a == b and a[0]["text"] == ref["lookaheads"]["att_70_13"]["rnnt"]["streaming"]["final"]["text"]


# --- pieces, rates, the command line --------------------------------------------------------


@pytest.mark.parametrize("model, options", [
    ("tiny_tdt", SETTINGS["c0.8_l1.6_r0.8"]),
    ("tiny_stream_tdt_ctc", {}),
])
def test_pieces_of_any_size_give_what_one_feed_gives(models, model, options):
    m = models(model)
    whole = run(m.stream(**options), PCM)
    assert finals(whole)
    for pieces in ([1, 7, 333, 4801], [16001], [160, 0, 12799]):
        assert run(m.stream(**options), PCM, pieces=pieces) == whole, pieces
    # float32, and the same stream used again after finish().
    stream = m.stream(**options)
    assert run(stream, PCM.astype(np.float32) / 32768) == whole
    assert run(stream, PCM, pieces=[3000]) == whole


def cli_events(parakeet_bin, model, args, wav):
    out = subprocess.run(
        [str(parakeet_bin), "stream", str(wav), "-m", str(FIXTURES / f"{model}.nemo"), "--format", "jsonl", "-t", "1", *args],
        capture_output=True, text=True, env=dict(os.environ), check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def assert_same_events(ours, cli):
    """The command line's events (its times rounded to ms, confidence printed as f32)."""
    assert [(e["type"], e["text"]) for e in ours] == [(e["type"], e["text"]) for e in cli]
    ms = 5e-4 + 1e-9
    for o, c in zip(ours, cli):
        assert set(o) == set(c)
        assert o["start"] == pytest.approx(c["start"], abs=ms) and o["end"] == pytest.approx(c["end"], abs=ms)
        assert [w["word"] for w in o["words"]] == [w["word"] for w in c["words"]]
        for wo, wc in zip(o["words"], c["words"]):
            assert set(wo) == set(wc)
            assert wo["start"] == pytest.approx(wc["start"], abs=ms)
            assert wo["end"] == pytest.approx(wc["end"], abs=ms)
            if "confidence" in wc:
                assert wo["confidence"] == pytest.approx(wc["confidence"], abs=1e-6)
                assert 0.0 <= wo["confidence"] <= 1.0


def test_the_same_events_as_the_stream_command(models, tmp_path, parakeet_bin):
    # Boosting and confidence in buffered streaming.
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("\ufeffthe cat\r\n")
    args = ["--chunk-secs", "1.6", "--left-secs", "1.6", "--right-secs", "1.6"]
    extra = ["--boost", "data", "--boost-file", str(phrases), "--confidence", "entropy_tsallis_exp"]
    cli = cli_events(parakeet_bin, "tiny_tdt", args + extra, CLIP)
    stream = models("tiny_tdt").stream(
        **SETTINGS["c1.6_l1.6_r1.6"], boost="data", boost_file=phrases, confidence="entropy_tsallis_exp"
    )
    ours = run(stream, PCM)
    assert_same_events(ours, cli)
    plain = finals(run(models("tiny_tdt").stream(**SETTINGS["c1.6_l1.6_r1.6"]), PCM))
    assert [f["text"] for f in finals(ours)] != [f["text"] for f in plain], "boosting changes the text"
    # 8 kHz audio, resampled on the way in as the command line resamples it.
    pcm_8k = PCM[::2].copy()
    wav_8k = tmp_path / "speech_8k.wav"
    with wave.open(str(wav_8k), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm_8k.astype("<i2").tobytes())
    cli = cli_events(parakeet_bin, "tiny_rnnt", [], wav_8k)
    assert_same_events(run(models("tiny_rnnt").stream(), pcm_8k, rate=8000, pieces=[999]), cli)
    # Utterances ended by Silero VAD, and a cache-aware model cut into short utterances.
    cli = cli_events(parakeet_bin, "tiny_tdt", ["--vad", "--min-silence-ms", "300"], CLIP)
    assert_same_events(run(models("tiny_tdt").stream(vad={"min_silence_ms": 300}), PCM), cli)
    cli = cli_events(parakeet_bin, "tiny_stream_tdt_ctc", ["--max-utterance-seconds", "2"], CLIP)
    ours = run(models("tiny_stream_tdt_ctc").stream(max_utterance_seconds=2), PCM)
    assert len(finals(ours)) >= 3
    assert_same_events(ours, cli)


# --- bad settings and samples ---------------------------------------------------------------


@pytest.mark.parametrize("model, options, error, message", [
    ("tiny_tdt", {"chunk_secs": 1.0}, ValueError, r"--chunk-secs\) 1 s is not a whole .* 13 frames \(1\.04 s\)"),
    ("tiny_tdt", {"chunk_secs": 0}, ValueError, "more than 0"),
    ("tiny_tdt", {"chunk_secs": math.nan}, ValueError, "chunk"),
    ("tiny_tdt", {"left_secs": -1.6}, ValueError, "0 or more"),
    ("tiny_tdt", {"right_secs": 0.1}, ValueError, "2 frames"),
    ("tiny_tdt", {"chunk_secs": 160}, ValueError, "attention"),
    ("tiny_tdt", {"att_context": "70,13"}, ValueError, "offline model.*--att-context"),
    ("tiny_tdt", {"att_context": "sideways"}, ValueError, "att_context='sideways'"),
    ("tiny_tdt", {"att_context": (1, 2, 3)}, ValueError, r"att_context=\(1, 2, 3\)"),
    ("tiny_tdt", {"decoder": "ctc"}, ValueError, "CTC"),
    ("tiny_tdt", {"decoder": "xyz"}, ValueError, "decoder=\"xyz\""),
    ("tiny_tdt", {"confidence": "bogus"}, ValueError, "--confidence"),
    ("tiny_tdt", {"boost": "the cat", "boost_alpha": 1e37}, ValueError, "--boost-alpha"),
    ("tiny_tdt", {"max_utterance_seconds": -1}, ValueError, "--max-utterance-seconds -1"),
    ("tiny_tdt", {"max_utterance_seconds": math.inf}, ValueError, "--max-utterance-seconds inf"),
    ("tiny_tdt", {"vad": {"threshold": 2}}, ValueError, "threshold 2"),
    ("tiny_tdt", {"vad": {"min_silence_ms": -5}}, ValueError, "min_silence_ms -5"),
    ("tiny_tdt", {"vad": {"window": 5}}, TypeError, 'unexpected end-of-turn keyword "window"'),
    ("tiny_tdt", {"vad": "yes"}, TypeError, "vad= takes True"),
    ("tiny_tdt", {"threads": 0}, ValueError, "--threads 0"),
    ("tiny_tdt_ctc", {"decoder": "ctc", "boost": "data"}, ValueError, "boosting in buffered streaming"),
    ("tiny_stream_tdt_ctc", {"chunk_secs": 1.6}, ValueError, "cache-aware streaming model.*--chunk-secs"),
    ("tiny_stream_tdt_ctc", {"boost": "data"}, ValueError, "cache-aware streaming model.*--boost"),
    ("tiny_stream_tdt_ctc", {"att_context": "70,5"}, ValueError, "att_context 70,5 is not one of the model's lookaheads"),
])
def test_bad_settings_are_refused_when_the_stream_is_made(models, model, options, error, message):
    with pytest.raises(error, match=message):
        models(model).stream(**options)


def test_bad_samples_are_value_errors_and_feed_nothing(models):
    model = models("tiny_tdt")
    expected = run(model.stream(), PCM)
    stream = model.stream()
    assert stream.feed(PCM[:16000]) == []
    bad = np.zeros(100, np.float32)
    bad[7] = np.nan
    # The sample is named by its place in the stream.
    with pytest.raises(ValueError, match=r"sample 16007 \(at 1\.000 s\) is NaN"):
        stream.feed(bad)
    with pytest.raises(ValueError, match="sample_rate=8000: this stream's audio is at 16000 Hz"):
        stream.feed(PCM[16000:17000], 8000)
    with pytest.raises(ValueError, match="unsupported dtype int32"):
        stream.feed(np.zeros(10, np.int32))
    with pytest.raises(TypeError, match="feed\\(\\) takes a numpy array"):
        stream.feed([0.0, 0.1])
    # Nothing of a refused piece went in: the stream goes on as if they never came.
    assert stream.feed(PCM[16000:]) + stream.finish() == expected
    with pytest.raises(ValueError, match="sample rate 0 Hz is outside"):
        model.stream().feed(PCM, 0)
    with pytest.raises(ValueError, match="sample rate 10000000 Hz is outside"):
        model.stream().feed(PCM, 10_000_000)
    # An empty piece and an empty stream: no events.
    empty = model.stream()
    assert empty.feed(np.zeros(0, np.int16)) == []
    assert empty.finish() == []
