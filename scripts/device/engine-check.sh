#!/usr/bin/env bash
# quench check on the GPU: generate greedily through quench's kernels, then judge every
# logit of every step with the f64 CPU reference teacher-forced on the GPU's tokens
# (|gpu − f64| ≤ 0.05 + 0.003·|f64| and the same top-1, fixed before dispatch), with a
# decode timing (128-token prompt, 128 greedy steps, host round trip per token).
#
#   scripts/device/engine-check.sh SMOLLM2.gguf [SHAPE ...]
#
# 1. SmolLM2-135M-Instruct Q4_1 (the GGUF file given as $1): 8 prompts × 64 tokens.
# 2. Each SHAPE (default: llama-3.2-1b), a synthetic bf16 checkpoint written by
#    `quench synth` (seed 1) under $SYNTH_DIR: 2 prompts × 32 tokens (its f64 reference
#    runs on the host CPU and dominates the time).
# The tiny synthetic shape cannot run: its head size (16) is below what the attention
# merge kernel takes (a multiple of 32).
#
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts and logs go to $OUT (or receipts/ when OUT is unset).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
SMOLLM2=${1:?usage: engine-check.sh SMOLLM2.gguf [SHAPE ...]}
shift
SHAPES=("$@")
[ ${#SHAPES[@]} -gt 0 ] || SHAPES=(llama-3.2-1b)
mkdir -p "$DEST" "$SYNTH_DIR"
"$BIN" devices
status=0

"$BIN" check -m "$SMOLLM2" --tokens 64 --time-tokens 128 --time-prompt 128 \
    --receipt "$DEST/engine-check-smollm2.json" 2>&1 | tee "$DEST/engine-check-smollm2.log" || status=1

printf '%s\n' "The capital of France is" "def fibonacci(n):" > "$DEST/engine-check-prompts.txt"
for shape in "${SHAPES[@]}"; do
    dir="$SYNTH_DIR/$shape"
    [ -f "$dir/config.json" ] || "$BIN" synth --shape "$shape" --seed 1 "$dir"
    "$BIN" check -m "$dir" --prompts "$DEST/engine-check-prompts.txt" --tokens 32 --context 1024 \
        --time-tokens 128 --time-prompt 128 \
        --receipt "$DEST/engine-check-$shape.json" 2>&1 | tee "$DEST/engine-check-$shape.log" || status=1
done
exit $status
