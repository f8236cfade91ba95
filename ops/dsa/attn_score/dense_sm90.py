"""Dense attention-score recompute for Hopper (sm_90a), CuTe DSL: the head-summed score core with a clamped exp.

Math (one sequence; query t, key j, heads h; s = softmax_scale; L[t, h] = softmax_lse[h, t], natural log):

    A[t, j]  = sum_h 2^min((s * (q[t, h] . kv[j]) - L[t, h]) * log2(e), 120)    visible keys (the indexer's mask), 0 else
    l1(t)    = min(sum_j A[t, j], FLT_MAX)
The clamp makes a degenerate lse harmless: lse = -1e30 or -inf gives 2^120 per head (128 heads: 2^127 < FLT_MAX,
never +inf), lse = +inf gives 0; an argument below -126 flushes to 0, the reference's rule. 2^x is
ops/common/exp2.exp2_accurate (under one ulp: the hardware ex2.approx is biased by up to 2^-22, which a head sum of
128 terms and an l1 norm over thousands of keys would carry past a float32 implementation). min() and the exp2
propagate NaN, so a NaN in query, kv or softmax_lse reaches the scores and the l1norm it touches.

Tiling, layouts, shared-memory handoffs: ops/common/head_sum_sm90.py, with N = 128 columns (2 queries at 64 heads,
1 at 128), the Q tile resident (128 x Dqk, 144 KiB at Dqk 576) and the key blocks streamed in 64-column chunks
through a ring of 8 x 8 KiB (9 chunks per block at 576, 8 at 512). softmax_lse is [B,H,Sq] (THD [H,Tq]), as the
attention forward returns it.

Status (H200, 2026-12-03): tests/gpu/test_dsa_attn_score.py 29 passed (every output within 2x a float32
implementation's error against float64: bench/dsa_attn_precision.py measured 0.4-1.7x with promotion, 2-16x
without), racecheck/memcheck clean; routed by paddle_dsa. 8K x 8K, 128 heads, Dqk 576, causal: 9.99 ms = 495
TFLOP/s, cuDNN frontend 9.51 ms in the same run (0.95x; 9.04 ms without the promotion). The pipelined promotion
(PROMOTE_LAG, a third accumulator) also passes the tests; its speed is not measured yet.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ...common.exp2 import exp2_accurate
from ...common.head_sum_sm90 import HeadSumScoresSm90

N_COLS = 128
CHUNK = 64
STAGES = 8
EXP2_MAX = 120.0
FLT_MAX = 3.4028234663852886e38
LOG2E = 1.4426950408889634
# The dot products' wgmma sums are promoted into an fp32 register accumulator every PROMOTE_KBLOCKS k-blocks
# (16 products each; head_sum_sm90.mma_block): exp() turns the absolute error of s X into a relative error of the
# score, and the tensor core's truncating accumulation over all 36 k-blocks of Dqk 576 costs 3-10x a float32
# implementation's error (H200, 2026-12-02).
PROMOTE_KBLOCKS = 4


class AttnScoreEpilogue:
    """The recompute's clamped exp, mask value 0, column constants (lse * log2 e) and row sum; shared by the dense
    core (this module) and the sparse core (sparse_sm90.py)."""

    MASK = 0.0
    STAT_EMPTY = 0.0
    PROMOTE = PROMOTE_KBLOCKS

    @cute.jit
    def column_value(self, mLSE, batch, row, h):
        if cutlass.const_expr(self.varlen):
            return mLSE[h, row]
        return mLSE[batch, h, row]

    @cute.jit
    def element(self, x, lse, scale):
        """2^min((scale x - lse) log2 e, 120): the natural-log argument is formed first (one fma, the rounding of
        a float32 implementation) and only then scaled to base 2, so its error stays relative to itself, not to lse."""
        arg = cute.arch.fmin((x * scale - lse) * Float32(LOG2E), Float32(EXP2_MAX), nan=True)
        return exp2_accurate(arg)

    # row sum: stat[0, i] (stat[1, i] unused)
    @cute.jit
    def stat_init(self, n):
        stat = cute.make_rmem_tensor((2, n), Float32)
        stat.fill(0.0)
        return stat

    @cute.jit
    def stat_update(self, stat, i, x0, x1):
        stat[0, i] = stat[0, i] + (x0 + x1)

    @cute.jit
    def stat_merge(self, a0, b0, a1, b1):
        return a0 + a1, b0

    @cute.jit
    def stat_final(self, a, b):
        return cute.arch.fmin(a, Float32(FLT_MAX), nan=True)


class DenseAttnScoreSm90(AttnScoreEpilogue, HeadSumScoresSm90):
    """One compiled variant: (Dqk, heads, varlen, has_offsets)."""

    def __init__(self, head_dim: int, heads: int, varlen: bool, has_offsets: bool):
        assert head_dim in (512, 576) and heads in (64, 128), (head_dim, heads)
        super().__init__(head_dim, heads, N_COLS, CHUNK, STAGES, varlen, True, has_offsets)
