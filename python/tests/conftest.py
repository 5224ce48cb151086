"""Shared by the Python package's tests."""

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def parakeet_bin():
    """The command line built beside the package (`cargo build`), or PARAKEET_BIN, or one on
    PATH; the test is skipped when there is none."""
    candidates = [os.environ.get("PARAKEET_BIN")]
    for target in (os.environ.get("CARGO_TARGET_DIR"), ROOT / "target"):
        if target:
            candidates += [Path(target) / "debug" / "parakeet", Path(target) / "release" / "parakeet"]
    found = [Path(c) for c in candidates if c and Path(c).is_file()]
    binary = found[0] if found else shutil.which("parakeet")
    if binary is None:
        pytest.skip("no parakeet binary built (cargo build), nor PARAKEET_BIN")
    return Path(binary)
