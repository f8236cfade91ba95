"""Vectorised fp32 scatter-add of wgmma accumulator tiles (sm_90): red.global.add.v4.f32, one reduction request per
four consecutive fp32 columns of a row instead of four.

Why: the sparse backward kernels add every gathered key's gradient row into a global fp32 buffer (dkv of the sparse
attention backward, d_index_k of the sparse indexer backward). Measured on the H200 (2026-12-03), both ran at the
same ~256 G scalar reductions/s, i.e. the L2 reduction units, not the tensor cores, set their time; a v4 request
carries four adds.

A wgmma accumulator (m64 nN) gives each thread, per row r in {0, 1} (row lane / 4 + 8 r of its warp's 16), column
pairs (lane % 4) * 2 + {0, 1} + 8 j. Both kernels hold their tile with the keys as rows (keys x columns), and
line_rows turns it into whole lines: per 32-column line, two lane-bit swaps (lane bit 0 with the column pair's bit
j0, lane bit 2 with j1) leave each lane four consecutive columns of one of four rows, so one instruction of the warp
adds a whole 128-byte line to each of 4 rows; partner_rows gives each lane the destination rows of those 4 rows
(its own and lane ^ 4's) and red_tile_lines does the whole tile. (The sparse attention backward's earlier BK = 32
kernel held its dkv tile transposed, columns x keys, and reached 16 keys x 32 bytes an instruction by a 4 x 4 lane
transpose: that form is gone with it, 2026-12-04.)
Why the layout of a warp instruction matters (H200, bench/red_lines.py, 2026-12-04, 18.9 MB fp32 buffer, random
rows): the L2 takes 106 / 155 / 206 / 246 G v4 requests/s when one instruction adds 16 / 32 / 64 / 128 contiguous
bytes a row (32 / 16 / 8 / 4 rows); wider runs gain nothing more. The first form for d_index_k (a lane-pair swap)
gave 32 bytes a row; line_rows replaced it.
st_tile_pairs is the plain-store form for the deterministic staging buffers (no shuffle: each lane stores its own
column pairs, 8 rows x 32 bytes a warp instruction; a v4 store after line_rows made ptxas serialize the sparse
attention backward's wgmmas, C7512, where red.v4 did not, CPU 2026-12-04).
Every lane of the warp must take part (the calls sit outside any per-lane condition); the reductions are then
issued under the lane's own validity test. The global address must be 16-byte aligned: the seams require the
buffer's base 16-byte aligned and its row stride a multiple of 4 elements.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


@cute.jit
def red_add_v4(ptr, x0: Float32, x1: Float32, x2: Float32, x3: Float32):
    """*ptr[0:4] += (x0, x1, x2, x3) as one red.relaxed.gpu.global.add.v4.f32 (ptr 16-byte aligned)."""
    v = cute.make_rmem_tensor((4,), Float32)
    v[0], v[1], v[2], v[3] = x0, x1, x2, x3
    cute.arch.red(ptr, v.load(), op="add", dtype=Float32, sem="relaxed", scope="gpu")


@cute.jit
def st_v2(ptr, x0: Float32, x1: Float32):
    """*ptr[0:2] = (x0, x1) as one st.global.v2.f32 (ptr 8-byte aligned)."""
    v = cute.make_rmem_tensor((2,), Float32)
    v[0], v[1] = x0, x1
    cute.arch.store(ptr, v.load())


def swap_lane_bit(v, hi, offset: int, vmask: int):
    """Swap a lane bit with a value-index bit: v (a list of Float32, its length a multiple of 2 vmask) is element
    (lane bit, value bit) of the lanes lane and lane ^ offset (hi: this lane's bit); afterwards this lane holds the
    elements whose value bit equalled its lane bit, at value index bit = the old lane bit. One shuffle per two
    values; a plain function (traced inline), every lane must call it."""
    pairs = [(i, i | vmask) for i in range(len(v)) if i & vmask == 0]
    got = [cute.arch.shuffle_sync_bfly(Float32(cutlass.select_(hi, v[i], v[j])), offset=offset) for i, j in pairs]
    out = list(v)
    for (i, j), r in zip(pairs, got):
        out[i] = Float32(cutlass.select_(hi, r, v[i]))
    for (i, j), r in zip(pairs, got):
        out[j] = Float32(cutlass.select_(hi, v[j], r))
    return out


def line_rows(v, lane):
    """One 32-column line of a (keys x columns) accumulator tile: v[r * 8 + j1 * 4 + j0 * 2 + e] = row r's column
    8 (2 j1 + j0) + 2 (lane % 4) + e of the line (the m64 accumulator's pairs of its 4 column groups). Returns the
    list w with w[r * 8 + b * 4 + i] = column 16 ((lane >> 2) & 1) + 8 (lane & 1) + 4 ((lane >> 1) & 1) + i of row
    (lane >> 2 with bit 0 replaced by b) + 8 r: the lane adds four consecutive columns to 4 rows (r, b), and each of
    the warp's instructions (r, b) covers 4 rows x 128 bytes. Row b's key comes from lane ^ 4 when b differs from
    this lane's bit 2 (the caller exchanges the row indices)."""
    w = swap_lane_bit(v, (lane & 1) != 0, 1, 2)
    return swap_lane_bit(w, ((lane >> 2) & 1) != 0, 4, 4)


def partner_rows(krow_b, own0, own1, lane):
    """krow_b[b, r] = the destination row (-1: skip) of tile row (lane >> 2 with bit 0 = b) + 8 r, from this lane's
    own rows (own_r: tile row lane >> 2 + 8 r) and its partner lane ^ 4's: the rows line_rows hands this lane. Every
    lane must call it (one shuffle a row); a plain function (traced inline)."""
    m0 = (lane >> 2) & 1
    for r in range(2):
        own = own0 if r == 0 else own1
        other = cute.arch.shuffle_sync_bfly(own, offset=4)
        krow_b[0, r] = cutlass.select_(m0 == 0, own, other)
        krow_b[1, r] = cutlass.select_(m0 == 0, other, own)


@cute.jit
def red_tile_lines(k_mn: cute.Tensor, krow_b: cute.Tensor, lane: Int32, mDst: cute.Tensor, batch: Int32, col0,
                   n_lines: cutlass.Constexpr):
    """Adds an m64 accumulator tile (rows x n_lines * 32 columns, k_mn its (row, column) view: ops/common/softmax.py
    acc_mn_view) to mDst[krow, col0 + column, batch] (fp32) by whole 128-byte lines: line_rows, then one red.v4 per
    (r, b) and line, skipped where krow_b[b, r] (partner_rows) < 0. Every lane must call it."""
    col_lane = 16 * ((lane >> 2) & 1) + 8 * (lane & 1) + 4 * ((lane >> 1) & 1)
    for ln in cutlass.range_constexpr(n_lines):
        v = [k_mn[i >> 3, 2 * (4 * ln + ((i >> 1) & 3)) + (i & 1)] for i in range(16)]
        y = line_rows(v, lane)
        col = col0 + 32 * ln + col_lane
        for r in cutlass.range_constexpr(2):
            for b in cutlass.range_constexpr(2):
                kr = krow_b[b, r]
                if kr >= 0:
                    red_add_v4(mDst.iterator + cute.crd2idx((kr, col, batch), mDst.layout), y[8 * r + 4 * b],
                               y[8 * r + 4 * b + 1], y[8 * r + 4 * b + 2], y[8 * r + 4 * b + 3])


@cute.jit
def st_tile_pairs(k_mn: cute.Tensor, own0: Int32, own1: Int32, lane: Int32, mDst: cute.Tensor, col0):
    """Writes an m64 accumulator tile (k_mn its (row, column) view) to mDst[row, col0 + column] (fp32, 2-D) as it
    lies in the registers: one st.global.v2 per column pair, row lane >> 2 + 8 r going to row own_r (skipped where
    own_r < 0); a warp instruction writes 8 rows x 32 bytes (whole sectors). No shuffle: the plain-store form for
    a destination each row of which one warp writes (the deterministic staging buffers)."""
    n_pairs = cute.size(k_mn, mode=[1]) // 2
    for r in cutlass.range_constexpr(2):
        kr = own0 if r == 0 else own1
        if kr >= 0:
            for j in cutlass.range_constexpr(n_pairs):
                st_v2(mDst.iterator + cute.crd2idx((kr, col0 + 8 * j + 2 * (lane % 4)), mDst.layout),
                      k_mn[r, 2 * j], k_mn[r, 2 * j + 1])
