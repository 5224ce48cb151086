#!/usr/bin/env bash
# The Windows build, cross-compiled with mingw-w64 and run under Wine on the tiny models: every
# command gives what the Linux binary gives (text, SRT, VTT and converted GGUFs byte for byte,
# JSON numbers within 1e-5, the same exit codes), and Windows' own bad input (device names,
# long paths, a read-only output folder) gets a clear error or works.
#
# Installs what it needs when missing (Debian: mingw-w64's posix GCC, wine64, curl; rustup: the
# x86_64-pc-windows-gnu standard library). The Linux binary is the dev build `cargo test`
# already made (PROFILE, default dev); the exe is built in WIN_PROFILE (default dev: ggml
# optimised, as the tests run it). Wine 8 lacks the ProcessPrng that Rust's standard library
# imports, so a stand-in bcryptprimitives.dll (scripts/wine/) goes into the Wine prefix's
# system folder, never beside the exe. The prefix and the stand-in live in target/wine.
# Usage (repo root): scripts/ci_windows.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
profile=${PROFILE:-dev}
win_profile=${WIN_PROFILE:-dev}
triple=x86_64-pc-windows-gnu
target_dir=${CARGO_TARGET_DIR:-target}
out_dir() { if [ "$1" = dev ]; then echo debug; else echo "$1"; fi; }
wine=/usr/lib/wine/wine64

missing=()
command -v x86_64-w64-mingw32-g++-posix >/dev/null 2>&1 || missing+=(g++-mingw-w64-x86-64-posix)
[ -x "$wine" ] || missing+=(wine64)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"
echo "windows: tools ready in ${SECONDS} s"

cargo build --quiet --profile "$profile" --bin parakeet
linux=$(realpath "$target_dir/$(out_dir "$profile")/parakeet")
t0=$SECONDS
cargo build --quiet --profile "$win_profile" --target "$triple" --bin parakeet
exe=$(realpath "$target_dir/$triple/$(out_dir "$win_profile")/parakeet.exe")
echo "windows: exe built in $((SECONDS - t0)) s"

# One file, nothing beside it: only Windows' own DLLs imported (api-ms-win-* are API sets that
# Windows 8 and later resolve itself).
dlls=$(x86_64-w64-mingw32-objdump -p "$exe" | sed -n 's/^\s*DLL Name: //p' | tr 'A-Z' 'a-z' | sort -u)
foreign=$(grep -vxE 'kernel32\.dll|msvcrt\.dll|ntdll\.dll|advapi32\.dll|bcrypt\.dll|bcryptprimitives\.dll|ws2_32\.dll|userenv\.dll|ole32\.dll|oleaut32\.dll|user32\.dll|shell32\.dll|secur32\.dll|crypt32\.dll|ncrypt\.dll|iphlpapi\.dll|api-ms-win-[a-z0-9-]*\.dll|propsys\.dll|winmm\.dll|avrt\.dll|mmdevapi\.dll|combase\.dll|psapi\.dll|rpcrt4\.dll' <<<"$dlls" || true)

wine_dir=$(realpath -m "$target_dir/wine")
export WINEPREFIX=$wine_dir/prefix WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
mkdir -p "$wine_dir"
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  "$wine" wineboot -i >/dev/null 2>&1 || true
fi
x86_64-w64-mingw32-gcc-posix -O2 -shared -s -o "$wine_dir/bcryptprimitives.dll" \
  scripts/wine/bcryptprimitives.c -ladvapi32
cp "$wine_dir/bcryptprimitives.dll" "$WINEPREFIX/drive_c/windows/system32/"
# One Wine server for every run (each exe start then takes a fraction of a second, not seconds).
/usr/lib/wine/wineserver -p </dev/null >/dev/null 2>&1 &
echo "windows: Wine prefix ready at $((SECONDS)) s"

