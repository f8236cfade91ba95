#!/usr/bin/env bash
# The device trial of BlockGather.GATHER_PREFETCH (ops/common/gather_sm90.py: the gather's cp.async.cg by inline PTX
# with the L2::256B prefetch hint, 2: and an L2 evict_last policy) in one call, under 10 minutes:
#   source .device/prelude.sh && export OUT && bash tests/gpu/check_gather_prefetch.sh
# 1) its GPU tests (forward test_schedules, backward test_gather_prefetch: float64 gates and bitwise equality with
#    the DSL's copies), 2) same-run A/B of the sparse attention forward at H 128, Skv 8K / 32K / 64K and 3) of the
#    backward at H 128, Skv 8K / 64K (bench/ab_sparse_attn.py, outputs compared). Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
P="python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf"
timeout 300 $P tests/gpu/test_dsa_sparse_attn.py -k schedules > "$OUT/prefetch_fwd_tests.log" 2>&1 &
timeout 300 $P tests/gpu/test_dsa_sparse_attn_bwd.py -k gather_prefetch > "$OUT/prefetch_bwd_tests.log" 2>&1 &
wait
for f in prefetch_fwd_tests prefetch_bwd_tests; do
  echo "$f: $(tail -1 "$OUT/$f.log")"; grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head -5
done
timeout 220 python3 bench/ab_sparse_attn.py --heads 128 --skv 8192 32768 65536 \
  --knobs GATHER_PREFETCH=1 GATHER_PREFETCH=2 --iters ${AB_ITERS:-20} > "$OUT/ab_prefetch_fwd.log" 2>&1
echo "ab fwd rc=$?"; cat "$OUT/ab_prefetch_fwd.log"
timeout 200 python3 bench/ab_sparse_attn.py --bwd --heads 128 --skv 8192 65536 \
  --knobs GATHER_PREFETCH=1 GATHER_PREFETCH=2 --iters ${AB_ITERS:-10} > "$OUT/ab_prefetch_bwd.log" 2>&1
echo "ab bwd rc=$?"; cat "$OUT/ab_prefetch_bwd.log"
echo "elapsed ${SECONDS}s"
