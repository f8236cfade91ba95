"""Vectorised fp32 scatter-add of wgmma accumulator tiles (sm_90): red.global.add.v4.f32, one reduction request per
four consecutive fp32 columns of a row instead of four.

Why: the sparse backward kernels add every gathered key's gradient row into a global fp32 buffer (dkv of the sparse
attention backward, d_index_k of the sparse indexer backward). Measured on the H200 (2026-12-03), both ran at the
same ~256 G scalar reductions/s, i.e. the L2 reduction units, not the tensor cores, set their time; a v4 request
carries four adds.

A wgmma accumulator (m64 nN) gives each thread, per row r in {0, 1} (row lane / 4 + 8 r of its warp's 16), column
pairs (lane % 4) * 2 + {0, 1} + 8 j. Two shapes reach four consecutive global columns:
  - pair_rows: the tile's rows are global rows and its columns global columns (d_index_k: keys x columns). Lanes
    lane and lane ^ 1 swap one column pair: the even lane then holds row 0's four columns 8 j + 2 (lane % 4) + 0..3,
    the odd lane row 1's 8 j + 2 (lane % 4 - 1) + 0..3. Two shuffles per four values.
  - transpose_quad: the tile is transposed (dkv^T: columns x keys). The four lanes lane / 4 = 4 g + 0..3 (lane bits 2
    and 3) hold four consecutive global columns of the same keys; a 4 x 4 transpose across them (two butterfly
    stages) leaves lane sub = (lane / 4) % 4 with key `sub` of the four it started with, at those four columns. Four
    shuffles per four values.
Every lane of the warp must take part (the calls sit outside any per-lane condition); the reductions are then
issued under the lane's own validity test. The global address must be 16-byte aligned: the seams require the
buffer's base 16-byte aligned and its row stride a multiple of 4 elements.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32


@cute.jit
def red_add_v4(ptr, x0: Float32, x1: Float32, x2: Float32, x3: Float32):
    """*ptr[0:4] += (x0, x1, x2, x3) as one red.relaxed.gpu.global.add.v4.f32 (ptr 16-byte aligned)."""
    v = cute.make_rmem_tensor((4,), Float32)
    v[0], v[1], v[2], v[3] = x0, x1, x2, x3
    cute.arch.red(ptr, v.load(), op="add", dtype=Float32, sem="relaxed", scope="gpu")


@cute.jit
def pair_rows(a0: Float32, a1: Float32, b0: Float32, b1: Float32, odd: Boolean):
    """Row 0's pair (a0, a1) and row 1's pair (b0, b1) at columns c, c + 1 (c = 8 j + 2 (lane % 4)) -> the four
    values this lane adds: row 0 at columns c .. c + 3 (even lane), row 1 at c - 2 .. c + 1 (odd lane)."""
    s0 = Float32(cutlass.select_(odd, a0, b0))      # the pair the partner keeps
    s1 = Float32(cutlass.select_(odd, a1, b1))
    r0 = cute.arch.shuffle_sync_bfly(s0, offset=1)
    r1 = cute.arch.shuffle_sync_bfly(s1, offset=1)
    y0 = Float32(cutlass.select_(odd, r0, a0))
    y1 = Float32(cutlass.select_(odd, r1, a1))
    y2 = Float32(cutlass.select_(odd, b0, r0))
    y3 = Float32(cutlass.select_(odd, b1, r1))
    return y0, y1, y2, y3


@cute.jit
def transpose_quad(x0: Float32, x1: Float32, x2: Float32, x3: Float32, sub: Int32):
    """x_i = element (sub, i) of a 4 x 4 matrix spread over the lanes sub = (lane >> 2) & 3 -> element (i, sub):
    the lane then holds key `sub` (of the four it held) at the four consecutive columns of the quad."""
    hi = (sub & 2) != 0                 # stage 1 (lane ^ 8): swap the off-diagonal 2 x 2 blocks
    r0 = cute.arch.shuffle_sync_bfly(Float32(cutlass.select_(hi, x0, x2)), offset=8)
    r1 = cute.arch.shuffle_sync_bfly(Float32(cutlass.select_(hi, x1, x3)), offset=8)
    x0, x1 = Float32(cutlass.select_(hi, r0, x0)), Float32(cutlass.select_(hi, r1, x1))
    x2, x3 = Float32(cutlass.select_(hi, x2, r0)), Float32(cutlass.select_(hi, x3, r1))
    lo = (sub & 1) != 0                 # stage 2 (lane ^ 4): transpose each 2 x 2 block
    r0 = cute.arch.shuffle_sync_bfly(Float32(cutlass.select_(lo, x0, x1)), offset=4)
    r1 = cute.arch.shuffle_sync_bfly(Float32(cutlass.select_(lo, x2, x3)), offset=4)
    x0, x2 = Float32(cutlass.select_(lo, r0, x0)), Float32(cutlass.select_(lo, r1, x2))
    x1, x3 = Float32(cutlass.select_(lo, x1, r0)), Float32(cutlass.select_(lo, x3, r1))
    return x0, x1, x2, x3
