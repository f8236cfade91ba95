#!/usr/bin/env bash
# The one script a device call runs:  source .device/prelude.sh && bash tests/gpu/run_device.sh
# 1) pytest on every tests/gpu/test_*.py (junit per file), 2) compute-sanitizer racecheck + memcheck on every
# tests/gpu/sanitize_*.py, 3) optional forward benchmark (RUN_BENCH=1), 4) a short summary table.
# Logs go to $OUT (or /tmp/gpu_out when OUT is unset).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUTE_DSL_ARCH=sm_90a
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1

declare -a ROWS
for t in tests/gpu/test_*.py; do
  name=$(basename "$t" .py)
  start=$(date +%s)
  timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider --confcutdir=tests/gpu -rf "$t" --junitxml="$OUT/$name.xml" \
    > "$OUT/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  summ=$(tail -1 "$OUT/$name.log")
  ROWS+=("$(printf '%-28s rc=%-3s %4ss  %s' "$name" "$rc" "$secs" "$summ")")
  grep -E "^(FAILED|ERROR)" "$OUT/$name.log" | head -40
done

SAN=compute-sanitizer
command -v $SAN >/dev/null 2>&1 || SAN=/usr/local/cuda/bin/compute-sanitizer
for s in tests/gpu/sanitize_*.py; do
  name=$(basename "$s" .py)
  for tool in racecheck memcheck; do
    start=$(date +%s)
    timeout "${SAN_TIMEOUT:-240}" $SAN --tool $tool --error-exitcode 9 python3 "$s" > "$OUT/${name}_$tool.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    summ=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$OUT/${name}_$tool.log" | tail -1)
    ROWS+=("$(printf '%-28s rc=%-3s %4ss  %s' "$name:$tool" "$rc" "$secs" "$summ")")
  done
done

if [ "${RUN_BENCH:-0}" = "1" ] && [ -f bench/flash_attention.py ]; then
  timeout "${BENCH_TIMEOUT:-200}" python3 bench/flash_attention.py --fwd > "$OUT/bench.log" 2>&1
  ROWS+=("$(printf '%-28s rc=%-3s' bench $?)")
  cat "$OUT/bench.log" | tail -40
fi

echo
echo "================ summary ================"
for r in "${ROWS[@]}"; do echo "$r"; done
