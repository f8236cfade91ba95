"""Ordered turns on a global counter (sm_90): the writers of one fp32 accumulator tile add into it one after the
other, in a fixed order, so the sums are bitwise the same on every run. Two users: the deterministic flash-attention
backward's dQ (every key block's CTA bulk-reduces its partial dQ tile into the same rows: a warp issues the TMA
reduce, ``wait_turn`` / ``pass_turn``) and the dense indexer backward's d_index_k (every query row's CTA adds its dk
tile of a key block by red.global from the 128 threads of one warpgroup: ``group_turn`` / ``group_pass``).

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

Thread-group form (plain red.global adds by every thread of a group, e.g. a warpgroup, with a named barrier of its
own): ``group_turn`` at the start of a tile's adds: every thread fences its earlier adds (fence.acq_rel.gpu: they
are performed) if the group has a previous tile, barrier, thread 0 passes the previous tile's turn (red.release.gpu
+1) and spins with ld.acquire.gpu until this tile's counter reaches its turn, barrier; then the adds. The previous
tile's turn thus passes when the group starts its next tile (its adds had a tile's time to land), and
``group_pass`` passes the last one after the group's loop. A barrier orders the other threads' adds before thread 0's
release and after its acquire (causality through bar.sync; the release and acquire are gpu-scope and cumulative).
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


@cute.jit
def group_turn(prev_ptr, has_prev, ptr, turn: Int32, t: Int32, barrier_id: cutlass.Constexpr,
               n_threads: cutlass.Constexpr):
    """Every thread t < n_threads of the group: pass the turn of the group's previous tile (prev_ptr, if has_prev),
    then wait until the counter at ptr reaches turn. See the module docstring."""
    if has_prev:
        cute.arch.fence_acq_rel_gpu()
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=n_threads)
    if t == 0:
        if has_prev:
            cute.arch.red(prev_ptr, Int32(1), op="add", dtype=Int32, sem="release", scope="gpu")
        seen = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
        while seen < turn:
            seen = cute.arch.load(ptr, Int32, sem="acquire", scope="gpu")
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=n_threads)


@cute.jit
def group_pass(ptr, t: Int32, barrier_id: cutlass.Constexpr, n_threads: cutlass.Constexpr):
    """Every thread of the group, after its last tile's adds: pass that tile's turn."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=n_threads)
    if t == 0:
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
