#!/usr/bin/env bash
# Every library kernel that quench's own code generator compiles, run on the GPU from that
# machine code (no ptxas) and in the interpreter on the same inputs (bit-identical for
# exact kernels), then (with PERF=1) timed at full size next to its PTX-built twin; the
# kernels it cannot compile yet are listed with the operation that stops them (`quench
# check-kernels --codegen sass`). A kernel that faults leaves its process's CUDA context
# unusable, so the kernels are checked in groups of GROUP, each in a process of its own.
# Receipts: codegen-check-N.json (and codegen-perf.json) in $OUT (or receipts/ when OUT is
# unset). Run from the repository root with the release binary carried
# (target/release/quench); further arguments go to each check-kernels call.
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
GROUP=${GROUP:-12}
mkdir -p "$DEST"
"$BIN" devices
mapfile -t names < <("$BIN" cc --list)
failed=0
for ((i = 0; i < ${#names[@]}; i += GROUP)); do
  only=$(IFS=,; echo "${names[*]:i:GROUP}")
  "$BIN" check-kernels --codegen sass --no-perf --only "$only" \
    --receipt "$DEST/codegen-check-$((i / GROUP)).json" "$@" > "$DEST/codegen-check-$((i / GROUP)).log" 2>&1 \
    || failed=1
  # Each kernel's line of the table, and what failed.
  grep -vE "^(checking|  |device-to-device|kernel |copy bandwidth|error:)" "$DEST/codegen-check-$((i / GROUP)).log"
done
if [ "${PERF:-0}" = 1 ]; then
  "$BIN" check-kernels --codegen sass --no-compare --receipt "$DEST/codegen-perf.json" "$@" 2>&1 \
    | grep -v "^timing" | tee "$DEST/codegen-perf.log" || failed=1
fi
exit "$failed"
