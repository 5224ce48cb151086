#!/usr/bin/env bash
# What confidence, phrase boosting and beam search cost against greedy decoding, in one run:
# per file, each variant REPS times, interleaved, median decoder time (the --profile stage
# table) and peak RSS.
# Usage: scripts/bench_decoding.sh MODEL.gguf FILE.wav [FILE.wav ...]
#   env: THREADS=2 REPS=3 PHRASES=10000 BEAM=4 BIN=target/release/parakeet ATT=128,128
# The phrases are made up (pseudo-words of 2-4 syllables, 1-3 words a phrase, a fixed seed), so
# that they tokenise into many pieces and share prefixes as real lists do.
set -euo pipefail
model=${1:?MODEL.gguf}; shift
[ $# -gt 0 ] || { echo "usage: $0 MODEL.gguf FILE.wav [FILE.wav ...]" >&2; exit 2; }
bin=${BIN:-target/release/parakeet}
threads=${THREADS:-2}; reps=${REPS:-3}; nphrases=${PHRASES:-10000}; beam=${BEAM:-4}
att=${ATT:-128,128}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 - "$nphrases" > "$work/phrases.txt" <<'EOF'
import random, sys
rng = random.Random(20)
onsets = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
          "br", "cl", "dr", "fl", "gr", "pl", "qu", "sh", "st", "th", "tr", "ch", "sp"]
vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y"]
codas = ["", "", "", "n", "r", "s", "t", "l", "m", "ck", "nd", "st"]
def word():
    return "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                   for _ in range(rng.randint(2, 4)))
seen = set()
while len(seen) < int(sys.argv[1]):
    seen.add(" ".join(word() for _ in range(rng.randint(1, 3))))
print("\n".join(sorted(seen)))
EOF

variants=(
  "greedy|-f txt"
  "greedy+confidence|-f json"
  "boost $nphrases|-f txt --boost-file $work/phrases.txt"
  "beam $beam|-f txt --beam $beam"
  "beam $beam+boost|-f txt --beam $beam --boost-file $work/phrases.txt"
)
run() { # variant-args file -> "decoder_ms rss_kb"
  local args=$1 file=$2 out
  out=$(/usr/bin/time -f "maxrss %M" "$bin" transcribe "$file" -m "$model" -t "$threads" -q \
      --att-context "$att" --profile -o "$work/out" $args 2>&1 >/dev/null)
  echo "$(awk '/^decoder /{print $2}' <<<"$out") $(awk '/^maxrss/{print $2}' <<<"$out")"
}
echo "model $(basename "$model"), $threads threads, $reps reps, median; $(date -u +%F)"
printf "%-28s %-24s %12s %10s %10s\n" file variant "decoder ms" "x greedy" "RSS MB"
for file in "$@"; do
  declare -A times=() rss=()
  for ((r = 0; r < reps; r++)); do
    for v in "${variants[@]}"; do
      read -r ms kb < <(run "${v#*|}" "$file")
      times[${v%%|*}]+="$ms "; rss[${v%%|*}]=$kb
    done
  done
  base=""
  for v in "${variants[@]}"; do
    name=${v%%|*}
    med=$(tr ' ' '\n' <<<"${times[$name]}" | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    [ -n "$base" ] || base=$med
    printf "%-28s %-24s %12.1f %10.3f %10.1f\n" "$(basename "$file")" "$name" "$med" \
      "$(awk -v a="$med" -v b="$base" 'BEGIN{print a/b}')" "$(awk -v k="${rss[$name]}" 'BEGIN{print k/1024}')"
  done
  unset times rss
done
