#!/usr/bin/env bash
# Time per audio second on a long file against a 1 min clip, in one run: 1, 1, LONG, 1, 1 min
# (the short clip before and after, so that a drift of the machine shows).
# Usage: scripts/bench_long.sh MODEL.gguf DIR [LONG_MIN=60] [THREADS=2]
#   DIR holds long_1min.wav and long_<LONG_MIN>min.wav (docs/BENCHMARKS.md says how to make them).
set -euo pipefail
model=${1:?MODEL.gguf}; dir=${2:?DIR}; long=${3:-60}; t=${4:-2}
bin=${BIN:-target/release/parakeet}
rt=(); chrt -f 10 true 2>/dev/null && rt=(chrt -f 10)
for m in 1 1 "$long" 1 1; do
  echo "== $m min"
  "${rt[@]}" /usr/bin/time -f "wall %e s, maxrss %M KB" "$bin" transcribe "$dir/long_${m}min.wav" \
    -m "$model" --att-context 128,128 --profile -t "$t" 2>&1 >/dev/null |
    grep -E "^encoder|^total|real-time|wall"
done
