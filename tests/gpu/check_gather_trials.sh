#!/usr/bin/env bash
# The device check of the knobs on trial (branch wip/gather-trials), in parts of < 10 minutes:
#   source .device/prelude.sh && source .device/extra/unpack.sh >/dev/null; export OUT
#   bash tests/gpu/check_gather_trials.sh fwd          (then "ab", then "others"; estimates ~4, ~5, ~7 minutes;
#                                                       several parts in one call where the limit allows)
# Knobs (class attributes, default 0 = main's kernels):
#   ELECT_RELEASE (ops/dsa/sparse_attn/fwd_sm90.py): one lane a warp arrives on a chunk's empty barrier with a count
#     of 32, after a syncwarp, instead of all 256 consumer threads (18 SYNCS.ARRIVE a thread a pair);
#   GATHER_CG (ops/common/gather_sm90.py BlockGather, ops/common/sparse_head_sum_sm90.py): the gathered key rows by
#     cp.async.cg (LDGSTS.BYPASS, L2 only) instead of cp.async.ca (allocates every gathered line in L1);
#   LATE_RELEASE (forward): each consumer's chunk releases that sit on the M1 / S0 handoff chain (W0: 13 chunks after
#     its M1 wait, W1: 9 after its Q K^T) moved behind an issued P V, off the chain;
#   GROUPED (forward): a pipeline stage is a chunk group (V-left, the rest: 4 stages a pair,
#     as FlashMLA's sm90 kernel) instead of a chunk (18 a pair): ~3.5x fewer full-barrier waits and releases, and
#     LAG_GROUPED = 1 group in flight behind the one being issued.
# Part fwd: test_dsa_sparse_attn -k "schedules or trial_knobs" (each knob, and all four at once, bitwise equal to
#   the default), test_dsa_sparse_scores -k gather_cg, then racecheck + memcheck of the forward with all four knobs
#   (SANITIZE_KNOBS).
# Part ab: the same-run A/B of the forward (bench/ab_sparse_attn.py: the knobs, LAG 6, the nogather knockout), then
#   ncu of the default forward (speed of light, tensor pipe, LSU wavefronts, stall reasons).
# Part others: same-run A/Bs with GATHER_CG of the sparse attention backward, the score recomputes
#   (bench/ab_attn_score.py; bench/sparse_score_shapes.py --cg, the indexer's launch shapes) and the indexer
#   backward (bench/indexer_bwd_shapes.py --cg).
# Logs to $OUT; short tables printed.
set -u
cd "$(dirname "$0")/../.."
source tests/gpu/device_env.sh
t0=$(date +%s)
stamp() { echo "---- $1 ($(( $(date +%s) - t0 )) s)"; }

part_fwd() {
  stamp "tests"
  timeout 240 python3 -m pytest -q tests/gpu/test_dsa_sparse_attn.py -k "schedules or trial_knobs" \
    > "$OUT/trial_tests.log" 2>&1
  echo "test_dsa_sparse_attn -k 'schedules or trial_knobs' rc=$?"; tail -2 "$OUT/trial_tests.log"
  timeout 120 python3 -m pytest -q -x tests/gpu/test_dsa_sparse_scores.py -k gather_cg >> "$OUT/trial_tests.log" 2>&1
  echo "test_dsa_sparse_scores -k gather_cg rc=$?"; tail -2 "$OUT/trial_tests.log"
  stamp "sanitizers (ELECT_RELEASE=1, GATHER_CG=1, LATE_RELEASE=1, GROUPED=1)"
  SANITIZE_KNOBS=ELECT_RELEASE=1,GATHER_CG=1,LATE_RELEASE=1,GROUPED=1 GPU_TESTS=none \
    GPU_SANITIZE=tests/gpu/sanitize_dsa_sparse_attn.py SAN_TIMEOUT=120 bash tests/gpu/run_device.sh \
    > "$OUT/run_device.log" 2>&1
  grep -E "sanitize_.*rc=" "$OUT/run_device.log"
}

part_ab() {
  stamp "A/B forward"
  timeout 300 python3 bench/ab_sparse_attn.py --heads 128 \
    --knobs ELECT_RELEASE=1 GATHER_CG=1 LATE_RELEASE=1 GROUPED=1 \
    ELECT_RELEASE=1,LATE_RELEASE=1 GROUPED=1,ELECT_RELEASE=1,LATE_RELEASE=1 \
    GROUPED=1,ELECT_RELEASE=1,LATE_RELEASE=1,GATHER_CG=1 LAG=6 --knockouts nogather --iters 10 > "$OUT/ab_fwd.log" 2>&1
  echo "ab_sparse_attn fwd rc=$?"; cat "$OUT/ab_fwd.log"
  stamp "ncu forward"
  m=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed
  m=$m,l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
  m=$m,l1tex__data_pipe_lsu_wavefronts.sum,smsp__inst_executed.sum
  timeout 120 ncu --clock-control none -k regex:SparseAttnFwd --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --metrics "$m" \
    python3 bench/sparse_attention.py --ncu > "$OUT/ncu_fwd.log" 2>&1
  echo "ncu rc=$?"
  grep -E "Duration|Throughput|tensor_op|lsu_wavefronts|inst_executed|Stall|Warp Cycles" "$OUT/ncu_fwd.log" | head -30
}

part_others() {
  stamp "A/B backward"
  timeout 150 python3 bench/ab_sparse_attn.py --bwd --heads 64 --knobs GATHER_CG=1 --iters 5 > "$OUT/ab_bwd.log" 2>&1
  echo "ab_sparse_attn bwd rc=$?"; cat "$OUT/ab_bwd.log"
  stamp "A/B score recompute"
  timeout 150 python3 bench/ab_attn_score.py --knobs GATHER_CG=1 > "$OUT/ab_score.log" 2>&1
  echo "ab_attn_score rc=$?"; cat "$OUT/ab_score.log"
  stamp "sparse indexer recompute shapes with GATHER_CG"
  timeout 150 python3 bench/sparse_score_shapes.py --cg --iters 10 > "$OUT/idx_shapes.log" 2>&1
  echo "sparse_score_shapes rc=$?"; cat "$OUT/idx_shapes.log"
  stamp "indexer backward shapes with GATHER_CG"
  timeout 150 python3 bench/indexer_bwd_shapes.py --cg --iters 5 > "$OUT/idx_bwd_shapes.log" 2>&1
  echo "indexer_bwd_shapes rc=$?"; cat "$OUT/idx_bwd_shapes.log"
}

[ $# -gt 0 ] || { echo "usage: check_gather_trials.sh fwd|ab|others ..."; exit 2; }
for part in "$@"; do
  case $part in
    fwd) part_fwd ;;
    ab) part_ab ;;
    others) part_others ;;
    *) echo "unknown part $part (fwd, ab or others)"; exit 2 ;;
  esac
done
stamp "done"
