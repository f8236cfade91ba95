#!/usr/bin/env bash
# The GPU check of the top-k ordering (ops/dsa/topk/sort_sm90.py) in one device call:
#   source .device/prelude.sh && source .device/extra/unpack.sh && bash tests/gpu/check_topk.sh [ncu|stages]
# tests/gpu/test_dsa_topk.py (both kernels, the three orderings) and sanitize_dsa_topk (racecheck, memcheck) through
# run_device.sh, then, when `python bench/ab_topk.py --prepare REV` was run here, the same-run A/B of REV's streaming
# kernel against the working tree's (bench/ab_topk.py), else bench/topk_breakdown.py (streaming kernel,
# TOPK_BREAKDOWN_ARGS: by default the "key" and "regs" orderings and order="column"), and the indexer + top-k
# row of bench/dsa_indexer.py against cuDNN frontend; with "ncu", an ncu summary of the streaming kernel at
# 32K x 32K k 2048 (8192 rows) last; with "stages", bench/topk_breakdown.py --stages (the kernel ended after each
# stage) and --sweep --first (launch shapes). Logs to $OUT; short tables printed.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
run_suite test_dsa_topk sanitize_dsa_topk 240 90
if [ -f ops/dsa/topk/_ab_base_stream_sm90.py ]; then
  timeout 240 python3 bench/ab_topk.py > "$OUT/ab_topk.log" 2>&1
  echo "ab_topk rc=$?"
  cat "$OUT/ab_topk.log"
else
  timeout 150 python3 bench/topk_breakdown.py ${TOPK_BREAKDOWN_ARGS:---sorts key,regs --no-cached --column} > "$OUT/topk_breakdown.log" 2>&1
  echo "topk_breakdown rc=$?"
  cat "$OUT/topk_breakdown.log"
fi
timeout 200 python3 bench/dsa_indexer.py --rows "indexer+top-k" --iters 5 --csv "$OUT/idx_topk.csv" \
  > "$OUT/idx_topk.log" 2>&1
echo "indexer+top-k rc=$?"
sed -n '/^# table/,$p' "$OUT/idx_topk.log"
if [ "${1:-}" = "stages" ]; then
  timeout 240 python3 bench/topk_breakdown.py --stages > "$OUT/topk_stages.log" 2>&1
  echo "stages rc=$?"; cat "$OUT/topk_stages.log"
  timeout 150 python3 bench/topk_breakdown.py --sweep --first > "$OUT/topk_sweep.log" 2>&1
  echo "sweep rc=$?"; cat "$OUT/topk_sweep.log"
fi
if [ "${1:-}" = "ncu" ]; then
  timeout 150 ncu -k regex:Topk --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section InstructionStats --section MemoryWorkloadAnalysis --section Occupancy \
    python3 bench/topk_breakdown.py --ncu --rows 8192 > "$OUT/topk_ncu.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|Throughput|Pipe|Issue|Stall|Warp Cycles|Executed Ipc|Achieved Occupancy|L2 Hit|Registers" \
    "$OUT/topk_ncu.txt" | head -40
fi
echo
sed -n '/================ summary/,$p' "$OUT/run_device.log"
