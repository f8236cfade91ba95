#!/usr/bin/env bash
# The one script a device call runs:  source .device/prelude.sh && bash tests/gpu/run_device.sh
# 1) pytest on every tests/gpu/test_*.py (junit per file), 2) compute-sanitizer racecheck + memcheck on every
# tests/gpu/sanitize_*.py, 3) optional benchmark (RUN_BENCH=1): bench/flash_attention.py, forward and backward vs
# SDPA FLASH/cuDNN and FlashAttention-4 when it is packed (.device/whl), CSV + SVG plot to $OUT, 4) a short summary.
# Logs go to $OUT (or /tmp/gpu_out when OUT is unset): one log per test file (JUNIT=1 adds junit XML), all sanitizer
# output in sanitize.log (a device call brings back at most 8 files); a test may write $OUT/<test file>.table.
# PYTEST_ARGS is passed to every pytest run (e.g. "--timeout=60", pytest-timeout is on the device).
# Knobs: RUN_DSA_DIAG=1 runs bench/dsa_attn_precision.py (DSA_PRECISION_ARGS) and bench/topk_breakdown.py;
# GPU_SANITIZE="tests/gpu/sanitize_x.py ..." picks the sanitizer scripts; RUN_DSA_BENCH=1 runs bench/dsa_indexer.py
# (DSA_BENCH_ARGS), cuDNN frontend peer when .device/extra was unpacked; RUN_ATTN_BENCH=1 runs bench/sparse_attention.py
# (ATTN_BENCH_ARGS); RUN_SHAPES_BENCH=1 runs bench/flash_attention_shapes.py (GQA and varlen rows, SHAPES_BENCH_ARGS);
# GPU_TESTS="tests/gpu/test_seed001.py ..." runs only those test files ("none": no pytest); RUN_SANITIZE=0 skips step 2;
# RUN_JOBS=N keeps up to N of those runs (test files, then sanitizer runs) going at once (default 1; the GPU is shared,
# so use it for the suites, not with a timed step); BENCH_ARGS (e.g. "--quick", "--no-fa4") is passed to the bench;
# PYTEST_TIMEOUT, SAN_TIMEOUT, BENCH_TIMEOUT bound each step (seconds). With RUN_BENCH=1 the host cost of one seam call
# is measured too (bench/flash_attention.py --host). The kernels are called through TVM-FFI: .device must carry
# apache-tvm-ffi (../shared/device/pack.sh apache-tvm-ffi==0.1.15.post2 ..., or the FA4 pack line in
# docs/performance.md).
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1
python3 -c "import tvm_ffi" 2>/dev/null || { echo "apache-tvm-ffi is not installed: pack it into .device (see the header)"; exit 3; }

declare -a ROWS
JOBS="${RUN_JOBS:-1}"
JOBDIR=$(mktemp -d)
# pool CMD...: run CMD in the background with at most $JOBS at once (RUN_JOBS=1: one after another, as before). The
# processes share the GPU by time slices and compile their kernels on separate cores; each writes its own files.
pool() {
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  "$@" &
}

# one_test INDEX FILE: pytest on one test file; its row and failure lines to $JOBDIR/t.INDEX.*
one_test() {
  local name start junit rc secs
  name=$(basename "$2" .py)
  start=$(date +%s)
  rm -f "$OUT/$name.table"
  junit=()
  [ "${JUNIT:-0}" = "1" ] && junit=(--junitxml="$OUT/$name.xml")
  # shellcheck disable=SC2086
  timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf "$2" "${junit[@]}" \
    ${PYTEST_ARGS:-} > "$OUT/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  printf '%-28s rc=%-3s %4ss  %s\n' "$name" "$rc" "$secs" "$(tail -1 "$OUT/$name.log")" > "$JOBDIR/t.$1.row"
  { grep -E "^(FAILED|ERROR)" "$OUT/$name.log" | head -40
    [ -f "$OUT/$name.table" ] && cat "$OUT/$name.table"   # rows a test chose to report (e.g. test_seed001's rel L2)
  } > "$JOBDIR/t.$1.out"
}

SAN=compute-sanitizer
command -v $SAN >/dev/null 2>&1 || SAN=/usr/local/cuda/bin/compute-sanitizer
# one_sanitize INDEX FILE TOOL: FILE under compute-sanitizer TOOL; its row and log to $JOBDIR/s.INDEX.*
one_sanitize() {
  local name log start rc secs
  name=$(basename "$2" .py)
  start=$(date +%s)
  log=/tmp/${name}_$3.log
  timeout "${SAN_TIMEOUT:-240}" $SAN --tool "$3" --error-exitcode 9 python3 "$2" > "$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  { echo "==== $name $3 rc=$rc ${secs}s"; head -c 200000 "$log"; } > "$JOBDIR/s.$1.log"
  printf '%-28s rc=%-3s %4ss  %s\n' "$name:$3" "$rc" "$secs" \
    "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$log" | tail -1)" > "$JOBDIR/s.$1.row"
}

TESTS="${GPU_TESTS:-$(ls tests/gpu/test_*.py)}"
[ "$TESTS" = "none" ] && TESTS=""
k=0
for t in $TESTS; do
  k=$((k + 1))
  pool one_test "$(printf %03d $k)" "$t"
