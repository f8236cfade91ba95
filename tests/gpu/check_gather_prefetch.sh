#!/usr/bin/env bash
# The device trial of BlockGather.GATHER_PREFETCH (ops/common/gather_sm90.py: the gather's cp.async.cg by inline PTX
# with the L2::256B prefetch hint; 2: and an L2 evict_last policy; 3, the sparse attention forward's default: evict_last
# while the kv fits EVICT_LAST_KV_BYTES, else evict_normal), parts of one call, each under 5 minutes:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT
#   bash tests/gpu/check_gather_prefetch.sh tests ab abb
# tests: the GPU tests (forward test_schedules, backward test_gather_prefetch: float64 gates, bitwise equality with
# the DSL's copies); ab: same-run A/B of the sparse attention forward at H 128, Skv 8K / 32K / 64K, the default
# against GATHER_PREFETCH 0 / 1 / 2; abb: the backward (default 0) against 1 / 2 at H 128, Skv 8K / 64K
# (bench/ab_sparse_attn.py, outputs compared). Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
P="python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf"
for part in "$@"; do
  case $part in
    tests)
      timeout 300 $P tests/gpu/test_dsa_sparse_attn.py -k schedules > "$OUT/prefetch_fwd_tests.log" 2>&1 &
      timeout 300 $P tests/gpu/test_dsa_sparse_attn_bwd.py -k gather_prefetch > "$OUT/prefetch_bwd_tests.log" 2>&1 &
      wait
      for f in prefetch_fwd_tests prefetch_bwd_tests; do
        echo "$f: $(tail -1 "$OUT/$f.log")"; grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head -5
      done ;;
    ab)
      timeout 250 python3 bench/ab_sparse_attn.py --heads 128 --skv 8192 32768 65536 \
        --knobs GATHER_PREFETCH=0 GATHER_PREFETCH=1 GATHER_PREFETCH=2 --iters ${AB_ITERS:-20} \
        > "$OUT/ab_prefetch_fwd.log" 2>&1
      echo "ab fwd rc=$?"; cat "$OUT/ab_prefetch_fwd.log" ;;
    abb)
      timeout 200 python3 bench/ab_sparse_attn.py --bwd --heads 128 --skv 8192 65536 \
        --knobs GATHER_PREFETCH=1 GATHER_PREFETCH=2 --iters ${AB_ITERS:-10} > "$OUT/ab_prefetch_bwd.log" 2>&1
      echo "ab bwd rc=$?"; cat "$OUT/ab_prefetch_bwd.log" ;;
    *) echo "usage: check_gather_prefetch.sh tests|ab|abb ..."; exit 2 ;;
  esac
done
echo "elapsed ${SECONDS}s"
