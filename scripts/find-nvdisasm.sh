#!/usr/bin/env bash
# Prints the path of nvdisasm (or, with the argument `cuobjdump`, of cuobjdump), installing
# NVIDIA's nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump wheel into .tools/ when none is
# found. The 13.0 series is not on PyPI; 13.2.51 is the oldest 13.x release there, and it
# reads ptxas 13.0's sm_90 cubins.
set -euo pipefail
cd "$(dirname "$0")/.."
tool="${1:-nvdisasm}"
case "$tool" in nvdisasm|cuobjdump) ;; *) echo "usage: $0 [nvdisasm|cuobjdump]" >&2; exit 2;; esac
if command -v "$tool" >/dev/null 2>&1; then command -v "$tool"; exit 0; fi
found="$(find ".tools/$tool" -name "$tool" -type f 2>/dev/null | head -1 || true)"
if [ -z "$found" ]; then
    python3 -m pip install -q --disable-pip-version-check --no-deps --target ".tools/$tool" "nvidia-cuda-$tool==13.2.51" >&2
    found="$(find ".tools/$tool" -name "$tool" -type f | head -1)"
fi
if [ -z "$found" ]; then echo "$tool not found in the nvidia-cuda-$tool wheel" >&2; exit 1; fi
chmod +x "$found"
echo "$PWD/$found"