done
SANS="${GPU_SANITIZE:-$(ls tests/gpu/sanitize_*.py)}"
[ "${RUN_SANITIZE:-1}" = "1" ] || SANS=""
k=0
for s in $SANS; do
  for tool in racecheck memcheck; do
    k=$((k + 1))
    pool one_sanitize "$(printf %03d $k)" "$s" "$tool"
  done
done
wait
for f in "$JOBDIR"/t.*.row; do                              # in the order given, whatever order they finished in
  [ -f "$f" ] || continue
  cat "${f%.row}.out"
  ROWS+=("$(cat "$f")")
done
for f in "$JOBDIR"/s.*.row; do
  [ -f "$f" ] || continue
  cat "${f%.row}.log" >> "$OUT/sanitize.log"               # one file for all
  ROWS+=("$(cat "$f")")
done
rm -rf "$JOBDIR"

if [ "${RUN_BENCH:-0}" = "1" ] && [ -f bench/flash_attention.py ]; then
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" python3 bench/flash_attention.py ${BENCH_ARGS:-} \
    --csv "$OUT/bench_flash_attention.csv" > "$OUT/bench.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  ROWS+=("$(printf '%-28s rc=%-3s %4ss  %s' bench "$rc" "$secs" "$(grep -m1 '^# FA4' "$OUT/bench.log")")")
  timeout 120 python3 bench/flash_attention.py --host > "$OUT/bench_host.log" 2>&1
  rc=$?
  while IFS= read -r l; do ROWS+=("$(printf '%-28s rc=%-3s %s' host "$rc" "$l")"); done \
    < <(grep '^# host time' "$OUT/bench_host.log")
  if grep -q '^# table' "$OUT/bench.log"; then
    sed -n '/^# table/,$p' "$OUT/bench.log"
  else
    tail -60 "$OUT/bench.log"
  fi
  if [ -s "$OUT/bench_flash_attention.csv" ]; then
    python3 bench/plot_performance.py "$OUT/bench_flash_attention.csv" -o "$OUT/bench_flash_attention.svg" \
      --title "Flash attention on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), bf16, $(date -u +%F)"
    ROWS+=("$(printf '%-28s rc=%-3s' plot $?)")
  fi
fi

if [ "${RUN_SHAPES_BENCH:-0}" = "1" ] && [ -f bench/flash_attention_shapes.py ]; then
  # the GQA 8:1 (64 query heads) and varlen (16 documents, 32K tokens) rows of the flash-attention bench
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" python3 bench/flash_attention_shapes.py ${SHAPES_BENCH_ARGS:-} \
    > "$OUT/bench_shapes.log" 2>&1
  rc=$?
  ROWS+=("$(printf '%-28s rc=%-3s %4ss' bench_shapes "$rc" "$(( $(date +%s) - start ))")")
  grep -v Warning "$OUT/bench_shapes.log" | tail -12
fi

if [ "${RUN_DSA_BENCH:-0}" = "1" ] && [ -f bench/dsa_indexer.py ]; then
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" python3 bench/dsa_indexer.py ${DSA_BENCH_ARGS:-} --csv "$OUT/bench_dsa_indexer.csv" \
    > "$OUT/bench_dsa.log" 2>&1
  rc=$?
  ROWS+=("$(printf '%-28s rc=%-3s %4ss' bench_dsa "$rc" "$(( $(date +%s) - start ))")")
  sed -n '/^# table/,$p' "$OUT/bench_dsa.log"
  grep -E "^# cuDNN|Error|error" "$OUT/bench_dsa.log" | head -5
fi

if [ "${RUN_ATTN_BENCH:-0}" = "1" ] && [ -f bench/sparse_attention.py ]; then
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" python3 bench/sparse_attention.py ${ATTN_BENCH_ARGS:-} \
    --csv "$OUT/bench_sparse_attention.csv" > "$OUT/bench_sparse_attn.log" 2>&1
  rc=$?
  ROWS+=("$(printf '%-28s rc=%-3s %4ss' bench_sparse_attn "$rc" "$(( $(date +%s) - start ))")")
  cat "$OUT/bench_sparse_attn.log"
fi

if [ "${RUN_DSA_DIAG:-0}" = "1" ]; then
  # diagnostics of the DSA kernels (docs/performance.md): precision vs speed of the attention-score promotion, and
  # where the top-k's time goes
  start=$(date +%s)
  timeout "${DIAG_TIMEOUT:-150}" python3 bench/dsa_attn_precision.py ${DSA_PRECISION_ARGS:-} > "$OUT/dsa_precision.log" 2>&1
  ROWS+=("$(printf '%-28s rc=%-3s %4ss' dsa_precision "$?" "$(( $(date +%s) - start ))")")
  tail -8 "$OUT/dsa_precision.log"
  start=$(date +%s)
  timeout "${DIAG_TIMEOUT:-150}" python3 bench/topk_breakdown.py --sorts key,regs > "$OUT/topk_breakdown.log" 2>&1
  ROWS+=("$(printf '%-28s rc=%-3s %4ss' topk_breakdown "$?" "$(( $(date +%s) - start ))")")
  cat "$OUT/topk_breakdown.log"
fi

echo
echo "================ summary ================"
for r in "${ROWS[@]}"; do echo "$r"; done
