#!/usr/bin/env bash
# The engine on the native backend (quench's own driver over the kernel module, no
# libcuda) beside the cuda backend: a seeded checkpoint per shape made here by `quench
# synth` (bf16), 32 greedy tokens from `quench generate` on each backend compared token
# for token (the text of the same prompt), the same generation in two processes at once on
# the native backend (each its own channel; both must give the single run's text), and
# `quench check` on the native backend.
# Receipts in $OUT (or receipts/): native-check-SHAPE.json (the check's own) and
# native-engine.json (both backends' texts and speeds, and whether they match).
# Run from the repository root with the release binary carried (target/release/quench);
# SHAPES names the catalog shapes (default llama-3.2-1b).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf 'The capital of France is\nIn 1492, a sailor named\n' > "$WORK/prompts"
status=0
for shape in ${SHAPES:-llama-3.2-1b}; do
  dir="$WORK/$shape"
  "$BIN" synth --shape "$shape" --seed 1 "$dir" > /dev/null || { echo "synth $shape failed"; status=1; continue; }
  for b in cuda native; do
    timeout 300 "$BIN" generate -m "$dir" --device cuda --backend "$b" --max-tokens 32 \
      --ignore-eos "Once upon a time" > "$WORK/$shape-$b.txt" 2> "$WORK/$shape-$b.err"
    echo "generate $shape $b: rc=$?; $(tail -1 "$WORK/$shape-$b.err")"
  done
  for p in 1 2; do
    timeout 60 "$BIN" generate -m "$dir" --device cuda --backend native --max-tokens 32 \
      --ignore-eos "Once upon a time" > "$WORK/$shape-two-$p.txt" 2> "$WORK/$shape-two-$p.err" &
  done
  wait
  # The checks' receipts hold each backend's greedy token ids (a seeded checkpoint's tokens
  # often decode to no text, so the texts alone can agree without saying anything).
  timeout 300 "$BIN" check -m "$dir" --device cuda --backend cuda --prompts "$WORK/prompts" \
    --tokens 16 --receipt "$WORK/$shape-check-cuda.json" > /dev/null 2>&1
  timeout 600 "$BIN" check -m "$dir" --device cuda --backend native --prompts "$WORK/prompts" \
    --tokens 16 --receipt "$DEST/native-check-$shape.json" > "$WORK/$shape-check.txt" 2>&1
  rc=$?
  tail -3 "$WORK/$shape-check.txt"
  echo "check $shape native: rc=$rc"
  [ "$rc" -eq 0 ] || status=1
done
python3 - "$WORK" "$DEST" "${SHAPES:-llama-3.2-1b}" <<'PY'
import datetime, json, os, re, subprocess, sys
work, dest, shapes = sys.argv[1], sys.argv[2], sys.argv[3].split()
def read(p):
    try:
        return open(p).read()
    except OSError:
        return None
runs = {}
for shape in shapes:
    r = {}
    for b in ("cuda", "native"):
        err = read(f"{work}/{shape}-{b}.err") or ""
        rate = re.findall(r"\(([\d.]+) tokens/s\)", err)
        r[b] = {"text": read(f"{work}/{shape}-{b}.txt"), "decode_tokens_per_s": float(rate[-1]) if rate else None}
    r["same_text"] = r["cuda"]["text"] is not None and r["cuda"]["text"] == r["native"]["text"]
    two = [read(f"{work}/{shape}-two-{p}.txt") for p in (1, 2)]
    r["two_processes"] = {
        "texts_equal_single_run": [t is not None and t == r["native"]["text"] for t in two],
        "decode_tokens_per_s": [
            (lambda m: float(m[-1]) if m else None)(re.findall(r"\(([\d.]+) tokens/s\)", read(f"{work}/{shape}-two-{p}.err") or ""))
            for p in (1, 2)
        ],
    }
    ids = {}
    for b, path in (("cuda", f"{work}/{shape}-check-cuda.json"), ("native", f"{dest}/native-check-{shape}.json")):
        try:
            ids[b] = [p["tokens"] for p in json.load(open(path))["outcome"]["prompts"]]
        except (OSError, ValueError, KeyError) as e:
            ids[b] = None
            print(f"{shape} {b}: no token ids ({e})")
        r[b]["check_tokens"] = ids[b]
    r["same_tokens"] = ids["cuda"] is not None and ids["cuda"] == ids["native"]
    r["check_passed"] = "check passed" in (read(f"{work}/{shape}-check.txt") or "")
    runs[shape] = r
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
receipt = {
    "format": "quench.receipt.v1",
    "kind": "native-engine",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "git_commit": commit or "unknown",
    "device": smi,
    "inputs": {"shapes": shapes, "seed": 1, "prompt": "Once upon a time", "tokens": 32},
    "bound": "the same greedy text and the same checked greedy token ids on both backends; two native processes at once each give the single run's text; quench check passes on native",
    "outcome": {"passed": all(r["same_text"] and r["same_tokens"] and r["check_passed"]
                              and all(r["two_processes"]["texts_equal_single_run"])
                              for r in runs.values()), "runs": runs},
}
with open(os.path.join(dest, "native-engine.json"), "w") as f:
    json.dump(receipt, f, indent=2)
for shape, r in runs.items():
    print(shape, "same text" if r["same_text"] else "TEXTS DIFFER",
          "same token ids" if r["same_tokens"] else "TOKEN IDS DIFFER",
          {b: r[b]["decode_tokens_per_s"] for b in ("cuda", "native")},
          "check passed" if r["check_passed"] else "check FAILED",
          "two processes:", r["two_processes"])
print("receipt:", os.path.join(dest, "native-engine.json"))
PY
exit $status
