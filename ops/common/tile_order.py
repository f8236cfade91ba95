"""Ordered turns on a global counter (sm_90): the writers of one fp32 accumulator tile add into it one after the
other, in a fixed order, so the sums are bitwise the same on every run (the deterministic flash-attention
backward's dQ: every key block's CTA bulk-reduces its partial dQ tile into the same rows, a warp issuing the TMA
reduce). Worth it where a tile's chain of writers is short against the work each writer does between two of its
reduces (there: grid_n key blocks a dQ tile, tens of tiles a CTA); see docs/performance.md for a form that was not.

Protocol, per accumulator tile, with an int32 counter zeroed on the same stream before the kernel:
- writer number t (0, 1, ... in the fixed order) waits until counter >= t (``wait_turn``: one lane spins with
  ld.acquire.gpu, then the warp syncs and fences the async proxy, so the bulk reduce it issues next is ordered after
  the earlier writers' reduces);
- it issues its reduce (cp.reduce.async.bulk) and commits the bulk group;
- once that group has fully completed (``cp_async_bulk_wait_group(0, read=False)`` by the issuing warp: the writes
  are performed, not only the shared-memory source read), ``pass_turn`` fences the async proxy, syncs the warp and
  adds 1 to the counter with red.release.gpu (lane 0).
The counter only grows, so ``>=`` and ``==`` are the same test; a writer never waits for a later one. Deadlock
freedom is the caller's: every CTA a writer waits for must have been dispatched before it (lower linear block index)
and must not wait on it in turn.
Every lane of the warp must call both functions (they sit outside any per-lane condition).
``clear_counters`` zeroes a counter buffer on the stream before the kernel that takes turns.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def wait_turn(ptr, turn: Int32):
    """Blocks the warp until the counter at ptr (global int32) reaches turn (acquire, gpu scope)."""
    if cute.arch.lane_idx() == 0:
        seen = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
        while seen < turn:
            seen = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
    cute.arch.sync_warp()
    cute.arch.fence_proxy("async.global")


@cute.jit
def pass_turn(ptr):
    """+1 on the counter at ptr (release, gpu scope), after the warp's bulk groups have fully completed."""
    cute.arch.fence_proxy("async.global")
    cute.arch.sync_warp()
    if cute.arch.lane_idx() == 0:
        cute.arch.red(ptr, Int32(1), op="add", dtype=Int32, sem="release", scope="gpu")


@cute.kernel
def _clear_kernel(mX: cute.Tensor, n: Int32):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    nb, _, _ = cute.arch.grid_dim()
    for i in cutlass.range(bidx * 256 + tidx, n, nb * 256, unroll=1):
        mX[i] = Int32(0)


@cute.jit
def clear_counters(mX: cute.Tensor, n: Int32, stream):
    """mX (int32, n elements from its base, contiguous) = 0: one launch on the stream, before the kernel that takes
    turns on it."""
    flat = cute.make_tensor(mX.iterator, cute.make_layout(n))
    ctas = cutlass.min((n + 255) // 256, Int32(264))
    _clear_kernel(flat, n).launch(grid=(cutlass.max(ctas, Int32(1)), 1, 1), block=(256, 1, 1), stream=stream)
