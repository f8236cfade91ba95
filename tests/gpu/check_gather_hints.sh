#!/usr/bin/env bash
# The device trial of the gather's L2 hints (gather_sm90.GatherHints.GATHER_PREFETCH: 1 the L2::256B prefetch hint by
# inline PTX, 2 and an evict_last policy, 3 evict_last while the kv is at most EVICT_LAST_KV_BYTES, else evict_normal),
# in parts, each about 5-6 minutes on a cold H100 (one call each, or both in one call where 600 s allow):
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT
#   bash tests/gpu/check_gather_hints.sh fwd        (then: scores)
# fwd: at once (3 processes; six at once, two suites and four sanitizer runs, lost a device machine on 2026-12-05) the
#   whole tests/gpu/test_dsa_sparse_attn.py (test_schedules: every hint form bitwise against the default) and
#   compute-sanitizer memcheck and racecheck of sanitize_dsa_sparse_attn.py with SANITIZE_KNOBS (default
#   GATHER_PREFETCH=3); then, alone on the GPU, the same-run A/B of the forward at H 128, Skv 8K / 32K / 64K, the
#   default against GATHER_PREFETCH 1 / 2 / 3 (bench/ab_sparse_attn.py).
# scores: tests/gpu/test_dsa_sparse_scores.py -k gather_hints (both sparse recomputes, bitwise against the DSL copies),
#   then bench/ab_attn_score.py --knobs GATHER_PREFETCH=1/2/3 (sparse attention-score recompute, H 128 and 64) and
#   bench/sparse_score_shapes.py --hints (sparse indexer recompute; cuDNN frontend in the same run when unpacked).
# A short table last. Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
SAN=compute-sanitizer
command -v $SAN >/dev/null 2>&1 || SAN=/usr/local/cuda/bin/compute-sanitizer
T=${PART_TIMEOUT:-230}
for part in "$@"; do
  case $part in
    fwd)
      (timeout $T python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf tests/gpu/test_dsa_sparse_attn.py \
        > "$OUT/test_dsa_sparse_attn.log" 2>&1
       echo "test_dsa_sparse_attn rc=$? $(tail -1 "$OUT/test_dsa_sparse_attn.log")" > "$OUT/row.fwd.tests") &
      for tool in memcheck racecheck; do
        (SANITIZE_KNOBS=${SANITIZE_KNOBS-GATHER_PREFETCH=3} timeout $T $SAN --tool $tool --error-exitcode 9 \
           python3 tests/gpu/sanitize_dsa_sparse_attn.py > "$OUT/$tool.log" 2>&1
         echo "sanitize_dsa_sparse_attn:$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -1)" \
           > "$OUT/row.fwd.$tool") &
      done
      wait
      grep -E "^(FAILED|ERROR)" "$OUT/test_dsa_sparse_attn.log" | head -10
      timeout ${AB_TIMEOUT:-200} python3 bench/ab_sparse_attn.py --heads 128 --skv 8192 32768 65536 \
        --knobs GATHER_PREFETCH=1 GATHER_PREFETCH=2 GATHER_PREFETCH=3 --iters ${AB_ITERS:-20} > "$OUT/ab_fwd.log" 2>&1
      echo "ab_sparse_attn rc=$?" > "$OUT/row.fwd.ab" ;;
    scores)
      timeout $T python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf tests/gpu/test_dsa_sparse_scores.py \
        -k gather_hints > "$OUT/test_gather_hints.log" 2>&1
      echo "test_dsa_sparse_scores -k gather_hints rc=$? $(tail -1 "$OUT/test_gather_hints.log")" > "$OUT/row.scores.tests"
      grep -E "^(FAILED|ERROR)" "$OUT/test_gather_hints.log" | head -10
      timeout ${AB_TIMEOUT:-200} python3 bench/ab_attn_score.py --knobs GATHER_PREFETCH=1 GATHER_PREFETCH=2 \
        GATHER_PREFETCH=3 --iters ${AB_ITERS:-20} > "$OUT/ab_attn_score.log" 2>&1
      echo "ab_attn_score rc=$?" > "$OUT/row.scores.ab"
      timeout ${AB_TIMEOUT:-200} python3 bench/sparse_score_shapes.py --hints > "$OUT/sparse_score_hints.log" 2>&1
      echo "sparse_score_shapes --hints rc=$?" > "$OUT/row.scores.idx" ;;
    *) echo "usage: check_gather_hints.sh fwd|scores ..."; exit 2 ;;
  esac
done
echo "==== summary (${SECONDS}s)"
cat "$OUT"/row.*
for f in ab_fwd ab_attn_score sparse_score_hints; do
  [ -f "$OUT/$f.log" ] && grep -v "^  max" "$OUT/$f.log"
done
[ -f "$OUT/ab_fwd.log" ] && grep "^  max" "$OUT/ab_fwd.log" | grep -v "0.000e+00 (|out|.*0.000e+00 (|lse|" | head -4
exit 0
