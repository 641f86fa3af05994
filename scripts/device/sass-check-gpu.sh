#!/usr/bin/env bash
# Every library kernel on the GPU from the driver's cubin and from quench's disassembled
# and reassembled cubin, outputs compared bit for bit (`quench sass check-gpu`); one table,
# one receipt (sass-check-gpu.json in $OUT, or receipts/ when OUT is unset).
# Run from the repository root with the release binary carried (target/release/quench, or
# .device/bin/quench.gz, unpacked here).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
if [ ! -x "$BIN" ] && [ -f .device/bin/quench.gz ]; then
    mkdir -p target/release && gunzip -c .device/bin/quench.gz >target/release/quench
    chmod +x target/release/quench
fi
DEST=${OUT:-receipts}
mkdir -p "$DEST"
"$BIN" devices
"$BIN" sass check-gpu --receipt "$DEST/sass-check-gpu.json" "$@" 2>&1 | tee "$DEST/sass-check-gpu.log"
exit "${PIPESTATUS[0]}"
