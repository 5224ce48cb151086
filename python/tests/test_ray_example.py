"""examples/ray_transcribe.py on a local Ray instance. Skipped unless `ray` is installed
(`pip install "ray[data]"`); CI does not install it."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import parakeet  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def load_example():
    spec = importlib.util.spec_from_file_location(
        "ray_transcribe", ROOT / "examples" / "ray_transcribe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ray_data_gives_the_same_text_as_the_model(tmp_path):
    # A .gguf both the driver and the actors read (the actors' cache is not the test's).
    os.environ["PARAKEET_CACHE"] = str(tmp_path / "cache")
    model = parakeet.Model(FIXTURES / "tiny_tdt.nemo", threads=1)
    example = load_example()
    clips = example.audio_files([FIXTURES / "reference"])
    assert len(clips) >= 2
    expected = {p: r.text for p, r in zip(clips, model.transcribe(clips))}
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        rows = example.transcribe(clips, str(model.path), actors=2, batch_size=2).take_all()
    finally:
        ray.shutdown()
    assert {row["path"]: row["text"] for row in rows} == expected
    assert all(row["audio_seconds"] > 0 for row in rows)


def test_the_defaults_fit_a_small_machine():
    example = load_example()
    # Threads and actors within the CPUs: an actor asking for more would wait forever.
    assert example.fit_to_cluster(1) == (1, 1)
    assert example.fit_to_cluster(2) == (2, 1)
    assert example.fit_to_cluster(3.0) == (3, 1)
    assert example.fit_to_cluster(16) == (4, 4)
    assert example.fit_to_cluster(2, threads=4) == (2, 1)
    assert example.fit_to_cluster(8, threads=1) == (1, 8)
    with pytest.raises(SystemExit, match="needs 8 CPUs; the Ray cluster has 4"):
        example.fit_to_cluster(4, threads=2, actors=4)


def test_the_command_runs_with_its_defaults_on_this_machine(tmp_path):
    """The script as a user runs it (defaults, local Ray on every CPU here), in bounded time."""
    env = dict(os.environ, PARAKEET_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "ray_transcribe.py"),
            "--model",
            str(FIXTURES / "tiny_tdt.nemo"),
            str(FIXTURES / "reference" / "speech_2s.wav"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    clip = FIXTURES / "reference" / "speech_2s.wav"
    expected = parakeet.Model(FIXTURES / "tiny_tdt.nemo", threads=1).transcribe(clip)
    assert done.stdout.splitlines()[-1] == f"{clip}\t{expected.text}", done.stdout
