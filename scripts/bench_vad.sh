#!/usr/bin/env bash
# `transcribe --vad` against plain `transcribe` on a recording that is half silence: a
# long speech clip with as much quiet noise (about -60 dBFS) inserted in the middle of
# its pauses (where `parakeet vad` finds them, so no word is cut) as it has audio. Prints the
# best wall time of RUNS runs of each, their ratio, and whether the text of the speech is the
# same with and without --vad.
#
# usage: scripts/bench_vad.sh MODEL.gguf...   (after `cargo build --release`)
# env:   PARAKEET (default target/release/parakeet), THREADS (2), RUNS (3),
#        SPEECH (default: the 53 s sonnet clip of the tests), OUT (a scratch dir)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${PARAKEET:-${CARGO_TARGET_DIR:-target}/release/parakeet}
threads=${THREADS:-2}
runs=${RUNS:-3}
speech=${SPEECH:-tests/fixtures/vad/audio/sonnet1_librivox_16k.wav}
out=${OUT:-$(mktemp -d)}
[ $# -ge 1 ] || { echo "usage: $0 MODEL.gguf..." >&2; exit 2; }
mkdir -p "$out"
wav=$out/half_silence.wav

"$bin" vad -f json "$speech" >"$out/speech.json"
python3 - "$speech" "$out/speech.json" "$wav" <<'EOF'
import json, random, struct, sys, wave
src, segs, dst = sys.argv[1:]
with wave.open(src) as w:
    assert w.getnchannels() == 1 and w.getsampwidth() == 2 and w.getframerate() == 16000
    pcm = w.readframes(w.getnframes())
n = len(pcm) // 2
s = [x["start_sample"] for x in json.load(open(segs))["segments"]]
e = [x["end_sample"] for x in json.load(open(segs))["segments"]]
cuts = [(a + b) // 2 for a, b in zip(e, s[1:])]  # the middle of each pause
extra = n // len(cuts)
rng = random.Random(0)
quiet = struct.pack(f"<{extra}h", *(rng.randint(-32, 32) for _ in range(extra)))
parts, prev = [], 0
for c in cuts:
    parts += [pcm[2 * prev:2 * c], quiet]
    prev = c
parts.append(pcm[2 * prev:])
with wave.open(dst, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000)
    w.writeframes(b"".join(parts))
total = sum(len(p) for p in parts) // 2
print(f"{dst}: {total / 16000:.1f} s, {extra * len(cuts) / total:.0%} inserted silence in {len(cuts)} pauses")
EOF
"$bin" vad "$wav" | awk '{ s += $2 - $1 } END { printf "speech segments: %d, %.1f s\n", NR, s }'

best() { # best wall seconds of $runs runs of the command; its text in $out/text
  local b=
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$out/text"
    t1=$(date +%s.%N)
    b=$(echo "$t0 $t1 ${b:-1e9}" | awk '{ d = $2 - $1; print (d < $3 ? d : $3) }')
  done
  echo "$b"
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $threads threads; best of $runs"
for model in "$@"; do
  plain=$(best "$bin" transcribe -q -t "$threads" -m "$model" "$wav")
  cp "$out/text" "$out/text.plain"
  vad=$(best "$bin" transcribe -q -t "$threads" -m "$model" --vad "$wav")
  same=$(cmp -s "$out/text" "$out/text.plain" && echo same || echo different)
  printf '%s: without --vad %.2f s, with --vad %.2f s: %.2fx the time; text %s\n' \
    "$(basename "$model")" "$plain" "$vad" "$(echo "$vad $plain" | awk '{ print $1 / $2 }')" "$same"
done
