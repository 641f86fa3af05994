#!/usr/bin/env bash
# Prints the path of a Python interpreter that has llama-cpp-python 0.3.36 (with numpy and the
# `gguf` package) built for one of ggml's x86 builds, building it the first time into
# .tools/llama-cpp-BUILD/ (a virtual environment; about four minutes on two cores):
#   avx2    -DGGML_NATIVE=OFF: AVX2, FMA, F16C, no AVX-512
#   avx512  the same with AVX-512 (F, CD, VL, DQ, BW, VNNI, VBMI, BF16), as a native build on
#           a CPU with AVX-512 and without AMX
# `quench generate --llama-cpp-rounding=BUILD` follows the build of the same name;
# crates/cli/tests/llama_cpp_live.rs compares the two. Build output goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-}"
case "$build" in
    avx2) flags="-DGGML_NATIVE=OFF" ;;
    avx512) flags="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON" ;;
    *)
        echo "usage: scripts/find-llama-cpp.sh avx2|avx512" >&2
        exit 2
        ;;
esac
venv=".tools/llama-cpp-$build"
python="$venv/bin/python"
if ! "$python" -c "import llama_cpp, gguf, numpy" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    # No wheel cache: a wheel built for one build must not be reused for the other.
    CMAKE_ARGS="$flags" "$python" -m pip install -q --disable-pip-version-check --no-cache-dir \
        --no-binary llama-cpp-python "llama-cpp-python==0.3.36" numpy "gguf>=0.10" >&2
fi
echo "$PWD/$python"
