#!/usr/bin/env bash
# Runs the server tests: builds quench, starts `quench serve` on a free port, runs the
# openai-client tests (pytest, and node's test runner for the JavaScript client) and the
# chat page test (Playwright in Debian's Chromium) against it, then stops it with SIGTERM
# and checks that it exits cleanly.
#
# Needs: python3 with `openai`, `pytest`, `jsonschema` and `langchain-openai`, node with
# npm, and /usr/bin/chromium (or CHROMIUM=path). Models: SmolLM2 and MiniLM when both are pulled (`quench pull smollm2`,
# `quench pull minilm`), else the built-in tiny models (or with QUENCH_SERVER_TINY=1).
# QUENCH_SKIP_BROWSER=1 leaves out the browser test; QUENCH_BIN=path uses that binary
# instead of building one.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

missing=()
python3 -c "import openai, pytest, jsonschema, langchain_openai" 2>/dev/null \
    || missing+=("pip install openai pytest jsonschema langchain-openai")
command -v npm >/dev/null || missing+=("apt-get install -y nodejs npm")
if [ "${QUENCH_SKIP_BROWSER:-0}" != 1 ]; then
    [ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing+=("apt-get install -y chromium")
fi
if [ ${#missing[@]} -gt 0 ]; then
    printf 'server tests: missing prerequisites; install them with:\n' >&2
    printf '  %s\n' "${missing[@]}" >&2
    exit 1
fi

if [ -n "${QUENCH_BIN:-}" ]; then
    bin="$QUENCH_BIN"
else
    cargo build --release -p quench
    bin="$root/target/release/quench"
fi

chat="synthetic:tiny-chat"
embed="synthetic:tiny-embed"
chat_name="tiny-chat"
embed_name="tiny-embed"
real=0
extra=()
if [ "${QUENCH_SERVER_TINY:-0}" != 1 ] && "$bin" info smollm2 >/dev/null 2>&1 \
    && "$bin" info minilm >/dev/null 2>&1; then
    chat="smollm2"
    embed="minilm"
    chat_name="smollm2"
    embed_name="minilm"
    real=1
    extra=(--context 1024)
fi

work="$(mktemp -d)"
log="$work/server.log"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$bin" serve --model "$chat" --embedding-model "$embed" --host 127.0.0.1 --port 0 \
    --max-batch 16 --queue 64 --header-timeout 2 --body-timeout 2 --shutdown-grace 10 \
    "${extra[@]}" 2>"$log" &
server_pid=$!

port=""
for _ in $(seq 1 600); do
    port="$(sed -n 's/.*"msg":"listening".*"port":\([0-9]*\).*/\1/p' "$log" | head -n1)"
    [ -n "$port" ] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "server tests: quench serve exited at startup:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.2
done
if [ -z "$port" ]; then
    echo "server tests: quench serve did not start listening" >&2
    cat "$log" >&2
    exit 1
fi
echo "server tests: quench serve on port $port with $chat_name and $embed_name"

export QUENCH_URL="http://127.0.0.1:$port/v1"
export QUENCH_ROOT="http://127.0.0.1:$port"
export QUENCH_CHAT_MODEL="$chat_name"
export QUENCH_EMBED_MODEL="$embed_name"
export QUENCH_REAL_MODELS="$real"

status=0
python3 -m pytest -q -s -p no:cacheprovider "$here" || status=$?

if [ $status -eq 0 ]; then
    if [ ! -d "$here/node_modules/playwright-core" ] || [ ! -d "$here/node_modules/openai" ]; then
        npm ci --prefix "$here" --no-audit --no-fund --silent
    fi
    node --test "$here/openai_client.test.mjs" || status=$?
fi
if [ "${QUENCH_SKIP_BROWSER:-0}" != 1 ] && [ $status -eq 0 ]; then
    node --test "$here/chat_page.test.mjs" || status=$?
fi

kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=""
if [ $server_status -ne 0 ] || ! grep -q '"msg":"stopped"' "$log"; then
    echo "server tests: quench serve did not shut down cleanly on SIGTERM (exit $server_status)" >&2
    tail -n 20 "$log" >&2
    status=1
else
    echo "server tests: quench serve stopped on SIGTERM with exit 0"
fi
requests=$(grep -c '"msg":"request"' "$log" || true)
errors=$(grep -c '"level":"error"' "$log" || true)
echo "server tests: $requests requests logged, $errors error lines"
exit $status
