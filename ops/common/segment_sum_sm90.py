"""Ordered segment sums of staged gradient rows, CuTe DSL (sm90): the deterministic form of the sparse backwards'
scatter-add (ops/common/deterministic_rows.py: dkv of the sparse attention backward, d_index_k of the indexer
backwards).

    out[k, :] = (((out[k, :] + S(order[lo], 0)) + S(order[lo], 1)) + ... + S(order[lo], G - 1)) + S(order[lo + 1], 0)
                + ... + S(order[hi - 1], G - 1)      for k < n_out,   S(e, g) = stage[e G + g, :]
    (one fp32 add a staged row, in that order: entries in sort order, each entry's G rows in group order)

sorted_keys int32 [E] non-decreasing, order int32 [E] (an entry id a position: the entries sorted by key, ties by
entry id: the caller's sort, e.g. of key * E + id), [lo, hi) the positions whose key is k (two binary searches),
stage fp32 [E G, D] (entry e's G rows: one per head group). Every add is a plain fp32 add in that fixed order, so
the result is bitwise the same on every run whatever the launch order of the CTAs; keys with no entry (and keys
outside [0, n_out), e.g. the caller's code for an invalid slot) are not touched. Only the stage rows of listed
entries are read (an unlisted entry's rows may be unwritten). Chunks of entries summed by successive launches on
one stream add to out in launch order.

Tiling: one warp a key (4 a CTA), a lane owns 4 consecutive columns of each 128-column line (D / 128 lines, the last
one partial for D = 576 or 64): 16-byte loads of the stage rows, two entries in flight. D static (a variant each).
Status: H200 2026-12-05 (perf/device_2026-12-05T0155.txt): the DSA backwards' deterministic tests pass through it,
racecheck / memcheck clean.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

WARPS = 4
VEC = 4                      # fp32 columns a lane a line
LINE = 32 * VEC


class SegmentSumSm90:
    def __init__(self, width: int, groups: int):
        assert width % VEC == 0 and groups >= 1, (width, groups)
        self.D, self.G = width, groups
        self.n_lines = (width + LINE - 1) // LINE

    @cute.jit
    def __call__(self, mStage: cute.Tensor, mKeys: cute.Tensor, mOrder: cute.Tensor, mOut: cute.Tensor, n_out: Int32,
                 stream):
        D = self.D
        stage = cute.make_tensor(mStage.iterator, cute.make_layout((mStage.shape[0], D), stride=(D, 1)))
        out = cute.make_tensor(mOut.iterator, cute.make_layout((n_out, D), stride=(D, 1)))
        ctas = (n_out + WARPS - 1) // WARPS
        self.kernel(stage, mKeys, mOrder, out, n_out).launch(grid=(cutlass.max(ctas, Int32(1)), 1, 1),
                                                             block=(32 * WARPS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, stage: cute.Tensor, mKeys: cute.Tensor, mOrder: cute.Tensor, out: cute.Tensor, n_out: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        key = bidx * WARPS + tidx // 32
        lane = tidx % 32
        n_e = mKeys.shape[0]
        if key < n_out:
            lo = lower_bound(mKeys, n_e, key)
            hi = lower_bound(mKeys, n_e, key + 1)
            if lo < hi:
                acc = cute.make_rmem_tensor((self.n_lines, VEC), Float32)
                # out's row offset in 64 bits: n_out x D may pass 2^31 (3.7 M kv rows at D = 576); the staging
                # rows' offsets fit 32 bits (deterministic_rows.check_row bounds them)
                row = Int64(key)
                self.load_row(out, row, lane, acc, False)
                for i in cutlass.range(lo, hi, unroll=2):
                    e = mOrder[i]
                    for g in cutlass.range_constexpr(self.G):
                        self.load_row(stage, e * self.G + g, lane, acc, True)
                self.store_row(out, row, lane, acc)

    @cute.jit
    def load_row(self, t: cute.Tensor, r, lane: Int32, acc: cute.Tensor, add: cutlass.Constexpr):
        """acc (+)= this lane's columns of row r of t (16-byte loads)."""
        v = cute.make_rmem_tensor((VEC,), Float32)
        for ln in cutlass.range_constexpr(self.n_lines):
            c = ln * 32 + lane
            if c * VEC < self.D:
                cute.autovec_copy(cute.local_tile(t[r, None], (VEC,), (c,)), v)
                for j in cutlass.range_constexpr(VEC):
                    if cutlass.const_expr(add):
                        acc[ln, j] = acc[ln, j] + v[j]
                    else:
                        acc[ln, j] = v[j]

    @cute.jit
    def store_row(self, t: cute.Tensor, r, lane: Int32, acc: cute.Tensor):
        v = cute.make_rmem_tensor((VEC,), Float32)
        for ln in cutlass.range_constexpr(self.n_lines):
            c = ln * 32 + lane
            if c * VEC < self.D:
                for j in cutlass.range_constexpr(VEC):
                    v[j] = acc[ln, j]
                cute.autovec_copy(v, cute.local_tile(t[r, None], (VEC,), (c,)))


@cute.jit
def lower_bound(mKeys: cute.Tensor, n: Int32, k: Int32) -> Int32:
    """The first position of the non-decreasing mKeys[0:n] (n >= 1) whose value is >= k (n if none): 32 halvings
    (n < 2^31), by selects."""
    lo, hi = Int32(0), n
    for _ in cutlass.range_constexpr(32):
        mid = lo + (hi - lo) // 2
        less = mKeys[cutlass.min(mid, n - 1)] < k
        busy = lo < hi
        lo, hi = (Int32(cutlass.select_(busy, cutlass.select_(less, mid + 1, lo), lo)),
                  Int32(cutlass.select_(busy, cutlass.select_(less, hi, mid), hi)))
    return lo


_CACHE = {}


def variant_keys():
    """(width, groups, rank of out) of every caller: the sparse attention backward's dkv (Dqk 576 / 512, one or two
    head groups) and the indexer backwards' d_index_k (Di 64 / 128), [B, S, D] or [T, D]."""
    return [(d, g, r) for d in (512, 576) for g in (1, 2) for r in (2, 3)] + [(d, 1, r) for d in (64, 128)
                                                                              for r in (2, 3)]


def compile_variant(width, groups, rank):
    key = (int(width), int(groups), int(rank))
    fn = _CACHE.get(key)
    if fn is None:
        from cutlass.cute.runtime import make_fake_stream
        from .head_sum_host import fake_tensor
        from . import kernel_cache
        i32 = cutlass.Int32
        fn = kernel_cache.compile(SegmentSumSm90(key[0], key[1]), fake_tensor(Float32, (None, None), 4, 16),
                                  fake_tensor(i32, (None,), 1, 4), fake_tensor(i32, (None,), 1, 4),
                                  fake_tensor(Float32, (None,) * key[2], 4, 16), Int32(1), make_fake_stream(),
                                  variant=(__name__, "compile_variant", list(key)))
        _CACHE[key] = fn
    return fn


def segment_sum(stage, sorted_keys, order, out, *, width, rank, n_out, groups, stream):
    """stage: tvm_ffi fp32 [E G, width]; out: tvm_ffi fp32 of `rank` axes, its n_out rows of `width` elements
    contiguous from a 16-byte aligned base (the caller checks); sorted_keys / order int32 [E], E >= 1; see the module
    docstring."""
    compile_variant(width, groups, rank)(stage, sorted_keys, order, out, int(n_out), stream)
