"""The side-by-side decode table from the receipts of scripts/device/engine-bench.sh:
quench (gpu-bench-NAME.json) next to PyTorch + transformers (torch-generate-NAME.json),
as Markdown on stdout.

    python3 scripts/perf/bench_table.py RECEIPTS_DIR"""
import json
import pathlib
import sys


def fmt(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "receipts")
    print(
        "| model | format | quench tok/s | % of copy | dispatches/token | ms/token p50 "
        "| torch eager tok/s | torch static+compiled tok/s | quench / best torch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for path in sorted(root.glob("gpu-bench-*.json")):
        name = path.stem.removeprefix("gpu-bench-")
        r = json.loads(path.read_text())
        o = r["outcome"]
        types = ", ".join(sorted(r["inputs"]["tensor_types"]))
        torch = {}
        t = root / f"torch-generate-{name}.json"
        if t.exists():
            torch = json.loads(t.read_text())["modes"]
        eager = torch.get("eager", {}).get("decode_tokens_per_s")
        compiled = torch.get("static-compiled", {}).get("decode_tokens_per_s")
        best = max((x for x in (eager, compiled) if x), default=None)
        ratio = f"{o['decode_tokens_per_s'] / best:.2f}×" if best else "—"
        print(
            f"| {name} | {types} | {fmt(o['decode_tokens_per_s'], 1)} "
            f"| {fmt(o['percent_of_copy_bandwidth'], 1)}% | {o['graph']['dispatches_per_token']} "
            f"| {fmt(o['ms_per_token_p50'], 3)} | {fmt(eager, 1)} | {fmt(compiled, 1)} | {ratio} |"
        )


if __name__ == "__main__":
    main()
