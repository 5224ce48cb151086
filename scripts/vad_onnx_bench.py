#!/usr/bin/env python3
"""Times the silero-vad package's ONNX model (silero_vad.onnx from the installed wheel) over a
16 kHz mono 16-bit WAV the way the package's OnnxWrapper runs it for get_speech_timestamps: one
onnxruntime call per 512-sample window with the 64-sample context prepended and the state
carried, 1 thread. The wrapper's torch conversions are left out (torch is not needed), so this
is a lower bound of the package's own time. Prints `seconds <best of N>` and the probabilities'
count and sum for a check against ours.
Usage: vad_onnx_bench.py WAV [RUNS]   (needs: pip install --no-deps silero-vad; pip install onnxruntime numpy)
"""
import importlib.util
import os
import sys
import time
import wave

import numpy as np
import onnxruntime as ort

path, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
with wave.open(path) as w:
    assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
    audio = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
spec = importlib.util.find_spec("silero_vad")
model = os.path.join(spec.submodule_search_locations[0], "data", "silero_vad.onnx")
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
opts.inter_op_num_threads = 1
sess = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
sr = np.array(16000, dtype=np.int64)
n = -(-len(audio) // 512) * 512
padded = np.zeros(n, dtype=np.float32)
padded[: len(audio)] = audio


def run():
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros((1, 64), dtype=np.float32)
    probs = []
    for i in range(0, n, 512):
        x = np.concatenate([context, padded[None, i : i + 512]], axis=1)
        out, state = sess.run(None, {"input": x, "state": state, "sr": sr})
        context = x[:, -64:]
        probs.append(float(out[0, 0]))
    return probs


best = float("inf")
for _ in range(runs):
    t = time.perf_counter()
    probs = run()
    best = min(best, time.perf_counter() - t)
print(f"seconds {best:.6f}")
print(f"windows {len(probs)} sum {sum(probs):.6f}")
