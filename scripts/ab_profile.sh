#!/usr/bin/env bash
# Interleaved A/B of two parakeet binaries on one model and clip: the binaries alternate REPS
# times (so machine drift hits both alike), and the medians of --profile's encoder, decoder and
# total stage times are printed for each. Raised priority (nice -20) when allowed: not a
# real-time class, whose throttling stalls a thread ~50 ms in every second of run time.
# Arguments after the clip go to `transcribe` as they are (e.g. --decoder ctc --beam 16).
# Usage: scripts/ab_profile.sh BIN_A BIN_B MODEL.gguf [REPS=7] [THREADS=2] [CLIP=jfk.wav] [FLAGS...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
a=${1:?BIN_A}; b=${2:?BIN_B}; model=${3:?MODEL}; reps=${4:-7}; threads=${5:-2}
clip=${6:-$here/../../shared/audio/en/jfk.wav}
shift $(($# < 6 ? $# : 6))
rt=(); nice -n -20 true 2>/dev/null && rt=(nice -n -20)
raw=$(mktemp); trap 'rm -f "$raw"' EXIT
for _ in $(seq "$reps"); do
  for side in A B; do
    bin=$a; [ "$side" = B ] && bin=$b
    "${rt[@]}" "$bin" transcribe "$clip" -m "$model" -t "$threads" --profile "$@" 2>&1 >/dev/null |
      awk -v s="$side" '$1=="encoder"{e=$2} $1=="decoder"{d=$2} $1=="total"{t=$2} END{print s, e, d, t}' >> "$raw"
  done
done
python3 - "$raw" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for side in "AB":
    r = [x for x in rows if x[0] == side]
    e, d, t = (statistics.median(float(x[i]) for x in r) for i in (1, 2, 3))
    print(f"{side}: encoder {e:.1f} ms, decoder {d:.2f} ms, total {t:.1f} ms (median of {len(r)})")
PY
