"""Load client for `quench serve`: greedy streaming completions at several concurrency
levels, with a receipt. Python standard library only.

    python3 serve_load.py --url http://127.0.0.1:8093 --model llama --levels 1 8 32 64
                          --receipt OUT.json [--prompt-tokens 32] [--gen-tokens 128]
                          [--rounds 2] [--check-tokens 24] [--binary PATH] [--checkpoint DIR]

Per level `c`:
  1. warm-up: `c` short requests at once (the server captures its decode step for each
     batch size the first time it runs one);
  2. timed: `c` clients, each sending `--rounds` requests one after another; every request
     a streamed greedy completion of a random `--prompt-tokens`-token prompt (ids below 256:
     text in the synthetic tokenizer) for exactly `--gen-tokens` tokens (EOS ignored).
     Aggregate decode tokens/s is the tokens generated over the wall time of the level
     (prefill steps included: prompts run through the same batched steps). Inter-token
     latency comes from the server's `quench_inter_token_latency_seconds` histogram, read
     before and after the level: its mean exactly (sum / count), p50 and p99 interpolated
     within the Prometheus buckets. (A synthetic model draws mostly ids past its small
     tokenizer, which have no text, so streamed chunks do not mark every token.) The
     client also records time to first streamed byte and each request's wall time;
  3. identity: `c` requests at once, non-streamed, `--check-tokens` tokens with
     `logprobs: 0`, each compared with the same request sent alone (run first, one at a
     time): identical when the text and every token's log-probability are equal (a
     different token or different logits shows in the log-probabilities). Batch-invariant
     decoding makes the share 1.

The bound, fixed here before the run: every level's identical share is 1 and no request
fails. Prints the receipt and exits 1 when the bound is not met."""
import argparse
import hashlib
import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time
import urllib.parse

ITL_METRIC = "quench_inter_token_latency_seconds"
TTFT_METRIC = "quench_time_to_first_token_seconds"
TOKENS_METRIC = "quench_completion_tokens_total"


