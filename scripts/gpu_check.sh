#!/usr/bin/env bash
# The checks for a machine with an NVIDIA GPU, in one run: a CUDA build, the device tests and
# the NeMo parity tests on `--device cuda`, then the speed target (a 0.6b model at f16 on 10
# minutes of audio, one stream: at least 500x real time).
#
# Needs: nvidia-smi and a driver; the CUDA build needs nvcc and cargo (or give one already built:
# GPU_CHECK_BIN for the `parakeet` binary, GPU_CHECK_TESTS for a folder holding the `device` and
# `pipeline` test binaries of the same build). The benchmark needs a 0.6b GGUF at f16
# (GPU_CHECK_MODEL; `parakeet convert X.nemo X-f16.gguf --type f16`); without one it is skipped
# and says so. Everything it writes goes under OUT (default target/gpu-check).
# Usage (repo root): scripts/gpu_check.sh       Exit: 0 all passed, 1 a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
out=${OUT:-target/gpu-check}
mkdir -p "$out"
log() { echo "[gpu_check ${SECONDS}s] $*" | tee -a "$out/summary.txt"; }
failed=0
check() { if "$@"; then log "ok: $*"; else log "FAILED: $*"; failed=1; fi; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt" \
  || { log "no NVIDIA GPU here"; exit 1; }

export GGML_NO_BACKTRACE=1 CARGO_INCREMENTAL=0
bin=${GPU_CHECK_BIN:-}
tests=${GPU_CHECK_TESTS:-}
if [ -z "$bin" ]; then
  if ! command -v cargo >/dev/null || ! command -v nvcc >/dev/null; then
    log "no cargo or nvcc here: build elsewhere and give GPU_CHECK_BIN and GPU_CHECK_TESTS"
    exit 1
  fi
  start=$SECONDS
  cargo test --release --features cuda --test device --test pipeline --no-run 2>&1 | tail -3
  log "cuda build: $((SECONDS - start)) s"
  bin=target/release/parakeet
  tests=target/release/deps
fi
"$bin" info --system | tee "$out/info.txt"
grep -q 'CUDA0' "$out/info.txt" || { log "the build sees no CUDA device"; exit 1; }

# A test binary of the build by its name (cargo names it NAME-HASH).
test_bin() { find "$tests" -maxdepth 1 -type f -executable -name "$1-*" | head -1; }

# Graphs of ggml's ops on the device against the CPU, state tensors, out of memory.
PARAKEET_TEST_DEVICE=cuda check "$(test_bin device)" --test-threads 1 --nocapture
# NeMo parity on the device (the tiny models of every head, the tolerances of the CPU suite).
PARAKEET_DEVICE=cuda check "$(test_bin pipeline)" --test-threads 2 \
  encoder::every_layer_matches_nemo_in_f32 decoder:: diar:: buffered::

# Same text on the device as on the CPU, every tiny model of the repository.
for m in tests/fixtures/tiny_*.nemo; do
  case $m in *sortformer*) continue ;; esac
  a=$("$bin" transcribe tests/fixtures/reference/speech_10s.wav -m "$m" --device cpu 2>/dev/null)
  b=$("$bin" transcribe tests/fixtures/reference/speech_10s.wav -m "$m" --device cuda 2>/dev/null)
  check test "$a" = "$b"
done

# The speed target: 10 minutes of audio, one stream, f16 weights.
if [ -n "${GPU_CHECK_MODEL:-}" ]; then
  audio=$out/long_10min.wav
  python3 - "$audio" <<'EOF'
import sys, wave
src = wave.open("tests/fixtures/reference/speech_10s.wav")
frames = src.readframes(src.getnframes())
out = wave.open(sys.argv[1], "wb")
out.setparams(src.getparams())
for _ in range(int(600 * src.getframerate() / src.getnframes()) + 1):
    out.writeframes(frames)
out.close()
EOF
  "$bin" transcribe "$audio" -m "$GPU_CHECK_MODEL" --device cuda >/dev/null 2>&1  # warm-up
  "$bin" transcribe "$audio" -m "$GPU_CHECK_MODEL" --device cuda --profile >/dev/null 2>"$out/profile.txt"
  cat "$out/profile.txt"
  rtf=$(grep -o '([0-9.]*x faster than real time)' "$out/profile.txt" | grep -o '[0-9.]*' | head -1)
  log "0.6b f16, 10 min, --device cuda: ${rtf}x real time (target 500x)"
  check awk -v r="${rtf:-0}" 'BEGIN { exit !(r >= 500) }'
else
  log "benchmark skipped: no GPU_CHECK_MODEL (a 0.6b GGUF at f16)"
fi
log "gpu_check: ${SECONDS} s, $( [ $failed = 0 ] && echo passed || echo FAILED)"
exit $failed
