"""Online softmax in base 2 over a wgmma accumulator (CuTe DSL device helpers).

Math. For a row with scores s_j (fp32, straight from Q K^T) and scale c = softmax_scale * log2(e), the state is
kept in scaled units (base-2 logits):

    m   = max_j c s_j over the blocks seen so far   (monotonic: m_new = max(m_old, block max))
    P_j = 2^(c s_j - m~),  m~ = 0 if m == -inf else m    (so a fully masked block/row never computes -inf - -inf)
    l   = l * 2^(m_old - m~) + sum_j P_j,   O = O * 2^(m_old - m~) + P V      (2^(-inf - x) = 0 for the first block)
    end:  out = O / l,  lse = ln(2) * (m + log2(l));   l == 0 (row saw no key): out = 0, lse = -inf;
          a NaN l (NaN logit) stays NaN in out and lse

Folded scale (fold_factors). For c > 0 the scores stay raw: the block max is taken over s and scaled once,
m_blk = rn(c max s) (= max rn(c s), c > 0 being monotone), and each exponent is one fma, P_j = 2^(fma(s_j, c, -m~)):
one multiply a score fewer than scaling every score first, and one rounding of the exponent instead of two. m~ is the
exact c max s but for its own rounding e (|e| <= ulp(m~)/2), so the row max's P is 2^e instead of 1; every P_j, l
and lse use the same m~, so the result is otherwise exact (the exponent's difference is formed exactly by the fma,
where scaling first rounds c s_j to ulp(c s_j)/2: at logits of millions that alone moves P by up to 2^(1/4)). The
drift only matters where 2^e could overflow or vanish: below FOLD_LIMIT = 2^28, |e| <= 8, so the largest P lies in
[2^-8, 2^8]. A row whose |m~| reaches FOLD_LIMIT (logits of ~2e8 and more, where the fp32 scores themselves are
rounded to 16 or more) has its scores scaled first in a branch only such rows take, so its largest P is exactly 1.
c <= 0 or NaN: the caller scales every score first (prescale = c; a max over raw scores would be a min), and the
step runs with multiplier 1.

Rescale skip (skip > 0, a forward's RESCALE_SKIP). The running max only has to bound the row's scores well enough
that no P overflows: a block whose max exceeds m~ by at most skip keeps m~ (corr = 2^0 = 1 exactly for every row of
it), so O needs no rescale (rescale_rows_where_needed: skipped when a warp's rows all keep theirs). Its P are then up
to 2^skip (times the fold's 2^8 at most): every P, l, O and lse still use the same m~, so the result is the same
math; skip <= 7 keeps 2^(skip + 8) inside float16's range. A larger jump (and the first block) takes the new max as
before: m~ is never below the block max minus skip. Not the same rounding, though: with the exact max the row's
largest P is 1 (2^e with the fold's tiny e) and passes the rounding to bf16 / fp16 unchanged; a kept max makes it
2^(positive fraction), rounded like any other P, and on peaked rows that one term carries most of the output
(seed 001's K*8 rows on the H100, 2026-12-08: rel L2 1.15x the fp32 floor, against 0.98x without the skip). So the
forward's knob is off by default (tests/test_softmax_fold_model.py models it).

A thread holds 2 rows of a 64-row wgmma accumulator; a row is spread over 4 consecutive lanes (quad), so row
max/sum need a butterfly over lane offsets 1 and 2. Row sums are kept per thread and reduced once at the end.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LN2 = math.log(2.0)
LOG2E = math.log2(math.e)
FOLD_LIMIT = 2.0 ** 28      # |m~| from which a row's scores are scaled before the exponent (module docstring)


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


@cute.jit
def fold_factors(scale_log2: Float32):
    """(prescale, mult) for a CTA's scale c: c > 0 folds (prescale 1, mult c), else the scores are scaled first
    (prescale c, mult 1). Uniform over the CTA."""
    fold = scale_log2 > Float32(0.0)
    prescale = Float32(cutlass.select_(fold, Float32(1.0), scale_log2))
    mult = Float32(cutlass.select_(fold, scale_log2, Float32(1.0)))
    return prescale, mult


@cute.jit
def prescale_scores(s_mn: cute.Tensor, prescale: Float32):
    """The unfolded form's t = c * s (prescale from fold_factors; 1 when the scale is folded: nothing to do).
    Call before masking, so -inf never meets a multiply, whatever the sign of c."""
    if prescale != Float32(1.0):
        scale_scores(s_mn, prescale)


@cute.jit
def scale_scores(s_mn: cute.Tensor, scale_log2: Float32):
    """t = c * s in place (before masking, so -inf never meets a multiply, whatever the sign of c)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            s_mn[r, c] = s_mn[r, c] * scale_log2


