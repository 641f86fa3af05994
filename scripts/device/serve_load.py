"""Load client for `quench serve`: greedy streaming completions at several prompt lengths
and concurrency levels, the prefix cache's time to first token, a receipt and a plot.
Python standard library only.

    python3 serve_load.py --url http://127.0.0.1:8093 --model llama --receipt OUT.json
                          [--levels 1 16 64 128] [--prompt-tokens 128 1024] [--gen-tokens 128]
                          [--rounds 2] [--check-tokens 24] [--plot OUT.svg]
                          [--binary PATH] [--checkpoint DIR]

Per prompt length and level `c`:
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
     decoding makes the share 1. The requests sent together find the prompts of those sent
     alone in the server's prefix cache: the share also checks that an answer from cached
     keys and values is that of the prompt computed whole.

Then the prefix cache (once, at the longest prompt length `L`): time to first token of a
request alone (wall time of a one-token, non-streamed completion) for fresh random
prompts of `L` tokens ("cold"), and for the same prompts sent again ("cached": all but
the last block's tokens found in the cache), medians of `--cache-probes` prompts.

The bound, fixed here before the run: every level's identical share is 1 and no request
fails. Prints the receipt and exits 1 when the bound is not met."""
import argparse
import hashlib
import http.client
import json
import os
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


def level(server, c, a, prompt_tokens, seed):
    rng = random.Random(seed)
    out = {"concurrency": c, "prompt_tokens": prompt_tokens}
    # 1. Warm-up: every batch size up to c is captured on its first step.
    run_parallel(lambda p: server.complete(
        {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True}, True),
        [prompt(rng, prompt_tokens) for _ in range(c)])

    # 2. Timed.
    _, before = server.get("/metrics")
    t0 = time.perf_counter()

    def client(prompts):
        return [server.complete({"prompt": p, "max_tokens": a.gen_tokens, "temperature": 0,
                                 "ignore_eos": True}, True) for p in prompts]

    work = [[prompt(rng, prompt_tokens) for _ in range(a.rounds)] for _ in range(c)]
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
    checks = [prompt(rng, prompt_tokens) for _ in range(c)]
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


def prefix_cache_probe(server, prompt_tokens, probes, seed):
    """Time to first token alone, cold and with the prompt's prefix cached (see above)."""
    rng = random.Random(seed)
    body = lambda p: {"prompt": p, "max_tokens": 1, "temperature": 0, "ignore_eos": True}
    _, before = server.get("/metrics")
    cold, cached, reused, failed = [], [], [], 0
    for _ in range(probes):
        p = prompt(rng, prompt_tokens)
        for times in (cold, cached):
            r = server.complete(body(p), False)
            if not r["ok"]:
                failed += 1
                continue
            times.append(r["end"] - r["start"])
            if times is cached:
                details = (r["usage"] or {}).get("prompt_tokens_details") or {}
                reused.append(details.get("cached_tokens", 0))
    _, after = server.get("/metrics")
    ms = lambda v: quantile(v, 0.5) and quantile(v, 0.5) * 1e3
    return {
        "prompt_tokens": prompt_tokens,
        "probes": probes,
        "failed": failed,
        "cold_p50_ms": ms(cold),
        "cached_p50_ms": ms(cached),
        "cold_ms": [t * 1e3 for t in cold],
        "cached_ms": [t * 1e3 for t in cached],
        "cached_tokens": reused,
        "hits": counter(after, "quench_prefix_cache_hits_total")
        - counter(before, "quench_prefix_cache_hits_total"),
        "misses": counter(after, "quench_prefix_cache_misses_total")
        - counter(before, "quench_prefix_cache_misses_total"),
        "how": "wall time of a non-streamed one-token completion, request sent to answer read",
    }


