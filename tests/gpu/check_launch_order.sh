#!/usr/bin/env bash
# The device check of the sparse attention kernels' launch order (SlotRows.GROUPS_ADJACENT, ops/dsa/sparse_attn/rows.py:
# a row's head-group CTAs adjacent in grid x) in one call, under 10 minutes:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/check_launch_order.sh
# 1) the GPU tests of both launch orders (forward: test_schedules, test_groups_adjacent_thd; backward:
#    test_groups_adjacent; float64 gates and bitwise equality), 2) the forward's same-run A/B at H 128, Skv 8K / 32K /
#    64K (bench/ab_sparse_attn.py; outputs compared), 3) the backward's at H 128, Skv 8K / 64K, 4) bench/sparse_attention.py
#    --bwd (cuDNN frontend's sm90 backward in the same run, when .device/extra was unpacked). Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
P="python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf"
timeout 400 $P tests/gpu/test_dsa_sparse_attn.py -k "schedules or groups_adjacent" > "$OUT/knob_fwd.log" 2>&1 &
timeout 400 $P tests/gpu/test_dsa_sparse_attn_bwd.py -k groups_adjacent > "$OUT/knob_bwd.log" 2>&1 &
wait
for f in knob_fwd knob_bwd; do echo "$f: $(tail -1 "$OUT/$f.log")"; grep -E "^(FAILED|ERROR)" "$OUT/$f.log" | head -5; done
timeout 200 python3 bench/ab_sparse_attn.py --heads 128 --skv 8192 32768 65536 --knobs GROUPS_ADJACENT=1 \
  --iters ${AB_ITERS:-20} > "$OUT/ab_fwd.log" 2>&1
echo "ab fwd rc=$?"; cat "$OUT/ab_fwd.log"
timeout 200 python3 bench/ab_sparse_attn.py --bwd --heads 128 --skv 8192 65536 --knobs GROUPS_ADJACENT=1 \
  --iters ${AB_ITERS:-10} > "$OUT/ab_bwd.log" 2>&1
echo "ab bwd rc=$?"; cat "$OUT/ab_bwd.log"
timeout 200 python3 bench/sparse_attention.py --bwd --iters 10 --csv "$OUT/sparse_attention_bwd.csv" \
  > "$OUT/sparse_attention_bwd.log" 2>&1
echo "sparse_attention --bwd rc=$?"; tail -8 "$OUT/sparse_attention_bwd.log"
# 5) where time is left (the call's limit is 600 s): bench/dsa_indexer.py's sparse rows (recomputes and the sparse
#    indexer backward over the cp.async.cg gathers) against cuDNN frontend in the same run
if [ "$SECONDS" -lt "${ROWS_IF_BEFORE:-400}" ]; then
  timeout $((560 - SECONDS)) python3 bench/dsa_indexer.py --rows sparse --csv "$OUT/dsa_indexer_sparse.csv" \
    > "$OUT/dsa_indexer_sparse.log" 2>&1
  echo "dsa_indexer --rows sparse rc=$?"; tail -12 "$OUT/dsa_indexer_sparse.log"
fi
echo "elapsed ${SECONDS}s"
