#!/usr/bin/env bash
# Kernels from quench's own code generator loaded alone and launched next to their ptxas
# builds (scripts/device/cubin_probe.py), each in its own process so that one fault names
# one cubin; then compute-sanitizer on each own build to name the faulting instruction and
# address; then a probe kernel that stores what the integer-product forms the code
# generator uses or used compute for known operands (3·5 and 3·0x100 with URZ as the
# addend, 0x100·5 + n, 0x100·0x100 with RZ, and the 64-bit products 3·0x100 and
# 0x80000000·0x100). Output in $OUT/cubin-probe.log.
# Run from the repository root with the release binary carried (target/release/quench).
set -uo pipefail
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
DIR=$(mktemp -d)
PTXAS=$(command -v ptxas || ls /usr/local/cuda*/bin/ptxas | head -1)
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
mkdir -p "$DEST"
{
for k in add_f32 add_bf16 reduce_sum_f32 gemv_bf16; do
  "$BIN" cc "$k" --emit sass > "$DIR/$k.sass" && "$BIN" sass asm "$DIR/$k.sass" -o "$DIR/$k.own.cubin"
  "$BIN" cc "$k" --emit ptx > "$DIR/$k.ptx" && "$PTXAS" -arch=sm_90 "$DIR/$k.ptx" -o "$DIR/$k.ptxas.cubin"
  for v in ptxas own; do timeout 60 python3 scripts/device/cubin_probe.py "$k" "$DIR/$k.$v.cubin" 2>&1 | tail -1; done
  timeout 120 "$SAN" --show-backtrace no python3 scripts/device/cubin_probe.py "$k" "$DIR/$k.own.cubin" 2>&1 \
    | grep -E "Invalid|Illegal|at $k|by thread|Access|ERROR SUMMARY" | head -8
done
cat > "$DIR/probe.sass" <<'SASS'
.kernel add_f32
.registers 32
.maxntid 256 1 1
.param 8 8 2 4
.param 8 8 2 4
.param 8 8 2 4
.param 4 4 0 0
add_f32:
        ULDC.64 UR4, c[0x0][0x208] ;  /* B------:R-:W-:-:S06 */
        ULDC UR6, c[0x0][0x228] ;  /* B------:R-:W-:-:S06 */
        LDC.64 R2, c[0x0][0x220] ;  /* B------:R-:W0:-:S02 */
        MOV R5, 0x3 ;  /* B0-----:R-:W-:-:S06 */
        MOV R6, 0x5 ;  /* B------:R-:W-:-:S06 */
        MOV R7, 0x100 ;  /* B------:R-:W-:-:S06 */
        MOV R20, 0x80000000 ;  /* B------:R-:W-:-:S06 */
        MOV R21, 0x4 ;  /* B------:R-:W-:-:S06 */
        IMAD R8, R5, R6, URZ ;  /* B------:R-:W-:-:S06 */
        IMAD R9, R5, R7, URZ ;  /* B------:R-:W-:-:S06 */
        IMAD R10, R7, R6, UR6 ;  /* B------:R-:W-:-:S06 */
        IMAD R11, R7, R7, RZ ;  /* B------:R-:W-:-:S06 */
        IMAD.WIDE.U32 R12, R5, R7, RZ ;  /* B------:R-:W-:-:S06 */
        IMAD.WIDE.U32 R14, R20, R7, RZ ;  /* B------:R-:W-:-:S06 */
        IMAD.WIDE.U32 R16, R21, 0x4, R2 ;  /* B------:R-:W-:-:S06 */
        STG.E.128 desc[UR4][R2.64], R8 ;  /* B------:R0:W-:-:S02 */
        STG.E.128 desc[UR4][R16.64], R12 ;  /* B------:R1:W-:-:S02 */
        EXIT ;  /* B01----:R-:W-:-:S06 */
.L_q_0:
        BRA `(.L_q_0) ;  /* B------:R-:W-:-:S06 */
SASS
for i in $(seq 14); do echo '        NOP ;  /* B------:R-:W-:-:S06 */' >> "$DIR/probe.sass"; done
"$BIN" sass asm "$DIR/probe.sass" -o "$DIR/probe.cubin" && timeout 60 python3 scripts/device/cubin_probe.py probe "$DIR/probe.cubin"
echo "expected words: 0xf 0x300 0x10503 0x10000 0x300 0x0 0x0 0x80"
} 2>&1 | tee "$DEST/cubin-probe.log"
