"""Speech to text with NVIDIA Parakeet models on ggml (CPU).

>>> import parakeet
>>> model = parakeet.Model("nvidia/parakeet-tdt-0.6b-v2")   # or a .gguf / .nemo path
>>> result = model.transcribe("talk.wav")
>>> result.text, result.words[0].start

See ``Model`` and ``Model.transcribe``.
"""

import os as _os

# ggml's threads meet at an OpenMP barrier after every op, and libgomp spins there for 300,000
# rounds by default before sleeping: under load that spinning takes the cores the other threads
# need (the command line sets 5000 rounds for the same reason; docs/BENCHMARKS.md). libgomp
# reads this once, when it is loaded, which is when the native module below is imported, unless
# another module loaded it first. The user's own setting wins.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "5000"

from ._parakeet import (  # noqa: E402
    Alternative,
    Diarization,
    Model,
    ParakeetError,
    SpeakerTurn,
    Stream,
    Token,
    Transcript,
    Word,
    __version__,
    diarize,
    vad,
)

__all__ = [
    "Alternative",
    "Diarization",
    "Model",
    "ParakeetError",
    "SpeakerTurn",
    "Stream",
    "Token",
    "Transcript",
    "Word",
    "__version__",
    "diarize",
    "vad",
]
