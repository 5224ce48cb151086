"""The Python package against NeMo's reference outputs, the command line and bad input.

Run: `pip install .` (or `maturin develop`), then `pytest python/tests` from the repository
root. Uses only tests/fixtures (the tiny synthetic models and the speech clips).
"""

import _thread
import json
import os
import signal
import subprocess
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest

import parakeet

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CLIP = FIXTURES / "reference" / "speech_10s.wav"
CLIP_2S = FIXTURES / "reference" / "speech_2s.wav"


@pytest.fixture(scope="session", autouse=True)
def cache(tmp_path_factory):
    """Converted .nemo fixtures go to a fresh cache, never the user's."""
    path = tmp_path_factory.mktemp("cache")
    os.environ["PARAKEET_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tdt():
    return parakeet.Model(str(FIXTURES / "tiny_tdt.nemo"), threads=2, workers=2)


@pytest.fixture(scope="session")
def hybrid():
    return parakeet.Model(FIXTURES / "tiny_tdt_ctc.nemo", threads=1)


def reference(name):
    return json.loads((FIXTURES / "reference" / name / "result.json").read_text())


def read_wav(path):
    with wave.open(str(path)) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), w.getframerate()


def write_wav(path, samples, rate):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())


def token_triples(result):
    return [(t.id, t.frame, t.duration) for t in result.tokens]


# --- against NeMo ---------------------------------------------------------------------------


def test_file_gives_nemos_greedy_tokens_and_text(tdt):
    ref = reference("tiny_tdt")
    r = tdt.transcribe(CLIP)
    g = ref["greedy"]
    assert token_triples(r) == list(zip(g["tokens"], g["timestamp"], g["token_duration"]))
    assert r.text == ref["transcribe_text"]
    assert r.audio_seconds == pytest.approx(ref["audio_samples"] / 16000)
    # Words tile the text, in time order, inside the audio.
    assert " ".join(w.word for w in r.words) == r.text
    starts = [w.start for w in r.words]
    assert starts == sorted(starts)
    # A word ends where its last token's span does: a TDT token after its predicted duration,
    # but never after the audio (NeMo's last token on this clip would end 0.24 s past it).
    last = r.tokens[-1]
    assert (last.frame + last.duration) * r.frame_seconds > r.audio_seconds
    assert r.words[-1].end == pytest.approx(r.audio_seconds)
    assert all(0 <= w.start < w.end for w in r.words)
    tok = r.tokens[1]
    assert tok.start == pytest.approx(tok.frame * r.frame_seconds)
    assert tok.end == pytest.approx((tok.frame + tok.duration) * r.frame_seconds)
    assert r.tokens[0].piece.startswith("\u2581") or r.tokens[0].piece
    assert set(r.timings) == {"features", "encoder", "decoder"}
    assert r.to_dict()["tokens"][3]["id"] == r.tokens[3].id


def test_ctc_head_gives_nemos_ctc_tokens(hybrid):
    ref = reference("tiny_tdt_ctc")
    r = hybrid.transcribe(str(CLIP), decoder="ctc")
    assert [t.id for t in r.tokens] == ref["ctc"]["tokens"]
    assert r.text == ref["ctc"]["text"]
    assert hybrid.transcribe(CLIP).text == ref["transcribe_text"]


# --- arrays ---------------------------------------------------------------------------------


def test_arrays_equal_the_file(tdt):
    from_file = tdt.transcribe(CLIP)
    pcm, rate = read_wav(CLIP)
    f32 = pcm.astype(np.float32) / 32768
    arrays = {
        "int16": pcm,
        "float32": f32,
        "float64": pcm.astype(np.float64) / 32768,
        "(channels, samples)": np.stack([f32, f32]),
        "(samples, channels)": np.stack([f32, f32], axis=1),
        "non-contiguous": np.stack([f32, f32], axis=1)[:, 0],
    }
    for what, array in arrays.items():
        r = tdt.transcribe(array, sample_rate=rate)
        assert token_triples(r) == token_triples(from_file), what
        assert r.text == from_file.text, what
        assert r.audio_seconds == from_file.audio_seconds, what


def test_other_rates_are_resampled_as_files_are(tdt, tmp_path):
    pcm, _ = read_wav(CLIP)
    pcm_8k = pcm[::2].copy()
    path = tmp_path / "speech_8k.wav"
    write_wav(path, pcm_8k, 8000)
    from_file = tdt.transcribe(path)
    from_array = tdt.transcribe(pcm_8k, sample_rate=8000)
    assert token_triples(from_array) == token_triples(from_file)
    assert from_array.audio_seconds == pytest.approx(10.0)


