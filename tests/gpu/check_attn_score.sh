#!/usr/bin/env bash
# The GPU check of the sparse attention-score recompute's HEAD_SPLIT schedule (ops/common/sparse_head_sum_sm90.py)
# in one device call:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/check_attn_score.sh
# test_dsa_sparse_scores (with its "attn-split" cases) and sanitize_dsa_sparse_scores (both schedules) through
# run_device.sh, then the same-run A/B of the two schedules (bench/ab_attn_score.py; AB_ATTN_ARGS=--dense adds the
# dense recompute's PROMOTE_LAG A/B, ~60 s) and cuDNN frontend's row
# (bench/dsa_indexer.py --rows "sparse attn rec."). Logs to $OUT; short tables printed.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
run_suite test_dsa_sparse_scores sanitize_dsa_sparse_scores 240 120
timeout 240 python3 bench/ab_attn_score.py ${AB_ATTN_ARGS:-} > "$OUT/ab_attn_score.log" 2>&1
echo "ab_attn_score rc=$?"
cat "$OUT/ab_attn_score.log"
timeout 150 python3 bench/dsa_indexer.py --rows "sparse attn rec." --iters 10 > "$OUT/attn_rec_cudnn.log" 2>&1
echo "sparse attn rec. vs cuDNN rc=$?"
sed -n '/^# table/,$p' "$OUT/attn_rec_cudnn.log"
echo
sed -n '/================ summary/,$p' "$OUT/run_device.log"
