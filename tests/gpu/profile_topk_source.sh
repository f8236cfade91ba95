#!/usr/bin/env bash
# Where the streaming top-k kernel's warps stall, per SASS instruction (H200 diagnostic, one device call):
#   source .device/prelude.sh && bash tests/gpu/profile_topk_source.sh [column|score]
# ncu (--clock-control none) on one launch at 8192 rows x 32K fp32, k 2048 (bench/topk_breakdown.py --ncu), with
# the SourceCounters section (warp-state sampling per instruction); writes $OUT/topk_<order>_sass.csv (the source
# page: one row per SASS instruction with its samples and executed counts) and $OUT/topk_<order>_ncu.txt (the
# summary sections). Read the csv with bench/sass_hotspots.py.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
ORDER="${1:-column}"
FLAG=""; [ "$ORDER" = "column" ] && FLAG="--column"
REP=/tmp/topk_${ORDER}
timeout 200 ncu --clock-control none -k regex:Topk --launch-count 1 --import-source no \
  --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SourceCounters \
  -f -o "$REP" python3 bench/topk_breakdown.py --ncu --rows 8192 $FLAG > "$OUT/topk_${ORDER}_ncu.txt" 2>&1
echo "ncu rc=$?"
ncu -i "$REP.ncu-rep" --print-summary none >> "$OUT/topk_${ORDER}_ncu.txt" 2>&1
ncu -i "$REP.ncu-rep" --page source --csv --print-source sass > "$OUT/topk_${ORDER}_sass.csv" 2> "$OUT/topk_${ORDER}_sass.err"
echo "source page rc=$? ($(wc -l < "$OUT/topk_${ORDER}_sass.csv") lines)"
head -c 600 "$OUT/topk_${ORDER}_sass.csv"; echo
grep -E "Duration|Throughput|Issue|Executed Ipc|Warp Cycles|No Eligible" "$OUT/topk_${ORDER}_ncu.txt" | head -20
