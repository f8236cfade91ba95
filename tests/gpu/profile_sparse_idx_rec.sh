#!/usr/bin/env bash
# ncu of the sparse indexer score recompute (ours, ops/dsa/indexer/sparse_sm90.py) and of cuDNN frontend's
# sparse_indexer_score_recompute_wrapper, one launch each at the bench row's shape (bench/sparse_score_shapes.py --ncu:
# Sq 4K, Sk 8K, top-k 2048, 64 heads, Di 128), on the device:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/profile_sparse_idx_rec.sh
# Writes $OUT/sparse_idx_rec_ncu.txt (speed of light, memory, warp states, scheduler, occupancy of both kernels) and
# $OUT/sparse_idx_rec_sass.csv (our kernel's SASS with its stall samples); prints the first file's key lines.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
REP=/tmp/sparse_idx_rec
timeout 240 ncu --profile-from-start off --import-source no --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters \
  -f -o "$REP" python3 bench/sparse_score_shapes.py --ncu > "$OUT/sparse_idx_rec_ncu_run.txt" 2>&1
echo "ncu rc=$?"
ncu -i "$REP.ncu-rep" > "$OUT/sparse_idx_rec_ncu.txt" 2>&1
ncu -i "$REP.ncu-rep" --page source --csv --print-source sass --kernel-name regex:SparseIndexer \
  > "$OUT/sparse_idx_rec_sass.csv" 2> "$OUT/sparse_idx_rec_sass.err"
grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Issue Slots|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|Block Limit|One or More Eligible|No Eligible|Active Warps Per" \
  "$OUT/sparse_idx_rec_ncu.txt" | head -80