def test_a_list_transcribes_in_one_call_in_input_order(tdt):
    pcm, rate = read_wav(CLIP_2S)
    singles = [tdt.transcribe(CLIP), tdt.transcribe(CLIP_2S), tdt.transcribe(pcm, rate)]
    batch = tdt.transcribe([CLIP, str(CLIP_2S), pcm], sample_rate=rate)
    assert isinstance(batch, list) and len(batch) == 3
    assert [r.text for r in batch] == [r.text for r in singles]
    assert [token_triples(r) for r in batch] == [token_triples(r) for r in singles]
    assert tdt.transcribe(()) == []


# --- decoding options -----------------------------------------------------------------------


def test_confidence_beam_and_boosting(tdt):
    greedy = tdt.transcribe(CLIP)
    r = tdt.transcribe(CLIP, confidence="max_prob")
    assert r.text == greedy.text
    conf = [t.confidence for t in r.tokens]
    assert all(c is not None and 0.0 <= c <= 1.0 for c in conf)
    assert all(w.confidence is not None for w in r.words)
    # Each word's confidence is its tokens' minimum (NeMo's default aggregation).
    assert min(w.confidence for w in r.words) == pytest.approx(min(conf), abs=1e-6)
    assert greedy.tokens[0].confidence is None

    beam = tdt.transcribe(CLIP, beam=4, nbest=3)
    assert len(beam.alternatives) == 3
    assert beam.alternatives[0].text == beam.text
    assert [a.tokens for a in beam.alternatives[:1]] == [[t.id for t in beam.tokens]]
    scores = [a.score for a in beam.alternatives]
    assert scores == sorted(scores, reverse=True)
    # The session goes back to greedy decoding for the next call.
    assert tdt.transcribe(CLIP).alternatives == []

    boosted = tdt.transcribe(CLIP, boost=["the", "ininin"], boost_alpha=5.0)
    assert boosted.text.count("the") >= greedy.text.count("the")


def test_boost_file_reads_phrases_as_the_cli_does(tdt, tmp_path):
    greedy = tdt.transcribe(CLIP)
    boosted = tdt.transcribe(CLIP, boost=["the", "ininin"], boost_alpha=5.0)
    assert token_triples(boosted) != token_triples(greedy)
    # A byte-order mark, CRLF, a blank line and a lone CR (an old Mac file's line end).
    mac = tmp_path / "phrases.txt"
    mac.write_bytes(b"\xef\xbb\xbfthe\r\n\r\nininin\r")
    r = tdt.transcribe(CLIP, boost_file=mac, boost_alpha=5.0)
    assert token_triples(r) == token_triples(boosted)
    # A list of files, after boost='s phrases.
    one = tmp_path / "one.txt"
    one.write_text("ininin\n")
    r = tdt.transcribe([CLIP], boost="the", boost_file=[str(one)], boost_alpha=5.0)[0]
    assert token_triples(r) == token_triples(boosted)


def test_bad_boost_files_name_the_file(tdt, tmp_path):
    with pytest.raises(FileNotFoundError, match="boost_file .*missing.txt: cannot read it"):
        tdt.transcribe(CLIP, boost_file=tmp_path / "missing.txt")
    utf16 = tmp_path / "utf16.txt"
    utf16.write_text("the cat\n", encoding="utf-16")
    with pytest.raises(ValueError, match="boost_file .*utf16.txt: is UTF-16 text; save it as UTF-8"):
        tdt.transcribe(CLIP, boost_file=utf16)
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"the cat\ncaf\xe9\n")
    with pytest.raises(ValueError, match="boost_file .*latin1.txt: line 2 is not UTF-8 text"):
        tdt.transcribe(CLIP, boost_file=latin1)
    # A device named by mistake is refused at the cap, not read until memory runs out.
    with pytest.raises(ValueError, match="boost_file /dev/zero: larger than 16 MiB"):
        tdt.transcribe(CLIP, boost_file="/dev/zero")
    with pytest.raises(TypeError):
        tdt.transcribe(CLIP, boost_file=42)


# --- threads --------------------------------------------------------------------------------


