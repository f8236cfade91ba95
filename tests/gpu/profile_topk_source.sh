#!/usr/bin/env bash
# Where the streaming top-k kernel's warps stall, per SASS instruction (H200 diagnostic, one device call):
#   source .device/prelude.sh && bash tests/gpu/profile_topk_source.sh [column|score] [--causal-lengths]
# (a second argument goes to bench/topk_breakdown.py: --causal-lengths profiles the causal row with its row lengths,
# the like-for-like row's form; the files are then named topk_<order>_lengths_*)
# ncu (--clock-control none) on one launch at 8192 rows x 32K fp32, k 2048 (bench/topk_breakdown.py --ncu), with
# the SourceCounters section (warp-state sampling per instruction); writes $OUT/topk_<order>_sass.csv (the source
# page: one row per SASS instruction with its samples and executed counts) and $OUT/topk_<order>_ncu.txt (the
# summary sections). Read the csv with tests/gpu/sass_stalls.py (--segments ROWS: stage by stage, split at the CTA
# barriers). Tried 2026-12-06: a CUTE_DSL_LINEINFO=1 build and `--print-source cuda` give the first source file's
# lines without any counters, so the stages are told from the SASS.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
ORDER="${1:-column}"
FLAG=""; [ "$ORDER" = "column" ] && FLAG="--column"
EXTRA="${2:-}"
[ -n "$EXTRA" ] && ORDER="${ORDER}_lengths"
REP=/tmp/topk_${ORDER}
timeout 200 ncu --clock-control none -k regex:Topk --launch-count 1 --import-source no \
  --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SourceCounters \
  -f -o "$REP" python3 bench/topk_breakdown.py --ncu --rows 8192 $FLAG $EXTRA > "$OUT/topk_${ORDER}_ncu.txt" 2>&1
echo "ncu rc=$?"
ncu -i "$REP.ncu-rep" --print-summary none >> "$OUT/topk_${ORDER}_ncu.txt" 2>&1
ncu -i "$REP.ncu-rep" --page source --csv --print-source sass > "$OUT/topk_${ORDER}_sass.csv" \
  2> "$OUT/topk_${ORDER}_sass.err"
echo "source page rc=$? ($(wc -l < "$OUT/topk_${ORDER}_sass.csv") lines)"
head -c 600 "$OUT/topk_${ORDER}_sass.csv"; echo
grep -E "Duration|Throughput|Issue|Executed Ipc|Warp Cycles|No Eligible" "$OUT/topk_${ORDER}_ncu.txt" | head -20
