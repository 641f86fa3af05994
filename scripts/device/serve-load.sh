#!/usr/bin/env bash
# Serving under load on the GPU: a synthetic llama-3.1-8b (bf16, `quench synth --seed 1`,
# under $SYNTH_DIR; with QUANTIZE=q4_k or another `quench quantize --type`, that checkpoint
# quantized) served by `quench serve --device cuda --max-batch 128`, and the load client
# (serve_load.py, Python standard library only): per prompt length (128 and 1024 tokens)
# and concurrency level, 128 greedy output tokens a request, aggregate output tokens/s,
# time to first token, inter-token latency p50/p99, failures, and the share of answers
# identical to the same request sent alone (bound: all of them); then the prefix cache's
# time to first token for a 1024-token prompt alone, cold and cached.
#
#   scripts/device/serve-load.sh [LEVEL ...]          (default: 1 16 64 128)
#
# Run from the repository root with the release binary carried (target/release/quench).
# Writes to $OUT (or receipts/ when OUT is unset):
#   serve-load.json         the receipt (per length and level, and the prefix cache)
#   serve-load.svg          tokens/s and latencies against concurrency
#   serve-load-client.log   what the client printed
#   serve-load-server.log   the server's log lines
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
PORT=${PORT:-8093}
ROUNDS=${ROUNDS:-2}
PROMPTS=${PROMPTS:-128 1024}
HERE=$(dirname "$0")
LEVELS=("$@")
[ ${#LEVELS[@]} -gt 0 ] || LEVELS=(1 16 64 128)
mkdir -p "$DEST" "$SYNTH_DIR"
"$BIN" devices || exit 1

dir="$SYNTH_DIR/llama-3.1-8b"
[ -f "$dir/config.json" ] || "$BIN" synth --shape llama-3.1-8b --seed 1 "$dir" || exit 1
model="$dir"
if [ -n "${QUANTIZE:-}" ]; then
    model="$SYNTH_DIR/llama-3.1-8b.$QUANTIZE.gguf"
    [ -f "$model" ] || "$BIN" quantize --type "$QUANTIZE" "$dir" "$model" || exit 1
fi

# Sessions of 2048 positions hold a 1024-token prompt and 128 generated tokens; 10,240 KV
# blocks of 16 positions hold 128 such requests at once (72 blocks each) with room to
# spare for the prefix cache.
"$BIN" serve --device cuda --model "llama=$model" --port "$PORT" --max-batch 128 \
    --context 2048 --kv-blocks 10240 --queue 1024 >"$DEST/serve-load-server.log" 2>&1 &
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

# shellcheck disable=SC2086 # PROMPTS is a list of lengths
python3 "$HERE/serve_load.py" --url "http://127.0.0.1:$PORT" --model llama \
    --levels "${LEVELS[@]}" --prompt-tokens $PROMPTS --rounds "$ROUNDS" \
    --receipt "$DEST/serve-load.json" --plot "$DEST/serve-load.svg" \
    --binary "$BIN" --checkpoint "$model" 2>&1 | tee "$DEST/serve-load-client.log"
status=${PIPESTATUS[0]}

kill -TERM "$server" 2>/dev/null
wait "$server" 2>/dev/null
trap - EXIT
exit "$status"
