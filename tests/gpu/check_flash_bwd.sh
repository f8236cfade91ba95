#!/usr/bin/env bash
# The GPU check of the pipelined flash-attention backward (ops/flash_attention/backward_fast_sm90.py) in one device
# call:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT; bash tests/gpu/check_flash_bwd.sh
# test_flash_bwd and sanitize_bwd (racecheck, memcheck) through run_device.sh, then the same-run A/B of bench/ab_flash_bwd.py's
# default knob set (bench/ab_flash_bwd.py: D 128 and 64 (AB_DIMS), causal and not, the ordered form at D 128). Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
run_suite test_flash_bwd sanitize_bwd 280 150
timeout 200 python3 bench/ab_flash_bwd.py --iters ${AB_ITERS:-10} --dims ${AB_DIMS:-128 64} > "$OUT/ab_flash_bwd.log" 2>&1
echo "ab_flash_bwd rc=$?"
cat "$OUT/ab_flash_bwd.log"
echo
sed -n '/================ summary/,$p' "$OUT/run_device.log"
