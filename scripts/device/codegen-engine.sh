#!/usr/bin/env bash
# The engine's decode on quench's own SASS beside the PTX path: seeded llama-3.2-1b and
# llama-3.1-8b checkpoints (bf16) made here by `quench synth`, each checked with `quench
# check` on `--codegen ptx` and `--codegen sass` (prompts fed one decode step a token, so
# that the decode step's kernels alone are compared), the decode
# timed by the check (`--time-tokens`; TOKENS checked tokens a prompt, 24 unless set), the
# checked greedy token ids and 40 greedy tokens' text from `quench generate` compared
# between the two. Receipts: check-SHAPE-CODEGEN.json in $OUT (or receipts/).
# Run from the repository root with the release binary carried (target/release/quench).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
start=$(date +%s)
prompts=$(mktemp)
printf 'The capital of France is\nIn 1492, a sailor named\n' > "$prompts"
for shape in ${SHAPES:-llama-3.2-1b llama-3.1-8b}; do
  dir=$(mktemp -d)
  "$BIN" synth --shape "$shape" --seed 1 "$dir" > /dev/null || { echo "synth $shape failed"; continue; }
  for cg in ptx sass; do
    timeout 200 "$BIN" check -m "$dir" --device cuda --codegen "$cg" --prefill-chunk 0 \
      --prompts "$prompts" --tokens "${TOKENS:-24}" --time-tokens 256 \
      --receipt "$DEST/check-$shape-$cg.json" 2>&1 | tail -4
    echo "check $shape $cg: rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
    timeout 100 "$BIN" generate -m "$dir" --device cuda --codegen "$cg" --prefill-chunk 0 \
      --max-tokens 40 --ignore-eos -q "Once upon a time" > "$dir/gen-$cg.txt" \
      || { echo "generate $shape $cg failed"; rm -f "$dir/gen-$cg.txt"; }
  done
  if [ ! -e "$dir/gen-ptx.txt" ] || [ ! -e "$dir/gen-sass.txt" ]; then echo "$shape: no comparison"
  elif cmp -s "$dir/gen-ptx.txt" "$dir/gen-sass.txt"; then echo "$shape: the same text ($(wc -c < "$dir/gen-ptx.txt") bytes)"
  else echo "$shape: the texts differ"; fi
  # The checked greedy token ids (a seeded checkpoint's tokens often decode to no text).
  python3 - "$DEST/check-$shape-ptx.json" "$DEST/check-$shape-sass.json" <<'PY'
import json, sys
try:
    ptx, sass = ([p["tokens"] for p in json.load(open(f))["outcome"]["prompts"]] for f in sys.argv[1:3])
except (OSError, ValueError, KeyError) as e:
    print("no token ids to compare:", e)
else:
    print("the same checked token ids" if ptx == sass else "the checked token ids DIFFER")
PY
  rm -rf "$dir"
done