def svg_plot(levels, path):
    """Aggregate tokens/s, and time to first token and inter-token latency (p50), against
    concurrency, a line per prompt length: two panels of one SVG file."""
    lengths = sorted({r["prompt_tokens"] for r in levels})
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    w, h, pad = 420, 300, 55
    panels = [
        ("output tokens/s", lambda r: r["aggregate_tokens_per_s"], False),
        ("latency p50, ms (solid: first token, dashed: between tokens)",
         lambda r: r["ttft_server"]["p50_ms"], True),
    ]
    conc = sorted({r["concurrency"] for r in levels})
    xpos = {c: pad + i * (w - 2 * pad) / max(len(conc) - 1, 1) for i, c in enumerate(conc)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" '
           'font-family="sans-serif" font-size="11">']
    for panel, (title, value, latency) in enumerate(panels):
        x0 = panel * w
        series = [[(r["concurrency"], value(r)) for r in levels if r["prompt_tokens"] == n]
                  for n in lengths]
        if latency:
            series += [[(r["concurrency"], r["itl_server"]["p50_ms"]) for r in levels
                        if r["prompt_tokens"] == n] for n in lengths]
        top = max([v for s in series for _, v in s if v] + [1]) * 1.1
        y = lambda v: h - pad - (v / top) * (h - 2 * pad)
        out.append(f'<text x="{x0 + w / 2}" y="20" text-anchor="middle">{title}</text>')
        out.append(f'<line x1="{x0 + pad}" y1="{h - pad}" x2="{x0 + w - pad}" y2="{h - pad}" stroke="black"/>')
        out.append(f'<line x1="{x0 + pad}" y1="{pad}" x2="{x0 + pad}" y2="{h - pad}" stroke="black"/>')
        for c in conc:
            out.append(f'<text x="{x0 + xpos[c]}" y="{h - pad + 15}" text-anchor="middle">{c}</text>')
        out.append(f'<text x="{x0 + w / 2}" y="{h - 12}" text-anchor="middle">concurrent streams</text>')
        for i in range(5):
            v = top * i / 4
            out.append(f'<text x="{x0 + pad - 5}" y="{y(v) + 4}" text-anchor="end">{v:.0f}</text>')
        for k, s in enumerate(series):
            n = lengths[k % len(lengths)]
            colour = colours[k % len(lengths) % len(colours)]
            dash = ' stroke-dasharray="4 3"' if k >= len(lengths) else ""
            pts = " ".join(f"{x0 + xpos[c]:.1f},{y(v):.1f}" for c, v in s if v is not None)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
            if k < len(lengths):
                out.append(f'<text x="{x0 + pad + 8}" y="{pad + 14 * k}" fill="{colour}">'
                           f'{n}-token prompts</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


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
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64, 128])
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--cache-probes", type=int, default=5)
    ap.add_argument("--plot", default="")
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
    for j, n in enumerate(a.prompt_tokens):
        for i, c in enumerate(a.levels):
            r = level(server, c, a, n, a.seed * 1000 + 100 * j + i)
            levels.append(r)
            print(f"{n:>5}-token prompts, concurrency {c:>3}: "
                  f"{r['aggregate_tokens_per_s'] or 0:9.1f} tokens/s, "
                  f"TTFT p50 {r['ttft_server']['p50_ms'] or 0:.1f} ms, "
                  f"ITL p50 {r['itl_server']['p50_ms'] or 0:.1f} ms p99 {r['itl_server']['p99_ms'] or 0:.1f} ms "
                  f"(mean {r['itl_server']['mean_ms'] or 0:.2f} ms), identical {r['identity']['identical']}/{c}, "
                  f"failed {r['failed']}", file=sys.stderr, flush=True)
    probe = prefix_cache_probe(server, max(a.prompt_tokens), a.cache_probes, a.seed + 7)
    print(f"prefix cache, {probe['prompt_tokens']}-token prompt alone: first token "
          f"{probe['cold_p50_ms'] or 0:.1f} ms cold, {probe['cached_p50_ms'] or 0:.1f} ms cached "
          f"({probe['cached_tokens']} tokens reused)", file=sys.stderr, flush=True)
    if a.plot:
        svg_plot(levels, a.plot)

    passed = probe["failed"] == 0 and all(
        r["failed"] == 0 and r["identity"]["failed"] == 0 and r["identity"]["share"] == 1
        for r in levels)
    # Each prompt length's first level.
    base = {}
    for r in levels:
        base.setdefault(r["prompt_tokens"], r["aggregate_tokens_per_s"])
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
            # A checkpoint directory by its config; a GGUF file by its size.
            "config_sha256": sha256(os.path.join(a.checkpoint, "config.json"))
            if os.path.isdir(a.checkpoint) else None,
            "checkpoint_bytes": os.path.getsize(a.checkpoint)
            if os.path.isfile(a.checkpoint) else None,
            "server": a.url, "model": a.model, "levels": a.levels,
            "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "rounds": a.rounds,
            "check_tokens": a.check_tokens, "cache_probes": a.cache_probes, "seed": a.seed,
        },
        "bound": {
            "identical_share": 1.0,
            "failed_requests": 0,
            "why": "batched decode is batch-invariant: a sequence's logits do not depend on the "
                   "other sequences in its steps, nor on whether its prompt's prefix came from "
                   "the prefix cache, so greedy answers are the same alone and under load",
        },
        "outcome": {
            "passed": passed,
            "levels": levels,
            "prefix_cache": probe,
            "scaling_vs_first_level": [
                (r["aggregate_tokens_per_s"] / base[r["prompt_tokens"]])
                if base.get(r["prompt_tokens"]) and r["aggregate_tokens_per_s"] else None
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
