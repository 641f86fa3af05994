#!/usr/bin/env bash
# Every weight type on the llama-3.1-8b shape: a `quench synth` checkpoint (seed 1)
# quantized by `quench quantize --type TYPE`, then, per phase:
#   gpu    decode on the GPU (`quench bench --device cuda`: 128-token prompt, 128 tokens,
#          median of 3, copy bandwidth in the same run), with the target if any
#   check  `quench check` on the GPU: one prompt, 16 greedy tokens, every logit against the
#          f64 reference (streamed a layer at a time on the host)
#   cpu    decode on the host's CPU (`quench bench --device cpu`, $CPU_THREADS threads,
#          8-token prompt, 8 tokens, one timed run)
#
#   scripts/device/types-8b.sh PHASES TYPE ...     (PHASES: e.g. gpu,check or all)
#
# Files are kept under $SYNTH_DIR between phases of one machine session; receipts and
# logs go to $OUT/types (or receipts/types). Run from the repository root with the
# release binary carried (target/release/quench).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}/types
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
CPU_THREADS=${CPU_THREADS:-$(nproc)}
SHAPE=${SHAPE:-llama-3.1-8b}
PHASES=${1:?usage: types-8b.sh PHASES TYPE ...}
shift
mkdir -p "$DEST" "$SYNTH_DIR"
status=0

# The decode targets, % of the copy bandwidth.
target() {
    case "$1" in
        q4_k_m) echo 55 ;;
        q5_k_m | q6_k) echo 60 ;;
        q8_0) echo 65 ;;
        iq4_xs) echo 50 ;;
    esac
}

want() { [ "$PHASES" = all ] || [[ ",$PHASES," == *",$1,"* ]]; }

model() {
    local t=$1 dir="$SYNTH_DIR/$SHAPE" q="$SYNTH_DIR/$SHAPE-$1.gguf"
    if [ ! -f "$dir/config.json" ]; then
        /usr/bin/time -f "synth: %e s" "$BIN" synth --shape "$SHAPE" --seed 1 "$dir" \
            >"$DEST/synth-$SHAPE.log" 2>&1 || return 1
        tail -n 1 "$DEST/synth-$SHAPE.log" >&2
    fi
    if [ ! -f "$q" ]; then
        /usr/bin/time -f "quantize $t: %e s, peak %M KiB" \
            "$BIN" quantize --type "$t" "$dir" "$q" >"$DEST/quantize-$SHAPE-$t.log" 2>&1 ||
            return 1
        tail -n 2 "$DEST/quantize-$SHAPE-$t.log" >&2
    fi
    echo "$q"
}

printf '%s\n' "The capital of France is" >"$DEST/types-8b-prompts.txt"
for t in "$@"; do
    q=$(model "$t") || { status=1; continue; }
    name="$SHAPE-$t"
    if want gpu; then
        tp=$(target "$t")
        # shellcheck disable=SC2046
        "$BIN" bench --device cuda -m "$q" --prompt-tokens 128 --gen-tokens 128 --repeats 3 \
            $([ -n "$tp" ] && echo "--target-percent $tp") \
            --receipt "$DEST/gpu-bench-$name.json" >"$DEST/gpu-bench-$name.log" 2>&1
        # A missed target fails the bench but still writes its receipt.
        [ -f "$DEST/gpu-bench-$name.json" ] || status=1
        tail -n 4 "$DEST/gpu-bench-$name.log"
    fi
    if want check; then
        "$BIN" check -m "$q" --prompts "$DEST/types-8b-prompts.txt" --tokens 16 \
            --receipt "$DEST/engine-check-$name.json" >"$DEST/engine-check-$name.log" 2>&1 ||
            status=1
        tail -n 3 "$DEST/engine-check-$name.log"
    fi
    if want cpu; then
        "$BIN" bench --device cpu -m "$q" --threads "$CPU_THREADS" --prompt-tokens 8 \
            --gen-tokens 8 --repeats 1 \
            --receipt "$DEST/cpu-bench-$name.json" >"$DEST/cpu-bench-$name.log" 2>&1 ||
            status=1
        tail -n 3 "$DEST/cpu-bench-$name.log"
    fi
done
exit $status
