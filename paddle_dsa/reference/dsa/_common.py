"""Shared pieces of the DSA reference path: clamps, the token layout, masks and gathers.

Clamps (docs/dsa.md, "Numerics contract"):
    EXP_ARG_MAX  = 120 ln 2 (~83.18): the argument of exp() in the attention-score recompute is clamped
                   above here, so a degenerate softmax_lse (-1e30, -inf) gives finite probabilities
                   (e^83.18 * 128 heads < FLT_MAX). Mirrors the kernels' exp2 clamp at 120.
    EXP_ARG_MIN  = -126 ln 2 (~-87.34): arguments below it contribute exactly 0 (flush to zero, no
                   denormals); this also makes a softmax_lse of +inf give an all-zero row.
    FLT_MAX      : attention scores and L1 norms saturate at the largest float32 instead of +inf.
    PROB_MIN     = e^-100: the target probability is clamped below at e^-100 in the loss and its gradient.
    LOG_MIN      = -100: log softmax(I) is clipped below at -100 (zero gradient where clipped).
    L1_EPS       = 1e-10: the target L1 norm is clamped below at 1e-10 before normalising.
"""
import math

import numpy as np
import paddle

EXP_ARG_MAX = 120.0 * math.log(2.0)
EXP_ARG_MIN = -126.0 * math.log(2.0)
FLT_MAX = float(np.finfo(np.float32).max)
PROB_MIN = math.exp(-100.0)
LOG_MIN = -100.0
L1_EPS = 1e-10
NEG_INF = float("-inf")

# Key-block width of the dense ops and the element budget of one temporary (a sparse row chunk
# rows x K x ..., a top-k row chunk). The dense ops size their temporaries (a tile rows x heads x
# KEY_BLOCK, a row buffer rows x visible width) by dense_budget(): at most ELEMENT_BUDGET, and
# DENSE_ELEMENTS_CPU on a CPU place (cache-sized: leaner and faster than larger tiles there) or
# DENSE_ELEMENTS_GPU on a GPU place (fewer, larger launches). Working memory of a dense op is a small
# constant number of such temporaries besides its outputs (docs/dsa.md, "Memory").
KEY_BLOCK = 256
ELEMENT_BUDGET = 1 << 25
DENSE_ELEMENTS_CPU = 1 << 20
DENSE_ELEMENTS_GPU = 1 << 24


def compute_dtype(x):
    """float64 stays float64; every other float dtype computes in float32."""
    return paddle.float64 if x.dtype == paddle.float64 else paddle.float32


