#!/usr/bin/env python3
"""NeMo 3.0's buffered streaming at the END of a stream: references for tests/fixtures/buffered/.

The shared buffered references only end where the two reference clips end. This makes clips that
end the four ways a stream can (cut from tests/fixtures/reference/speech_10s.wav, int16 samples
kept as they are), runs NeMo 3.0.0's BufferedRNNTPipeline / BufferedCTCPipeline on each with the
reference set's run_buffered_reference.py (every head of every tiny model), and cuts the results
down with scripts/extract_buffered_fixtures.py:

  cut_word     the first 5.5 s: the audio ends inside a word
  cut_silence  the first 2.96 s (the end of the first sentence) and 1.5 s of digital silence
  cut_short    the first 0.62 s: shorter than one chunk of either setting
  cut_chunk    exactly one chunk: 4.8 s for the 4.8 s setting, 0.8 s for the 0.8 s one

Settings (chunk:left:right seconds): 4.8:1.6:1.6 (NeMo's default) and 0.8:1.6:0.8. The tests
(tests/pipeline/buffered.rs) cut the same clips from the same file.

usage: NEMO_REF=DIR scripts/buffered_end_references.py [CLIP...]   (default: every clip)
  NEMO_REF holds venv/ with nemo-toolkit[asr]==3.0.0 and torch==2.15.0 (the reference set's
  scripts/reproduce.sh builds it); REFERENCE_SCRIPTS (default /work/shared/reference/scripts) is
  where run_buffered_reference.py lives. Outputs go to $NEMO_REF/outputs_end/.
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import soundfile as sf

ROOT = pathlib.Path(__file__).resolve().parent.parent
NEMO_REF = pathlib.Path(os.environ.get("NEMO_REF", "/tmp/nemo-ref"))
SCRIPTS = pathlib.Path(os.environ.get("REFERENCE_SCRIPTS", "/work/shared/reference/scripts"))
RATE = 16000
SETTINGS = {"c4.8": "4.8:1.6:1.6", "c0.8": "0.8:1.6:0.8"}
MODELS = ["tiny_ctc", "tiny_tdt_ctc", "tiny_tdt", "tiny_rnnt"]


def clips(x):
    """(name, samples, settings) of every ending."""
    silence = np.concatenate([x[: int(2.96 * RATE)], np.zeros(int(1.5 * RATE), dtype=x.dtype)])
    return [
        ("cut_word", x[: int(5.5 * RATE)], list(SETTINGS)),
        ("cut_silence", silence, list(SETTINGS)),
        ("cut_short", x[: int(0.62 * RATE)], list(SETTINGS)),
        ("cut_chunk4.8", x[: int(4.8 * RATE)], ["c4.8"]),
        ("cut_chunk0.8", x[: int(0.8 * RATE)], ["c0.8"]),
    ]


def main():
    python = NEMO_REF / "venv/bin/python"
    x, rate = sf.read(ROOT / "tests/fixtures/reference/speech_10s.wav", dtype="int16")
    assert rate == RATE and x.ndim == 1
    audio = NEMO_REF / "audio_end"
    outputs = NEMO_REF / "outputs_end"
    audio.mkdir(parents=True, exist_ok=True)
    wanted = sys.argv[1:]
    for name, samples, settings in clips(x):
        if wanted and name not in wanted:
            continue
        wav = audio / f"{name}.wav"
        sf.write(wav, samples, RATE, subtype="PCM_16")
        for model in MODELS:
            nemo = ROOT / "tests/fixtures" / f"{model}.nemo"
            out = outputs / f"{model}_buffered_{name}"
            cmd = [str(python), str(SCRIPTS / "run_buffered_reference.py"), str(nemo), str(wav), str(out),
                   "--settings", ",".join(SETTINGS[s] for s in settings), "--threads", "1"]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
    subprocess.run([sys.executable, str(ROOT / "scripts/extract_buffered_fixtures.py"), str(outputs)], check=True)


if __name__ == "__main__":
    main()
