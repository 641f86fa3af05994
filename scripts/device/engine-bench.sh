#!/usr/bin/env bash
# Decode speed on the GPU, quench beside PyTorch + transformers in the same run, on the
# same checkpoint, prompt (128 tokens) and length (128 generated), with receipts.
#
#   scripts/device/engine-bench.sh SPEC ...
#
# SPEC is one of
#   gguf:NAME:PATH[:TARGET]   a GGUF file (quench only: transformers needs its float weights)
#   shape:SHAPE[:TARGET]      a synthetic bf16 checkpoint of a catalog shape (`quench synth`,
#                             seed 1, under $SYNTH_DIR), quench and torch on the same files
#   quant:SHAPE:TYPE[:TARGET] that checkpoint quantized by `quench quantize --type TYPE`
#   f16:SHAPE[:TARGET]        the same checkpoint written in f16 (`quench synth --dtype f16`),
#                             quench only
# TARGET is `N` tokens/s or `N%` of the copy bandwidth (weight bytes per token × rate),
# fixed here before the run and recorded in the receipt.
#
# Run from the repository root with the release binary carried (target/release/quench).
# Receipts: $OUT/gpu-bench-*.json (quench) and $OUT/torch-generate-*.json (PyTorch).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
SYNTH_DIR=${SYNTH_DIR:-/tmp/quench-synth}
HERE=$(dirname "$0")
mkdir -p "$DEST" "$SYNTH_DIR"
status=0

target_args() {
    case "$1" in
        "") ;;
        *%) echo "--target-percent ${1%\%}" ;;
        *) echo "--target-tokens-per-s $1" ;;
    esac
}

synth() {
    local shape=$1 dtype=${2:-bf16} dir="$SYNTH_DIR/$1"
    [ "$dtype" = bf16 ] || dir="$dir-$dtype"
    [ -f "$dir/config.json" ] ||
        "$BIN" synth --shape "$shape" --seed 1 --dtype "$dtype" "$dir" >&2 || return 1
    echo "$dir"
}

bench() {
    local name=$1 model=$2 target=$3
    # shellcheck disable=SC2046
    "$BIN" bench --device cuda -m "$model" --prompt-tokens 128 --gen-tokens 128 --repeats 3 \
        $(target_args "$target") --receipt "$DEST/gpu-bench-$name.json" 2>&1 |
        tee "$DEST/gpu-bench-$name.log"
    return "${PIPESTATUS[0]}"
}

for spec in "$@"; do
    IFS=: read -r kind a b c <<<"$spec"
    case "$kind" in
        gguf) bench "$a" "$b" "${c:-}" || status=1 ;;
        shape)
            dir=$(synth "$a") || { status=1; continue; }
            bench "$a" "$dir" "${b:-}" || status=1
            python3 "$HERE/torch_generate.py" "$dir" >"$DEST/torch-generate-$a.json" ||
                status=1
            ;;
        f16)
            dir=$(synth "$a" f16) || { status=1; continue; }
            bench "$a-f16" "$dir" "${b:-}" || status=1
            ;;
        quant)
            dir=$(synth "$a") || { status=1; continue; }
            q="$SYNTH_DIR/$a-$b.gguf"
            [ -f "$q" ] || "$BIN" quantize --type "$b" "$dir" "$q" || { status=1; continue; }
            bench "$a-$b" "$q" "${c:-}" || status=1
            ;;
        *) echo "engine-bench.sh: unknown spec $spec" >&2; status=1 ;;
    esac
done
exit $status
