#!/usr/bin/env bash
# The wgmma products on the GPU: each against the interpreter at wgmma tiles (one and two
# warpgroups, token widths 64, 128 and 256, partial tiles), then timed at llama-3.1-8b's
# layer shapes (2048 and 512 tokens) and at 4096³ beside the mma.sync kernel at the
# engine's tiles and torch.matmul, in the same run.
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts and logs go to $OUT (or receipts/ when OUT is unset).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
status=0
"$BIN" devices
only=gemm_bf16_xf16,gemm_bf16_xf16_residual,gemm_bf16_xf16_to_f16,gemm_f16_xf16,gemm_bf16
"$BIN" check-kernels --only "$only" --no-perf \
    --compare-shape "m=70 n=128 k=192 bm=64 bn=128 stages=3 wgmma=1" \
    --compare-shape "m=200 n=256 k=512 bm=128 bn=128 stages=4 wgmma=1" \
    --compare-shape "m=300 n=256 k=256 bm=256 bn=128 stages=4 wgmma=1" \
    --compare-shape "m=130 n=128 k=256 bm=256 bn=64 stages=3 wgmma=1" \
    --receipt "$DEST/kernel-check-wgmma.json" >"$DEST/kernel-check-wgmma.log" 2>&1 || status=1
grep -E "gemm_|FAIL|error" "$DEST/kernel-check-wgmma.log" | tail -30
shapes=()
for m in 2048 512; do
    for nk in "6144 4096" "4096 4096" "14336 4096" "4096 14336"; do
        read -r n k <<<"$nk"
        shapes+=(--shape "m=$m n=$n k=$k bm=128 bn=128 wn=64 stages=3")
        tiles=("128 128 4" "256 128 4" "256 128 3" "128 128 3" "256 64 4")
        [ "$m" = 512 ] && tiles=("128 128 4" "256 128 4" "128 64 4")
        for t in "${tiles[@]}"; do
            read -r bm bn st <<<"$t"
            shapes+=(--shape "m=$m n=$n k=$k bm=$bm bn=$bn stages=$st wgmma=1")
        done
    done
done
shapes+=(--shape "m=4096 n=4096 k=4096 bm=128 bn=128 wn=64 stages=3")
shapes+=(--shape "m=4096 n=4096 k=4096 bm=256 bn=128 stages=4 wgmma=1")
shapes+=(--shape "m=4096 n=4096 k=4096 bm=128 bn=128 stages=4 wgmma=1")
"$BIN" check-kernels --only gemm_bf16_xf16,gemm_f16_xf16 --no-compare "${shapes[@]}" \
    --receipt "$DEST/kernel-perf-wgmma.json" >"$DEST/kernel-perf-wgmma.log" 2>&1 || status=1
grep -E "gemm_|copy" "$DEST/kernel-perf-wgmma.log" | awk '{print $1, $2, $3, $(NF-4), $(NF-3), $NF}' | tail -90
python3 scripts/device/torch_baseline.py >"$DEST/torch-baseline-wgmma.json" || status=1
cat "$DEST/torch-baseline-wgmma.json"
exit $status
