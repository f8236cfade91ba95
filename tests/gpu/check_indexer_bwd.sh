#!/usr/bin/env bash
# The GPU check of the indexer backward (ops/dsa/indexer/sparse_bwd_sm90.py, its dense subclass) in one device call:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/check_indexer_bwd.sh
# test_dsa_indexer_bwd and test_dsa_indexer_dense_bwd and their sanitizers through run_device.sh, then
# bench/indexer_bwd_shapes.py (the launch shapes, cuDNN frontend's sparse row in the same run). Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
GPU_TESTS="tests/gpu/test_dsa_indexer_bwd.py tests/gpu/test_dsa_indexer_dense_bwd.py" \
  GPU_SANITIZE="tests/gpu/sanitize_dsa_indexer_bwd.py tests/gpu/sanitize_dsa_indexer_dense_bwd.py" PYTEST_TIMEOUT=200 \
  SAN_TIMEOUT=90 bash tests/gpu/run_device.sh > "$OUT/run_device.log" 2>&1
grep -h -E "FAILED|Error" "$OUT"/test_dsa_indexer_bwd.log "$OUT"/test_dsa_indexer_dense_bwd.log 2>/dev/null | head -8
timeout 200 python3 bench/indexer_bwd_shapes.py --iters 10 > "$OUT/indexer_bwd_shapes.log" 2>&1
echo "indexer_bwd_shapes rc=$?"
cat "$OUT/indexer_bwd_shapes.log"
echo
sed -n '/================ summary/,$p' "$OUT/run_device.log"
