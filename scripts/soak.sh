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
# non-zero when a request failed, KV blocks were left in use, memory grew past its bound
# after the warm-up, or the server, stopped with SIGTERM while 8 streams are in flight, was
# not gone within its grace plus 4 s.
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

# The server stops under load: streams that would run to the end of the context are in
# flight when SIGTERM comes. It answers them until its grace runs out, then cancels them,
# and must be gone within the grace plus one step and the few seconds it gives open
# connections to close (docs/serve.md).
inflight_log="$(mktemp)"
python3 - "$port" "$inflight_log" <<'PY' &
import json, sys, threading, urllib.request
port, out = sys.argv[1], sys.argv[2]
ended = []
def one(i):
    body = {"model": "soak", "stream": True, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Count to a thousand ({i})."}]}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    how = "closed"
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for line in r:
                if b'"error"' in line:
                    how = "error event"
                elif line.strip() == b"data: [DONE]":
                    how = "finished"
    except Exception as e:  # a refused or broken connection also ends it
        how = f"failed: {e.__class__.__name__}"
    ended.append(how)
threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
json.dump(ended, open(out, "w"))
PY
inflight=$!
sleep 2
started=$(date +%s.%N)
kill -TERM "$server"
wait "$server"
server_status=$?
stopped=$(date +%s.%N)
wait "$inflight"
trap 'rm -f "$log" "$inflight_log"' EXIT
python3 - "$receipt" "$started" "$stopped" "$server_status" "$grace" "$inflight_log" <<'PY' || status=1
import json, sys
path, started, stopped, code, grace = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
inflight = json.load(open(sys.argv[6]))
r = json.load(open(path))
took = round(stopped - started, 2)
# One step of the soak's models takes well under a second; the server gives open
# connections up to 3 s to close after the engines stop.
bound = grace + 4
ok = code == 0 and took <= bound and len(inflight) == 8
r["outcome"]["shutdown"] = {"seconds": took, "exit_status": code, "bound_seconds": bound,
                            "within_bound": ok, "streams_in_flight": len(inflight),
                            "how_they_ended": inflight}
r["outcome"]["passed"] = r["outcome"]["passed"] and ok
json.dump(r, open(path, "w"), indent=1)
print(f"soak: the server stopped in {took} s with status {code}, 8 streams in flight: {inflight}")
sys.exit(0 if ok else 1)
PY
errors=$(grep -c '"level":"error"' "$log" || true)
echo "soak: $errors error lines in the server's log; receipt $receipt"
exit $status