def row_chunk(rows, per_row, budget=None):
    """Rows per chunk so that a chunk's temporaries stay within budget (default ELEMENT_BUDGET) elements."""
    budget = ELEMENT_BUDGET if budget is None else budget
    return max(1, min(rows, budget // max(1, per_row)))


def dense_budget(like):
    """Element budget of one dense temporary for tensors on like's place (see KEY_BLOCK above)."""
    return min(ELEMENT_BUDGET, DENSE_ELEMENTS_GPU if like.place.is_gpu_place() else DENSE_ELEMENTS_CPU)


class Layout:
    """Token-major view of a BSHD or THD call.

    Query rows are tokens 0..Tq-1 of a [Tq, ...] tensor, keys tokens 0..Tk-1 of a [Tk, ...] tensor.
    segments: list of (q_start, q_len, k_start, k_len, q_offset) per sequence (host ints).
    width: the score width (Sk for BSHD; THD: max_seqlen_k when the caller gives it, else the max key length).
    norm_rows: N of the loss normalisation (B * Sq for BSHD, cu_seqlens_q[-1] for THD).
    Rows of THD past cu_seqlens_q[-1] belong to no segment.
    """

    def __init__(self, tq, tk, segments, width, batch_shape, norm_rows):
        self.tq, self.tk = tq, tk
        self.segments = segments
        self.width = width
        self.batch_shape = batch_shape  # (B, Sq) for BSHD, None for THD
        self.norm_rows = norm_rows
        self._row_arrays = None

    @staticmethod
    def bshd(b, sq, sk, q_offsets=None):
        offs = np.zeros(b, np.int64) if q_offsets is None else np.asarray(q_offsets, np.int64)
        segs = [(i * sq, sq, i * sk, sk, int(offs[i])) for i in range(b)]
        return Layout(b * sq, b * sk, segs, sk, (b, sq), b * sq)

    @staticmethod
    def thd(tq, tk, cu_q, cu_k, q_offsets=None, width=None):
        cu_q = np.asarray(cu_q, np.int64)
        cu_k = np.asarray(cu_k, np.int64)
        b = len(cu_q) - 1
        offs = np.zeros(b, np.int64) if q_offsets is None else np.asarray(q_offsets, np.int64)
        segs = [(int(cu_q[i]), int(cu_q[i + 1] - cu_q[i]), int(cu_k[i]), int(cu_k[i + 1] - cu_k[i]), int(offs[i]))
                for i in range(b)]
        if width is None:   # else the caller's max_seqlen_k (>= every key length; columns past one are masked)
            width = int(np.diff(cu_k).max()) if b else 0
        return Layout(tq, tk, segs, width, None, int(cu_q[-1]))

    def row_arrays(self):
        """Host int64 arrays over query rows: key start, key length (0 for rows of no segment)."""
        if self._row_arrays is None:
            k_start = np.zeros(self.tq, np.int64)
            k_len = np.zeros(self.tq, np.int64)
            for qa, ql, ka, kl, _ in self.segments:
                k_start[qa:qa + ql] = ka
                k_len[qa:qa + ql] = kl
            self._row_arrays = (k_start, k_len)
        return self._row_arrays

    def rows_to_public(self, x):
        """[Tq, ...] -> [B, Sq, ...] for BSHD; unchanged for THD."""
        if self.batch_shape is None:
            return x
        return x.reshape(list(self.batch_shape) + list(x.shape[1:]))


def causal_limits(q_len, k_len, q_offset, causal, ratio):
    """Host int64 [q_len]: row i sees keys j < limit[i] (clamp((offset + i + 1) // ratio, 0, k_len))."""
    if not causal:
        return np.full(q_len, k_len, np.int64)
    i = np.arange(q_len, dtype=np.int64)
    return np.clip((q_offset + i + 1) // ratio, 0, k_len)


def block_mask(limits, j0, j1, place):
    """bool [rows, j1 - j0] tensor: key j (absolute j0 + c) visible iff j < limits[row]."""
    j = np.arange(j0, j1, dtype=np.int64)[None, :]
    return paddle.to_tensor(j < limits[:, None], place=place)


def slot_validity(layout, topk_indices, topk_length, place):
    """For [Tq, K] int32 indices local to each row's sequence: (global int64 index [Tq, K] with invalid
    slots pointing at row 0, bool valid [Tq, K]). A slot is valid iff 0 <= idx < its sequence's key
    length and its position < topk_length (when given)."""
    k_start, k_len = layout.row_arrays()
    tq, k = topk_indices.shape
    start = paddle.to_tensor(k_start, place=place).unsqueeze(-1)
    length = paddle.to_tensor(k_len, place=place).unsqueeze(-1)
    idx = topk_indices.astype(paddle.int64)
    valid = paddle.logical_and(idx >= 0, idx < length)
    if topk_length is not None:
        pos = paddle.arange(k, dtype=paddle.int64).unsqueeze(0)
        valid = paddle.logical_and(valid, pos < topk_length.astype(paddle.int64).reshape([tq, 1]))
    gidx = paddle.where(valid, idx + start, paddle.zeros_like(idx))
    return gidx, valid


def gather_rows(x, gidx, valid):
    """x [Tk, D], gidx/valid [R, K] -> [R, K, D], rows of invalid slots zeroed (never read as data:
    a NaN in row 0 cannot leak through an invalid slot)."""
    r, k = gidx.shape
    g = paddle.gather(x, gidx.reshape([-1]), axis=0).reshape([r, k, x.shape[-1]])
    return paddle.where(valid.unsqueeze(-1), g, paddle.zeros_like(g))


def masked_exp(x, mask):
    """exp(x) where mask, exactly 0 elsewhere (Paddle's CPU exp(-inf) is not exactly 0)."""
    zero = paddle.zeros_like(x)
    return paddle.where(mask, paddle.exp(paddle.where(mask, x, zero)), zero)


# NaN-keeping min / max / relu (they keep a NaN, never mask one), the same on every Paddle release: paddle.minimum / maximum drop a NaN operand on 2.6
# and 3.0 (fmin semantics; 3.2+ keep it), relu maps NaN to 0 everywhere, and clip(x, max=b) turns -inf into
# -FLT_MAX. Selects on a comparison that is False for NaN keep the NaN on the computed side.
def min_nan(x, bound):
    """min(x, bound) for a float bound; NaN and -inf kept."""
    return paddle.where(x > bound, paddle.full_like(x, bound), x)


def max_nan(x, bound):
    """max(x, bound) for a float bound; NaN and +inf kept."""
    return paddle.where(x < bound, paddle.full_like(x, bound), x)


def stable_max(a, b):
    """max(a, b) as the stabiliser of a logaddexp: where(a < b, b, a) keeps a NaN in a; a NaN in b is dropped here
    but reaches the result through exp(b - max) (the caller's sum), so the logaddexp is NaN either way."""
    return paddle.where(a < b, b + paddle.zeros_like(a), a)


def nan_relu(x):
    """max(x, 0), NaN kept (Paddle's relu maps NaN to 0, so a NaN input would vanish from the scores)."""
    return max_nan(x, 0.0)


def relu_slope(x):
    """d nan_relu / dx: 1 where x > 0, 0 where x <= 0 (and at -inf), x itself (NaN) where x is NaN: both comparisons
    are False for NaN, so it falls through to x."""
    return paddle.where(x > 0, paddle.ones_like(x), paddle.where(x <= 0, paddle.zeros_like(x), x))


def below(x, bound):
    """x < bound, False for NaN: a select on it keeps a NaN on the computed side (never swallows it)."""
    return x < bound


def clamped_exp(x, mask):
    """exp(min(x, EXP_ARG_MAX)) where mask and not x < EXP_ARG_MIN, exactly 0 elsewhere (incl. x = -inf); a NaN x
    at a masked-in entry gives NaN."""
    keep = paddle.logical_and(mask, paddle.logical_not(below(x, EXP_ARG_MIN)))
    return masked_exp(min_nan(x, EXP_ARG_MAX), keep)


def row_lse(scores, mask, empty_value):
    """logsumexp over the masked entries of each row of [R, W]; empty_value where a row has none."""
    if scores.shape[-1] == 0:
        return paddle.full(scores.shape[:-1], empty_value, dtype=scores.dtype)
    neg = paddle.full_like(scores, NEG_INF)
    s = paddle.where(mask, scores, neg)
    m = s.max(axis=-1, keepdim=True)
    has = mask.any(axis=-1, keepdim=True)
    m_safe = paddle.where(has, m, paddle.zeros_like(m))
    l = masked_exp(s - m_safe, mask).sum(axis=-1, keepdim=True)
    l_safe = paddle.where(has, l, paddle.ones_like(l))
    lse = paddle.where(has, m_safe + paddle.log(l_safe), paddle.full_like(m, empty_value))
    return lse.squeeze(-1)


def row_limits(layout, causal, ratio):
    """Host int64 [Tq]: query row t sees local keys j < limit[t] (0 for rows of no segment)."""
    lim = np.zeros(layout.tq, np.int64)
    for qa, ql, _, kl, off in layout.segments:
        lim[qa:qa + ql] = causal_limits(ql, kl, off, causal, ratio)
    return lim


def dense_chunks(layout, limits, heads, like):
    """Yield (segment, r0, r1, top) row chunks of the visible region: rows qa+r0..qa+r1 of a segment,
    which see local keys j < top at most (top = the chunk's largest limit, >= 1; chunks whose rows see
    no key are skipped). A chunk is sized so that one of its tiles (rows x heads x KEY_BLOCK) and one
    of its row buffers (rows x top) each stay within dense_budget(like) elements."""
    budget = dense_budget(like)
    for seg in layout.segments:
        qa, ql, _, kl, _ = seg
        if ql == 0 or kl == 0:
            continue
        lim = limits[qa:qa + ql]
        seg_top = int(lim.max())
        if seg_top == 0:
            continue
        rows = row_chunk(ql, max(heads * min(KEY_BLOCK, seg_top), seg_top), budget)
        for r0 in range(0, ql, rows):
            r1 = min(ql, r0 + rows)
            top = int(lim[r0:r1].max())
            if top > 0:
                yield seg, r0, r1, top


def key_blocks(top):
    """(j0, j1) key blocks of width KEY_BLOCK covering local keys 0..top."""
    for j0 in range(0, top, KEY_BLOCK):
        yield j0, min(top, j0 + KEY_BLOCK)
