#!/usr/bin/env bash
# ncu of the launches a bench makes between cudaProfilerStart / Stop (its --ncu mode: ours and the peer's kernel, one
# launch each, warmed up first), on the device:
#   bash tests/gpu/profile_pair.sh NAME KERNEL_REGEX python3 bench/X.py --ncu
# Writes $OUT/NAME_ncu.txt (speed of light, memory, warp states, scheduler, occupancy, launch of every profiled kernel)
# and $OUT/NAME_sass.csv (the SASS of the kernels matching KERNEL_REGEX, ours, with its stall samples); prints the
# first file's key lines and tests/gpu/sass_stalls.py's summary of the second.
set -u
NAME=$1; REGEX=$2; shift 2
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
REP=/tmp/$NAME
timeout 240 ncu --profile-from-start off --import-source no --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters \
  -f -o "$REP" "$@" > "$OUT/${NAME}_ncu_run.txt" 2>&1
echo "ncu rc=$?"
ncu -i "$REP.ncu-rep" > "$OUT/${NAME}_ncu.txt" 2>&1
ncu -i "$REP.ncu-rep" --page source --csv --print-source sass --kernel-name "regex:$REGEX" \
  > "$OUT/${NAME}_sass.csv" 2> "$OUT/${NAME}_sass.err"
# key lines of each kernel but torch's own (at::...)
awk '/^  [a-zA-Z_].*\(/ { skip = ($0 ~ /at::/); if (!skip) print substr($0, 1, 140); next }
     !skip && /Duration|Memory Throughput|L2 Cache Throughput|L1\/TEX Cache Throughput|Compute \(SM\)|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|One or More Eligible|Active Warps Per/' \
  "$OUT/${NAME}_ncu.txt" | head -40
python3 tests/gpu/sass_stalls.py "$OUT/${NAME}_sass.csv"
