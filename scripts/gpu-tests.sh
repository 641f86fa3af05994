#!/usr/bin/env bash
# Builds the test binaries that hold GPU tests (marked #[ignore = "needs a GPU: ..."]; a
# plain `cargo test` skips them) and copies them into gpu-tests/ at the repository root,
# for scripts/device/gpu-tests.sh to run on a GPU machine, which has no Rust toolchain.
# Run here; then give the device tool `carry: ["gpu-tests"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf gpu-tests && mkdir gpu-tests
# Every test binary of the crates whose tests use the GPU (today quench-rt: its CUDA
# unit tests and tests/cuda_backend.rs), named by cargo's JSON messages.
CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}" \
    cargo test -p quench-rt --no-run --message-format=json \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
    | while read -r exe; do
        # Only binaries that list at least one ignored (GPU) test are worth carrying.
        n="$("$exe" --list --ignored | grep -c ': test$' || true)"
        if [ "$n" -gt 0 ]; then
            cp "$exe" gpu-tests/
            echo "gpu-tests/$(basename "$exe"): $n GPU test(s)"
        fi
    done
ls gpu-tests/* >/dev/null 2>&1 || { echo "no GPU test binaries were built" >&2; exit 1; }
