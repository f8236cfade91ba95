#!/usr/bin/env bash
# The GPU check of the flash-attention forward's 192-row tile at head dim 64 (supported.FWD_BLOCK_M) in one call:
#   source .device/prelude.sh && bash tests/gpu/check_flash_fwd64.sh
# tests/gpu/test_flash_fwd.py and sanitize_fwd (racecheck, memcheck; its (64, 64) config takes the 192-row tile)
# through run_device.sh, then bench/flash_attention.py --fwd at D 64 (S 1k-16k) with the old 128-row tile and the
# new one in the same call (PADDLE_DSA_FWD_BM64=128/128 and 192/192; masked and unmasked rows), SDPA / cuDNN (and
# FA4 where packed) as peers. Logs to $OUT.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
run_suite test_flash_fwd sanitize_fwd 300 150
for bm in 128/128 192/192; do
  tag=${bm%%/*}
  PADDLE_DSA_FWD_BM64=$bm timeout 240 python3 bench/flash_attention.py --fwd --dims 64 --iters 10 \
    --csv "$OUT/flash_fwd64_bm$tag.csv" > "$OUT/flash_fwd64_bm$tag.log" 2>&1
  echo "bench BM $bm rc=$?"
  tail -14 "$OUT/flash_fwd64_bm$tag.log"
done
echo
sed -n '/================ summary/,$p' "$OUT/run_device.log"
