#!/usr/bin/env bash
# Our speed against the reference runtimes, side by side, for each model and thread count:
# runs ../shared/peers/compare.sh (onnx-asr f32, sherpa-onnx int8, then every GGUF given) once
# per (model, threads). Raised priority (nice -20, when allowed) keeps other processes on the
# machine from skewing one runtime more than another; not a real-time class, whose throttling
# stalls a thread ~50 ms in every second of run time.
# Usage: scripts/bench_compare.sh MODELS_DIR [CLIP] [THREADS="1 2"]
#   MODELS_DIR holds <model>.gguf, <model>-q8_0.gguf, <model>-q4_0.gguf for tdt_0.6b_v2 and
#   tdt_ctc_110m (the ones present are timed); peers from ../shared/peers/setup.sh in /tmp/peers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
models=${1:?MODELS_DIR}; clip=${2:-$here/../../shared/audio/en/jfk.wav}; threads=${3:-"1 2"}
compare=${COMPARE:-$here/../../shared/peers/compare.sh}
rt=(); nice -n -20 true 2>/dev/null && rt=(nice -n -20)
for m in tdt_0.6b_v2 tdt_ctc_110m; do
  ggufs=()
  for suffix in "" -q8_0 -q4_0; do
    [ -f "$models/$m$suffix.gguf" ] && ggufs+=("$models/$m$suffix.gguf")
  done
  [ ${#ggufs[@]} -gt 0 ] || continue
  for t in $threads; do
    echo "## $m, $t thread(s), $(basename "$clip")"
    THREADS=$t "${rt[@]}" "$compare" "/tmp/peers/$m" "$clip" "${ggufs[@]}"
    echo
  done
done
