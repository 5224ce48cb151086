#!/usr/bin/env bash
# Copies the Silero VAD reference outputs the tests compare against (../shared/reference/vad,
# made by run_vad_reference.py) into tests/fixtures/vad: per clip the ONNX probabilities and the
# segments/VADIterator JSON, the ONNX LSTM states for one clip per rate, and the audio the tests
# cannot make themselves.
set -euo pipefail
shared=${SHARED:-/work/shared}
ref=$shared/reference/vad/outputs
out=tests/fixtures/vad
mkdir -p "$out/audio"
for d in "$ref"/*/; do
  clip=$(basename "$d")
  mkdir -p "$out/$clip"
  cp "$d/probs_onnx.npy" "$d/segments.json" "$out/$clip/"
  [ -f "$d/input.npy" ] && cp "$d/input.npy" "$out/$clip/"
done
for clip in jfk ldc93s1_8k_s16; do cp "$ref/$clip/state_onnx.npy" "$out/$clip/"; done
for f in "$shared"/audio/en/*.wav "$shared/audio/long/sonnet1_librivox_16k.wav" \
  "$shared/audio/formats/conv_jfk_8k_ulaw.wav" "$shared/audio/formats/ldc93s1_8k_s16.wav" \
  "$shared"/reference/vad/audio/*.wav; do
  cp "$f" "$out/audio/"
done
rm -f "$out/audio/one_two_three_44k1.wav"   # the tests feed input.npy, the samples the model saw