class Server:
    def __init__(self, url, model):
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.model = u.hostname, u.port or 80, model

    def connection(self, timeout=600):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path):
        c = self.connection(30)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def complete(self, body, stream):
        """One completion; returns a record with timings, text, usage and log-probabilities."""
        body = dict(body, model=self.model, stream=stream)
        if stream:
            body["stream_options"] = {"include_usage": True}
        c = self.connection()
        start = time.perf_counter()
        rec = {"ok": False, "start": start, "chunks": [], "text": "", "usage": None,
               "token_logprobs": None, "error": None}
        try:
            c.request("POST", "/v1/completions", json.dumps(body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}: {r.read().decode()[:300]}"
                return rec
            if not stream:
                v = json.loads(r.read())
                choice = v["choices"][0]
                rec["text"] = choice["text"]
                rec["usage"] = v.get("usage")
                lp = choice.get("logprobs") or {}
                rec["token_logprobs"] = lp.get("token_logprobs")
            else:
                text = []
                for line in r:
                    line = line.strip()
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        break
                    v = json.loads(data)
                    if v.get("usage"):
                        rec["usage"] = v["usage"]
                    for choice in v.get("choices", []):
                        if choice.get("text"):
                            rec["chunks"].append(time.perf_counter())
                            text.append(choice["text"])
                rec["text"] = "".join(text)
            rec["ok"] = True
        except Exception as e:  # the record says what failed; the run goes on
            rec["error"] = f"{type(e).__name__}: {e}"
        finally:
            rec["end"] = time.perf_counter()
            c.close()
        return rec


def histogram(metrics_text, name):
    """(cumulative buckets [(le, count)], sum, count) of a Prometheus histogram, summed
    over its label sets."""
    buckets, total, count = {}, 0.0, 0
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            le = float("inf") if le == "+Inf" else float(le)
            buckets[le] = buckets.get(le, 0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count += int(float(line.rsplit(" ", 1)[1]))
    return sorted(buckets.items()), total, count


def counter(metrics_text, name):
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics_text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def delta_quantiles(before, after, qs):
    """Quantiles of the observations between two histogram readings, interpolated
    linearly within buckets (the last finite bound for the +Inf bucket)."""
    b0 = dict(before[0])
    diff = [(le, n - b0.get(le, 0)) for le, n in after[0]]
    total = diff[-1][1] if diff else 0
    out = {}
    for q in qs:
        if total <= 0:
            out[q] = None
            continue
        rank, lo, prev = q * total, 0.0, 0
        for le, n in diff:
            if n >= rank:
                hi = le if le != float("inf") else lo
                out[q] = lo + (hi - lo) * ((rank - prev) / max(n - prev, 1e-12))
                break
            lo, prev = le, n
    mean = None
    n = after[2] - before[2]
    if n > 0:
        mean = (after[1] - before[1]) / n
    return out, mean, n


def quantile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[round((len(v) - 1) * q)]


def run_parallel(fn, args):
    results = [None] * len(args)

    def work(i):
        results[i] = fn(args[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def prompt(rng, n):
    return [rng.randrange(256) for _ in range(n)]


def level(server, c, a, seed):
    rng = random.Random(seed)
    out = {"concurrency": c}
    # 1. Warm-up: every batch size up to c is captured on its first step.
    run_parallel(lambda p: server.complete(
        {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True}, True),
        [prompt(rng, a.prompt_tokens) for _ in range(c)])

    # 2. Timed.
    _, before = server.get("/metrics")
    t0 = time.perf_counter()

    def client(prompts):
        return [server.complete({"prompt": p, "max_tokens": a.gen_tokens, "temperature": 0,
                                 "ignore_eos": True}, True) for p in prompts]

    work = [[prompt(rng, a.prompt_tokens) for _ in range(a.rounds)] for _ in range(c)]
    records = [r for rs in run_parallel(client, work) for r in rs]
    wall = time.perf_counter() - t0
    _, after = server.get("/metrics")
    failed = [r["error"] for r in records if not r["ok"]]
    tokens = sum((r["usage"] or {}).get("completion_tokens", 0) for r in records if r["ok"])
    itl_q, itl_mean, itl_n = delta_quantiles(histogram(before, ITL_METRIC),
                                             histogram(after, ITL_METRIC), [0.5, 0.99])
    ttft_q, ttft_mean, _ = delta_quantiles(histogram(before, TTFT_METRIC),
                                           histogram(after, TTFT_METRIC), [0.5, 0.99])
    gaps = [b - a_ for r in records for a_, b in zip(r["chunks"], r["chunks"][1:])]
    first = [r["chunks"][0] - r["start"] for r in records if r["chunks"]]
    out.update({
        "requests": len(records),
        "failed": len(failed),
        "errors": failed[:5],
        "wall_s": wall,
        "completion_tokens": tokens,
        "server_completion_tokens": counter(after, TOKENS_METRIC) - counter(before, TOKENS_METRIC),
        "aggregate_tokens_per_s": tokens / wall if wall > 0 else None,
        "per_sequence_tokens_per_s": (1 / itl_mean) if itl_mean else None,
        "itl_server": {"observations": itl_n, "mean_ms": itl_mean and itl_mean * 1e3,
                       "p50_ms": itl_q[0.5] and itl_q[0.5] * 1e3,
                       "p99_ms": itl_q[0.99] and itl_q[0.99] * 1e3,
                       "how": "server histogram delta; mean exact, quantiles interpolated within buckets"},
        "ttft_server": {"mean_ms": ttft_mean and ttft_mean * 1e3,
                        "p50_ms": ttft_q[0.5] and ttft_q[0.5] * 1e3,
                        "p99_ms": ttft_q[0.99] and ttft_q[0.99] * 1e3},
        "client_chunk_gaps": {"count": len(gaps),
                              "p50_ms": quantile(gaps, 0.5) and quantile(gaps, 0.5) * 1e3,
                              "p99_ms": quantile(gaps, 0.99) and quantile(gaps, 0.99) * 1e3},
        "client_first_chunk_p50_ms": quantile(first, 0.5) and quantile(first, 0.5) * 1e3,
        "request_wall_p50_s": quantile([r["end"] - r["start"] for r in records], 0.5),
    })

    # 3. Identity with the same requests sent alone.
    checks = [prompt(rng, a.prompt_tokens) for _ in range(c)]
    body = lambda p: {"prompt": p, "max_tokens": a.check_tokens, "temperature": 0,
                      "ignore_eos": True, "logprobs": 0}
    alone = [server.complete(body(p), False) for p in checks]
    together = run_parallel(lambda p: server.complete(body(p), False), checks)
    same = sum(1 for x, y in zip(alone, together)
               if x["ok"] and y["ok"] and x["text"] == y["text"]
               and x["token_logprobs"] == y["token_logprobs"] and x["token_logprobs"])
    out["identity"] = {"requests": c, "identical": same, "share": same / c,
                       "failed": sum(1 for r in alone + together if not r["ok"])}
    return out


def sha256(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError as e:
        return f"unreadable: {e}"


def command(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:
        return f"unavailable: {e}"


def build_of(binary):
    """The commit the server binary was built from (`quench --version`), else the
    working tree's."""
    m = re.search(r"\(git (\w+), uncommitted changes: (\w+)\)",
                  command([binary, "--version"]) if binary else "")
    if m:
        return {"git_commit": m.group(1), "git_dirty": m.group(2) == "true"}
    return {"git_commit": command(["git", "rev-parse", "HEAD"]),
            "git_dirty": bool(command(["git", "status", "--porcelain", "--untracked-files=no"]))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--check-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--receipt", required=True)
    ap.add_argument("--binary", default="")
    ap.add_argument("--checkpoint", default="")
    a = ap.parse_args()
    server = Server(a.url, a.model)

    levels = []
    for i, c in enumerate(a.levels):
        r = level(server, c, a, a.seed * 1000 + i)
        levels.append(r)
        print(f"concurrency {c:>3}: {r['aggregate_tokens_per_s'] or 0:9.1f} tokens/s, "
              f"ITL p50 {r['itl_server']['p50_ms'] or 0:.1f} ms p99 {r['itl_server']['p99_ms'] or 0:.1f} ms "
              f"(mean {r['itl_server']['mean_ms'] or 0:.2f} ms), identical {r['identity']['identical']}/{c}, "
              f"failed {r['failed']}", file=sys.stderr, flush=True)

    passed = all(r["failed"] == 0 and r["identity"]["failed"] == 0 and r["identity"]["share"] == 1
                 for r in levels)
    base = levels[0]["aggregate_tokens_per_s"] if levels else None
    receipt = {
        "format": "quench.receipt.v1",
        "kind": "serve-load",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **build_of(a.binary),
        "binary_sha256": sha256(a.binary) if a.binary else None,
        "device": {
            "nvidia_smi": command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                   "--format=csv,noheader"]),
        },
        "inputs": {
            "checkpoint": a.checkpoint,
            "config_sha256": sha256(a.checkpoint + "/config.json") if a.checkpoint else None,
            "server": a.url, "model": a.model, "levels": a.levels,
            "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "rounds": a.rounds,
            "check_tokens": a.check_tokens, "seed": a.seed,
        },
        "bound": {
            "identical_share": 1.0,
            "failed_requests": 0,
            "why": "batched decode is batch-invariant: a sequence's logits do not depend on the "
                   "other sequences in its steps, so greedy answers are the same alone and under load",
        },
        "outcome": {
            "passed": passed,
            "levels": levels,
            "scaling_vs_first_level": [
                (r["aggregate_tokens_per_s"] / base) if base and r["aggregate_tokens_per_s"] else None
                for r in levels
            ],
        },
    }
    with open(a.receipt, "w") as f:
        json.dump(receipt, f, indent=2)
        f.write("\n")
    print(json.dumps(receipt["outcome"], indent=2))
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
