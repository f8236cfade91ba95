#!/usr/bin/env bash
# The sparse attention forward's GPU check in one short call (about 5 minutes on a cold H100):
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/check_sparse_attn_quick.sh
# At once (3 processes; six at once, two suites and four sanitizer runs, lost a device machine on 2026-12-05): the
# whole tests/gpu/test_dsa_sparse_attn.py, and compute-sanitizer memcheck and racecheck of sanitize_dsa_sparse_attn.py;
# then, alone on the GPU, the same-run A/B of the forward's gather copies at H 128, Skv 8K / 64K (the default against
# GATHER_PREFETCH 0 and 1, bench/ab_sparse_attn.py). A short table last. Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
SAN=compute-sanitizer
command -v $SAN >/dev/null 2>&1 || SAN=/usr/local/cuda/bin/compute-sanitizer
T=${QUICK_TIMEOUT:-230}
(timeout $T python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf tests/gpu/test_dsa_sparse_attn.py \
  > "$OUT/test_dsa_sparse_attn.log" 2>&1; echo "test_dsa_sparse_attn rc=$? $(tail -1 "$OUT/test_dsa_sparse_attn.log")" \
  > "$OUT/row.tests") &
for tool in memcheck racecheck; do
  (SANITIZE_KNOBS=${SANITIZE_KNOBS-GATHER_PREFETCH=3} timeout $T $SAN --tool $tool --error-exitcode 9 \
     python3 tests/gpu/sanitize_dsa_sparse_attn.py > "$OUT/$tool.log" 2>&1
   echo "sanitize_dsa_sparse_attn:$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -1)" \
     > "$OUT/row.$tool") &
done
wait
grep -E "^(FAILED|ERROR)" "$OUT/test_dsa_sparse_attn.log" | head -10
timeout ${AB_TIMEOUT:-200} python3 bench/ab_sparse_attn.py --heads 128 --skv 8192 32768 65536 \
  --knobs GATHER_PREFETCH=1 GATHER_PREFETCH=2 GATHER_PREFETCH=3 --iters ${AB_ITERS:-20} > "$OUT/ab_fwd.log" 2>&1
echo "ab rc=$?"
echo "==== summary (${SECONDS}s)"
cat "$OUT"/row.*
grep -v "^  max" "$OUT/ab_fwd.log"
grep "^  max" "$OUT/ab_fwd.log" | grep -v "0.000e+00 (|out|.*0.000e+00 (|lse|" | head -4   # only differing outputs
