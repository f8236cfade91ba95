#!/usr/bin/env bash
# The device check of the gathering kernels after chunk groups (sparse attention forward) and cp.async.cg (every
# gather) became their only form (2026-12-05), in two calls of < 10 minutes each:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT
#   bash tests/gpu/check_gather_defaults.sh attn        (sparse attention fwd / bwd: tests, racecheck + memcheck, the
#                                                        forward table of bench/sparse_attention.py)
#   bash tests/gpu/check_gather_defaults.sh scores      (score recomputes, indexer, indexer backwards: tests and
#                                                        sanitizers, then bench/dsa_indexer.py's recompute and backward
#                                                        rows against cuDNN frontend)
# Logs to $OUT; run_device.sh's summary table printed.
set -u
cd "$(dirname "$0")/../.."
g=tests/gpu
case ${1:-} in
  attn)
    GPU_TESTS="$g/test_dsa_sparse_attn.py $g/test_dsa_sparse_attn_bwd.py" \
      GPU_SANITIZE="$g/sanitize_dsa_sparse_attn.py $g/sanitize_dsa_sparse_attn_bwd.py" SAN_TIMEOUT=120 \
      RUN_ATTN_BENCH=1 ATTN_BENCH_ARGS="--iters 10" BENCH_TIMEOUT=120 bash $g/run_device.sh ;;
  scores)
    GPU_TESTS="$g/test_dsa_sparse_scores.py $g/test_dsa_attn_score.py $g/test_dsa_indexer.py $g/test_dsa_indexer_bwd.py
      $g/test_dsa_indexer_dense_bwd.py" PYTEST_TIMEOUT=120 \
      GPU_SANITIZE="$g/sanitize_dsa_sparse_scores.py $g/sanitize_dsa_attn_score.py $g/sanitize_dsa_indexer_bwd.py
      $g/sanitize_dsa_indexer_dense_bwd.py" SAN_TIMEOUT=60 \
      RUN_DSA_BENCH=1 DSA_BENCH_ARGS="--iters 5 --rows rec. bwd" BENCH_TIMEOUT=150 bash $g/run_device.sh ;;
  *) echo "usage: check_gather_defaults.sh attn|scores"; exit 2 ;;
esac
