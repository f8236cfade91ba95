"""Lightning-indexer scores for Hopper (sm_90a), CuTe DSL: the head-summed score core with relu * w.

Math (one sequence; query t, key j, index heads h = 0..H-1):

    I[t, j]  = sum_h w[t, h] * relu(q[t, h, :] . k[j, :])       fp32 (bf16 inputs, fp32 accumulate and sum)
    visible  : j < lim(t),  lim(t) = clamp((q_offset + t + 1) // ratio, 0, Sk)  (causal)  or  Sk
    score    = I[t, j] where visible, -inf elsewhere (every column of the output row is written)
    lse(t)   = ln sum_{visible j} exp(I[t, j])   (optional; 0 for a row that sees no key)

relu is the NaN-propagating maximum (a NaN in q, k or w reaches the scores and the lse it touches; an invisible
key's value is dropped by a select, never by arithmetic, so nothing leaks from it). The lse is online per owned
query: a running (max m, sum l) with m~ = 0 while m is -inf (no -inf - -inf), merged across lanes and warps.

Tiling, layouts, shared-memory handoffs: ops/common/head_sum_sm90.py (N = 256 columns = 256 / H queries per CTA,
the whole head_dim D in one K chunk, a ring of 6 x 16 KiB (D = 128) or 8 x 8 KiB (D = 64) key tiles).
Weights come in bf16 or fp32 ([B,Sq,H] / THD [Tq,H]) and are held in fp32.

Status (H200, 2026-12-02): tests/gpu/test_dsa_indexer.py 48 passed, compute-sanitizer racecheck and memcheck
clean; 8K x 8K, 64 heads, D 128, causal: 0.84 ms = 651 TFLOP/s (with lse 632).
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ...common.head_sum_sm90 import HeadSumScoresSm90
from ...common.softmax import LOG2E

N_COLS = 256
LN2 = math.log(2.0)


def stages_for(head_dim):
    """K ring depth (both consumers together): 6 x 16 KiB at D = 128, 8 x 8 KiB at D = 64."""
    return 6 if head_dim > 64 else 8


class IndexerEpilogue:
    """The indexer's per-element function, mask value, column constants (the weights) and online lse; shared by
    the dense core (this module) and the sparse core (sparse_sm90.py)."""

    MASK = float("-inf")
    STAT_EMPTY = 0.0

    @cute.jit
    def column_value(self, mW, batch, row, h):
        if cutlass.const_expr(self.varlen):
            return Float32(mW[row, h])
        return Float32(mW[batch, row, h])

    @cute.jit
    def element(self, x, w, scale):
        return cute.arch.fmax(x, Float32(0.0), nan=True) * w

    # online lse: stat[0, i] = running max, stat[1, i] = sum of exp(x - max)
    @cute.jit
    def stat_init(self, n):
        stat = cute.make_rmem_tensor((2, n), Float32)
        for i in cutlass.range_constexpr(n):
            stat[0, i] = -Float32.inf
            stat[1, i] = Float32(0.0)
        return stat

    @cute.jit
    def stat_update(self, stat, i, x0, x1):
        m_old = stat[0, i]
        m_new = cute.arch.fmax(m_old, cute.arch.fmax(x0, x1))
        m_use = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new))
        stat[1, i] = (stat[1, i] * cute.math.exp2((m_old - m_use) * LOG2E, fastmath=True)
                      + cute.math.exp2((x0 - m_use) * LOG2E, fastmath=True)
                      + cute.math.exp2((x1 - m_use) * LOG2E, fastmath=True))
        stat[0, i] = m_new

    @cute.jit
    def stat_merge(self, m_a, l_a, m_b, l_b):
        m = cute.arch.fmax(m_a, m_b)
        m_use = Float32(cutlass.select_(m == -Float32.inf, Float32(0.0), m))
        l = (l_a * cute.math.exp2((m_a - m_use) * LOG2E, fastmath=True)
             + l_b * cute.math.exp2((m_b - m_use) * LOG2E, fastmath=True))
        return m, l

    @cute.jit
    def stat_final(self, m, l):
        """lse = m + ln(l); 0 for a row that saw no visible key (l == 0); a NaN sum stays NaN."""
        alive = l > Float32(0.0)
        l_safe = Float32(cutlass.select_(alive, l, Float32(1.0)))
        lse = m + cute.math.log2(l_safe, fastmath=False) * Float32(LN2)
        lse = Float32(cutlass.select_(alive, lse, Float32(0.0)))
        return Float32(cutlass.select_(l == l, lse, l))


class IndexerScoreSm90(IndexerEpilogue, HeadSumScoresSm90):
    """One compiled variant: (head_dim, heads, varlen, with_lse, has_offsets); the weight dtype comes with mC."""

    def __init__(self, head_dim: int, heads: int, varlen: bool, with_lse: bool, has_offsets: bool):
        assert head_dim in (64, 128) and heads in (16, 32, 64), (head_dim, heads)
        super().__init__(head_dim, heads, N_COLS, head_dim, stages_for(head_dim), varlen, with_lse, has_offsets)
