#!/usr/bin/env bash
# Whether the context a session is opened for slows its decode steps: `quench generate
# --device cuda -n 400 --receipt` on a synthetic checkpoint of SHAPE (seed 1), greedy,
# once with sessions of the default context and once with --context 512. The two
# receipts' decode_step_ms should agree.
#
#   scripts/device/generate-context.sh SHAPE [NAME]
#
# Run from the repository root with the release binary carried (target/release/quench;
# QUENCH_BIN picks another). Receipts: $OUT/generate-context-NAME-default.json and
# $OUT/generate-context-NAME-512.json (NAME defaults to SHAPE).
set -uo pipefail
shape=$1 name=${2:-$1}
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
dir=${SYNTH_DIR:-/tmp/quench-synth}/$shape
mkdir -p "$DEST"
if [ ! -f "$dir/config.json" ]; then
    "$BIN" synth --shape "$shape" --seed 1 "$dir" || exit 1
fi
prompt="The history of the printing press"
status=0
for context in default 512; do
    extra=()
    if [ "$context" != default ]; then
        extra=(--context "$context")
    fi
    "$BIN" generate --device cuda -m "$dir" -n 400 "${extra[@]}" \
        --receipt "$DEST/generate-context-$name-$context.json" "$prompt" >/dev/null || status=1
done
exit $status
