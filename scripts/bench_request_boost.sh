#!/bin/bash
# Per-request latency of a `boost` field on a server started with a large --boost-file: the
# server's phrases are N made-up words, each request adds one phrase of its own.
# usage: scripts/bench_request_boost.sh BINARY MODEL AUDIO [PHRASES] [REQUESTS] [PORT]
set -u
BIN=$1; MODEL=$2; AUDIO=$3; N=${4:-100000}; R=${5:-3}; PORT=${6:-8765}
WORK=$(mktemp -d)
python3 - "$N" > "$WORK/phrases.txt" <<'PY'
import sys
syl = ["ka", "lo", "mi", "ter", "pon", "dra", "vel", "sun", "qui", "zor"]
for i in range(int(sys.argv[1])):
    w, n = "", i
    for _ in range(5):
        w += syl[n % 10]
        n //= 10
    print(f"{w} {syl[i % 7]}")
PY
start=$(date +%s.%N)
"$BIN" serve -m "$MODEL" --port "$PORT" --workers 1 --boost-file "$WORK/phrases.txt" 2>"$WORK/log" &
SRV=$!
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 "$SRV" 2>/dev/null || { cat "$WORK/log"; exit 1; }
  sleep 0.2
done
echo "startup with $N phrases: $(echo "$(date +%s.%N) - $start" | bc) s"
request() {
  curl -sf -o /dev/null -w "%{time_total}" "http://127.0.0.1:$PORT/v1/audio/transcriptions" \
    -F file=@"$AUDIO" -F model=x "$@"
}
echo "request without boost: $(request) s"
for i in $(seq "$R"); do
  echo "request with one boost phrase: $(request -F "boost=parakeet number $i") s"
done
kill -TERM "$SRV"; wait "$SRV"
rm -rf "$WORK"
