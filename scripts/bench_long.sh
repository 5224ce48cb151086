#!/usr/bin/env bash
# Time per audio second on a long file against a 1 min clip, in one run: ROUNDS rounds of
# 1, 1, LONG min (the short clip between the long runs, so that a drift of the machine hits
# both), then the medians and the long file's per-second cost over the short clip's: for the
# whole transcription ("total" of --profile, model load and audio read included) and for
# features + encoder + decoder (what compare.sh times).
# Usage: [ROUNDS=1] scripts/bench_long.sh MODEL.gguf DIR [LONG_MIN=60] [THREADS=2]
#   DIR holds long_1min.wav and long_<LONG_MIN>min.wav (docs/BENCHMARKS.md says how to make them).
set -euo pipefail
model=${1:?MODEL.gguf}; dir=${2:?DIR}; long=${3:-60}; t=${4:-2}
bin=${BIN:-target/release/parakeet}; rounds=${ROUNDS:-1}
rt=(); nice -n -20 true 2>/dev/null && rt=(nice -n -20)
rows=$(mktemp); trap 'rm -f "$rows"' EXIT
runs=(); for _ in $(seq "$rounds"); do runs+=(1 1 "$long"); done
for m in "${runs[@]}" 1; do
  "${rt[@]}" /usr/bin/time -f "maxrss %M" "$bin" transcribe "$dir/long_${m}min.wav" \
    -m "$model" --att-context 128,128 --profile -t "$t" 2>&1 >/dev/null |
    awk -v m="$m" '$1=="features"||$1=="encoder"||$1=="decoder"{s+=$2} $1=="encoder"{e=$2}
      $1=="total"{tot=$2} $1=="maxrss"{r=$2}
      END{printf "%s min: total %.1f ms, features+encoder+decoder %.1f ms, encoder %.1f ms, maxrss %d KB\n", m, tot, s, e, r}' |
    tee -a "$rows"
done
python3 - "$rows" "$long" <<'PY'
import re, statistics, sys
rows = [l for l in open(sys.argv[1]) if l.strip()]
long = sys.argv[2]
def med(m, key):
    v = [float(re.search(key + r" ([\d.]+)", l).group(1)) / float(m)
         for l in rows if l.startswith(m + " min")]
    return statistics.median(v), len(v)
for key in ("total", "features\\+encoder\\+decoder", "encoder"):
    (s, ns), (l, nl) = med("1", key), med(long, key)
    name = key.replace("\\", "")
    print(f"{name}: {s:.1f} ms per audio minute (1 min, median of {ns}), "
          f"{l:.1f} ({long} min, median of {nl}): {l / s:.3f}x")
PY
