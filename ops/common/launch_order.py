"""Launch order of a grid of (tile rank, pair) CTAs: longest tiles first across an L2 section of pairs (sm_90).

A flash-attention grid is (tiles of one pair) x (pairs): pairs are (batch or varlen segment, head), and under a
causal mask a pair's tiles range from one key block of work to all of them. The hardware dispatches CTAs in linear
block order (x fastest), so with x = the tile rank each pair runs longest-to-shortest on its own, and the last pairs'
longest tiles start late and finish alone: a tail. ``lpt_tile`` remaps the linear launch position so that the
launch walks the tile ranks, rank 0 (the caller's longest tile) first, across the pairs of a section, then the next
section's pairs: the longest work is dispatched first and the launch ends on short tiles (LPT order). The section
bounds how many pairs' K / V (forward) or Q / dO (backward) stream through L2 at once: the caller sizes it to a
budget. The remainder section (n_pairs % sec pairs) goes first, so the launch ends on full sections (a CPU model
of greedy dispatch on 132 SMs: a short last section runs its longest tiles alone at the end, 0.90-0.96 of the
ideal instead of 0.98-1.00).

The map is a bijection of [0, n_ranks x n_pairs) onto (rank, pair): every tile runs exactly once.
Verified: docs/performance.md (the LPT trial).
"""
import cutlass
from cutlass import Int32


def lpt_rank_pair(lin, n_ranks, n_pairs, sec, select=lambda c, a, b: a if c else b):
    """(rank, pair) of linear launch position lin: pairs in sections of sec (>= 1), the remainder section first;
    within a section rank-major, so consecutive CTAs take the same rank of the section's pairs. Plain arithmetic (no
    branch), so the kernels (lpt_tile: Int32 values, a select instruction) and the CPU test (Python ints) run these
    same lines; every value is >= 0, where the DSL's and Python's integer division agree."""
    sec = cutlass.max(cutlass.min(sec, n_pairs), 1)
    rem = n_pairs - (n_pairs // sec) * sec
    first = rem * n_ranks                          # CTAs of the remainder section (rem pairs)
    full = cutlass.max(lin - first, 0)
    s = full // (sec * n_ranks)
    in_first = lin < first
    r = select(in_first, lin, full - s * sec * n_ranks)
    n_in = select(in_first, rem, sec)
    base = select(in_first, 0, rem + s * sec)
    rank = r // n_in
    return rank, base + (r - rank * n_in)


@cutlass.cute.jit
def lpt_tile(lin: Int32, n_ranks: Int32, n_pairs: Int32, sec: Int32):
    """lpt_rank_pair on the device."""
    return lpt_rank_pair(lin, n_ranks, n_pairs, sec, lambda c, a, b: Int32(cutlass.select_(c, a, b)))