work=$(mktemp -d)
cleanup() {
  chattr -i "$work/readonly" 2>/dev/null || true
  [ -n "${server_pids:-}" ] && kill $server_pids 2>/dev/null || true
  /usr/lib/wine/wineserver -k 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export PARAKEET_CACHE=$work/cache
fixtures=$PWD/tests/fixtures
clip2=$fixtures/audio/speech_2s.wav
clip10=$fixtures/audio/speech_10s.wav
fail=0
pass=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

if [ -z "$foreign" ]; then
  ok "parakeet.exe imports only Windows' DLLs: $(tr '\n' ' ' <<<"$dlls")"
else
  bad "parakeet.exe needs DLLs Windows lacks: $foreign"
fi

# run SIDE NAME ARGS...: the binary of SIDE (linux | win) with ARGS, in $work/SIDE, stdout to
# $work/SIDE/NAME.out, stderr to .err, exit code to .rc (stdin from $STDIN or nothing).
run() {
  local side=$1 name=$2
  shift 2
  mkdir -p "$work/$side"
  local bin=("$linux")
  [ "$side" = win ] && bin=("$wine" "$exe")
  set +e
  (cd "$work/$side" && "${bin[@]}" "$@" <"${STDIN:-/dev/null}" >"$name.out" 2>"$name.err")
  echo $? >"$work/$side/$name.rc"
  set -e
}
# both NAME ARGS...: the same command on both sides.
both() {
  run linux "$@"
  run win "$@"
}
# same_rc NAME: both exit codes equal; prints the Windows side's stderr when not.
same_rc() {
  local a b
  a=$(cat "$work/linux/$1.rc") b=$(cat "$work/win/$1.rc")
  if [ "$a" = "$b" ]; then return 0; fi
  bad "$1: exit $b under Wine, $a on Linux: $(head -c 600 "$work/win/$1.err")"
  return 1
}
# same_out NAME [json]: exit codes and stdout equal (JSON numbers within 1e-5 with `json`).
same_out() {
  same_rc "$1" || return 0
  if [ "${2:-}" = json ]; then
    if python3 scripts/wine/same_json.py "$work/linux/$1.out" "$work/win/$1.out" 2>"$work/diff"; then
      ok "$1 (exit $(cat "$work/win/$1.rc"), JSON within 1e-5)"
    else
      bad "$1: $(cat "$work/diff")"
    fi
  elif cmp -s "$work/linux/$1.out" "$work/win/$1.out"; then
    ok "$1 (exit $(cat "$work/win/$1.rc"), $(wc -c <"$work/win/$1.out") bytes identical)"
  else
    bad "$1: stdout differs"
    diff "$work/linux/$1.out" "$work/win/$1.out" | head -10
  fi
}
# same_files NAME LINUX_DIR WIN_DIR: the same file names, text formats identical, JSON within 1e-5.
same_files() {
  local name=$1 a=$2 b=$3 f n=0
  if [ "$(cd "$a" && find . -type f | sort)" != "$(cd "$b" && find . -type f | sort)" ]; then
    bad "$name: different files: $(cd "$a" && find . -type f | sort | tr '\n' ' ') vs $(cd "$b" && find . -type f | sort | tr '\n' ' ')"
    return
  fi
  while IFS= read -r f; do
    n=$((n + 1))
    if [[ $f == *.json ]]; then
      python3 scripts/wine/same_json.py "$a/$f" "$b/$f" 2>"$work/diff" || {
        bad "$name: $f: $(cat "$work/diff")"
        return
      }
    elif ! cmp -s "$a/$f" "$b/$f"; then
      bad "$name: $f differs"
      diff "$a/$f" "$b/$f" | head -6
      return
    fi
  done < <(cd "$a" && find . -type f | sort)
  ok "$name ($n files equal)"
}

# info --system: the same kernels chosen at run time.
both info info --system
same_rc info && if [ "$(grep -i kernel "$work/linux/info.out")" = "$(grep -i kernel "$work/win/info.out")" ]; then
  ok "info --system: the same kernels: $(grep -i -m1 kernel "$work/win/info.out")"
else
  bad "info --system: kernels differ"
  diff <(grep -i kernel "$work/linux/info.out") <(grep -i kernel "$work/win/info.out") | head
fi

# convert: byte-identical GGUFs, f32 and q8_0.
for ty in f32 q8_0; do
  both "convert-$ty" convert "$fixtures/tiny_tdt.nemo" "tiny_tdt_$ty.gguf" --type "$ty"
  same_rc "convert-$ty" && if cmp -s "$work/linux/tiny_tdt_$ty.gguf" "$work/win/tiny_tdt_$ty.gguf"; then
    ok "convert --type $ty: identical GGUF ($(wc -c <"$work/win/tiny_tdt_$ty.gguf") bytes)"
  else
    bad "convert --type $ty: the GGUFs differ"
  fi
done
for m in tiny_ctc tiny_stream_rnnt tiny_sortformer; do
  "$linux" convert "$fixtures/$m.nemo" "$work/$m.gguf" >/dev/null
done
model=$work/linux/tiny_tdt_f32.gguf

# transcribe: every format, both clips, outputs under a folder.
both transcribe transcribe "$clip2" "$clip10" -m "$model" -t 2 -f txt,json,srt,vtt -o out --quiet
same_rc transcribe && same_files "transcribe txt/json/srt/vtt" "$work/linux/out" "$work/win/out"
both transcribe-q8 transcribe "$clip10" -m "$work/linux/tiny_tdt_q8_0.gguf" -t 2 --quiet
same_out transcribe-q8
both transcribe-ctc transcribe "$clip10" -m "$work/tiny_ctc.gguf" -t 2 -f json --quiet
same_out transcribe-ctc json

# A folder with a bad file among good ones: that one fails, the rest are written, same exit.
for side in linux win; do
  mkdir -p "$work/$side/batch/sub dir"
  cp "$clip2" "$work/$side/batch/a.wav"
  cp "$clip10" "$work/$side/batch/sub dir/ünïcode talk.wav"
  head -c 3000 /dev/urandom >"$work/$side/batch/broken.wav"
done
both batch transcribe batch -m "$model" -t 2 -f txt,json -o batch-out --quiet
same_rc batch && same_files "transcribe a folder with a broken file" "$work/linux/batch-out" "$work/win/batch-out"
grep -q broken.wav "$work/win/batch.err" && ok "the broken file is named: $(grep -m1 broken.wav "$work/win/batch.err")" ||
  bad "the broken file is not named: $(cat "$work/win/batch.err")"

# Standard input, in binary: WAV in, text out.
STDIN=$clip10 both stdin transcribe - -m "$model" -t 2 --quiet
same_out stdin

# vad, diarize, stream from a file.
both vad vad "$clip10" -f json
same_out vad json
both diarize diarize "$clip10" -m "$work/tiny_sortformer.gguf" -f json
same_out diarize json
both stream stream "$clip10" -m "$work/tiny_stream_rnnt.gguf" -t 2
same_out stream
STDIN=$clip10 both stream-stdin stream - -m "$work/tiny_stream_rnnt.gguf" -t 2
same_out stream-stdin

# Windows paths: a drive letter with backslashes, spaces and non-ASCII names.
winclip=$("$wine" winepath -w "$work/win/batch/sub dir/ünïcode talk.wav" 2>/dev/null)
run win winpath transcribe "$winclip" -m "$model" -t 2 --quiet
run linux winpath transcribe "$work/linux/batch/sub dir/ünïcode talk.wav" -m "$model" -t 2 --quiet
same_out winpath

# serve: each side's server answers curl on this side with the same JSON.
server_pids=
serve() {
  local side=$1
  local bin=("$linux")
  [ "$side" = win ] && bin=("$wine" "$exe")
  "${bin[@]}" serve -m "$model" -t 2 --port 0 2>"$work/$side-serve.err" >/dev/null &
  server_pids="$server_pids $!"
  echo $! >"$work/$side-serve.pid"
  local i port=
  for i in $(seq 1 120); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/$side-serve.err")
    [ -n "$port" ] && break
    sleep 0.5
  done
  echo "$port"
}
for side in linux win; do
  port=$(serve $side)
  if [ -z "$port" ]; then
    bad "serve ($side): no port: $(cat "$work/$side-serve.err")"
    continue
  fi
  curl -s -F file=@"$clip10" -F response_format=verbose_json -F timestamp_granularities[]=word \
    "http://127.0.0.1:$port/v1/audio/transcriptions" >"$work/$side/serve.out" || true
  kill -INT "$(cat "$work/$side-serve.pid")"
  set +e
  wait "$(cat "$work/$side-serve.pid")"
  echo $? >"$work/$side/serve.rc"
  set -e
done
same_out serve json

# Ctrl-C in a batch: the exe stops, says so with the exit code of an interrupted command, and
# leaves no temp file (Wine turns SIGINT into the console's Ctrl-C event).
mkdir -p "$work/win/many"
for i in $(seq -w 1 40); do cp "$clip10" "$work/win/many/talk$i.wav"; done
(cd "$work/win" && exec "$wine" "$exe" transcribe many -m "$model" -t 2 -f txt,json -o many-out \
  2>ctrlc.err >/dev/null) &
pid=$!
for i in $(seq 1 200); do
  [ -n "$(ls "$work/win/many-out" 2>/dev/null)" ] && break
  sleep 0.1
done
kill -INT $pid
set +e
wait $pid
rc=$?
set -e
temps=$(find "$work/win/many-out" -name '.parakeet-*' 2>/dev/null | wc -l)
written=$(find "$work/win/many-out" -name '*.json' 2>/dev/null | wc -l)
if [ "$rc" = 130 ] && [ "$temps" = 0 ] && [ "$written" -lt 40 ]; then
  ok "Ctrl-C ends the batch: exit 130, $written of 40 files written, no temp file left"
else
  bad "Ctrl-C: exit $rc, $temps temp files, $written of 40 written: $(tail -3 "$work/win/ctrlc.err")"
fi

# Windows' own bad input. A device name, as input and as an output's name.
for dev in CON NUL aux.wav; do
  [ "$dev" = aux.wav ] && cp "$clip2" "$work/win/aux.wav"
  run win "dev-$dev" transcribe "$dev" -m "$model" -t 2 --quiet
  rc=$(cat "$work/win/dev-$dev.rc")
  err=$(head -c 300 "$work/win/dev-$dev.err")
  if [ "$rc" = 2 ] && [ "$(wc -l <"$work/win/dev-$dev.err")" -le 2 ]; then
    ok "transcribe $dev: exit 2: $err"
  else
    bad "transcribe $dev: exit $rc: $err"
  fi
done
# In a folder: aux.wav fails, the other file is written.
mkdir -p "$work/win/devs"
cp "$clip2" "$work/win/devs/aux.wav"
cp "$clip2" "$work/win/devs/fine.wav"
run win devs transcribe devs -m "$model" -t 2 -o devs-out --quiet
if [ "$(cat "$work/win/devs.rc")" != 0 ] && [ -f "$work/win/devs-out/fine.txt" ] && grep -q aux "$work/win/devs.err"; then
  ok "a folder with aux.wav: it fails ($(grep -m1 aux "$work/win/devs.err")), fine.wav is written"
else
  bad "a folder with aux.wav: exit $(cat "$work/win/devs.rc"), $(ls "$work/win/devs-out" 2>/dev/null): $(cat "$work/win/devs.err")"
fi

# A path over 260 characters (Rust's std gives Windows the \\?\ form it needs).
long=$work/win/$(printf 'a%.0s' $(seq 1 120))/$(printf 'b%.0s' $(seq 1 120))
mkdir -p "$long"
cp "$clip2" "$long/talk.wav"
run win long transcribe "$long/talk.wav" -m "$model" -t 2 -o "$long/out" --quiet
if [ "$(cat "$work/win/long.rc")" = 0 ] && cmp -s "$long/out/talk.txt" "$work/linux/out/speech_2s.txt"; then
  ok "a ${#long}-character path: read and written"
else
  bad "a ${#long}-character path: exit $(cat "$work/win/long.rc"): $(head -c 300 "$work/win/long.err")"
fi

# A read-only output folder (immutable: root writes through permissions, also under Wine):
# that file fails with exit 2 and a clear error.
mkdir -p "$work/readonly"
if chattr +i "$work/readonly" 2>/dev/null; then
  run win readonly transcribe "$clip2" -m "$model" -t 2 -o "$work/readonly" --quiet
  rc=$(cat "$work/win/readonly.rc")
  if [ "$rc" = 2 ] && grep -q 'cannot' "$work/win/readonly.err"; then
    ok "a read-only output folder: exit 2: $(head -c 300 "$work/win/readonly.err")"
  else
    bad "a read-only output folder: exit $rc: $(head -c 300 "$work/win/readonly.err")"
  fi
  chattr -i "$work/readonly"
else
  echo "skipped: a read-only output folder (chattr +i is not available on this file system)"
fi

echo "windows checks: $pass ok, $fail failed, ${SECONDS} s in all"
[ "$fail" = 0 ]
