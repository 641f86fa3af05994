#!/usr/bin/env bash
# The test command. Checks that every number the README and docs quote beside a receipt
# is in that receipt (scripts/check-claims.py), installs what the tests need — ptxas from
# NVIDIA's nvidia-cuda-nvcc wheel (13.0 series, matching the driver the GPU path targets)
# and the two real models (SmolLM2-135M-Instruct, all-MiniLM-L6-v2) fetched by `quench
# pull` — then runs every test of the workspace and the server's client tests (the
# official `openai` Python client, and the chat page in Chromium when /usr/bin/chromium
# exists). No GPU is needed. A claim or test that fails makes the script fail once the
# rest has run.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
# Fast, and needs no build: the claims first (the checker's own tests, then the docs).
python3 scripts/test_check_claims.py || status=$?
python3 scripts/check-claims.py || status=$?

if [ -z "${QUENCH_PTXAS:-}" ]; then
    QUENCH_PTXAS="$(scripts/find-ptxas.sh)"
    export QUENCH_PTXAS
fi
echo "ptxas: $QUENCH_PTXAS ($("$QUENCH_PTXAS" --version | tail -1))"

# A clean build gains nothing from incremental state (it only costs disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# One build serves the tests and the `pull` below (the dev and test profiles match).
cargo build -q -p quench
cache="${QUENCH_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/quench}/models"
target/debug/quench pull smollm2 --cache "$cache"
target/debug/quench pull minilm --cache "$cache"
export QUENCH_SMOLLM2_GGUF="$cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
export QUENCH_MINILM_DIR="$cache/minilm"

cargo test --workspace --no-fail-fast "$@" || status=$?

python3 -c "import openai, pytest" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check "openai>=1.50" "pytest>=8"
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "server tests: the chat page test is SKIPPED (no Chromium; apt-get install chromium)"
    export QUENCH_SKIP_BROWSER=1
fi
QUENCH_BIN=target/debug/quench bash tests/server/run.sh || status=$?
exit $status
