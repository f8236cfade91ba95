#!/usr/bin/env bash
# The GPU check of the sparse MLA attention forward (ops/dsa/sparse_attn/fwd_sm90.py) in one device call:
#   here (CPU), once:  python bench/ab_sparse_attn.py --prepare main     (the base kernel files travel untracked)
#   device:            source .device/prelude.sh && bash tests/gpu/check_sparse_attn.sh
# tests/gpu/test_dsa_sparse_attn.py and sanitize_dsa_sparse_attn (racecheck, memcheck) through run_device.sh, then
# the same-run A/B of the working tree's forward against the prepared base (bench/ab_sparse_attn.py: H 64 and 128,
# outputs compared), then bench/sparse_attention.py's forward rows (Skv 8K / 32K / 64K). Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
run_suite test_dsa_sparse_attn sanitize_dsa_sparse_attn 300 120
timeout 200 python3 bench/ab_sparse_attn.py --heads 64 128 --knockouts nogather \
  --iters ${AB_ITERS:-20} \
  > "$OUT/ab_sparse_attn.log" 2>&1
echo "ab_sparse_attn rc=$?"
cat "$OUT/ab_sparse_attn.log"
timeout 200 python3 bench/sparse_attention.py --iters 10 --csv "$OUT/sparse_attention.csv" > "$OUT/sparse_attention.log" 2>&1
echo "sparse_attention rc=$?"
tail -12 "$OUT/sparse_attention.log"
echo
sed -n '/================ summary/,$p' "$OUT/run_device.log"
