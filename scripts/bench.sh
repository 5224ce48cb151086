#!/usr/bin/env bash
# Times `parakeet transcribe --profile` on one clip over N runs and prints the median of each
# stage. Usage: scripts/bench.sh MODEL.gguf CLIP.wav [RUNS=5] [THREADS=2]
set -euo pipefail
model=$1 clip=$2 runs=${3:-5} threads=${4:-2}
bin=${PARAKEET_BIN:-target/release/parakeet}
[ -x "$bin" ] || cargo build --release --quiet
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# One warm-up run pages the weights in; it is not counted.
"$bin" transcribe "$clip" -m "$model" -t "$threads" >/dev/null 2>&1
for i in $(seq "$runs"); do
  "$bin" transcribe "$clip" -m "$model" -t "$threads" --profile >"$tmp/text" 2>"$tmp/p$i"
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "model $(basename "$model"), clip $(basename "$clip"), $runs runs, $threads threads (median ms)"
for stage in "model load" "features" "encoder" "decoder" "total"; do
  printf '  %-10s %10.1f\n' "$stage" "$(grep -h "^$stage " "$tmp"/p* | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { print $i; next }}' | median)"
done
grep -h "^decoder" "$tmp/p1" | sed 's/^/  /'
grep -h "peak RSS" "$tmp/p1" | sed 's/^/  /'
echo "  text: $(cat "$tmp/text")"
