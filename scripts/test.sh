#!/usr/bin/env bash
# The test command: installs the tools the tests need (ptxas from NVIDIA's
# nvidia-cuda-nvcc wheel, 13.0 series, matching the driver the GPU path targets),
# then runs every test of the workspace. No GPU is needed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${QUENCH_PTXAS:-}" ]; then
    QUENCH_PTXAS="$(scripts/find-ptxas.sh)"
    export QUENCH_PTXAS
fi
echo "ptxas: $QUENCH_PTXAS ($("$QUENCH_PTXAS" --version | tail -1))"

cargo test --workspace --no-fail-fast "$@"
