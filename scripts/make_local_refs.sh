#!/usr/bin/env bash
# NeMo references for local attention (rel_pos_local_attn), made with scripts/run_reference.py
# (the shared script plus eval() after change_attention_model -- the shared outputs/*_local16 were
# made with attention dropout on and are not NeMo's inference result -- and zeroed attention
# biases for bias-free models, which the switch would leave at their random initialisation).
#  - <model>_local16: the four tiny models switched to [16, 16] on speech_10s.wav;
#  - window edges: the start of speech_10s.wav cut to 16, 32, 33 and 34 encoder frames (shorter
#    than the [16, 16] window of 33 frames, NeMo's 2w chunk, exactly the window, one longer) on
#    tiny_tdt_ctc; and NeMo's asymmetric windows [8, 4] and [4, 8] on 33 frames.
# Needs the NeMo venv of ../shared/reference/scripts/reproduce.sh. Usage (repo root):
#   scripts/make_local_refs.sh [/tmp/nemo-ref/venv] [/tmp/local-refs]
# Copies the files the tests read into tests/fixtures/reference/.
set -euo pipefail
venv=${1:-/tmp/nemo-ref/venv}
out=${2:-/tmp/local-refs}
ref=../shared/reference
mkdir -p "$out"
"$venv/bin/python" - "$ref/audio/speech_10s.wav" "$out" <<'PY'
import sys, soundfile as sf
x, sr = sf.read(sys.argv[1], dtype="int16")
# T' = ceil(T / 8) encoder frames for T = samples / 160 feature frames.
for frames in (16, 32, 33, 34):
    sf.write(f"{sys.argv[2]}/edge_{frames}.wav", x[: frames * 8 * 160], sr, subtype="PCM_16")
PY
run() { # name model wav context
  "$venv/bin/python" scripts/run_reference.py "$ref/models/$2.nemo" "$3" "$out/$1" \
    --att-context "$4" --threads 1 > "$out/$1.log" 2>&1
}
for m in tiny_tdt tiny_tdt_ctc tiny_rnnt tiny_ctc; do
  run "${m}_local16" "$m" "$ref/audio/speech_10s.wav" 16,16
done
for f in 16 32 33 34; do run "tiny_tdt_ctc_local16_t$f" tiny_tdt_ctc "$out/edge_$f.wav" 16,16; done
run tiny_tdt_ctc_local8x4_t33 tiny_tdt_ctc "$out/edge_33.wav" 8,4
run tiny_tdt_ctc_local4x8_t33 tiny_tdt_ctc "$out/edge_33.wav" 4,8
# Keep only what the tests read.
dst=tests/fixtures/reference
for d in "$out"/*_local*/; do
  n=$(basename "$d"); rm -rf "${dst:?}/$n"; mkdir -p "$dst/$n"
  cp "$d"/result.json "$d"/enc_layer_0[0-9].npy "$d"/encoder_out.npy "$dst/$n/"
  if [ -f "$d/enc_layer_00_self_attn.npy" ]; then cp "$d/enc_layer_00_self_attn.npy" "$dst/$n/"; fi
done
cp "$out"/edge_*.wav "$dst/"
du -sh "$dst"
