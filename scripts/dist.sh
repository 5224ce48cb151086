#!/usr/bin/env bash
# Release archives: dist/parakeet-<version>-<target>.tar.gz for x86_64 and aarch64 Linux and
# dist/parakeet-<version>-x86_64-pc-windows-gnu.zip for Windows, each with the binary, README.md,
# the licence files and THIRD_PARTY_LICENSES.txt (ggml's MIT licence and every crate linked in,
# from `cargo metadata`: scripts/third_party_licenses.py).
#
# The x86-64 binary runs on any x86-64-v2 CPU (.cargo/config.toml) and picks its kernels at run
# time; the aarch64 one on any ARMv8-A. Both link the GCC runtime (libgomp, libstdc++)
# statically (feature `static-runtime`), so they need only glibc (the version they report).
# They leave the microphone out (default feature `mic`, which would need ALSA's library on the
# machine, and ALSA built for ARM to cross-build); `parakeet stream` still reads files and pipes.
#
# The Windows exe (mingw-w64, .cargo/config.toml) links the GCC runtime, libgomp and winpthreads
# in (no DLL beside it) and keeps the microphone (WASAPI, through cpal).
#
# Needs the aarch64 cross compilers (apt-get install gcc-aarch64-linux-gnu
# g++-aarch64-linux-gnu; `rustup target add aarch64-unknown-linux-gnu`) and mingw-w64's posix
# GCC (g++-mingw-w64-x86-64-posix; `rustup target add x86_64-pc-windows-gnu`); installs them
# when missing.
# Usage (repo root): scripts/dist.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu x86_64-pc-windows-gnu)
target_dir=${CARGO_TARGET_DIR:-target}
version=$(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["packages"][0]["version"])')

for t in "${targets[@]}"; do
  case $t in
  aarch64-unknown-linux-gnu)
    if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1; then
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq gcc-aarch64-linux-gnu g++-aarch64-linux-gnu >/dev/null
    fi
    rustup target list --installed | grep -qx "$t" || rustup target add "$t"
    ;;
  x86_64-pc-windows-gnu)
    if ! command -v x86_64-w64-mingw32-g++-posix >/dev/null 2>&1; then
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends g++-mingw-w64-x86-64-posix >/dev/null
    fi
    rustup target list --installed | grep -qx "$t" || rustup target add "$t"
    ;;
  x86_64-unknown-linux-gnu) ;;
  *) echo "dist.sh: no recipe for target $t" >&2; exit 2 ;;
  esac
done

mkdir -p dist
for t in "${targets[@]}"; do
  features=(--no-default-features --features static-runtime)
  if [ "$t" = x86_64-pc-windows-gnu ]; then
    # The microphone stays (WASAPI needs nothing beyond Windows); static via .cargo/config.toml.
    features=()
  fi
  cargo build --release --locked --target "$t" --bin parakeet ${features[@]+"${features[@]}"}
  name=parakeet-$version-$t
  stage=dist/$name
  rm -rf "$stage"
  mkdir -p "$stage"
  cp README.md LICENSE-MIT LICENSE-APACHE "$stage/"
  python3 scripts/third_party_licenses.py "$t" ${features[@]+"${features[@]}"} >"$stage/THIRD_PARTY_LICENSES.txt"
  if [ "$t" = x86_64-pc-windows-gnu ]; then
    cp "$target_dir/$t/release/parakeet.exe" "$stage/"
    echo "$name: imports $(x86_64-w64-mingw32-objdump -p "$stage/parakeet.exe" | sed -n 's/^\s*DLL Name: //p' | tr '\n' ' ')"
    rm -f "dist/$name.zip"
    (cd dist && python3 -m zipfile -c "$name.zip" "$name")
    rm -rf "$stage"
    ls -l "dist/$name.zip"
    continue
  fi
  cp "$target_dir/$t/release/parakeet" "$stage/"
  # The newest glibc symbol version the binary needs: the oldest distribution it runs on.
  glibc=$(readelf -V "$stage/parakeet" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  echo "$name: needs $glibc; links $(readelf -d "$stage/parakeet" | grep -o 'NEEDED.*' | grep -o '\[.*\]' | tr -d '[]' | tr '\n' ' ')"
  tar -C dist -czf "dist/$name.tar.gz" "$name"
  rm -rf "$stage"
  ls -l "dist/$name.tar.gz"
done
