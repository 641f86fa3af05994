#!/usr/bin/env bash
# Two builds of quench side by side on the GPU, in the same run on the same checkpoints:
# `quench bench --device cuda` (decode and prompt rates, receipts) and a greedy
# `quench generate --device cuda` of each, whose tokens and logits must be identical.
#
#   scripts/device/compare-bench.sh OLD_BIN NEW_BIN NAME=MODEL ...
#
# MODEL is a GGUF file or a checkpoint directory. The builds take turns (old, new, new,
# old) so that a drift of the GPU's clocks over the run falls on both alike. Receipts go to
# $OUT (default receipts/): compare-NAME-{old,new}-{1,2}.json and compare-NAME.json (the
# two builds' medians, the change, the generations' agreement); the generations' tokens
# and logits stay in $WORK (default /tmp/compare). Exits non-zero if a run fails or the
# generations differ.
set -uo pipefail
OLD=${1:?usage: compare-bench.sh OLD_BIN NEW_BIN NAME=MODEL ...}
NEW=${2:?usage: compare-bench.sh OLD_BIN NEW_BIN NAME=MODEL ...}
shift 2
DEST=${OUT:-receipts}
WORK=${WORK:-/tmp/compare}
HERE=$(dirname "$0")
mkdir -p "$DEST" "$WORK"
status=0

bench() { # BIN MODEL RECEIPT
    "$1" bench --device cuda -m "$2" --prompt-tokens 128 --gen-tokens 128 --repeats 3 \
        --receipt "$3" >"$3.log" 2>&1 || { cat "$3.log"; return 1; }
}

generate() { # BIN MODEL OUT: up to 64 greedy tokens after a fixed prompt, every logit kept
    "$1" generate --device cuda -m "$2" --temperature 0 --max-tokens 64 --logits-out "$3" \
        "The history of the printing press begins" >"$3.txt" 2>"$3.log" ||
        { cat "$3.log"; return 1; }
}

for spec in "$@"; do
    name=${spec%%=*} model=${spec#*=}
    for run in old:1 new:1 new:2 old:2; do
        bin=$OLD
        [ "${run%:*}" = new ] && bin=$NEW
        bench "$bin" "$model" "$DEST/compare-$name-${run%:*}-${run#*:}.json" || status=1
    done
    generate "$OLD" "$model" "$WORK/$name-old.json" || status=1
    generate "$NEW" "$model" "$WORK/$name-new.json" || status=1
    python3 "$HERE/compare_summary.py" "$DEST" "$WORK" "$name" || status=1
done
exit $status
