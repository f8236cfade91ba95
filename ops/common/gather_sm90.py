"""Device helpers of the sparse (top-k slot) kernels for Hopper (sm_90a), CuTe DSL: the varlen row search and the
cp.async publish step of a gathering producer. Used by ops/common/sparse_head_sum_sm90.py (the sparse score
recomputes) and ops/dsa/sparse_attn/fwd_sm90.py (sparse MLA attention forward).
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32


@cute.jit
def find_sequence(mCu: cute.Tensor, n_seq: Int32, row: Int32, lane: Int32):
    """The b with cu[b] <= row < cu[b + 1] (row < cu[n_seq]): a warp-wide 32-ary search (every lane of the warp
    runs it; no host data)."""
    lo = Int32(0)
    hi = n_seq
    while hi - lo > 1:
        step = (hi - lo + 31) // 32
        probe = lo + lane * step
        v = mCu[cutlass.min(probe, hi - 1)]
        ok = probe < hi and v <= row
        n_ok = cute.arch.popc(cute.arch.vote_ballot_sync(ok))
        lo = lo + (n_ok - 1) * step
        hi = cutlass.min(lo + step, hi)
    return lo


@cute.jit
def publish(pipe, stages: cutlass.Constexpr, index: Int32, pending: cutlass.Constexpr):
    """Ring buffer `index`'s cp.async group retired (this thread's: at most `pending` newer groups still in flight),
    this thread's shared-memory writes to it (cp.async and plain stores alike) fenced for the async proxy (wgmma
    reads them), then this thread's arrival on the buffer's full barrier. The barrier completes only when every
    writer arrived, so a consumer's wait orders all lanes' writes, not only a fence."""
    cute.arch.cp_async_wait_group(pending)
    cute.arch.fence_proxy("async.shared", space="cta")
    pipe.producer_commit(pipeline.PipelineState(stages, Int32(0), index, Int32(0)))