@cute.jit
def online_softmax_update(s_mn: cute.Tensor, o_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor,
                          mult: Float32):
    """Masked scores (raw with mult = c, or prescaled with mult = 1: fold_factors) -> unnormalised P (in place);
    update (row_max, row_sum); rescale O's view (online_softmax_step, then rescale_rows)."""
    corr = cute.make_rmem_tensor((cute.size(s_mn, mode=[0]),), Float32)
    online_softmax_step(s_mn, row_max, row_sum, corr, mult)
    rescale_rows(o_mn, corr)


@cute.jit
def online_softmax_finalize(o_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, lse_out: cute.Tensor):
    """Normalise O in place; lse_out[r] = natural-log LSE (-inf and O = 0 for rows that saw no key: l == 0). A NaN l
    (a NaN logit) is not such a row: it reaches O and lse instead of being replaced by 0 / -inf."""
    for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        l = quad_sum(row_sum[r])
        dead = l == Float32(0.0)
        l_safe = Float32(cutlass.select_(dead, Float32(1.0), l))
        inv = Float32(cutlass.select_(dead, Float32(0.0), Float32(1.0) / l_safe))
        lse = (row_max[r] + cute.math.log2(l_safe, fastmath=False)) * Float32(LN2)
        lse_out[r] = Float32(cutlass.select_(dead, -Float32.inf, lse))
        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[r, c] = o_mn[r, c] * inv


@cute.jit
def online_softmax_step(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, corr: cute.Tensor,
                        mult: Float32, skip: cutlass.Constexpr = 0):
    """Like online_softmax_update, but leaves O alone: corr[r] = 2^(m_old - m~) for a later rescale_rows(O, corr)
    (lets the caller overlap this with the previous P V wgmma still in flight). mult: fold_factors' multiplier.
    skip > 0 (RESCALE_SKIP): a block whose max exceeds the running max by at most skip keeps the running max (corr
    exactly 1, so rescale_rows_where_needed can skip O), its P then up to 2^skip (module docstring)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        m_blk = s_mn[r, 0]
        for c in cutlass.range_constexpr(1, cute.size(s_mn, mode=[1])):
            m_blk = cute.arch.fmax(m_blk, s_mn[r, c])
        m_blk = quad_max(m_blk) * mult                  # rn(c max s): -inf stays -inf (mult > 0)
        m_old = row_max[r]
        m_new = cute.arch.fmax(m_old, m_blk)
        if cutlass.const_expr(skip > 0):
            # keep the running max unless the block's exceeds it by more than skip (m_old = -inf: only an all -inf
            # block keeps it; a NaN block max is no keep, and fmax already ignored it, as without skip)
            keep = m_blk <= m_old + Float32(skip)
            m_new = Float32(cutlass.select_(keep, m_old, m_new))
        m_use = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new))
        corr[r] = cute.math.exp2(m_old - m_use, fastmath=True)
        row_max[r] = m_new
        a = mult
        if cute.arch.fmax(m_use, -m_use) >= Float32(FOLD_LIMIT):   # huge logits: scale first (module docstring)
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                s_mn[r, c] = s_mn[r, c] * mult
            a = Float32(1.0)
        part = Float32(0.0)
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            p = cute.math.exp2(cute.math.fma(s_mn[r, c], a, -m_use), fastmath=True)
            s_mn[r, c] = p
            part = part + p
        row_sum[r] = row_sum[r] * corr[r] + part


@cute.jit
def rescale_rows_where_needed(o_mn: cute.Tensor, corr: cute.Tensor):
    """rescale_rows, skipped when no row of the warp has corr != 1 (a warp-uniform branch: one vote): with a skip
    threshold most blocks keep every row's max, and O stays as it is."""
    need = corr[0] != Float32(1.0)
    for r in cutlass.range_constexpr(1, cute.size(corr)):
        need = need or corr[r] != Float32(1.0)
    if cute.arch.vote_any_sync(need):
        rescale_rows(o_mn, corr)


@cute.jit
def rescale_rows(o_mn: cute.Tensor, corr: cute.Tensor):
    for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[r, c] = o_mn[r, c] * corr[r]