def test_four_python_threads_at_once_give_the_same_results():
    model = parakeet.Model(FIXTURES / "tiny_tdt.nemo", threads=1, workers=4)
    expected = model.transcribe(CLIP)
    rounds = 3

    def work(out, i):
        out[i] = [model.transcribe(CLIP) for _ in range(rounds)]

    def timed(threaded):
        out = [None] * 4
        start = time.perf_counter()
        if threaded:
            threads = [threading.Thread(target=work, args=(out, i)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for i in range(4):
                work(out, i)
        return time.perf_counter() - start, out

    sequential, _ = timed(False)
    threaded, out = timed(True)
    for results in out:
        for r in results:
            assert token_triples(r) == token_triples(expected)
    # Measured, not asserted: on a shared 2-core machine the ratio depends on the load.
    print(
        f"\n4 threads x {rounds} transcriptions of 10 s: sequential {sequential:.3f} s, "
        f"threaded {threaded:.3f} s, speedup {sequential / threaded:.2f}x "
        f"({os.cpu_count()} cores, 4 workers x 1 thread)"
    )


def test_the_gil_is_released_while_transcribing(tdt):
    """A Python thread keeps running while another transcribes."""
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        before = ticks
        tdt.transcribe([CLIP] * 4)
        during = ticks - before
    finally:
        stop.set()
        counter.join()
    assert during > 0


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler for the test, as a Python started from a terminal has it. A
    process started in the background by a non-interactive shell (`cmd &` in a CI script)
    inherits SIGINT ignored; Python then installs no handler and `_thread.interrupt_main`
    does nothing at all, which is not what is under test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_cancels_the_inputs_not_started(tdt, sigint_raises):
    """A KeyboardInterrupt during a long list raises, and the inputs not started are dropped:
    the next call runs at once instead of waiting behind them."""
    # One clip's time once warm (the first call of a worker builds its state): the fastest of three.
    tdt.transcribe([CLIP, CLIP])
    one = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        tdt.transcribe(CLIP)
        one = min(one, time.perf_counter() - start)
    # About ten seconds of work on the two workers.
    n = max(50, int(20 / one))
    timer = threading.Timer(max(0.3, 3 * one), _thread.interrupt_main)
    timer.start()
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        tdt.transcribe([CLIP] * n)
    interrupted = time.perf_counter() - start
    timer.join()
    start = time.perf_counter()
    tdt.transcribe(CLIP)
    after = time.perf_counter() - start
    # The interrupt ends the call well before the list would have (n * one / 2 on two
    # workers), and the next call waits at most for the clips running when it came (one per
    # worker), not for the queue behind them.
    detail = f"{n} clips of {one:.3f} s: interrupted after {interrupted:.2f} s, next call {after:.2f} s"
    print(f"\n{detail}")
    assert interrupted < n * one / 4, detail
    assert after < 4 * one + 0.5, detail


# --- bad input ------------------------------------------------------------------------------


def test_a_missing_audio_file_is_file_not_found(tdt, tmp_path):
    missing = tmp_path / "missing.wav"
    with pytest.raises(FileNotFoundError, match="cannot decode audio file .*missing.wav"):
        tdt.transcribe(missing)
    with pytest.raises(FileNotFoundError, match="missing.wav"):
        tdt.transcribe([CLIP, missing])


def test_a_missing_model_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf: no such model file"):
        parakeet.Model(tmp_path / "nope.gguf")


def test_devices_are_checked_as_the_command_line_checks_them():
    model = FIXTURES / "tiny_tdt.nemo"
    cpu = parakeet.Model(model, threads=1, workers=1, device="cpu")
    assert cpu.device.startswith("CPU")
    with pytest.raises(ValueError, match="is not a device"):
        parakeet.Model(model, device="gpu")
    with pytest.raises(ValueError, match="out of range|--features cuda|no cuda device"):
        parakeet.Model(model, device="cuda:7")


def test_a_broken_model_is_a_parakeet_error(tmp_path):
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(parakeet.ParakeetError, match="broken.gguf"):
        parakeet.Model(gguf)
    nemo = tmp_path / "broken.nemo"
    nemo.write_bytes((FIXTURES / "tiny_tdt.nemo").read_bytes()[:5000])
    with pytest.raises(parakeet.ParakeetError):
        parakeet.Model(nemo)
    assert issubclass(parakeet.ParakeetError, Exception)


def test_undecodable_audio_is_a_value_error(tdt, tmp_path):
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"RIFF not really a wave file" * 10)
    with pytest.raises(ValueError, match="cannot decode audio file .*noise.wav"):
        tdt.transcribe(bad)
    # The command line's rule: less than one 10 ms feature frame.
    with pytest.raises(ValueError, match="too short"):
        tdt.transcribe(np.zeros(100, np.float32), sample_rate=16000)
    assert tdt.transcribe(np.zeros(160, np.float32), sample_rate=16000).audio_seconds == 0.01


@pytest.mark.parametrize(
    "array, rate, message",
    [
        (np.zeros(16000, np.int32), 16000, "unsupported dtype int32"),
        (np.zeros(16000, np.complex64), 16000, "unsupported dtype"),
        (np.zeros((2, 2, 4000), np.float32), 16000, r"1-D array .* got shape \[2, 2, 4000\]"),
        (np.zeros((100, 100), np.float32), 16000, "at most 32 channels"),
        (np.zeros(0, np.float32), 16000, "contains no audio samples"),
        (np.zeros(16000, np.float32), 0, "sample rate 0 Hz is outside"),
        (np.zeros(16000, np.float32), 10_000_000, "outside the supported"),
        (np.full(16000, np.nan, np.float32), 16000, "sample 0 .* is NaN"),
        (np.full(16000, 1e30, np.float64), 16000, "corrupt"),
        (np.zeros(16000, np.float32), None, "needs sample_rate="),
    ],
)
def test_bad_arrays_are_value_errors(tdt, array, rate, message):
    with pytest.raises(ValueError, match=message):
        tdt.transcribe(array, sample_rate=rate)


def test_bad_options_are_value_errors(tdt):
    with pytest.raises(ValueError, match="decoder=\"xyz\": expected one of auto, tdt, ctc"):
        tdt.transcribe(CLIP, decoder="xyz")
    with pytest.raises(ValueError, match="CTC"):
        tdt.transcribe(CLIP, decoder="ctc")  # tiny_tdt has no CTC head
    with pytest.raises(ValueError, match="--beam 0"):
        tdt.transcribe(CLIP, beam=0)
    with pytest.raises(ValueError, match="--confidence"):
        tdt.transcribe(CLIP, confidence="bogus")
    with pytest.raises(ValueError, match="greedy decoding only"):
        tdt.transcribe(CLIP, beam=2, confidence="max_prob")
    with pytest.raises(ValueError, match="att_context"):
        tdt.transcribe(CLIP, att_context="sideways")
    with pytest.raises(ValueError, match="sample_rate= is for arrays"):
        tdt.transcribe(CLIP, sample_rate=16000)
    with pytest.raises(ValueError, match="--threads 0: at least 1 thread"):
        parakeet.Model(FIXTURES / "tiny_tdt.nemo", threads=0)
    with pytest.warns(UserWarning, match="--threads 10000 is more than the"):
        many = parakeet.Model(FIXTURES / "tiny_tdt.nemo", threads=10000, workers=1)
    assert 1 <= many.threads <= os.cpu_count()
    for beam in (2**64 - 1, 2**32, 100000, 4096):
        with pytest.raises((ValueError, OverflowError), match=r"--beam \d+: at most 256|int too big"):
            tdt.transcribe(CLIP, beam=beam)
    with pytest.raises(ValueError, match="--nbest 0: keeps at least 1"):
        tdt.transcribe(CLIP, beam=2, nbest=0)
    with pytest.raises(ValueError, match="--boost-alpha 1e\\+?37|--boost-alpha 100000"):
        tdt.transcribe(CLIP, boost="the cat", boost_alpha=1e37)
    with pytest.raises(TypeError, match="expected a path, a numpy array"):
        tdt.transcribe(42)
    # The model still works after every refusal.
    assert tdt.transcribe(CLIP_2S).text == reference("tiny_tdt_2s")["greedy"]["text"]


# --- the command line -----------------------------------------------------------------------


def test_same_text_and_error_messages_as_the_cli(tdt, tmp_path, cache, parakeet_bin):
    binary = parakeet_bin
    env = dict(os.environ, PARAKEET_CACHE=str(cache))
    model = str(FIXTURES / "tiny_tdt.nemo")
    out = subprocess.run(
        [str(binary), "transcribe", "-q", "-m", model, str(CLIP)],
        capture_output=True, text=True, env=env, check=True,
    )
    assert out.stdout.rstrip("\n") == tdt.transcribe(CLIP).text
    missing = tmp_path / "missing.wav"
    out = subprocess.run(
        [str(binary), "transcribe", "-q", "-m", model, str(missing)],
        capture_output=True, text=True, env=env,
    )
    cli_message = out.stderr.strip().removeprefix("error: ")
    with pytest.raises(FileNotFoundError) as err:
        tdt.transcribe(missing)
    assert str(err.value) == cli_message


def test_words_are_the_clis_json_words(tdt, tmp_path, cache, parakeet_bin):
    """``to_dict()``'s words carry the keys and values of ``transcribe -f json``'s words."""
    binary = parakeet_bin
    env = dict(os.environ, PARAKEET_CACHE=str(cache))
    model = str(FIXTURES / "tiny_tdt.nemo")
    subprocess.run(
        [str(binary), "transcribe", "-q", "-m", model, "-f", "json", "-o", str(tmp_path), str(CLIP)],
        capture_output=True, text=True, env=env, check=True,
    )
    cli = json.loads((tmp_path / "speech_10s.json").read_text())["words"]
    ours = tdt.transcribe(CLIP).to_dict()["words"]
    assert len(ours) == len(cli) > 0
    for o, c in zip(ours, cli):
        assert set(c) <= set(o), (c, o)
        assert o["word"] == c["word"]
        assert o["start"] == pytest.approx(c["start"], abs=5e-4)
        assert o["end"] == pytest.approx(c["end"], abs=5e-4)
