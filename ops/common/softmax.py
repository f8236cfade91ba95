"""Online softmax in base 2 over a wgmma accumulator (CuTe DSL device helpers).

Math. For a row with scores s_j (fp32, straight from Q K^T, masked entries -inf) and a scale c > 0 (the "fold"
scale: softmax_scale * log2(e) when that is positive; see fold_scale for the other case):

    M   = max_j s_j over the blocks seen so far        (monotonic: M_new = max(M_old, block max); raw units)
    m~  = 0 if M == -inf else c * M                    (so a fully masked block/row never computes -inf - -inf)
    P_j = 2^(c s_j - m~)                               one fma a score (c s_j is never rounded on its own)
    l   = l * 2^(c M_old - m~) + sum_j P_j,   O = O * 2^(c M_old - m~) + P V  (2^(-inf) = 0 for the first block)
    end:  out = O / l,  lse = ln(2) * (c M + log2(l));   l == 0 (row saw no key): out = 0, lse = -inf;
          a NaN l (NaN logit) stays NaN in out and lse
Because c > 0, max_j c s_j = c max_j s_j and a masked -inf stays -inf under the fma, so the scaling folds into the
exponent's fma: one multiply a score less than scaling every score first (H100 / H200: the forward's softmax is
issue-bound at D 64). A non-positive softmax_scale is scaled first instead (fold_scale: the scores are multiplied by
it before masking, and the fold scale is 1: 2^(t - m~) as before); the branch is uniform over the CTA.

A thread holds 2 rows of a 64-row wgmma accumulator; a row is spread over 4 consecutive lanes (quad), so row
max/sum need a butterfly over lane offsets 1 and 2. A thread's own max and sum of a row run as TREE independent
chains (max is exact in any order; the fp32 sum's order changes its rounding only), so the 32 values of a row do not
form one dependent chain of 32 instructions. Row sums are kept per thread and reduced once at the end.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .exp2 import exp2_poly4

LN2 = math.log(2.0)
LOG2E = math.log2(math.e)


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """(rows, cols) view of a thread's sm90 wgmma accumulator fragment ((2, 2, N/8), 1, 1).

    Value v of the fragment sits at row (v // 2) % 2 and column v % 2 + 2 * (v // 4) of the thread's slice.
    Works for register fragments and for identity-coordinate partitions alike (composition with the
    fragment's own layout).
    """
    n8 = cute.size(acc) // 4
    mn = cute.make_layout((2, (2, n8)), stride=(2, (1, 4)))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def p_operand_view(rP: cute.Tensor, n: int) -> cute.Tensor:
    """A 16-bit copy of a (64 x n) wgmma accumulator, seen as the register A operand of the next wgmma (RS, K = n):
    the C fragment ((2, 2, n/8), 1, 1) holds exactly the A fragment ((2, 2, 2), 1, n/16), register for register."""
    return cute.make_tensor(rP.iterator, cute.make_layout(((2, 2, 2), 1, n // 16), stride=((1, 2, 4), 0, 8)))


def quad_max(x: Float32) -> Float32:
    x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=1))
    return cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=2))


def quad_sum(x: Float32) -> Float32:
    x = x + cute.arch.shuffle_sync_bfly(x, offset=1)
    return x + cute.arch.shuffle_sync_bfly(x, offset=2)


def softmax_state(rows: int = 2):
    """(row_max, row_sum) register tensors, initialised to (-inf, 0)."""
    row_max = cute.make_rmem_tensor((rows,), Float32)
    row_sum = cute.make_rmem_tensor((rows,), Float32)
    row_max.fill(-Float32.inf)
    row_sum.fill(0.0)
    return row_max, row_sum


TREE = 4   # independent chains of a thread's row max / row sum


def fold_scale(scale_log2: Float32):
    """The scale the softmax folds into its exponent: scale_log2 if positive, else 1 (the caller then multiplies the
    scores by scale_log2 before masking: prescale_scores)."""
    return Float32(cutlass.select_(scale_log2 > Float32(0.0), scale_log2, Float32(1.0)))


@cute.jit
def prescale_scores(s_mn: cute.Tensor, scale_log2: Float32):
    """t = scale_log2 * s in place when scale_log2 <= 0 (a branch uniform over the CTA), before masking; nothing
    otherwise (the softmax folds a positive scale into its exponent)."""
    if scale_log2 <= Float32(0.0):
        scale_scores(s_mn, scale_log2)


def _tree(s_mn: cute.Tensor, r: cutlass.Constexpr, op):
    """op-reduction of row r of a thread's view in TREE interleaved chains, then the chains pairwise."""
    n = cute.size(s_mn, mode=[1])
    k = min(TREE, n)
    acc = [s_mn[r, c] for c in range(k)]
    for c in range(k, n):
        acc[c % k] = op(acc[c % k], s_mn[r, c])
    while len(acc) > 1:
        acc = [op(acc[i], acc[i + 1]) if i + 1 < len(acc) else acc[i] for i in range(0, len(acc), 2)]
    return acc[0]


def _fmax(a, b):
    return cute.arch.fmax(a, b)


def _fadd(a, b):
    return a + b


@cute.jit
def scale_scores(s_mn: cute.Tensor, scale_log2: Float32):
    """t = c * s in place (before masking, so -inf never meets a multiply, whatever the sign of c)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            s_mn[r, c] = s_mn[r, c] * scale_log2


@cute.jit
def online_softmax_update(s_mn: cute.Tensor, o_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                          c: Float32, poly: cutlass.Constexpr = 0):
    """Masked scores -> unnormalised P (in place); update (row_max, row_sum); rescale O's view
    (online_softmax_step, then rescale_rows). c: the fold scale (fold_scale); poly: online_softmax_step's."""
    corr = cute.make_rmem_tensor((cute.size(s_mn, mode=[0]),), Float32)
    online_softmax_step(s_mn, row_max, row_sum, corr, c, poly)
    rescale_rows(o_mn, corr)


@cute.jit
def online_softmax_finalize(o_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, lse_out: cute.Tensor,
                            c: Float32):
    """Normalise O in place; lse_out[r] = natural-log LSE (-inf and O = 0 for rows that saw no key: l == 0). A NaN l
    (a NaN logit) is not such a row: it reaches O and lse instead of being replaced by 0 / -inf. c: the fold scale
    (row_max is in raw score units)."""
    for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        l = quad_sum(row_sum[r])
        dead = l == Float32(0.0)
        l_safe = Float32(cutlass.select_(dead, Float32(1.0), l))
        inv = Float32(cutlass.select_(dead, Float32(0.0), Float32(1.0) / l_safe))
        lse = (row_max[r] * c + cute.math.log2(l_safe, fastmath=False)) * Float32(LN2)
        lse_out[r] = Float32(cutlass.select_(dead, -Float32.inf, lse))
        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[r, c] = o_mn[r, c] * inv


@cute.jit
def online_softmax_step(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, corr: cute.Tensor,
                        c: Float32, poly: cutlass.Constexpr = 0):
    """Like online_softmax_update, but leaves O alone: corr[r] = 2^(c M_old - m~) for a later rescale_rows(O, corr)
    (lets the caller overlap this with the previous P V wgmma still in flight). c: the fold scale (> 0). poly: of
    every 8 consecutive values of a thread's row, the first poly take exp2_poly4 (FMA pipe) instead of ex2.approx
    (MUFU), to balance the two units."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        m_blk = quad_max(_tree(s_mn, r, _fmax))
        m_old = row_max[r]
        m_new = cute.arch.fmax(m_old, m_blk)
        m_use = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new * c))
        corr[r] = cute.math.exp2(m_old * c - m_use, fastmath=True)
        row_max[r] = m_new
        neg = -m_use
        for j in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            if cutlass.const_expr(j % 8 < poly):
                s_mn[r, j] = exp2_poly4(cute.math.fma(s_mn[r, j], c, neg))
            else:
                s_mn[r, j] = cute.math.exp2(cute.math.fma(s_mn[r, j], c, neg), fastmath=True)
        row_sum[r] = row_sum[r] * corr[r] + _tree(s_mn, r, _fadd)


@cute.jit
def rescale_rows(o_mn: cute.Tensor, corr: cute.Tensor):
    for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[r, c] = o_mn[r, c] * corr[r]
