#!/usr/bin/env bash
# Fuzzes every parser quench points at untrusted bytes: builds quench-fuzz in the `fuzz`
# profile (release, with overflow checks and debug assertions: an overflow is a panic) and
# runs each target (GGUF, safetensors, config.json, tokenizer.json, chat templates, request
# JSON, the IR text, cubins, SASS text) for ITERATIONS seeded inputs (default 10^6), one process per target,
# JOBS at a time (default: one per core), then writes the receipt: inputs tried, panics,
# slow inputs (over 1 s), the slowest input and each process's peak RSS.
#
#   scripts/fuzz.sh [ITERATIONS [TARGET ...]]
#   QUENCH_FUZZ_SEED=7 QUENCH_FUZZ_JOBS=16 scripts/fuzz.sh
#
# A failing input is written under target/fuzz-failures/ and the line that replays it is
# printed (`target/fuzz/quench-fuzz replay TARGET FILE`). The script fails when any
# target misses the bound the receipt states.
set -euo pipefail
cd "$(dirname "$0")/.."

iterations="${1:-${QUENCH_FUZZ_ITERATIONS:-1000000}}"
shift || true
seed="${QUENCH_FUZZ_SEED:-1}"
jobs="${QUENCH_FUZZ_JOBS:-$(nproc)}"
receipt="${QUENCH_FUZZ_RECEIPT:-receipts/fuzz.json}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

cargo build --profile fuzz -q -p quench-fuzz
exec target/fuzz/quench-fuzz all "$@" --iterations "$iterations" --seed "$seed" --jobs "$jobs" \
    --failures target/fuzz-failures --receipt "$receipt"
