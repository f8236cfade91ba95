"""Fill a contiguous float32 buffer with one value, CuTe DSL (sm90): the zeroing pass before a kernel that
accumulates into the buffer with atomics (ops/dsa/sparse_attn/bwd.py's dkv). One launch on the caller's stream, so
the accumulating kernel queued after it sees every element written. Grid-stride loop, 4 elements a thread a step.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

THREADS = 256
MAX_CTAS = 1056          # 8 per SM of an H200; the loop strides over the rest


class FillSm90:
    @cute.jit
    def __call__(self, mX: cute.Tensor, value: Float32, n: Int32, stream):
        flat = cute.make_tensor(mX.iterator, cute.make_layout(n))
        ctas = cutlass.min((n + THREADS * 4 - 1) // (THREADS * 4), Int32(MAX_CTAS))
        self.kernel(flat, value, n).launch(grid=(cutlass.max(ctas, Int32(1)), 1, 1), block=(THREADS, 1, 1),
                                           stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, value: Float32, n: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        nb, _, _ = cute.arch.grid_dim()
        for i in cutlass.range(bidx * THREADS + tidx, n, nb * THREADS, unroll=4):
            mX[i] = value


_CACHE = {}
RANKS = (2, 3)           # dkv / d_index_k: [T, D] (THD) or [B, S, D]


def compile_fill(rank):
    """The fill kernel for a float32 tensor of `rank` axes (one compiled variant per rank, cached)."""
    fn = _CACHE.get(rank)
    if fn is None:
        from cutlass.cute.runtime import make_fake_stream
        from . import kernel_cache
        from .head_sum_host import fake_tensor
        fn = kernel_cache.compile(FillSm90(), fake_tensor(cutlass.Float32, (None,) * rank, 1, 4), Float32(0.0),
                                  Int32(1), make_fake_stream(), variant=(__name__, "compile_fill", [rank]))
        _CACHE[rank] = fn
    return fn


def fill_f32(x, rank, value, n, stream):
    """x: a tvm_ffi float32 tensor of `rank` axes whose n elements are contiguous from its base (the caller checks)."""
    compile_fill(rank)(x, float(value), int(n), stream)
