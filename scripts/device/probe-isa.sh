#!/usr/bin/env bash
# Measure the sm_90 machine model on the GPU: MMA fragment and ldmatrix layouts and
# the error of approximate instructions. Run from the repository root with the
# release binary carried (target/release/quench). Tables and the receipt are written
# under $OUT (or the repository when OUT is unset).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-.}
mkdir -p "$DEST/isa" "$DEST/receipts"
"$BIN" devices
"$BIN" isa probe --out "$DEST/isa" --receipt "$DEST/receipts/isa-probe.json"
