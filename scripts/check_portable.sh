#!/usr/bin/env bash
# The portable-build checks, on the bundled tiny TDT model and the 2 s clip:
#   - the x86-64 binary gives the same text on this CPU, under `qemu-x86_64 -cpu Nehalem`
#     (SSE4.2, the baseline: our portable kernels) and `-cpu Haswell` (AVX2: our AVX2 kernels);
#   - under `-cpu core2duo` (below the x86-64-v2 baseline) it says so in one line and exits 2
#     instead of dying of SIGILL;
#   - the aarch64 cross build gives the same text under `qemu-aarch64`.
# Installs qemu-user and the aarch64 cross compilers when missing (Debian), and the Rust target.
# The x86-64 binary is the dev build `cargo test` already made (PROFILE, default dev); the
# aarch64 one is built in the `cross-check` profile (Cargo.toml: nothing optimised, no debug
# info, the cheapest build of the same code paths; AARCH64_PROFILE overrides it), without the
# microphone (cpal would need ALSA built for ARM).
# Usage (repo root): scripts/check_portable.sh    Env: PROFILE, AARCH64_PROFILE, SKIP_AARCH64=1.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-dev}
arm_profile=${AARCH64_PROFILE:-cross-check}
# cargo's output folder of a profile.
out_dir() { if [ "$1" = dev ]; then echo debug; else echo "$1"; fi; }
dir=$(out_dir "$profile")
target_dir=${CARGO_TARGET_DIR:-target}

missing=()
command -v qemu-x86_64 >/dev/null 2>&1 || missing+=(qemu-user)
if [ -z "${SKIP_AARCH64:-}" ]; then
  command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
  command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || missing+=(g++-aarch64-linux-gnu)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

start=$SECONDS
cargo build --quiet --profile "$profile" --bin parakeet
x86=$target_dir/$dir/parakeet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARAKEET_CACHE=$work/cache
model=$work/tiny_tdt.gguf
clip=tests/fixtures/audio/speech_2s.wav
"$x86" convert tests/fixtures/tiny_tdt.nemo "$model" >/dev/null

fail=0
# transcribe NAME COMMAND...: the text of the clip, compared with this CPU's.
transcribe() {
  local name=$1
  shift
  local t0=$SECONDS text
  text=$("$@" transcribe "$clip" -m "$model" -t 2 --quiet)
  if [ "$name" = native ]; then
    expected=$text
  elif [ "$text" != "$expected" ]; then
    echo "FAIL $name: '$text' (native: '$expected')"
    fail=1
    return
  fi
  echo "ok   $name ($((SECONDS - t0)) s): $text"
}

transcribe native "$x86"
for cpu in Nehalem Haswell; do
  transcribe "qemu-x86_64 -cpu $cpu" qemu-x86_64 -cpu "$cpu" "$x86"
done
qemu-x86_64 -cpu Nehalem "$x86" info --system | sed 's/^/     Nehalem: /'

# Below the baseline: one line on stderr, exit code 2, no signal.
set +e
msg=$(qemu-x86_64 -cpu core2duo "$x86" info --system 2>&1 >/dev/null)
rc=$?
set -e
if [ "$rc" = 2 ] && [ "$(printf '%s\n' "$msg" | wc -l)" = 1 ] && [[ $msg == *"this CPU lacks"* ]]; then
  echo "ok   qemu-x86_64 -cpu core2duo refuses: $msg"
else
  echo "FAIL qemu-x86_64 -cpu core2duo: exit $rc, '$msg'"
  fail=1
fi
echo "x86-64 checks: $((SECONDS - start)) s"

if [ -z "${SKIP_AARCH64:-}" ]; then
  start=$SECONDS
  # The Rust standard library for aarch64 comes from rustup's servers, which a machine may not
  # reach: then say so and skip the aarch64 check rather than fail on the download.
  if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu &&
    ! rustup target add aarch64-unknown-linux-gnu; then
    echo "SKIP aarch64: rustup could not install the aarch64-unknown-linux-gnu standard library"
    exit $fail
  fi
  cargo build --quiet --profile "$arm_profile" --bin parakeet --no-default-features \
    --target aarch64-unknown-linux-gnu
  arm=$target_dir/aarch64-unknown-linux-gnu/$(out_dir "$arm_profile")/parakeet
  echo "aarch64 build: $((SECONDS - start)) s"
  transcribe qemu-aarch64 qemu-aarch64 -L /usr/aarch64-linux-gnu "$arm"
  qemu-aarch64 -L /usr/aarch64-linux-gnu "$arm" info --system | sed 's/^/     aarch64: /'
fi
exit $fail
