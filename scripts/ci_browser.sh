#!/usr/bin/env bash
# The page of `parakeet serve` in a real headless Chromium: installs Debian's chromium and
# chromium-driver, selenium (into target/browser-venv) and axe-core (npm, into target/browser-npm;
# skipped with a note when npm or its registry is unavailable) when missing, builds the dev
# binary (reused when `cargo test` built it), runs tests/browser/test_page.py, and keeps its
# screenshots under target/browser/ as the CI artifact. Prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
target="${CARGO_TARGET_DIR:-target}"

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi

venv=target/browser-venv
if ! "$venv/bin/python" -c "import selenium, numpy" >/dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check selenium numpy
fi

axe=target/browser-npm/node_modules/axe-core/axe.min.js
if [ ! -f "$axe" ] && command -v npm >/dev/null 2>&1; then
  npm install --silent --no-audit --no-fund --prefix target/browser-npm axe-core@4 \
    || echo "note: axe-core could not be installed; the page's own accessibility checks still run"
fi

export GGML_NO_BACKTRACE=1 CARGO_INCREMENTAL=0
cargo build --quiet --bin parakeet
rm -rf target/browser
"$venv/bin/python" tests/browser/test_page.py --binary "$target/debug/parakeet" \
  --out target/browser --axe "$axe"
echo "browser tests: ${SECONDS} s (screenshots in target/browser/)"
