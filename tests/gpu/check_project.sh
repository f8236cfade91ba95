#!/usr/bin/env bash
# The project check on the device: every GPU test file, then every sanitizer script under racecheck and memcheck,
# through run_device.sh with RUN_JOBS (default 2) runs at once, the longest first (the suites are bound by kernel
# compilation on the host's cores; the GPU is shared by time slices, so nothing here is timed):
#   source .device/prelude.sh && export OUT && bash tests/gpu/check_project.sh prebuild tests    (then: sanitize)
#   ... bash tests/gpu/check_project.sh prebuild tests sanitize                                  (all, where time allows)
# prebuild: compiles the kernel variants of tests/gpu/kernel_manifest.jsonl (the variants the last device run's
# processes stored; PREBUILD="--all": every variant of every seam) into the kernel store (device_env.sh,
# ops/common/kernel_cache.py) on PREBUILD_JOBS (default 12) cores, so the test and sanitizer processes load them
# instead of compiling one after another. Every part ends by copying the store's manifest to $OUT/kernel_manifest.jsonl
# (commit it as tests/gpu/kernel_manifest.jsonl for the next call); STORE_OUT=1 also packs the whole store into
# $OUT/kernel_store.tar.xz, which the next call carries as .device/kernel_store.tar.xz (device_env.sh unpacks it).
# Serial times on a cold H100 / H200 (2026-12-05, no store): tests ~1200 s, sanitizers ~770 s. With the store: tests at
# RUN_JOBS 4 168 s wall, sanitizers at RUN_JOBS 3 134 s (H100 2026-12-07 00:33, twelve compile processes beside them);
# six processes at once (two test files and four sanitizer runs, by hand) lost an H100 machine on 2026-12-05 19:35
# (the call never answered; cause unknown): keep the sanitizers at 3 or fewer. Logs to
# $OUT; the summary table of each part printed (rc 0 and "N passed" / "0 hazards" / "0 errors" on every row is a pass).
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
g=tests/gpu
# longest first (cold seconds, 2026-12-05): sparse attn bwd 292, topk 179, flash bwd 177, sparse attn 143, flash fwd
# 105, indexer bwd 87, indexer dense bwd 79, sparse scores 44, attn score 39, seed001 30, indexer 29
TESTS="test_dsa_sparse_attn_bwd test_dsa_topk test_flash_bwd test_dsa_sparse_attn test_flash_fwd test_dsa_indexer_bwd
  test_dsa_indexer_dense_bwd test_dsa_sparse_scores test_dsa_attn_score test_seed001 test_dsa_indexer test_kernel_cache"
SANS="sanitize_bwd sanitize_dsa_topk sanitize_dsa_sparse_attn_bwd sanitize_fwd sanitize_dsa_sparse_attn
  sanitize_dsa_indexer_bwd sanitize_dsa_indexer_dense_bwd sanitize_dsa_sparse_scores sanitize_dsa_attn_score
  sanitize_dsa_indexer"
for part in "$@"; do
  case $part in
    tests)
      missing=$(comm -13 <(for n in $TESTS; do echo "$g/$n.py"; done | sort) <(ls $g/test_*.py | sort))
      [ -z "$missing" ] || echo "check_project.sh: not in its list, run last: $missing"
      RUN_JOBS=${RUN_JOBS:-2} GPU_TESTS="$(for n in $TESTS; do echo "$g/$n.py"; done) $missing" RUN_SANITIZE=0 \
        PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-500} bash $g/run_device.sh ;;
    sanitize)
      missing=$(comm -13 <(for n in $SANS; do echo "$g/$n.py"; done | sort) <(ls $g/sanitize_*.py | sort))
      [ -z "$missing" ] || echo "check_project.sh: not in its list, run last: $missing"
      RUN_JOBS=${RUN_JOBS:-2} GPU_TESTS=none GPU_SANITIZE="$(for n in $SANS; do echo "$g/$n.py"; done) $missing" \
        SAN_TIMEOUT=${SAN_TIMEOUT:-300} bash $g/run_device.sh ;;
    prebuild)
      m=${PREBUILD:-$g/kernel_manifest.jsonl}
      [ "$m" = "--all" ] || [ -f "$m" ] || m=--all
      timeout "${PREBUILD_TIMEOUT:-400}" python3 $g/prebuild_kernels.py --jobs "${PREBUILD_JOBS:-12}" $m 2>&1 | tail -20 ;;
    *) echo "usage: check_project.sh prebuild|tests|sanitize ..."; exit 2 ;;
  esac
  [ -f "$PADDLE_DSA_KERNEL_CACHE/manifest.jsonl" ] && sort -u "$PADDLE_DSA_KERNEL_CACHE/manifest.jsonl" > "$OUT/kernel_manifest.jsonl"
done
if [ "${STORE_OUT:-0}" = "1" ] && [ -d "$PADDLE_DSA_KERNEL_CACHE" ]; then     # the whole store (xz: ~5 KB an entry)
  tar -cf - -C "$PADDLE_DSA_KERNEL_CACHE" . | xz -6 -T0 > "$OUT/kernel_store.tar.xz"
  echo "kernel store: $(ls "$PADDLE_DSA_KERNEL_CACHE" | grep -c '\.o$') entries, $(du -h "$OUT/kernel_store.tar.xz" | cut -f1) to \$OUT"
fi
