#!/usr/bin/env bash
# Every library kernel that quench's own code generator compiles, run on the GPU from that
# machine code (no ptxas) and in the interpreter on the same inputs (bit-identical for
# exact kernels), then timed at full size next to its PTX-built twin; the kernels it
# cannot compile yet are listed with the operation that stops them (`quench check-kernels
# --codegen sass`). Receipt: codegen-check.json in $OUT (or receipts/ when OUT is unset).
# Run from the repository root with the release binary carried (target/release/quench).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
"$BIN" devices
"$BIN" check-kernels --codegen sass --receipt "$DEST/codegen-check.json" "$@" 2>&1 | tee "$DEST/codegen-check.log"
exit "${PIPESTATUS[0]}"
