#!/usr/bin/env bash
# What structured output's token masks cost beside a decode step on the GPU: `quench
# generate --device cuda --json-schema --receipt` on a synthetic checkpoint of SHAPE whose
# tokenizer is a real model's (TOKENIZER_DIR holds the tokenizer.json and
# tokenizer_config.json that scripts/perf/gguf_tokenizer_json.py writes from a GGUF file:
# the mask's cost depends on the vocabulary it walks). Greedy, up to 400 tokens, the
# schema scripts/device/mask-schema.json. The same run without the schema gives the plain
# decode step beside it.
#
#   scripts/device/mask-cost.sh SHAPE TOKENIZER_DIR
#
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts: $OUT/mask-cost-SHAPE.json (bound: waits for masks ≤ 5% of the decode step)
# and $OUT/mask-cost-SHAPE-plain.json.
set -uo pipefail
shape=$1 tokenizer=$2
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
dir=${SYNTH_DIR:-/tmp/quench-synth}/$shape-tokenizer
mkdir -p "$DEST"
if [ ! -f "$dir/config.json" ]; then
    "$BIN" synth --shape "$shape" --seed 1 "$dir" || exit 1
fi
cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$dir/" || exit 1
prompt="The new user's profile, as JSON:"
status=0
for run in schema plain; do
    extra=()
    name=mask-cost-$shape
    if [ "$run" = schema ]; then
        extra=(--json-schema scripts/device/mask-schema.json)
    else
        name=$name-plain
    fi
    "$BIN" generate --device cuda -m "$dir" -n 400 "${extra[@]}" --receipt "$DEST/$name.json" \
        "$prompt" >"$DEST/$name.txt" 2>"$DEST/$name.log" || status=1
    cat "$DEST/$name.log"
done
exit $status
