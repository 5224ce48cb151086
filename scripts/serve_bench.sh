#!/bin/bash
# Start `parakeet serve`, run examples/serve_bench against it, stop it with SIGTERM.
# usage: scripts/serve_bench.sh MODEL PORT WORKERS THREADS (overhead URL MODEL AUDIO [N] [THREADS] | throughput URL AUDIO [REQUESTS] [CLIENTS])
# PROFILE=release uses target/release (default: the dev build in target/debug).
set -u
DIR=target/${PROFILE:-debug}
MODEL=$1; PORT=$2; W=$3; T=$4; shift 4
"$DIR/parakeet" serve -m "$MODEL" --port "$PORT" --workers "$W" --threads "$T" 2>/dev/null &
SRV=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.2; done
"$DIR/examples/serve_bench" "$@"
kill -TERM "$SRV"; wait "$SRV"; echo "server exit $?"
