#!/usr/bin/env bash
# A soak of `quench serve`: starts a server, runs scripts/soak.py against it (many clients
# of mixed traffic: answers, streams, cancelled streams, session turns and deletions,
# completions, embeddings), then stops it with SIGTERM, and writes a receipt with the
# requests, failures, p50/p99 latency, KV blocks and memory before and after, and the
# time the server took to stop.
#
#   scripts/soak.sh                      64 clients for 10 minutes, on the CPU
#   SOAK_CLIENTS=16 SOAK_SECONDS=30 scripts/soak.sh
#   SOAK_DEVICE=cuda SOAK_MODEL=DIR scripts/soak.sh   the GPU server
#
# SOAK_MODEL and SOAK_EMBED_MODEL choose the models (default: smollm2 and minilm when
# pulled, else the built-in tiny ones); QUENCH_BIN the binary (default: a release build);
# SOAK_WARMUP the seconds after which memory must stay flat (default: half the run; the sessions the clients make fill the store first);
# SOAK_RECEIPT where the receipt goes (default: receipts/soak-$SOAK_DEVICE.json). Exits
# non-zero when a request failed, KV blocks were left in use, memory kept growing, or the
# server did not stop within its grace.
set -uo pipefail
cd "$(dirname "$0")/.."
clients=${SOAK_CLIENTS:-64}
seconds=${SOAK_SECONDS:-600}
device=${SOAK_DEVICE:-cpu}
grace=${SOAK_GRACE:-10}
warmup=${SOAK_WARMUP:-$((seconds / 2))}
receipt=${SOAK_RECEIPT:-receipts/soak-$device.json}
if [ -n "${QUENCH_BIN:-}" ]; then
    bin="$QUENCH_BIN"
else
    cargo build -q --release -p quench || exit 1
    bin=target/release/quench
fi
chat=${SOAK_MODEL:-}
embed=${SOAK_EMBED_MODEL:-}
if [ -z "$chat" ]; then
    if "$bin" info smollm2 >/dev/null 2>&1; then chat=smollm2; else chat=synthetic:tiny-chat; fi
fi
if [ -z "$embed" ] && [ "$device" = cpu ]; then
    if "$bin" info minilm >/dev/null 2>&1; then embed=minilm; else embed=synthetic:tiny-embed; fi
fi
# Every client is 127.0.0.1 and holds one session at a time; without API keys the address's
# quota refuses new sessions rather than forget others', so it must hold them all.
sessions=$(( clients * 2 > 256 ? clients * 2 : 256 ))
args=(serve --model "soak=$chat" --device "$device" --port 0 --context 1024
      --shutdown-grace "$grace" --queue 256 --max-sessions "$sessions"
      --sessions-per-client "$sessions")
[ -n "$embed" ] && args+=(--embedding-model "soak-embed=$embed")

log="$(mktemp)"
"$bin" "${args[@]}" 2>"$log" &
server=$!
trap 'kill -KILL "$server" 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 1200); do
    port="$(sed -n 's/.*"msg":"listening".*"port":\([0-9]*\).*/\1/p' "$log" | head -n1)"
    if [ -n "$port" ] && grep -q '"msg":"model loaded"' "$log"; then break; fi
    port=""
    kill -0 "$server" 2>/dev/null || { echo "soak: the server exited:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.5
done
[ -n "$port" ] || { echo "soak: the server did not start" >&2; cat "$log" >&2; exit 1; }

embed_args=()
[ -n "$embed" ] && embed_args=(--embed-model soak-embed)
mkdir -p "$(dirname "$receipt")"
python3 scripts/soak.py --port "$port" --chat-model soak "${embed_args[@]}" \
    --clients "$clients" --seconds "$seconds" --warmup "$warmup" --server-pid "$server" --binary "$bin" \
    --device "$device" --receipt "$receipt"
status=$?

# The server stops within its grace (nothing is in flight now).
started=$(date +%s.%N)
kill -TERM "$server"
wait "$server"
server_status=$?
stopped=$(date +%s.%N)
trap 'rm -f "$log"' EXIT
python3 - "$receipt" "$started" "$stopped" "$server_status" "$grace" <<'PY' || status=1
import json, sys
path, started, stopped, code, grace = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
r = json.load(open(path))
took = round(stopped - started, 2)
ok = code == 0 and took <= grace
r["outcome"]["shutdown"] = {"seconds": took, "exit_status": code, "within_grace": ok}
r["outcome"]["passed"] = r["outcome"]["passed"] and ok
json.dump(r, open(path, "w"), indent=1)
print(f"soak: the server stopped in {took} s with status {code}")
sys.exit(0 if ok else 1)
PY
errors=$(grep -c '"level":"error"' "$log" || true)
echo "soak: $errors error lines in the server's log; receipt $receipt"
exit $status
