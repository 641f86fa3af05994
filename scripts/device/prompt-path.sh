#!/usr/bin/env bash
# The prompt path on the GPU, in phases (each a separate device call if need be):
#
#   scripts/device/prompt-path.sh kernels             the prompt path's kernels, GPU against
#                                                     the interpreter, and the f16-operand
#                                                     GEMMs timed at llama-3.1-8b's shapes
#                                                     beside torch.matmul (same run)
#   scripts/device/prompt-path.sh speed SHAPE         bench: prompts of 512 and 2048 tokens
#                                                     (chunks of 512, and one chunk of 2048),
#                                                     then `quench generate` with a prompt of
#                                                     about 2,000 tokens (time to first token)
#   scripts/device/prompt-path.sh check MODEL NAME [TOKENS] [PROMPTS]
#                                                     quench check (prompts fed through the
#                                                     prompt path), built-in prompts unless
#                                                     a PROMPTS file is given
#   scripts/device/prompt-path.sh long-prompt FILE    writes a prompts file of one table of
#                                                     products (about 1,300 tokens or more)
#
# MODEL is a GGUF file, a checkpoint directory, or shape:SHAPE (a seeded bf16 checkpoint by
# `quench synth`, seed 1, under $SYNTH_DIR) or quant:SHAPE:TYPE (that checkpoint quantized).
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts and logs go to $OUT (or receipts/ when OUT is unset).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
mkdir -p "$DEST" "$SYNTH_DIR"

# A table of products, one per line, `lines` lines long (the prompts file's "\n" escapes).
table() {
    local lines=$1 a b i=0 out="A table of products, one per line:\\n"
    for ((a = 2; i < lines; a++)); do
        for ((b = 2; b <= 13 && i < lines; b++, i++)); do
            out+="$a × $b = $((a * b))\\n"
        done
    done
    printf '%sQ: According to the table, what is 7 × 12?\\nA:\n' "$out"
}

model_path() {
    local spec=$1 kind shape type dir
    IFS=: read -r kind shape type <<<"$spec"
    case "$kind" in
        shape | quant)
            dir="$SYNTH_DIR/$shape"
            [ -f "$dir/config.json" ] || "$BIN" synth --shape "$shape" --seed 1 "$dir" >&2 || return 1
            if [ "$kind" = quant ]; then
                local q="$SYNTH_DIR/$shape-$type.gguf"
                [ -f "$q" ] || "$BIN" quantize "$dir" "$q" --type "$type" >&2 || return 1
                echo "$q"
            else
                echo "$dir"
            fi
            ;;
        *) echo "$spec" ;;
    esac
}

case "${1:?usage: prompt-path.sh kernels|speed|check|long-prompt ...}" in
    kernels)
        "$BIN" devices
        only=rmsnorm_residual_f16,silu_mul_f16,cast_f32_f16,attention_prefill_f16,attention_prefill_f32
        for f in bf16 f16 q8_0 q4_0 q4_1 q4_k q5_k q6_k; do
            only+=",gemm_${f}_xf16,gemm_${f}_xf16_residual,gemm_${f}_xf16_to_f16"
        done
        "$BIN" check-kernels --only "$only" --no-perf --receipt "$DEST/kernel-check-prompt-path.json" \
            >"$DEST/kernel-check-prompt-path.log" 2>&1
        status=$?
        tail -45 "$DEST/kernel-check-prompt-path.log"
        # The 8B layer's products at 512 and 2048 rows, with the tiles the engine picks
        # (64×64 warp tiles) and the 64×32 ones it picked before.
        shapes=()
        for m in 512 2048; do
            for nk in "6144 4096" "4096 4096" "14336 4096" "4096 14336"; do
                read -r n k <<<"$nk"
                for wn in 64 32; do
                    shapes+=(--shape "m=$m n=$n k=$k bm=128 bn=128 wn=$wn stages=3")
                done
            done
        done
        shapes+=(--shape "m=4096 n=4096 k=4096 bm=128 bn=128 wn=64 stages=3")
        "$BIN" check-kernels --only gemm_bf16,gemm_bf16_xf16,gemm_f16_xf16 --no-compare "${shapes[@]}" \
            --receipt "$DEST/kernel-perf-gemm-xf16.json" >"$DEST/kernel-perf-gemm-xf16.log" 2>&1 || status=1
        qshapes=()
        for nk in "6144 4096" "14336 4096" "4096 14336"; do
            read -r n k <<<"$nk"
            for wn in 64 32; do
                qshapes+=(--shape "m=2048 n=$n k=$k bm=128 bn=128 wn=$wn stages=2")
            done
        done
        "$BIN" check-kernels --only gemm_q4_k_xf16,gemm_q8_0_xf16 --no-compare "${qshapes[@]}" \
            --receipt "$DEST/kernel-perf-gemm-xf16-quant.json" >>"$DEST/kernel-perf-gemm-xf16.log" 2>&1 || status=1
        grep -E "gemm_" "$DEST/kernel-perf-gemm-xf16.log" | tail -60
        python3 scripts/device/torch_baseline.py >"$DEST/torch-baseline-prompt-path.json" || status=1
        exit $status
        ;;
    speed)
        m=$(model_path "shape:${2:?a SHAPE}") || exit 1
        status=0
        for run in "512 512" "2048 512" "2048 2048"; do
            read -r n chunk <<<"$run"
            "$BIN" bench --device cuda -m "$m" --prompt-tokens "$n" --gen-tokens 16 --repeats 3 \
                --prefill-chunk "$chunk" --receipt "$DEST/gpu-prefill-$n-chunk-$chunk-$2.json" 2>&1 |
                tail -4 || status=1
        done
        # Time to first token as `quench generate` reports it (the model loaded first).
        p="$(table 146)"
        p=${p//\\n/$'\n'}
        for i in 1 2; do
            "$BIN" generate --device cuda -m "$m" --max-tokens 8 "$p" 2>&1 >/dev/null |
                grep "prompt tokens" | tee -a "$DEST/generate-ttft-$2.log"
        done
        exit $status
        ;;
    check)
        m=$(model_path "${2:?MODEL}") || exit 1
        name=${3:?NAME}
        extra=()
        [ -n "${5:-}" ] && extra=(--prompts "$5")
        "$BIN" check -m "$m" --tokens "${4:-64}" "${extra[@]}" \
            --receipt "$DEST/engine-check-$name.json" >"$DEST/engine-check-$name.log" 2>&1
        status=$?
        grep -vE "^\s*layers done|output projection" "$DEST/engine-check-$name.log" | tail -25
        exit $status
        ;;
    long-prompt)
        table 330 >"${2:?FILE}"
        ;;
esac
