#!/usr/bin/env bash
# Every library kernel on the GPU and in the interpreter on the same inputs, one table:
# kernel, shape, max error, bit-exact, reference check, time, bandwidth against the
# device-to-device copy measured in the same run; then the PyTorch peers (copy
# bandwidth, torch.matmul bf16) in the same call.
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts go to $OUT (or receipts/ when OUT is unset).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
"$BIN" devices
status=0
"$BIN" check-kernels --receipt "$DEST/kernel-check.json" "$@" 2>&1 | tee "$DEST/kernel-check.log" || status=$?
if command -v python3 >/dev/null && python3 -c "import torch" 2>/dev/null; then
    python3 scripts/device/torch_baseline.py | tee "$DEST/torch-baseline.json"
fi
exit $status
