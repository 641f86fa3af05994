"""The summary of one model's run of compare-bench.sh: each build's median decode rate,
the change, and whether the two greedy generations agree in every token and logit.

    python3 compare_summary.py DEST WORK NAME

Writes DEST/compare-NAME.json, prints one line, exits 1 if the generations differ."""

import json
import statistics
import sys

dest, work, name = sys.argv[1:]


def rate(which):
    runs = [json.load(open(f"{dest}/compare-{name}-{which}-{n}.json")) for n in (1, 2)]
    return statistics.median(r["outcome"]["decode_tokens_per_s"] for r in runs)


old, new = rate("old"), rate("new")
a, b = (json.load(open(f"{work}/{name}-{which}.json")) for which in ("old", "new"))
same_tokens = a["tokens"] == b["tokens"]
same_logits = a["logits"] == b["logits"]
change = 100 * (new / old - 1)
summary = {
    "model": name,
    "decode_tokens_per_s": {"old": old, "new": new, "change_percent": change},
    "generation": {
        "prompt": a["prompt"],
        "tokens": len(a["tokens"]),
        "tokens_identical": same_tokens,
        "logits_identical": same_logits,
    },
}
with open(f"{dest}/compare-{name}.json", "w") as f:
    json.dump(summary, f, indent=1)
print(
    f"{name}: decode old {old:.1f} new {new:.1f} tokens/s ({change:+.2f}%); "
    f"{len(a['tokens'])} greedy tokens {'identical' if same_tokens else 'DIFFERENT'}, "
    f"logits {'bit-identical' if same_logits else 'DIFFERENT'}"
)
sys.exit(0 if same_tokens and same_logits else 1)
