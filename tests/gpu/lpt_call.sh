#!/usr/bin/env bash
# One device call for the LPT launch order (issue 12) and the project check together, so that a single call that
# starts decides the knob and runs the whole suite on the kernels that will be the defaults:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null && export OUT &&
#     BUDGET=490 bash tests/gpu/lpt_call.sh 2>&1 | tail -80
# 1) bench/ab_flash_fwd.py and bench/ab_flash_bwd.py at D 128 and 64, LPT_MB (LPT_SETS, default "LPT_MB=24 LPT_MB=8")
#    against the defaults, B 2 H 16 S 8K (~80 s with the carried store);
# 2) tests/gpu/lpt_pick.py reads both tables and picks per direction the set that wins (its causal rows' geometric
#    mean >= 1.01x, no row it changes under 0.985x, the forward's out / lse and the backward's dK / dV bit for bit
#    equal; tests/test_lpt_pick.py), or none;
# 3) the whole suite and every sanitizer (check_project.sh tests sanitize; with less than 170 s left test_flash_fwd and
#    test_flash_bwd only) with FLASH_FWD_KNOBS / FLASH_BWD_KNOBS set to the picks, i.e. on the kernels that become the
#    defaults if the pick is made so (a knob's module is the default's byte for byte once the class attribute is set:
#    a store hit; CPU 2026-12-08: LPT_MB = 24 in both classes, prebuild_kernels --all finds 766 of 766 in the store).
# Every summary goes to $OUT/0_summary.txt as it ends.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
BUDGET=${BUDGET:-490}
left() { echo $((BUDGET - SECONDS)); }
: > "$OUT/0_summary.txt"
summ() { tee -a "$OUT/0_summary.txt"; }
mkdir -p "$OUT/z"
nvidia-smi --query-gpu=name --format=csv,noheader | summ
SETS=${LPT_SETS:-LPT_MB=24 LPT_MB=8}
timeout $(($(left) - 5)) python3 bench/ab_flash_fwd.py --dims 128 64 --knobs $SETS 2>&1 | grep -v Warn > "$OUT/ab_fwd.txt"
grep -E "^(#|row|D[0-9])" "$OUT/ab_fwd.txt" | summ
timeout $(($(left) - 5)) python3 bench/ab_flash_bwd.py --dims 128 64 --knobs $SETS 2>&1 | grep -v Warn > "$OUT/ab_bwd.txt"
grep -E "^(#|row|D[0-9])" "$OUT/ab_bwd.txt" | summ
picks=$(python3 tests/gpu/lpt_pick.py "$OUT/ab_fwd.txt" "$OUT/ab_bwd.txt")
echo "$picks" | summ
FWD=$(echo "$picks" | sed -n 's/^forward pick: //p')
BWD=$(echo "$picks" | sed -n 's/^backward pick: //p')
[ "$FWD" = none ] && FWD=""
[ "$BWD" = none ] && BWD=""
echo "suite with FLASH_FWD_KNOBS='$FWD' FLASH_BWD_KNOBS='$BWD' (at ${SECONDS}s)" | summ
export FLASH_FWD_KNOBS="$FWD" FLASH_BWD_KNOBS="$BWD"
if [ "$(left)" -ge 170 ]; then
  OUT="$OUT/z" RUN_JOBS=4 timeout $(($(left) - 5)) bash tests/gpu/check_project.sh tests > "$OUT/z/tests.log" 2>&1
  sed -n '/================ summary/,$p' "$OUT/z/tests.log" | summ
elif [ "$(left)" -ge 60 ]; then     # a short call: the two flash test files only, on the picked kernels
  OUT="$OUT/z" RUN_JOBS=2 GPU_TESTS="tests/gpu/test_flash_fwd.py tests/gpu/test_flash_bwd.py" RUN_SANITIZE=0 \
    PYTEST_TIMEOUT=$(($(left) - 10)) timeout $(($(left) - 5)) bash tests/gpu/run_device.sh > "$OUT/z/tests.log" 2>&1
  sed -n '/================ summary/,$p' "$OUT/z/tests.log" | summ
else echo "tests skipped: $(left) s left" | summ; fi
if [ "$(left)" -ge 100 ]; then
  OUT="$OUT/z" RUN_JOBS=3 timeout $(($(left) - 5)) bash tests/gpu/check_project.sh sanitize > "$OUT/z/sanitize.log" 2>&1
  sed -n '/================ summary/,$p' "$OUT/z/sanitize.log" | summ
else echo "sanitize skipped: $(left) s left" | summ; fi
echo "== done at ${SECONDS}s; the summaries again:"
cut -c1-150 "$OUT/0_summary.txt"
