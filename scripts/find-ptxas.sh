#!/usr/bin/env bash
# Prints the path of ptxas, installing NVIDIA's nvidia-cuda-nvcc wheel (13.0 series)
# into .tools/ when no ptxas is found.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v ptxas >/dev/null 2>&1; then command -v ptxas; exit 0; fi
found="$(find .tools -name ptxas -type f 2>/dev/null | head -1 || true)"
if [ -z "$found" ]; then
    python3 -m pip install -q --disable-pip-version-check --no-deps --target .tools/nvcc "nvidia-cuda-nvcc==13.0.88" >&2
    found="$(find .tools -name ptxas -type f | head -1)"
fi
if [ -z "$found" ]; then echo "ptxas not found in the nvidia-cuda-nvcc wheel" >&2; exit 1; fi
chmod +x "$found"
echo "$PWD/$found"
