#!/usr/bin/env python3
# Usage: python scripts/python_threads_bench.py MODEL.gguf CLIP.wav N ROUNDS (in a venv with the package: pip install .)
# Wall time of N transcriptions of one clip spread over 1, 2 and 4 Python threads (one shared
# Model of 4 workers x 1 thread), the three settings interleaved, median of ROUNDS.
import statistics, sys, threading, time
import parakeet

model_path, clip = sys.argv[1], sys.argv[2]
n, rounds = int(sys.argv[3]), int(sys.argv[4])
model = parakeet.Model(model_path, threads=1, workers=4)
expected = model.transcribe(clip).text

def run(k):
    per = [n // k + (i < n % k) for i in range(k)]
    bad = []
    def work(m):
        for _ in range(m):
            if model.transcribe(clip).text != expected:
                bad.append(1)
    ts = [threading.Thread(target=work, args=(m,)) for m in per]
    t0 = time.perf_counter()
    for t in ts: t.start()
    for t in ts: t.join()
    assert not bad
    return time.perf_counter() - t0

times = {k: [] for k in (1, 2, 4)}
for _ in range(rounds):
    for k in times:
        times[k].append(run(k))
base = statistics.median(times[1])
for k, v in times.items():
    m = statistics.median(v)
    print(f"{k} Python threads: {n} transcriptions in {m:.3f} s (median of {rounds}), {base / m:.2f}x one thread")
