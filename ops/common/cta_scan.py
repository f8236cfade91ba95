"""Prefix sums across the lanes of a warp and across the warps of a CTA (CuTe DSL device helpers), the pieces of the
top-k kernels' CTA-wide scans (ops/dsa/topk: the threshold digit's pick, the tie ranks, the column bitmap's
positions, the batched appends).

A CTA-wide exclusive prefix of per-thread counts c is built in three steps by the caller:
    incl = warp_inclusive_scan(c, lane)            this lane's prefix within its warp (shuffles, no memory)
    one lane of each warp writes the warp's total to part[warp], then a barrier of the whole CTA (the reads below
        must come after every warp's write: a barrier, not a fence)
    add_warps_before(incl - c, part, warp, nwarps) the totals of the warps before this one added
add_warps_before_and_total also returns the CTA's total (after the same barrier). The adds run in warp order, so the result is
the same integer whatever the path; part is a shared-memory Int32 tensor of at least nwarps entries.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def warp_inclusive_scan(v, lane):
    """v summed over lanes 0..lane of the warp (Hillis-Steele over shuffle-up, 5 steps); every lane must call it."""
    for off in cutlass.range_constexpr(5):
        o = cute.arch.shuffle_sync_up(v, offset=1 << off)
        if lane >= (1 << off):
            v = v + o
    return v


@cute.jit
def add_warps_before(acc, part: cute.Tensor, warp, nwarps: cutlass.Constexpr):
    """acc + part[0] + ... + part[warp - 1]."""
    for w in cutlass.range_constexpr(nwarps):
        if w < warp:
            acc = acc + part[w]
    return acc


@cute.jit
def add_warps_before_and_total(acc, part: cute.Tensor, warp, nwarps: cutlass.Constexpr):
    """(acc + part[0] + ... + part[warp - 1], part[0] + ... + part[nwarps - 1]): every entry is loaded once, with no
    branch (the loads vectorize)."""
    total = Int32(0)
    for w in cutlass.range_constexpr(nwarps):
        total = total + part[w]
        if w < warp:
            acc = acc + part[w]
    return acc, total
