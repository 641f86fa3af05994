#!/usr/bin/env bash
# The GPU tests, on the GPU machine: runs every test binary in gpu-tests/ (built and
# copied there by scripts/gpu-tests.sh, carried with `carry: ["gpu-tests"]`) with
# `--include-ignored` (the GPU tests and the rest, whose GPU branches run there), one test
# at a time. A GPU test fails, not passes, when there is no GPU.
# Prints one line per binary and a summary; exits nonzero if any test failed.
#
#   bash scripts/device/gpu-tests.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
shopt -s nullglob
bins=(gpu-tests/*)
[ ${#bins[@]} -gt 0 ] || { echo "gpu-tests/ is empty: run scripts/gpu-tests.sh first" >&2; exit 1; }
nvidia-smi -L || true
failed=0 passed=0 bad=()
for bin in "${bins[@]}"; do
    log="$(mktemp)"
    "$bin" --include-ignored --test-threads=1 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    # libtest's last line: "test result: ok. N passed; M failed; ..."
    result="$(grep '^test result:' "$log" | tail -1)"
    p="$(sed -n 's/.* \([0-9]*\) passed.*/\1/p' <<<"$result")"
    f="$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$result")"
    passed=$((passed + ${p:-0})) failed=$((failed + ${f:-0}))
    # A binary that crashed before its summary counts as a failure too.
    [ "$rc" -eq 0 ] || bad+=("$(basename "$bin") (exit $rc)")
    rm -f "$log"
done
echo "GPU tests: $passed passed, $failed failed, in ${#bins[@]} binaries"
[ ${#bad[@]} -eq 0 ] || { echo "failed: ${bad[*]}"; exit 1; }
