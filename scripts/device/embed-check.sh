#!/usr/bin/env bash
# Sentence embeddings on the GPU: all-MiniLM-L6-v2 through quench's kernels
# (`quench embed --device cuda --check`), every vector judged by the f64 CPU reference
# (cosine ≥ 0.999, fixed in code before the run), and the paraphrase pair ranked above
# the unrelated sentence (the set the CPU tests use).
#
#   scripts/device/embed-check.sh MINILM_DIR
#
# Run from the repository root with the release binary carried (target/release/quench).
# The receipt, the OpenAI-style vectors and the log go to $OUT (or receipts/ when OUT is
# unset).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
MINILM=${1:?usage: embed-check.sh MINILM_DIR}
mkdir -p "$DEST"
"$BIN" devices
TEXTS=("A man is eating food." "A man is eating a piece of bread." "The girl is carrying a baby.")
status=0
"$BIN" embed -m "$MINILM" --device cuda --json --check --receipt "$DEST/embed-check-minilm.json" "${TEXTS[@]}" \
    > "$DEST/embed-check-minilm-vectors.json" 2> "$DEST/embed-check-minilm.log" || status=$?
cat "$DEST/embed-check-minilm.log"
# The paraphrase (texts 1 and 2) must be closer than text 1 and the unrelated text 3.
python3 - "$DEST/embed-check-minilm.json" <<'PY' || status=1
import json, sys
r = json.load(open(sys.argv[1]))
s = r["outcome"]["similarity"]
ok = s[0][1] > s[0][2]
print(f"paraphrase {s[0][1]:.4f} vs unrelated {s[0][2]:.4f}: {'ranked' if ok else 'NOT ranked'} above")
sys.exit(0 if ok else 1)
PY
exit $status
