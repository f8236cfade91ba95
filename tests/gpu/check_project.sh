#!/usr/bin/env bash
# The project check on the device: every GPU test file, then every sanitizer script under racecheck and memcheck,
# through run_device.sh with RUN_JOBS (default 2) runs at once, the longest first (the suites are bound by kernel
# compilation on the host's cores; the GPU is shared by time slices, so nothing here is timed):
#   source .device/prelude.sh && export OUT && bash tests/gpu/check_project.sh tests      (then: sanitize)
#   ... bash tests/gpu/check_project.sh tests sanitize                                   (both, where time allows)
# Serial times on a cold H100 / H200 (2026-12-05): tests ~1200 s, sanitizers ~770 s. RUN_JOBS 4 has not run yet; six
# processes at once (two test files and four sanitizer runs, by hand) lost an H100 machine on 2026-12-05 19:35 (the
# call never answered; cause unknown): start with RUN_JOBS=2 and raise it only while the calls come back. Logs to
# $OUT; the summary table of each part printed (rc 0 and "N passed" / "0 hazards" / "0 errors" on every row is a pass).
set -u
cd "$(dirname "$0")/../.."
g=tests/gpu
# longest first (cold seconds, 2026-12-05): sparse attn bwd 292, topk 179, flash bwd 177, sparse attn 143, flash fwd
# 105, indexer bwd 87, indexer dense bwd 79, sparse scores 44, attn score 39, seed001 30, indexer 29
TESTS="test_dsa_sparse_attn_bwd test_dsa_topk test_flash_bwd test_dsa_sparse_attn test_flash_fwd test_dsa_indexer_bwd
  test_dsa_indexer_dense_bwd test_dsa_sparse_scores test_dsa_attn_score test_seed001 test_dsa_indexer"
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
    *) echo "usage: check_project.sh tests|sanitize ..."; exit 2 ;;
  esac
done
