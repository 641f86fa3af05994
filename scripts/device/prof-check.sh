#!/usr/bin/env bash
# quench prof on the GPU, on SmolLM2's decode through the replayed step graph:
#   1. one profiled `quench bench --device cuda` run: every dispatch of every decode
#      step as a Chrome trace, the per-kernel summary against the copy bandwidth and FMA
#      throughput measured in the same run, the roofline, and a receipt whose bounds are
#      that the kernels counted every dispatch the host submitted
#      (dispatches_recorded = dispatches_submitted) and that each step's dispatches ran
#      one after another (replays_ordered);
#   2. the cost of profiling: the same bench PAIRS times plain and PAIRS times profiled,
#      in turns, comparing the median host time of a decode step (bound: below 3%) and
#      the greedy tokens of each pair (bound: tokens_identical).
#
#   [EVERY=N] scripts/device/prof-check.sh SMOLLM2.gguf [PAIRS]
#
# Run from the repository root with the release binary carried (target/release/quench).
# Writes to $OUT (or receipts/ when OUT is unset):
#   prof-summary.json   receipt of the profiled run (summary, ceilings, host spans,
#                       record checks; fails past its bounds)
#   prof-summary.txt    the summary table
#   prof-trace.json     Chrome trace / Perfetto JSON
#   prof-roofline.png   roofline and bandwidth per kernel
#   prof-overhead.json  receipt of the overhead measurement (fails past the bound)
#   prof-overhead-every-N.json  the same with one step in N instrumented (EVERY=N)
#   prof-*.log          everything the runs printed
set -uo pipefail
MODEL=${1:?usage: scripts/device/prof-check.sh SMOLLM2.gguf [PAIRS]}
PAIRS=${2:-3}
BIN=${QUENCH_BIN:-target/release/quench}
DEST=${OUT:-receipts}
mkdir -p "$DEST"
status=0
"$BIN" devices || exit 1

# The workload: a 128-token prompt, then 128 tokens decoded greedily on the device, three
# timed runs after a warm-up (the bench's own receipts go beside ours).
bench=(bench --device cuda -m "$MODEL" --prompt-tokens 128 --gen-tokens 128 --repeats 3)

"$BIN" prof --trace "$DEST/prof-trace.json" --roofline "$DEST/prof-roofline.png" \
    --json "$DEST/prof-summary.json" -- "${bench[@]}" --receipt "$DEST/prof-bench-profiled.json" \
    >"$DEST/prof-summary.txt" 2>"$DEST/prof-run.log"
[ $? -eq 0 ] || status=1
cat "$DEST/prof-run.log" "$DEST/prof-summary.txt"

"$BIN" prof --overhead "$PAIRS" --json "$DEST/prof-overhead.json" \
    -- "${bench[@]}" --receipt "$DEST/prof-bench-overhead.json" 2>&1 | tee "$DEST/prof-overhead.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# 3. With EVERY set, the cost of instrumenting one decode step in EVERY (`--every`).
if [ -n "${EVERY:-}" ]; then
    "$BIN" prof --every "$EVERY" --overhead "$PAIRS" --json "$DEST/prof-overhead-every-$EVERY.json" \
        -- "${bench[@]}" --receipt "$DEST/prof-bench-overhead-every-$EVERY.json" 2>&1 |
        tee "$DEST/prof-overhead-every-$EVERY.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
