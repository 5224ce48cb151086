#!/usr/bin/env bash
# The device backend proven without a GPU: ggml's Vulkan backend on Mesa's lavapipe (the CPU
# Vulkan driver of the distribution), the NeMo parity tests run on `--device vulkan`.
#   - installs glslc, spirv-headers, libvulkan-dev and mesa-vulkan-drivers when missing (Debian);
#   - the vendored ggml-vulkan needs Vulkan headers newer than Debian 12's 1.3.239 (it uses
#     vk::LayerSettingEXT): Debian 13's libvulkan-dev package is fetched once and unpacked under
#     target/ (nothing installed system-wide), and handed to the build as VULKAN_SDK;
#   - builds with `--features vulkan` in cargo's target dir (the feature changes only ggml's and
#     our crate's hashes, so the CPU build's artifacts stay; the uplifted binaries become the
#     Vulkan ones, which is why this runs last);
#   - runs the device tests (gated on PARAKEET_TEST_DEVICE; without it they print a skip line)
#     and the NeMo parity tests of the built-in lowering with their models on the device
#     (PARAKEET_DEVICE).
# ggml skips CPU-type Vulkan devices unless GGML_VK_VISIBLE_DEVICES names them; lavapipe is one.
# Each shader pipeline compiles on first use (seconds each), then runs in milliseconds.
# Usage (repo root): scripts/ci_vulkan.sh [extra cargo test args]   Env: CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
target_dir=${CARGO_TARGET_DIR:-target}

missing=()
command -v glslc >/dev/null 2>&1 || missing+=(glslc)
[ -f /usr/include/spirv/unified1/spirv.hpp ] || missing+=(spirv-headers)
ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so ' || missing+=(libvulkan-dev)
ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Newer Vulkan headers, unpacked once (cached under the target dir).
deb=libvulkan-dev_1.4.309.0-1_amd64.deb
sha=8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a
sdk_root=$target_dir/vulkan-sdk
if [ ! -f "$sdk_root/usr/include/vulkan/vulkan.hpp" ]; then
  mkdir -p "$sdk_root"
  curl -fsSL -o "$sdk_root/$deb" "http://deb.debian.org/debian/pool/main/v/vulkan-loader/$deb"
  echo "$sha  $sdk_root/$deb" | sha256sum -c --quiet
  dpkg -x "$sdk_root/$deb" "$sdk_root"
  rm "$sdk_root/$deb"
fi
sdk=$(cd "$sdk_root/usr" && pwd)
# FindVulkan looks for include/ and lib/ under VULKAN_SDK; the loader is the system's.
mkdir -p "$sdk/lib"
ln -sf "$(ldconfig -p | awk '/libvulkan\.so\.1 /{print $NF; exit}')" "$sdk/lib/libvulkan.so"
export VULKAN_SDK=$sdk
echo "vulkan headers: $(grep -m1 -o 'VK_HEADER_VERSION [0-9]*' "$sdk/include/vulkan/vulkan_core.h")"

export GGML_NO_BACKTRACE=1 CARGO_INCREMENTAL=0
# One cargo invocation builds the binary and the test binaries: feature unification then gives
# llama-cpp-sys-2's build script one hash, and ggml with Vulkan is compiled once. That script
# hands every GGML_* variable to CMake and reruns when one changes, so GGML_VK_VISIBLE_DEVICES
# is set only for the runs below, which call the built binaries directly (not through cargo).
start=$SECONDS
built=$(cargo test --features vulkan --bin parakeet --test device --test pipeline --no-run 2>&1 \
  | tee /dev/stderr | grep -o '(.*deps/[a-z_]*-[0-9a-f]*)' | tr -d '()')
echo "vulkan build: $((SECONDS - start)) s"
test_bin() { echo "$built" | grep "/$1-" | head -1; }
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
"$target_dir/debug/parakeet" info --system

start=$SECONDS
# Graphs of ggml's ops on the device against the CPU backend, state tensors, out of memory.
PARAKEET_TEST_DEVICE=vulkan "$(test_bin device)" --nocapture --test-threads 1
echo "vulkan device tests: $((SECONDS - start)) s"
# NeMo parity on the device: the built-in lowering's tests (every head's tiny model: TDT, RNN-T,
# CTC, hybrid, cache-aware streaming, Sortformer offline and streaming), their models loaded
# on `PARAKEET_DEVICE`, at the CPU suite's tolerances (every encoder layer and its output 1e-4
# relative to NeMo in f32; tokens exact; Sortformer's stages as tests/pipeline/diar.rs states).
start=$SECONDS
PARAKEET_DEVICE=vulkan "$(test_bin pipeline)" on_ggml_ops "$@"
echo "vulkan parity tests: $((SECONDS - start)) s"
echo "ci_vulkan: ${SECONDS} s in all"
