#!/usr/bin/env bash
# Latency and throughput of each instruction class on the GPU (`quench isa latency`):
# writes isa/sm90/latencies.json under $OUT/isa (or isa/sm90 when OUT is unset) and the
# receipt isa-latency.json beside it. Run from the repository root with the release binary
# carried (target/release/quench, or .device/bin/quench.gz, unpacked here).
set -euo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
if [ ! -x "$BIN" ] && [ -f .device/bin/quench.gz ]; then
    mkdir -p target/release && gunzip -c .device/bin/quench.gz >target/release/quench
    chmod +x target/release/quench
fi
if [ -n "${OUT:-}" ]; then
    TABLE="$OUT/isa" RECEIPT="$OUT/isa-latency.json"
else
    TABLE=isa/sm90 RECEIPT=receipts/isa-latency.json
fi
mkdir -p "$TABLE" "$(dirname "$RECEIPT")"
"$BIN" isa latency --out "$TABLE" --receipt "$RECEIPT" "$@" 2>&1 | tee "${RECEIPT%.json}.log"
exit "${PIPESTATUS[0]}"
