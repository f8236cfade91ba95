"""Sparse attention-score recompute for Hopper (sm_90a), CuTe DSL: the clamped-exp head sum over each query's own
top-k slots (ops/common/sparse_head_sum_sm90.py with AttnScoreEpilogue from dense_sm90.py).

    attn_score[t, s] = sum_h 2^min(c q[t, h] . kv[idx[t, s]] - lse[h, t] log2 e, 120)   valid slots; 0 elsewhere
    attn_l1norm[t]   = min(sum_s attn_score[t, s], FLT_MAX)
Key rows (Dqk 576 or 512) gathered with cp.async in 64-column chunks through a ring of 8 x 8 KiB; the Q tile
(H x Dqk, up to 144 KiB) resident; one query row per CTA.

Status (H200, 2026-12-03): tests/gpu/test_dsa_sparse_scores.py (attention cases) pass within the 2x float32 gate
(the dense kernel's fp32 promotion every 4 k-blocks), racecheck/memcheck clean; routed by paddle_dsa. Sq 4K, top-k
2048, 128 heads, Dqk 576: 5.53 ms = 224 TFLOP/s, cuDNN frontend 2.78 ms in the same run (0.50x); without the
promotion 3.46 ms (but 3-5x the float32 error): the wait per promoted group stalls this kernel far more than the
dense one. 2026-12-04 (slot idx loaded a block ahead in the core): 5.21 ms = 238 TFLOP/s, cuDNN 2.78 (0.53x); tests
and sanitizers pass. The promotion's wait per group is what
this kernel lost to cuDNN (without it 3.46 ms). Since 2026-12-05 the kernel runs the HEAD_SPLIT schedule
(ops/common/sparse_head_sum_sm90.py: both consumers on every block at half the heads, the promotion pipelined).
H200 2026-12-05 (bench/ab_attn_score.py, same run): H 128 3.48 ms = 356 TFLOP/s against the lockstep schedule's 5.32
ms (1.53x), H 64 2.61 vs 3.86 ms (1.48x), scores and l1norm within 1e-7 relative of it; cuDNN frontend 2.80 ms at
H 128 (0.81x). tests/gpu/test_dsa_sparse_scores.py (45 passed, the split schedule's cases included) and both
sanitizers clean on both schedules. H100 2026-12-06 (LAG 1: a producer thread publishes each chunk once the next one
is issued): H 128 3.05 ms against 3.18 at LAG 3, bitwise equal; cuDNN frontend 3.13-3.15 ms in the same runs (1.02-
1.03x); tests/gpu/test_dsa_sparse_scores.py and both sanitizers pass (the whole suite at 09:05). H200 2026-12-06
10:17-10:23: the whole suite and both sanitizers pass; 3.06 ms against cuDNN frontend's 2.79 there (0.91x: cuDNN is
faster on the H200, ours the same).
"""
from ...common.sparse_head_sum_sm90 import SparseHeadSumSm90
from .dense_sm90 import CHUNK, STAGES, AttnScoreEpilogue


class SparseAttnScoreSm90(AttnScoreEpilogue, SparseHeadSumSm90):
    """One compiled variant: (Dqk, heads, varlen, has_length)."""

    HEAD_SPLIT = True    # H200 2026-12-05: 1.5x the lockstep schedule (module docstring); False only for the A/B
    LAG = 1              # chunks in flight a producer thread before it publishes the oldest (H100 2026-12-06 08:27,
    #                      bench/ab_attn_score.py, bitwise equal: H 128 3.18 / 3.14 / 3.05 ms at LAG 3 / 2 / 1)

    def __init__(self, head_dim: int, heads: int, varlen: bool, has_length: bool):
        assert head_dim in (512, 576) and heads in (64, 128), (head_dim, heads)
        super().__init__(head_dim, heads, CHUNK, STAGES, varlen, has_length)
