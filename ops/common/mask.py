"""Attention visibility: which key j a query i of one segment sees (CuTe DSL device helpers + host helper).

Convention (fixed for the project): a segment has ``seqlen_q`` queries and ``seqlen_k`` keys; causal and window
masks are aligned bottom-right, i.e. query i sits on the key diagonal ``d(i) = i + seqlen_k - seqlen_q``:

    visible(i, j)  <=>  j < seqlen_k  and  d(i) - left <= j <= d(i) + right

with ``left``/``right`` = +inf for an unbounded side (-1 on the API), and causal meaning ``right = 0`` (intersected
with any window). Host code turns the API values into finite int32 bounds with ``effective_window``; kernels carry
a compile-time flag ``bounded`` (any of causal/window set) and the two runtime bounds.

Device helpers work on a thread's "MN view" of a wgmma accumulator (rows x columns held by the thread) and the
matching identity-coordinate view, so the backward kernels can reuse them with their own tiles.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

# Stand-in for an unbounded window side: far beyond any int32 sequence position difference we use, and
# small enough that  position + UNBOUNDED  stays inside int32 (positions < 2^30).
UNBOUNDED = 1 << 30


def effective_window(causal, window):
    """(bounded, left, right) with -1/None mapped to UNBOUNDED and causal forcing right = 0 (host side)."""
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    if left < -1 or right < -1:
        raise ValueError(f"window=({left}, {right}): each side must be -1 (unbounded) or >= 0")
    left_eff = UNBOUNDED if left < 0 else left
    right_eff = UNBOUNDED if right < 0 else right
    if causal:
        right_eff = 0 if right < 0 else min(right_eff, 0)
    bounded = bool(causal or left >= 0 or right >= 0)
    return bounded, left_eff, right_eff


@cute.jit
def key_block_range(m_start: Int32, m_rows: cutlass.Constexpr, seqlen_q: Int32, seqlen_k: Int32,
                    left: Int32, right: Int32, block_n: cutlass.Constexpr, bounded: cutlass.Constexpr):
    """[n_lo, n_hi) of key blocks of size block_n that rows [m_start, m_start + m_rows) can see.

    Never negative, n_hi >= n_lo (an empty range means those rows see no key at all).
    """
    n_hi = (seqlen_k + block_n - 1) // block_n
    n_lo = Int32(0)
    if cutlass.const_expr(bounded):
        diag0 = seqlen_k - seqlen_q
        # last row of the tile that exists (rows past seqlen_q are not stored, they need no keys)
        m_last = cutlass.min(m_start + m_rows, seqlen_q) - 1
        hi_key = cutlass.min(m_last + diag0 + right + 1, seqlen_k)   # exclusive
        hi_key = cutlass.max(hi_key, 0)
        n_hi = (hi_key + block_n - 1) // block_n
        lo_key = cutlass.max(m_start + diag0 - left, 0)
        n_lo = cutlass.min(lo_key // block_n, n_hi)
    return n_lo, n_hi


@cute.jit
def block_needs_mask(m_start: Int32, m_rows: cutlass.Constexpr, n_start: Int32, block_n: cutlass.Constexpr,
                     seqlen_q: Int32, seqlen_k: Int32, left: Int32, right: Int32,
                     bounded: cutlass.Constexpr):
    """True if some (row, key) of the tile is invisible (a conservative test; False means all visible)."""
    need = n_start + block_n > seqlen_k
    if cutlass.const_expr(bounded):
        diag0 = seqlen_k - seqlen_q
        need = need or (n_start + block_n - 1 > m_start + diag0 + right)
        need = need or (n_start < m_start + m_rows - 1 + diag0 - left)
    return need


@cute.jit
def apply_mask(s_mn: cute.Tensor, c_mn: cute.Tensor, m_start: Int32, n_start: Int32, seqlen_q: Int32,
               seqlen_k: Int32, left: Int32, right: Int32, bounded: cutlass.Constexpr):
    """Set invisible scores of a thread's accumulator view to -inf.

    s_mn: (rows, cols) fp32 register view; c_mn: the same view of the tile's identity coordinates (row, col),
    relative to (m_start, n_start). Apply after any scaling so -inf never meets a multiply.
    Each row's bounds are taken relative to the thread's first column, so an element compares a compile-time column
    offset against two per-row values (comparing absolute columns kept a register per column live: the 192-row D 64
    forward tile spilled 84 B that way; H100 2026-12-07, the same outputs bit for bit and 1.00-1.06x faster).
    """
    diag0 = seqlen_k - seqlen_q
    col0 = c_mn[0, 0][1]
    base = n_start + col0
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        row = m_start + c_mn[r, 0][0]
        hi = seqlen_k - 1
        lo = Int32(0)
        if cutlass.const_expr(bounded):
            hi = cutlass.min(hi, row + diag0 + right)
            lo = row + diag0 - left
        # columns are >= 0 and < seqlen_k, so clamping both bounds to [-1, seqlen_k] changes no decision and keeps
        # the differences inside int32 (lo is about -2^30 for an unbounded left side)
        hi_rel = cutlass.max(hi, Int32(-1)) - base
        lo_rel = cutlass.max(lo, Int32(0)) - base
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            k = c_mn[r, c][1] - col0
            ok = k <= hi_rel
            if cutlass.const_expr(bounded):
                ok = ok and k >= lo_rel
            s_mn[r, c] = Float32(cutlass.select_(ok, s_mn[r, c], -Float32.inf))
