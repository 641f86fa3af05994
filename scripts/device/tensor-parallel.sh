#!/usr/bin/env bash
# Tensor parallelism on the GPUs of this machine: for each SHAPE (a seeded bf16 checkpoint
# written by `quench synth`, seed 1, under $SYNTH_DIR), `quench check` split over RANKS
# GPUs (2 prompts × 32 tokens, judged by the f64 reference), then `quench bench` on one
# GPU and split over RANKS GPUs (128-token prompt, 128 greedy tokens, the copy bandwidth
# of the GPUs used measured in the same run).
#
#   RANKS=2 scripts/device/tensor-parallel.sh [SHAPE ...]     (default: llama-3.1-8b)
#
# RANKS defaults to the number of GPUs nvidia-smi lists; with one GPU the split runs with
# one rank (the same code path: its logits have the whole model's bits). Run from the
# repository root with the release binary carried (target/release/quench, or $QUENCH_BIN).
# Receipts and logs go to $OUT (or receipts/ when OUT is unset).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
RANKS=${RANKS:-$(nvidia-smi --list-gpus | wc -l)}
SHAPES=("$@")
[ ${#SHAPES[@]} -gt 0 ] || SHAPES=(llama-3.1-8b)
mkdir -p "$DEST" "$SYNTH_DIR"
"$BIN" devices
status=0
printf '%s\n' "The capital of France is" "def fibonacci(n):" > "$DEST/tp-prompts.txt"
for shape in "${SHAPES[@]}"; do
    dir="$SYNTH_DIR/$shape"
    [ -f "$dir/config.json" ] || "$BIN" synth --shape "$shape" --seed 1 "$dir"
    "$BIN" check -m "$dir" --tensor-parallel "$RANKS" --prompts "$DEST/tp-prompts.txt" \
        --tokens 32 --context 1024 --receipt "$DEST/tp-check-$shape-x$RANKS.json" 2>&1 |
        tee "$DEST/tp-check-$shape-x$RANKS.log" || status=1
    "$BIN" bench --device cuda -m "$dir" --prompt-tokens 128 --gen-tokens 128 \
        --receipt "$DEST/tp-bench-$shape-x1.json" 2>&1 | tee "$DEST/tp-bench-$shape-x1.log" || status=1
    "$BIN" bench --device cuda -m "$dir" --prompt-tokens 128 --gen-tokens 128 \
        --tensor-parallel "$RANKS" --receipt "$DEST/tp-bench-$shape-x$RANKS.json" 2>&1 |
        tee "$DEST/tp-bench-$shape-x$RANKS.log" || status=1
done
exit $status
