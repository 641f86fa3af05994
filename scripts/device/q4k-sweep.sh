#!/usr/bin/env bash
# The Q4_K decode products of the llama-3.1-8b shape at several block shapes: warps per
# block × blocks per multiprocessor (the grid cap). Each block quantizes the whole
# activation vector once before its row groups, so fewer, wider blocks spend less of
# their time on it and keep fewer loads in flight: this sweep finds the balance.
# One `quench check-kernels` run per product (timings only: the GPU-versus-interpreter
# comparison is `check-kernels --only qgemv_q4_k...`), each with the copy bandwidth
# measured in the same run.
#
#   scripts/device/q4k-sweep.sh [MULTIPROCESSORS]     (default 132, an H200)
#
# Run from the repository root with the release binary carried (target/release/quench).
# Writes kernel-perf-q4k-sweep-*.json and .log to $OUT (or receipts/ when OUT is unset).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SMS=${1:-132}
mkdir -p "$DEST"
status=0
# kernel, rows, cols: q|k|v and gate/up (with the norm), o and down (residual).
for spec in qgemv_q4_k_rmsnorm_xf32:6144:4096 qgemv_q4_k_rmsnorm_swiglu_xf32:14336:4096 \
    qgemv_q4_k_residual_xf32:4096:4096 qgemv_q4_k_residual_xf32:4096:14336; do
    IFS=: read -r kernel rows cols <<<"$spec"
    shapes=()
    for warps in 4 8 16; do
        for per_sm in 1 2 4 8; do
            shapes+=(--shape "rows=$rows cols=$cols warps=$warps max_blocks=$((per_sm * SMS))")
        done
    done
    name="$DEST/kernel-perf-q4k-sweep-$kernel-${rows}x$cols"
    "$BIN" check-kernels --only "$kernel" --no-compare "${shapes[@]}" --receipt "$name.json" >"$name.log" 2>&1 ||
        status=1
    grep -E "^$kernel .*\[" "$name.log"
done
exit $status
