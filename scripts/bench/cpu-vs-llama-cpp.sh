#!/usr/bin/env bash
# Decode speed on the CPU against llama.cpp (llama-cpp-python) in the same run, one receipt
# per GGUF file: quench bench --device cpu --vs-llama-cpp.
#
#   scripts/bench/cpu-vs-llama-cpp.sh RECEIPT_DIR PYTHON NAME=FILE.gguf [NAME=FILE.gguf ...]
#
# PYTHON is an interpreter with llama-cpp-python (scripts/find-llama-cpp.sh avx2 builds one).
# QUENCH (default target/release/quench), THREADS (2), PROMPT (16), GEN (32) and REPEATS (3)
# set the binary and the workload. Receipts: RECEIPT_DIR/cpu-bench-NAME.json.
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,9p' "$0" >&2
    exit 2
fi
dir=$1 python=$2
shift 2
quench=${QUENCH:-target/release/quench}
mkdir -p "$dir"
for pair in "$@"; do
    name=${pair%%=*} file=${pair#*=}
    if [ "$name" = "$pair" ] || [ ! -f "$file" ]; then
        echo "cpu-vs-llama-cpp: '$pair' is not NAME=FILE with an existing file" >&2
        exit 2
    fi
    "$quench" bench --device cpu -m "$file" --threads "${THREADS:-2}" \
        --prompt-tokens "${PROMPT:-16}" --gen-tokens "${GEN:-32}" --repeats "${REPEATS:-3}" \
        --vs-llama-cpp --python "$python" --receipt "$dir/cpu-bench-$name.json" |
        grep -E 'quench f32|llama.cpp  |decode speed' | sed "s/^/$name: /"
done
