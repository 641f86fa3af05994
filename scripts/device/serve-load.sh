#!/usr/bin/env bash
# Serving under load on the GPU with batched decode: a synthetic llama-3.1-8b (bf16,
# `quench synth --seed 1`, under $SYNTH_DIR) served by `quench serve --device cuda
# --max-batch 64`, and the load client (serve_load.py, Python standard library only) at
# each concurrency level: aggregate decode tokens/s, p50/p99 inter-token latency, and the
# share of greedy answers identical to the same request sent alone (bound: all of them).
#
#   scripts/device/serve-load.sh [LEVEL ...]          (default: 1 8 32 64)
#
# Run from the repository root with the release binary carried (target/release/quench).
# Writes to $OUT (or receipts/ when OUT is unset):
#   serve-load.json         the receipt (per level: tokens/s, latencies, identical share)
#   serve-load-client.log   what the client printed
#   serve-load-server.log   the server's log lines
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
PORT=${PORT:-8093}
HERE=$(dirname "$0")
LEVELS=("$@")
[ ${#LEVELS[@]} -gt 0 ] || LEVELS=(1 8 32 64)
mkdir -p "$DEST" "$SYNTH_DIR"
"$BIN" devices || exit 1

dir="$SYNTH_DIR/llama-3.1-8b"
[ -f "$dir/config.json" ] || "$BIN" synth --shape llama-3.1-8b --seed 1 "$dir" || exit 1

# Sessions of 1024 positions (a 32-token prompt and 128 generated fit many times over);
# 4096 KV blocks of 16 positions hold 64 of them at once, one per row of a full batch.
"$BIN" serve --device cuda --model "llama=$dir" --port "$PORT" --max-batch 64 \
    --context 1024 --kv-blocks 4096 --queue 512 >"$DEST/serve-load-server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT

# Loading 16 GB of weights and compiling the kernels takes a while.
for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 ||
        python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
        ready=1
        break
    fi
    kill -0 "$server" 2>/dev/null || break
    sleep 1
done
if [ "${ready:-0}" != 1 ]; then
    echo "serve-load.sh: the server did not come up; its log:" >&2
    cat "$DEST/serve-load-server.log" >&2
    exit 1
fi

python3 "$HERE/serve_load.py" --url "http://127.0.0.1:$PORT" --model llama \
    --levels "${LEVELS[@]}" --receipt "$DEST/serve-load.json" \
    --binary "$BIN" --checkpoint "$dir" 2>&1 | tee "$DEST/serve-load-client.log"
status=${PIPESTATUS[0]}

kill -TERM "$server" 2>/dev/null
wait "$server" 2>/dev/null
trap - EXIT
exit "$status"
