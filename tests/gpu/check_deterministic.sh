#!/usr/bin/env bash
# The GPU check of the deterministic backwards written on the CPU (2026-12-04/05), in three device calls of under
# 600 s each:  source .device/prelude.sh && source .device/extra/unpack.sh && bash tests/gpu/check_deterministic.sh N
#   1: flash attention's ordered kernel (PADDLE_DSA_BWD_DET=ordered): the smoke first, in a time limit (a hang of a
#      turn wait can not be caught inside pytest), then tests/gpu/test_flash_bwd.py -k ordered (every deterministic
#      case under the ordered kernel, test_ordered_*) and sanitize_bwd (racecheck, memcheck)
#   2: the DSA backwards' deterministic modes (staged: sparse attention, sparse and dense indexer) and their
#      sanitizers, through tests/gpu/run_device.sh
#   3: the benches: flash attention backward with both deterministic kernels (--det), the sparse attention backward
#      and the indexer backwards ("ours det" lines), all against their peers in the same run
# Logs to $OUT (run_device.sh's); each part prints a short table last.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
part="${1:-1}"
case "$part" in
  1)
    start=$(date +%s)
    timeout 240 python3 tests/gpu/test_flash_bwd.py smoke ordered > "$OUT/smoke_ordered.log" 2>&1
    rc=$?
    grep -E "^(PASS|FAIL)|smoke" "$OUT/smoke_ordered.log" | tail -14
    echo "smoke ordered rc=$rc $(( $(date +%s) - start ))s (124: timed out, a turn wait hung)"
    [ "$rc" = 0 ] || exit "$rc"
    # -k ordered: the "ordered" variant's cases (every deterministic case) and test_ordered_*; the other kernels'
    # PTX is unchanged since their last H200 run
    GPU_TESTS=tests/gpu/test_flash_bwd.py GPU_SANITIZE=tests/gpu/sanitize_bwd.py PYTEST_TIMEOUT=300 \
      PYTEST_ARGS="-k ordered" bash tests/gpu/run_device.sh 2>&1 | tail -16
    ;;
  2)
    GPU_TESTS="tests/gpu/test_dsa_indexer_dense_bwd.py tests/gpu/test_dsa_indexer_bwd.py tests/gpu/test_dsa_sparse_attn_bwd.py" \
    GPU_SANITIZE="tests/gpu/sanitize_dsa_indexer_dense_bwd.py tests/gpu/sanitize_dsa_indexer_bwd.py tests/gpu/sanitize_dsa_sparse_attn_bwd.py" \
      PYTEST_TIMEOUT=200 SAN_TIMEOUT=60 bash tests/gpu/run_device.sh 2>&1 | tail -24
    ;;
  3)
    timeout 200 python3 bench/flash_attention.py --bwd --quick --det --no-fa4 --iters 5 \
      --csv "$OUT/bench_flash_det.csv" > "$OUT/bench_flash_det.log" 2>&1
    echo "flash --det rc=$?"
    sed -n '/^# table/,$p' "$OUT/bench_flash_det.log"
    timeout 180 python3 bench/sparse_attention.py --bwd --iters 5 > "$OUT/bench_sparse_attn_det.log" 2>&1
    echo "sparse attention rc=$?"
    tail -12 "$OUT/bench_sparse_attn_det.log"
    timeout 180 python3 bench/dsa_indexer.py --rows "idx bwd" --iters 5 --csv "$OUT/bench_idx_det.csv" \
      > "$OUT/bench_idx_det.log" 2>&1
    echo "indexer bwd rc=$?"
    sed -n '/^# table/,$p' "$OUT/bench_idx_det.log"
    ;;
  *)
    echo "usage: bash tests/gpu/check_deterministic.sh 1|2|3"; exit 2 ;;
esac
