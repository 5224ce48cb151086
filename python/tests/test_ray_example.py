"""examples/ray_transcribe.py on a local Ray instance. Skipped unless `ray` is installed
(`pip install "ray[data]"`); CI does not install it."""

import importlib.util
import os
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
