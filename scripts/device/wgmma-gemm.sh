#!/usr/bin/env bash
# The wgmma products on the GPU, in two phases (each fits one device call):
#
#   scripts/device/wgmma-gemm.sh kernels   each wgmma variant (every thread copying, and a
#                                          copier warp with mbarriers) against the
#                                          interpreter at several tiles with partial tiles,
#                                          then timed at llama-3.1-8b's layer shapes (2048
#                                          tokens) and at 4096³ beside the mma.sync products
#                                          at the engine's former tiles and torch.matmul,
#                                          in the same run
#   scripts/device/wgmma-gemm.sh speed     quench bench on the seeded llama-3.1-8b shape
#                                          (bf16): 2048 tokens in one chunk and 512, then
#                                          quench generate with a prompt of about 2,000
#                                          tokens (time to first token)
#
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts and logs go to $OUT (or receipts/ when OUT is unset).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
status=0
case "${1:?usage: wgmma-gemm.sh kernels|speed}" in
    kernels)
        "$BIN" devices
        only=gemm_bf16_xf16,gemm_bf16_xf16_residual,gemm_bf16_xf16_to_f16,gemm_f16_xf16,gemm_bf16
        compare=()
        for w in 1 2; do
            compare+=(--compare-shape "m=70 n=128 k=192 bm=64 bn=128 stages=3 wgmma=$w")
            compare+=(--compare-shape "m=300 n=256 k=256 bm=256 bn=128 stages=4 wgmma=$w")
        done
        compare+=(--compare-shape "m=200 n=256 k=512 bm=128 bn=128 stages=4 wgmma=2")
        "$BIN" check-kernels --only "$only" --no-perf "${compare[@]}" \
            --receipt "$DEST/kernel-check-wgmma.json" >"$DEST/kernel-check-wgmma.log" 2>&1 || status=1
        quant=gemm_q4_k_xf16,gemm_q8_0_xf16,gemm_q6_k_xf16,gemm_q5_k_xf16,gemm_q4_0_xf16,gemm_q4_1_xf16
        "$BIN" check-kernels --only "$quant" --no-perf \
            --compare-shape "m=130 n=256 k=1024 bm=128 bn=128 stages=3 wgmma=1" \
            --compare-shape "m=300 n=128 k=512 bm=256 bn=128 stages=3 wgmma=1" \
            --receipt "$DEST/kernel-check-wgmma-quant.json" >>"$DEST/kernel-check-wgmma.log" 2>&1 || status=1
        grep -E "^gemm_|FAIL|error" "$DEST/kernel-check-wgmma.log" | tail -40
        shapes=()
        for nk in "6144 4096" "4096 4096" "14336 4096" "4096 14336"; do
            read -r n k <<<"$nk"
            shapes+=(--shape "m=2048 n=$n k=$k bm=128 bn=128 wn=64 stages=3")
            for t in "256 128 4 1" "256 128 4 2" "128 128 4 2"; do
                read -r bm bn st w <<<"$t"
                shapes+=(--shape "m=2048 n=$n k=$k bm=$bm bn=$bn stages=$st wgmma=$w")
            done
        done
        shapes+=(--shape "m=4096 n=4096 k=4096 bm=256 bn=128 stages=4 wgmma=1")
        shapes+=(--shape "m=4096 n=4096 k=4096 bm=256 bn=128 stages=4 wgmma=2")
        "$BIN" check-kernels --only gemm_bf16_xf16,gemm_f16_xf16 --no-compare --reps 20 "${shapes[@]}" \
            --receipt "$DEST/kernel-perf-wgmma.json" >"$DEST/kernel-perf-wgmma.log" 2>&1 || status=1
        # Quantized weights: the mma.sync products at the engine's tiles, then wgmma.
        qshapes=()
        for nk in "6144 4096" "14336 4096" "4096 14336"; do
            read -r n k <<<"$nk"
            qshapes+=(--shape "m=2048 n=$n k=$k bm=128 bn=128 wn=64 stages=2")
            qshapes+=(--shape "m=2048 n=$n k=$k bm=256 bn=128 stages=3 wgmma=1")
            qshapes+=(--shape "m=2048 n=$n k=$k bm=128 bn=128 stages=3 wgmma=1")
        done
        "$BIN" check-kernels --only gemm_q4_k_xf16,gemm_q8_0_xf16 --no-compare --reps 20 "${qshapes[@]}" \
            --receipt "$DEST/kernel-perf-wgmma-quant.json" >>"$DEST/kernel-perf-wgmma.log" 2>&1 || status=1
        grep -E "^gemm_|copy" "$DEST/kernel-perf-wgmma.log" | awk '{print $1, $2, $3, $(NF-4), $(NF-3), $NF}'
        python3 scripts/device/torch_baseline.py >"$DEST/torch-baseline-wgmma.json" || status=1
        cat "$DEST/torch-baseline-wgmma.json"
        ;;
    speed)
        SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
        m="$SYNTH_DIR/llama-3.1-8b"
        [ -f "$m/config.json" ] || "$BIN" synth --shape llama-3.1-8b --seed 1 "$m" >/dev/null || exit 1
        for run in "2048 2048" "512 512"; do
            read -r n chunk <<<"$run"
            "$BIN" bench --device cuda -m "$m" --prompt-tokens "$n" --gen-tokens 16 --repeats 3 \
                --prefill-chunk "$chunk" \
                --receipt "$DEST/gpu-prefill-$n-chunk-$chunk-llama-3.1-8b-wgmma.json" 2>&1 |
                tail -3 || status=1
        done
        # A table of products, about 2,000 tokens; time to first token as generate reports it.
        p="A table of products, one per line:"
        for a in $(seq 2 150); do
            for b in 2 3 4 5 6 7 8 9 10 11 12 13; do p+=$'\n'"$a × $b = $((a * b))"; done
        done
        for chunk in 512 2048; do
            "$BIN" generate --device cuda -m "$m" --max-tokens 8 --prefill-chunk "$chunk" "$p" 2>&1 \
                >/dev/null | grep "prompt tokens" | sed "s/^/chunk $chunk: /" |
                tee -a "$DEST/generate-ttft-llama-3.1-8b-wgmma.log"
        done
        ;;
    *)
        echo "usage: wgmma-gemm.sh kernels|speed" >&2
        exit 2
        ;;
esac
exit $status
