#!/usr/bin/env bash
# The Windows exe under Wine against the Linux binary on one model and clip: `transcribe
# --profile`, interleaved runs, the median of each stage (ms) and the exe's time over Linux's.
# The times are the command's own (model load to the end of decoding), not Wine's start-up.
# Usage: scripts/bench_wine.sh MODEL.gguf CLIP.wav [RUNS=7] [THREADS=2]
# Env: LINUX_BIN (default target/release/parakeet), WIN_EXE (default
# target/x86_64-pc-windows-gnu/release/parakeet.exe), WINEPREFIX (default target/wine/prefix,
# made by scripts/ci_windows.sh with its stand-in bcryptprimitives.dll).
set -euo pipefail
model=$1 clip=$2 runs=${3:-7} threads=${4:-2}
target_dir=${CARGO_TARGET_DIR:-target}
linux=${LINUX_BIN:-$target_dir/release/parakeet}
exe=${WIN_EXE:-$target_dir/x86_64-pc-windows-gnu/release/parakeet.exe}
export WINEPREFIX=${WINEPREFIX:-$(realpath -m "$target_dir/wine/prefix")} WINEDEBUG=-all
wine=/usr/lib/wine/wine64
for f in "$linux" "$exe" "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"; do
  [ -e "$f" ] || { echo "bench_wine.sh: $f is missing (build it; scripts/ci_windows.sh makes the prefix)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bench() { # SIDE RUN
  local bin=("$linux")
  [ "$1" = win ] && bin=("$wine" "$exe")
  "${bin[@]}" transcribe "$clip" -m "$model" -t "$threads" --profile >"$tmp/$1.text" 2>"$tmp/$1.$2"
}
# One warm-up run each pages the weights in (and starts Wine's server); not counted.
bench linux 0
bench win 0
for i in $(seq "$runs"); do
  bench linux "$i"
  bench win "$i"
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
stage() { # SIDE STAGE -> median ms
  for i in $(seq "$runs"); do
    grep -h "^$2 " "$tmp/$1.$i" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { print $i; exit }}'
  done | median
}
echo "model $(basename "$model"), clip $(basename "$clip"), $runs interleaved runs, $threads threads"
echo "median ms            linux       wine    wine/linux"
for s in "model load" "features" "encoder" "decoder" "total"; do
  a=$(stage linux "$s") b=$(stage win "$s")
  printf '  %-12s %10.1f %10.1f %10.2fx\n' "$s" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN {print (a > 0 ? b / a : 0)}')"
done
echo "  linux: $(grep -h '^decoder' "$tmp/linux.1")"
echo "  wine:  $(grep -h '^decoder' "$tmp/win.1")"
if cmp -s "$tmp/linux.text" "$tmp/win.text"; then
  echo "  the same text: $(head -c 120 "$tmp/win.text")"
else
  echo "  the texts differ: '$(head -c 120 "$tmp/linux.text")' vs '$(head -c 120 "$tmp/win.text")'"
fi
