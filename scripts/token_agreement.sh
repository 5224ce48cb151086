#!/usr/bin/env bash
# Token agreement of quantized models with the f32 model on a set of clips: for each clip, the
# fraction of f32 tokens reproduced (1 - token edit distance / f32 token count; token ids from
# `--format json`). Usage: scripts/token_agreement.sh F32.gguf QUANT.gguf [QUANT.gguf...] -- CLIP...
set -euo pipefail
bin=${PARAKEET_BIN:-target/release/parakeet}
models=(); while [ "$1" != "--" ]; do models+=("$1"); shift; done; shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in "${!models[@]}"; do
  for clip in "$@"; do
    mkdir -p "$tmp/$i"
    "$bin" transcribe "$clip" -m "${models[$i]}" -t 1 -f json -o "$tmp/$i" >/dev/null 2>&1
  done
done
python3 - "$tmp" "${#models[@]}" "${models[@]}" -- "$@" <<'PY'
import json, sys, os
tmp, n = sys.argv[1], int(sys.argv[2]); models = sys.argv[3:3 + n]; clips = sys.argv[4 + n:]
def toks(j):
    d = json.load(open(j))
    d = d[0] if isinstance(d, list) else d
    for key in ("tokens", "token_ids"):
        if key in d:
            return [t["id"] if isinstance(t, dict) else t for t in d[key]]
    return d["text"].split()
def dist(a, b):
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]
for i in range(1, n):
    tot_ref = tot_err = exact = 0
    for c in clips:
        c = os.path.splitext(os.path.basename(c))[0]
        ref, got = toks(f"{tmp}/0/{c}.json"), toks(f"{tmp}/{i}/{c}.json")
        tot_ref += len(ref); tot_err += dist(ref, got); exact += ref == got
    print(f"{os.path.basename(models[i])}: {1 - tot_err / max(tot_ref, 1):.3f} of {tot_ref} f32 tokens, {exact}/{len(clips)} clips identical")
PY
