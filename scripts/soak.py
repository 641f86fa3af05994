#!/usr/bin/env python3
"""A soak of a running `quench serve`: many clients of mixed traffic for a while, then
checks that nothing leaked. Python standard library only.

Each client loops until the time is up, choosing at random among: a chat answer, a
streamed chat answer, a stream it cancels after its first tokens, a turn of a session
(each session deleted after four turns), a text completion and, with an embedding model, an
embeddings request. Before, during and after the run it reads the server's /metrics
(KV blocks, sessions, requests in flight) and the server process's memory, threads and
file descriptors (/proc). At the end it deletes the sessions it made, waits for the KV
blocks to come back, and writes a receipt (JSON).

A request fails when it gets anything but its expected answer: a status other than 200,
a stream without its end, a connection error. Cancelled streams are not failures.
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time

# The receipt's provenance fields, as the GPU load client writes them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "device"))
from serve_load import build_of, command, sha256  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "Say hello in Spanish.",
    "What is two plus two?",
    "Write one word that rhymes with cat.",
    "Name a planet.",
    "What do bees make?",
    "Tell me a fact about the sea.",
]


class Server:
    def __init__(self, host, port, key):
        self.host, self.port, self.key = host, port, key

    def connect(self, timeout=300):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def call(self, method, path, body=None, timeout=300):
        conn = self.connect(timeout)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers=self.headers())
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def metrics(self):
        status, text = self.call("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        out = {}
        for line in text.decode().splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            family = name.split("{", 1)[0]
            out[family] = out.get(family, 0.0) + float(value)
        return out


def process(pid):
    """Memory, threads and open files of the server process."""
    if not pid:
        return {}
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                fields[key] = int(value.split()[0])
    return {
        "rss_mib": round(fields.get("VmRSS", 0) / 1024, 1),
        "threads": fields.get("Threads", 0),
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
    }


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind = {}
        self.failures = []

    def add(self, kind, seconds, ok, detail=None):
        with self.lock:
            entry = self.by_kind.setdefault(kind, {"requests": 0, "failed": 0, "seconds": []})
            entry["requests"] += 1
            entry["seconds"].append(seconds)
            if not ok:
                entry["failed"] += 1
                if len(self.failures) < 50:
                    self.failures.append({"kind": kind, "detail": detail})


def chat_body(model, text, max_tokens, stream=False, session=None):
    body = {"model": model, "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "temperature": 0.7, "stream": stream}
    if session:
        body["session_id"] = session
    return body


def stream(server, body, cancel_after=None):
    """A streamed answer: True when it ended with [DONE] (or was cancelled as asked)."""
    conn = server.connect()
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers=server.headers())
        r = conn.getresponse()
        if r.status != 200:
            return False, f"status {r.status}: {r.read()[:200]!r}"
        events = 0
        while True:
            line = r.readline()
            if not line:
                return False, "the stream ended without [DONE]"
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    return True, None
                if b'"error"' in line:
                    return False, line[:200].decode(errors="replace")
                events += 1
                if cancel_after is not None and events >= cancel_after:
                    return True, None  # the connection closes below: a cancel
    finally:
        conn.close()


def client(index, args, server, tally, deadline, sessions_made):
    rng = random.Random(args.seed * 1000 + index)
    turn = 0
    while time.monotonic() < deadline:
        kind = rng.choices(
            ["chat", "stream", "cancel", "session", "completion", "embed"],
            weights=[30, 20, 10, 20, 10, 10 if args.embed_model else 0])[0]
        text = rng.choice(QUESTIONS)
        started = time.monotonic()
        ok, detail = True, None
        try:
            if kind == "chat":
                status, body = server.call("POST", "/v1/chat/completions",
                                           chat_body(args.chat_model, text, args.max_tokens))
                ok = status == 200 and "choices" in json.loads(body)
                detail = None if ok else f"status {status}: {body[:200]!r}"
            elif kind == "stream":
                ok, detail = stream(server, chat_body(args.chat_model, text, args.max_tokens, True))
            elif kind == "cancel":
                ok, detail = stream(server, chat_body(args.chat_model, text, 4 * args.max_tokens, True),
                                    cancel_after=2)
            elif kind == "session":
                sid = f"soak-{index}-{turn // 4}"
                turn += 1
                with tally.lock:
                    sessions_made.add(sid)
                status, body = server.call("POST", "/v1/chat/completions",
                                           chat_body(args.chat_model, text, args.max_tokens,
                                                     session=sid))
                ok = status == 200
                detail = None if ok else f"status {status}: {body[:200]!r}"
                # A conversation of four turns, then deleted: the sessions alive at once
                # stay about one a client, so memory can reach its plateau.
                if ok and turn % 4 == 0:
                    status, body = server.call("DELETE", f"/v1/sessions/{sid}")
                    ok = status == 200
                    detail = None if ok else f"delete: status {status}: {body[:200]!r}"
            elif kind == "completion":
                status, body = server.call("POST", "/v1/completions", {
                    "model": args.chat_model, "prompt": text, "max_tokens": args.max_tokens})
                ok = status == 200
                detail = None if ok else f"status {status}: {body[:200]!r}"
            else:
                texts = [rng.choice(QUESTIONS) for _ in range(rng.randint(1, 16))]
                status, body = server.call("POST", "/v1/embeddings",
                                           {"model": args.embed_model, "input": texts})
                ok = status == 200 and len(json.loads(body)["data"]) == len(texts)
                detail = None if ok else f"status {status}: {body[:200]!r}"
        except Exception as e:  # a connection error is a failure, and the soak goes on
            ok, detail = False, f"{type(e).__name__}: {e}"
        tally.add(kind, time.monotonic() - started, ok, detail)


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--api-key", default=os.environ.get("QUENCH_API_KEY"))
    p.add_argument("--chat-model", required=True)
    p.add_argument("--embed-model")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds after which memory is expected flat (default: half the run)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--server-pid", type=int)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--binary", default="", help="the server's binary, for the receipt")
    p.add_argument("--device", default="cpu", help="where the server's models run")
    p.add_argument("--receipt", required=True)
    args = p.parse_args()
    warmup = args.seconds / 2 if args.warmup is None else args.warmup

    server = Server(args.host, args.port, args.api_key)
    before = {"metrics": server.metrics(), "process": process(args.server_pid)}
    tally = Tally()
    sessions_made = set()
    started = time.monotonic()
    deadline = started + args.seconds
    threads = [threading.Thread(target=client, args=(i, args, server, tally, deadline, sessions_made))
               for i in range(args.clients)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        time.sleep(min(10.0, max(1.0, args.seconds / 30)))
        m = server.metrics()
        samples.append({"t": round(time.monotonic() - started, 1),
                        "kv_blocks_used": m.get("quench_kv_blocks_used", 0),
                        "in_flight": m.get("quench_requests_in_flight", 0),
                        **process(args.server_pid)})
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started

    # Forget what the soak made; the idle sessions' KV blocks then all come back.
    for sid in sorted(sessions_made):
        server.call("DELETE", f"/v1/sessions/{sid}")
    settle = time.monotonic() + 30
    while True:
        m = server.metrics()
        if (m.get("quench_kv_blocks_used", 0) == 0 and m.get("quench_requests_in_flight", 0) <= 1) \
                or time.monotonic() > settle:
            break
        time.sleep(0.2)
    after = {"metrics": m, "process": process(args.server_pid)}

    kinds = {}
    all_seconds = []
    for kind, e in sorted(tally.by_kind.items()):
        all_seconds += e["seconds"]
        kinds[kind] = {"requests": e["requests"], "failed": e["failed"],
                       "p50_s": round(percentile(e["seconds"], 50), 3),
                       "p99_s": round(percentile(e["seconds"], 99), 3)}
    requests = sum(k["requests"] for k in kinds.values())
    failed = sum(k["failed"] for k in kinds.values())
    warm = [s for s in samples if s["t"] >= warmup and "rss_mib" in s]
    rss = {}
    if warm:
        rss = {"after_warmup_mib": warm[0]["rss_mib"], "max_after_warmup_mib": max(s["rss_mib"] for s in warm),
               "end_mib": after["process"].get("rss_mib")}
    leaked_blocks = int(after["metrics"].get("quench_kv_blocks_used", 0))
    # Memory is flat when, after the warm-up, it grows by at most a tenth (allocator slack).
    flat = not rss or rss["max_after_warmup_mib"] <= rss["after_warmup_mib"] * 1.10
    outcome = {
        "passed": failed == 0 and leaked_blocks == 0 and flat,
        "clients": args.clients, "seconds": round(elapsed, 1), "requests": requests,
        "failed": failed, "requests_per_s": round(requests / elapsed, 2),
        "p50_s": round(percentile(all_seconds, 50), 3) if all_seconds else None,
        "p99_s": round(percentile(all_seconds, 99), 3) if all_seconds else None,
        "by_kind": kinds, "kv_blocks_left_in_use": leaked_blocks,
        "sessions_left": int(after["metrics"].get("quench_sessions", 0)),
        "rss": rss, "rss_flat": flat, "before": before["process"], "after": after["process"],
        "samples": samples, "failures": tally.failures,
    }
    receipt = {
        "format": "quench.receipt.v1",
        "kind": "soak",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **build_of(args.binary),
        "binary_sha256": sha256(args.binary) if args.binary else None,
        "device": {"server_device": args.device,
                   "cpus": os.cpu_count(),
                   "nvidia_smi": command(["nvidia-smi", "--query-gpu=name,driver_version",
                                          "--format=csv,noheader"]) if args.device != "cpu" else None},
        "inputs": {"chat_model": args.chat_model, "embed_model": args.embed_model,
                   "clients": args.clients, "seconds": args.seconds, "warmup_s": warmup,
                   "max_tokens": args.max_tokens, "seed": args.seed,
                   "mix": "chat 30, stream 20, cancelled stream 10, session turn 20 (each "
                          "session deleted after 4 turns), completion 10, embeddings 10 (with "
                          "an embedding model)"},
        "bound": {"failed_requests": 0, "kv_blocks_left_in_use": 0,
                  "rss_growth_after_warmup": 0.10,
                  "why": "every request is answered; cancelled and finished requests give their "
                         "KV blocks back; memory reaches a plateau after the warm-up"},
        "outcome": outcome,
    }
    with open(args.receipt, "w") as f:
        json.dump(receipt, f, indent=1)
        f.write("\n")
    print(f"soak: {requests} requests from {args.clients} clients in {elapsed:.0f} s, "
          f"{failed} failed; p50 {outcome['p50_s']} s, p99 {outcome['p99_s']} s; "
          f"KV blocks left in use {leaked_blocks}; RSS {rss}; "
          f"threads {before['process'].get('threads')} -> {after['process'].get('threads')}, "
          f"open files {before['process'].get('open_files')} -> {after['process'].get('open_files')}")
    for f in tally.failures[:10]:
        print(f"  failed {f['kind']}: {f['detail']}", file=sys.stderr)
    return 0 if outcome["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
