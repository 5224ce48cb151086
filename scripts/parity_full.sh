#!/usr/bin/env bash
# Full-size parity: transcribe NeMo's reference clip with our GGUFs and compare tokens, frames
# and TDT durations with NeMo's greedy_batch result (built by ../shared/reference/scripts/
# reproduce.sh with MODELS="tdt_0.6b_v2 tdt_ctc_110m").
# Usage: scripts/parity_full.sh NEMO_REF_OUTPUT_DIR GGUF [GGUF...]
#   e.g. scripts/parity_full.sh NEMO_REF/outputs/tdt_0.6b_v2 MODELS_DIR/tdt_0.6b_v2.gguf
# Env: BIN (target/release/parakeet), THREADS (2). Exit 1 when any GGUF differs from NeMo.
set -euo pipefail
ref=${1:?NEMO output dir}; shift
BIN=${BIN:-target/release/parakeet}; T=${THREADS:-2}
wav=$(dirname "$(dirname "$ref")")/$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['wav'])" "$ref/result.json")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
status=0
for g in "$@"; do
  "$BIN" transcribe "$wav" -m "$g" -t "$T" -f json -o "$tmp/$(basename "$g" .gguf)" >/dev/null 2>&1
  python3 - "$ref/result.json" "$tmp/$(basename "$g" .gguf)"/*.json "$(basename "$g")" <<'PY' || status=1
import ast, json, sys
ref = json.load(open(sys.argv[1]))
nemo = ref["greedy_batch"]
nemo = nemo if isinstance(nemo, dict) else ast.literal_eval(nemo)
ours = json.load(open(sys.argv[2]))["tokens"]
ids = [t["id"] for t in ours]
frames = [t["frame"] for t in ours]
durs = [t["duration_frames"] for t in ours]
same_ids = ids == list(nemo["tokens"])
same_frames = frames == list(nemo["timestamp"])
same_durs = "token_duration" not in nemo or durs == list(nemo["token_duration"])
first = next((i for i, (a, b) in enumerate(zip(ids, nemo["tokens"])) if a != b), None)
print(f"{sys.argv[3]}: {len(ids)} tokens (NeMo {len(nemo['tokens'])}); ids {'==' if same_ids else '!='}, "
      f"frames {'==' if same_frames else '!='}, durations {'==' if same_durs else '!='}"
      + ("" if same_ids else f"; first difference at token {first}"))
sys.exit(0 if same_ids and same_frames and same_durs else 1)
PY
done
exit $status
