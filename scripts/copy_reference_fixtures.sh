#!/usr/bin/env bash
# Copies the small part of NeMo's reference outputs that the tests compare against into
# tests/fixtures/reference/ (run from the repo root; needs ../shared/reference).
set -euo pipefail
src=${1:-../shared/reference}
dst=tests/fixtures/reference
mkdir -p "$dst"
cp "$src/audio/speech_2s.wav" "$src/audio/speech_10s.wav" "$dst/"
for dir in "$src"/outputs/*/; do
  name=$(basename "$dir")
  mkdir -p "$dst/$name"
  for f in result.json decode_trace.json enc_pre_encode.npy enc_pos_emb.npy encoder_out.npy \
           ctc_logprobs.npy; do
    if [ -f "$dir/$f" ]; then cp "$dir/$f" "$dst/$name/"; fi
  done
  cp "$dir"/enc_layer_[0-9][0-9].npy "$dst/$name/"
  # Layer 0's sub-blocks only for the short clip: they locate a drift, they don't add coverage.
  case "$name" in *_2s) cp "$dir"/enc_layer_00_*.npy "$dst/$name/" ;; esac
done
du -sh "$dst"
