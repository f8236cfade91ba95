"""Sparse MLA attention backward for Hopper (sm_90a), CuTe DSL: gradients of fwd_sm90.py's forward.

Math (query row t, heads h, valid slots j; c = softmax_scale; L2 = log2 e; K_j = kv[idx_j], V_j = K_j[:Dv]):

    lse+[h]  = logaddexp(lse[h], sink[h])  (= lse without a sink; lse = -inf: the sink)
    P[h,j]   = 2^min(c L2 q_h . K_j - lse+[h] L2, 0)        the forward's probabilities (<= 1 by construction;
    Pn[h,j]  = 2^min(c L2 q_h . K_j - lse[h] L2, 0)          the clamp keeps a degenerate lse finite)
    Delta[h] = sum_v dout[h, v] out[h, v]                     (fp32, from the stored bf16 out)
    dP[h,j]  = dout_h . V_j;   dS[h,j] = P (dP - Delta[h]) + dlse[h] Pn      (invalid slot: 0, by a select)
    dq[h]    = c sum_j dS[h,j] K_j
    dkv[idx_j]     += c sum_h dS[h,j] q_h          (all Dqk columns)
    dkv[idx_j, :Dv] += sum_h P[h,j] dout_h
    d_sink_rows[t, h] = -2^min(sink[h] L2 - lse+[h] L2, 0) Delta[h]   (the caller sums over rows; sink -inf: -0)
A row with no valid slot: dq 0, no dkv contribution, d_sink_rows -0 x Delta = 0 (its out is 0). NaN in q, kv, out,
dout, lse or the sink reaches the gradients it influences.

Tiling. One CTA = one query row and 64 heads (grid x = rows x H / 64, a row's CTAs adjacent: rows.SlotRows). Resident:
Q (64 x Dqk, 72 KiB) and dout (64 x Dv, 64 KiB), both by TMA. Slots in blocks of BK = 64; a block's kv rows gathered
by cp.async (producer warpgroup, as in the forward; invalid slots zero-filled; the block's gathered rows, -1 where
invalid, to sRows[n % 2]) into the one kv slot: NC = Dqk / 64 chunks of 64 keys x 64 columns (8 KiB), each with a full
and an empty mbarrier, so chunk c of block n + 1 is gathered as soon as both consumers are done with chunk c of block
n.
Consumer warpgroups (setmaxnreg 232 each, the producer 40):
  - A (w = 0): S = Q K^T and dP = dout V^T (m64 n64 k16, chunk by chunk as the chunks arrive; 32 + 32 accumulator
    registers), P and dS in registers, sP = bf16(P) and sdS = bf16(c dS) by stmatrix (fence.proxy.async; PDS_FULL
    for B, PDS_A for A's own wgmmas), then dq[:, 0:256] += dS K[:, 0:256] (A = sdS, B = the kv chunks read
    MN-major; 4 chunk accumulators over all blocks), then the dkv tiles of the last DKV_A chunks (below). It
    releases chunks >= 4 once S / dP retired and chunks 0-3 once its dq wgmmas retired.
  - B (w = 1): after PDS_FULL, dq[:, 256:Dqk] += dS K[:, 256:Dqk] (NC - 4 chunk accumulators), then the dkv tiles of
    the other chunks, and it releases every kv chunk once its dq wgmmas retired (dkv reads no kv), so the next
    block's gather and S / dP run under its dkv tiles.
  dkv tile of chunk c, the keys as M: 64 keys x 64 columns = dS^T Q_c + P^T dout_c (c < Dv / 64) (A = sdS / sP read
  MN-major, B = the resident Q / dout chunk read MN-major), added to global fp32 by whole 128-byte lines
  (ops/common/vector_red_sm90.py red_tile_lines: 4 keys x 128 bytes a red.v4 instruction), valid keys only.
Measured choices (H200 and ptxas, 2026-12-04): DKV_A = 2 (0 / 2 / 3 / 4: 7.64 / 7.50 / 7.60 / 7.85 ms at H 64, equal
within 1 % at H 128). Measured and removed (H100 2026-12-07, same run, perf/device_2026-12-07T1903_h100.txt): B
releasing the kv chunks it never reads at PDS_FULL (7.434 vs 7.433 ms at H 64, 14.95 vs 14.98 at H 128); the dkv tiles
by 8 rows x 64 bytes a red.v4 (half the shuffles): 8.58 / 17.08 ms, 0.87x. What does not fit the register budget (ptxas C7512, the wgmmas serialized, CPU): dq by an RS
wgmma (A = dS from registers) with 4 chunks in A; 6 dq chunks in B; a second dkv accumulator in either consumer
(tile c + 1's wgmmas under tile c's reductions; a predicated red, `@p red`, is not what serializes them).
Shared-memory handoffs: sP / sdS(n) written by A's 128 threads (stmatrix), fence.proxy.async, then A arrives on
PDS_FULL (B syncs on it before its wgmmas read them) and syncs on PDS_A (A's 128 threads, before its own dq and dkv
wgmmas read them); rewritten (n + 1) only after PDS_FREE: B arrives after the wait_group that retired its last wgmma
of block n reading them, A syncs before its stores of block n + 1 (its own reads retired by its wait_group 0). sStat
(Delta, lse+, lse, dlse) written by 64 + 256 threads before PRE_BAR, read after. kv chunks: full barrier (128
producer arrivals after their cp.async groups retired and a proxy fence), empty barrier (256 consumer arrivals, each
after its own last wgmma reading the chunk retired); B waits on the full barriers itself before its reads.
sRows[n % 2] (slot validity and the dkv rows of block n): written by the producer after it acquired chunk 0 of block
n (so both consumers have released chunk 0 of block n - 1, which each does after its reads of block n - 2's rows)
and before chunk 0 of block n is published; A reads it after chunk 0's full barrier, B after PDS_FULL(n), each
before it releases chunk 0 of block n.
Shared memory (Dqk 576): Q 72 + dout 64 + kv 72 + sP 8 + sdS 8 KiB = 224 KiB of 227.

Layouts: as the forward; out/dout bf16 [B,Sq,H,Dv] / [Tq,H,Dv], dq bf16 like q, dkv fp32 [B,Skv,Dqk] / [Tkv,Dqk]
(accumulated: zero it first; the seam does), dlse like lse, d_sink_rows fp32 [B,Sq,H] / [Tq,H] (every element
written). Not deterministic: dkv sums arrive in any order (fp32 atomics).
Deterministic variant (deterministic=True; the seam, ops/dsa/sparse_attn/bwd.py, sums the result per key): the
grid covers the query rows [row0, row0 + R) of every batch; entry e = ((row - row0) B + batch) K + slot; mdKV is a
staging buffer fp32 [E G, Dqk] (G = H / 64) and entry e's dkv rows (head group grp) are row e G + grp, written with
plain stores as the tile lies in the registers (vector_red_sm90.st_tile_pairs: each row by one warp, no atomics);
mKeys[e] = the slot's global kv row (b Skv + idx, or the THD row), -1 where the slot adds nothing. The producer
publishes the staging row instead of the kv row in sRows (publish_rows), so the consumers are the same code; head
group 0's producer writes the keys of the gathered blocks as it publishes them and -1 for the slots past the last
block (clear_row: all of a THD tail row's). Every valid slot's staging rows and every key of the chunk are written;
an invalid slot's staging rows are not (the seam never reads them). No wgmma serialization in any of its 64
variants (spills 32-120 bytes). H200 2026-12-05 (perf/device_2026-12-05T0155.txt): tests/gpu/test_dsa_sparse_attn_bwd.py
30 passed (deterministic cases included), racecheck / memcheck clean; Sq 4K, Skv 8K, top-k 2048: H 64 21.62 ms, H 128
42.25 ms, 2.9x the default mode's 7.49 / 14.72.

Status (H200, 2026-12-04 21:00 UTC, tree f51b752): tests/gpu/test_dsa_sparse_attn_bwd.py 23 passed, racecheck /
memcheck clean. Sq 4K, Skv 8K, top-k 2048, 576 / 512, sink: H 64 7.50 ms (389 TFLOP/s) against cuDNN frontend's 6.42
in the same run (0.86x), H 128 15.36 against 13.76 (0.90x); the BK = 32 kernel before it: 13.90 / 27.24 ms.
Without the dkv reductions (knockout) 4.79 ms at H 64: the reductions (1.21 G red.v4 requests at H 64, ~4.9 ms at
bench/red_lines.py's 246 G/s) are what is left (docs/performance.md). H100, 2026-12-05 19:22 (cp.async.cg gathers): H 64
7.46 ms vs cuDNN 6.81 (0.91x), H 128 14.96 vs 13.94 (0.93x); a row's head-group CTAs adjacent in launch order
(perf/launch_order_2026-12-05T1920.txt, H 128): 14.90 -> 15.03 ms at Skv 8K, 40.0 -> 28.0 ms at Skv 64K.
"""
import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.cute.nvgpu.warp import StMatrix8x8x16bOp
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ...common.gather_sm90 import BlockGather, find_sequence, load_resident_tiles
from .rows import SlotRows
from ...common.softmax import acc_mn_view, quad_sum
from ...common.vector_red_sm90 import partner_rows, red_tile_lines, st_tile_pairs

LOG2E = math.log2(math.e)
HG = 64              # heads per CTA
BK = 64              # key slots per block
DC = 64              # kv columns per chunk
NUM_THREADS = 384
PIECE = 8            # bf16 elements per 16-byte cp.async
PRE_BAR, PDS_FULL, PDS_FREE, PDS_A = 3, 4, 5, 6
DQ_A = 4             # dq chunks [0, 4) on consumer A, [4, NC) on consumer B


class SparseAttnBwdSm90(SlotRows, BlockGather):
    """One compiled variant: (Dqk, Dv, heads, varlen, has_length, has_sink, has_dlse, deterministic)."""

    LAG = 3
    DKV_A = 2            # dkv tiles (the last chunks) consumer A adds after its dq; B adds the rest

    def __init__(self, head_dim: int, v_head_dim: int, heads: int, varlen: bool, has_length: bool, has_sink: bool,
                 has_dlse: bool, deterministic: bool = False):
        assert head_dim in (512, 576) and v_head_dim == 512 and heads in (64, 128), (head_dim, v_head_dim, heads)
        self.D, self.Dv, self.H = head_dim, v_head_dim, heads
        self.NC, self.NV = head_dim // DC, v_head_dim // DC
        self.stages = self.NC                     # one kv slot, a stage per chunk
        self.varlen, self.has_length, self.has_sink, self.has_dlse = varlen, has_length, has_sink, has_dlse
        self.stage = deterministic                # dkv rows to the staging buffer (st.v2), keys to mKeys
        self.G = heads // HG
        self.dt = cutlass.BFloat16
        self.pieces = BK * DC // PIECE // 128     # 4

    def state(self, n, c, producer):
        """Pipeline state of chunk c of block n: stage c, one fill a block (one slot)."""
        lap = n % 2
        return pipeline.PipelineState(self.stages, n * self.NC + c, c, lap ^ 1 if producer else lap)

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKv: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor,
                 mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor, mdQ: cute.Tensor,
                 mdKV: cute.Tensor, mdSink: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, mKeys: cute.Tensor,
                 row0: Int32, scale: Float32, stream):
        """Deterministic variant: mdKV is the staging buffer fp32 [E G, Dqk] and mKeys int32 [E] of the rows
        [row0, row0 + E / (B K)) (E = rows x B x K, B = 1 for THD); otherwise mKeys is None and row0 0."""
        D, Dv, H, dt = self.D, self.Dv, self.H, self.dt
        if cutlass.const_expr(self.varlen):
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D, 1), stride=(mQ.stride[1], 1, 0)))
            do_v = cute.make_tensor(mdO.iterator, cute.make_layout((mdO.shape[0] * H, Dv, 1),
                                                                   stride=(mdO.stride[1], 1, 0)))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[0], D, 1), stride=(mKv.stride[0], 1, 0)))
            dkv_v = cute.make_tensor(mdKV.iterator, cute.make_layout((mdKV.shape[0], D, 1),
                                                                     stride=(mdKV.stride[0], 1, 0)))
            batch = 1
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            do_v = cute.make_tensor(mdO.iterator, cute.make_layout((mdO.shape[1] * H, Dv, mdO.shape[0]),
                                                                   stride=(mdO.stride[2], 1, mdO.stride[0])))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[1], D, mKv.shape[0]),
                                                                   stride=(mKv.stride[1], 1, mKv.stride[0])))
            dkv_v = cute.make_tensor(mdKV.iterator, cute.make_layout((mdKV.shape[1], D, mdKV.shape[0]),
                                                                     stride=(mdKV.stride[1], 1, mdKV.stride[0])))
            batch = mQ.shape[0]
        if cutlass.const_expr(self.stage):
            dkv_v = cute.make_tensor(mdKV.iterator, cute.make_layout((mdKV.shape[0], D), stride=(D, 1)))
        rows = mQ.shape[0] if cutlass.const_expr(self.varlen) else mQ.shape[1]
        if cutlass.const_expr(self.stage):
            rows = mKeys.shape[0] // (batch * mIdx.shape[len(mIdx.shape) - 1])
        grid = self.launch_grid(rows, batch)
        K, MN, L = OperandMajorMode.K, OperandMajorMode.MN, LayoutEnum
        mma = lambda a, b, **kw: sm90_utils.make_trivial_tiled_mma(dt, dt, a, b, Float32, (1, 1, 1),  # noqa: E731
                                                                    tiler_mn=(64, 64), **kw)
        # S / dP (first k-step overwrites), S / dP accumulate, dq, dkv (keys as M)
        mmas = (mma(K, K), mma(K, K), mma(K, MN), mma(MN, MN))
        layouts = (
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (HG, BK, D), dt, 1),             # Q (h, c): S A
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (BK, DC, HG), dt, self.NC),      # Q chunks (c, h): dkv B
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (HG, BK, Dv), dt, 1),            # dout (h, v): dP A
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (BK, DC, HG), dt, self.NV),      # dout chunks (v, h): dkv B
            sm90_utils.make_smem_layout_b(L.ROW_MAJOR, (HG, BK, DC), dt, self.stages),  # kv (key, c): S / dP B
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (HG, DC, BK), dt, self.stages),  # kv (c, key): dq B
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (HG, DC, BK), dt, 1),            # dS / P (h, key): dq A
            sm90_utils.make_smem_layout_a(L.COL_MAJOR, (BK, DC, HG), dt, 1))            # dS / P (key, h): dkv A
        sQ_l, _, sdO_l, _, sK_l, _, sS_l, _ = layouts
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, q_v, cute.slice_(sQ_l, (None, None, 0)), (HG, D))
        tma_do, tdO = cpasync.make_tiled_tma_atom(g2s, do_v, cute.slice_(sdO_l, (None, None, 0)), (HG, Dv))
        self.tma_bytes = HG * (D + Dv) * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sStat: cute.struct.MemRange[Float32, 4 * HG]
            sRows: cute.struct.MemRange[Int32, 2 * BK]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_l)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdO_l)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_l)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sS_l)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sS_l)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(tma_q, tQ, tma_do, tdO, kv_v, dkv_v, mIdx, mLen, mSink, mO, mdO, mLSE, mdLSE, mdQ, mdSink, mCuQ,
                    mCuK, mKeys, row0, scale, mmas, layouts).launch(grid=grid, block=(NUM_THREADS, 1, 1), stream=stream,
                                                       min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_do: cute.CopyAtom, tdO: cute.Tensor,
               mKv: cute.Tensor, mdKV: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor,
               mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor, mdQ: cute.Tensor,
               mdSink: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, mKeys: cute.Tensor, row0: Int32,
               scale: Float32, mmas, layouts):
        tidx, _, _ = cute.arch.thread_idx()
        rel, grp, batch = self.grid_coords()
        row = rel
        if cutlass.const_expr(self.stage):
            row = row0 + rel
        g = (tma_q, tQ, tma_do, tdO, mKv, mdKV, mIdx, mLen, mSink, mO, mdO, mLSE, mdLSE, mdQ, mdSink, scale, mKeys, rel)
        if cutlass.const_expr(self.varlen):
            n_seq = mCuQ.shape[0] - 1
            if row >= mCuQ[n_seq]:
                self.clear_row(mdQ, mdSink, mKeys, mIdx.shape[1], row, rel, grp, tidx)
            else:
                b = find_sequence(mCuQ, n_seq, row, tidx % 32)
                k_off = mCuK[b]
                self.backward_row(g, mmas, layouts, tidx, grp, Int32(0), row, k_off, mCuK[b + 1] - k_off)
        else:
            self.backward_row(g, mmas, layouts, tidx, grp, batch, row, Int32(0), mKv.shape[0])

    @cute.jit
    def clear_row(self, mdQ: cute.Tensor, mdSink: cute.Tensor, mKeys: cute.Tensor, n_slots: Int32, row: Int32,
                  rel: Int32, grp: Int32, tidx: Int32):
        """A THD row at or past cu_seqlens_q[-1]: dq 0 and d_sink_rows 0 for this CTA's heads (deterministic: keys
        -1, no entry)."""
        h0 = grp * HG
        if cutlass.const_expr(self.stage):
            if grp == 0:
                for i in cutlass.range(tidx, n_slots, NUM_THREADS, unroll=1):
                    mKeys[rel * n_slots + i] = Int32(-1)
        for i in cutlass.range(tidx, HG * self.D, NUM_THREADS, unroll=1):
            mdQ[row, h0 + i // self.D, i % self.D] = self.dt(0.0)
        if cutlass.const_expr(self.has_sink):
            if tidx < HG:
                mdSink[row, h0 + tidx] = Float32(0.0)

    GATHER_BK = BK

    def gather_dst(self, sK, r, col, index):
        return cute.local_tile(sK[r, None, index], (PIECE,), (col,))

    @cute.jit
    def backward_row(self, g, mmas, layouts, tidx: Int32, grp: Int32, batch: Int32, row: Int32, k_off: Int32,
                     seqlen_k: Int32):
        tma_q, tQ, tma_do, tdO, mKv, mdKV, mIdx, mLen, mSink, mO, mdO, mLSE, mdLSE, mdQ, mdSink, scale, mKeys, rel = g
        sQ_l, sQc_l, sdO_l, sdOc_l, sK_l, sKt_l, sS_l, sSt_l = layouts
        D, Dv = self.D, self.Dv
        n_slots = mIdx.shape[1] if cutlass.const_expr(self.varlen) else mIdx.shape[2]
        row_len = n_slots
        if cutlass.const_expr(self.has_length):
            row_len = cutlass.max(cutlass.min(n_slots, mLen[self.row_coord(batch, row)]), Int32(0))
        n_blk = (row_len + BK - 1) // BK

        smem = SmemAllocator()
        st = smem.allocate(self.shared_storage)
        sQ = st.sQ.get_tensor(sQ_l.outer, swizzle=sQ_l.inner)
        sQc = st.sQ.get_tensor(sQc_l.outer, swizzle=sQc_l.inner)
        sdO = st.sdO.get_tensor(sdO_l.outer, swizzle=sdO_l.inner)
        sdOc = st.sdO.get_tensor(sdOc_l.outer, swizzle=sdOc_l.inner)
        sK = st.sKV.get_tensor(sK_l.outer, swizzle=sK_l.inner)
        sKt = st.sKV.get_tensor(sKt_l.outer, swizzle=sKt_l.inner)
        sdS = st.sdS.get_tensor(sS_l.outer, swizzle=sS_l.inner)
        sdSt = st.sdS.get_tensor(sSt_l.outer, swizzle=sSt_l.inner)
        sP = st.sP.get_tensor(sS_l.outer, swizzle=sS_l.inner)
        sPt = st.sP.get_tensor(sSt_l.outer, swizzle=sSt_l.inner)
        sStat = st.sStat.get_tensor(cute.make_layout((4, HG), stride=(HG, 1)))   # Delta, lse+ L2, lse L2, dlse
        sRows = st.sRows.get_tensor(cute.make_layout((2, BK), stride=(BK, 1)))    # gathered kv rows, -1: invalid
        q_bar = st.mbar_q.data_ptr()
        qrow = row * (self.H // HG) + grp
        gQ = cute.local_tile(tQ[None, None, batch], (HG, D), (qrow, 0))
        gdO = cute.local_tile(tdO[None, None, batch], (HG, Dv), (qrow, 0))
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ[None, None, 0], 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        tdOs, tdOg = cpasync.tma_partition(tma_do, 0, cute.make_layout(1),
                                           cute.group_modes(sdO[None, None, 0], 0, 2), cute.group_modes(gdO, 0, 2))
        pipe = self.gather_pipeline(st.mbar.data_ptr(), 256, q_bar, tidx)

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            cute.arch.setmaxregister_decrease(40)
            if warp == 0:
                load_resident_tiles(q_bar, self.tma_bytes, ((tma_q, tQg, tQs), (tma_do, tdOg, tdOs)))
            if cutlass.const_expr(self.stage):
                # entry (rel, batch, slot) of the chunk is ebase + slot; its key the global kv row
                n_batch = 1 if cutlass.const_expr(self.varlen) else mIdx.shape[0]
                ebase = (rel * n_batch + batch) * n_slots
                key_off = Int32(0) if cutlass.const_expr(self.varlen) else batch * seqlen_k
                self.produce(pipe, sK, mKv, mIdx, batch, row, row_len, n_blk, k_off, seqlen_k, tidx,
                             (sRows, mKeys, ebase, n_slots, key_off, grp))
                if grp == 0:        # the slots past the last block: no entry
                    for i in cutlass.range(n_blk * BK + tidx, n_slots, 128, unroll=1):
                        mKeys[ebase + i] = Int32(-1)
            else:
                self.produce(pipe, sK, mKv, mIdx, batch, row, row_len, n_blk, k_off, seqlen_k, tidx, sRows)
        else:
            cute.arch.setmaxregister_increase(232)
            ctid = tidx - 128
            self.row_stats(sStat, mO, mdO, mLSE, mdLSE, mSink, batch, row, grp, ctid)
            pipeline.NamedBarrier(barrier_id=PRE_BAR, num_threads=256).arrive_and_wait()   # sStat by 64 + 256 lanes
            mma_s, mma_s_acc, mma_dq, mma_dkv = mmas     # MMA fields fixed once, outside the branches
            mma_s.set(warpgroup.Field.ACCUMULATE, False)
            mma_s_acc.set(warpgroup.Field.ACCUMULATE, True)
            mma_dq.set(warpgroup.Field.ACCUMULATE, True)
            mma_dkv.set(warpgroup.Field.ACCUMULATE, True)
            t = ctid % 128
            cute.arch.mbarrier_wait(q_bar, 0)
            if wg == 1:
                self.consume_a(pipe, mmas, (sQ[None, None, 0], sdO[None, None, 0], sK, sKt, sdS[None, None, 0],
                                            sP[None, None, 0], sStat, sRows, sQc, sdOc, sdSt[None, None, 0],
                                            sPt[None, None, 0]), mdKV, mdQ, mdSink, mSink, scale, t, grp, batch, row,
                               n_blk)
            else:
                self.consume_b(pipe, mmas, (sQc, sdOc, sKt, sdS[None, None, 0], sdSt[None, None, 0],
                                            sPt[None, None, 0], sRows), mdKV, mdQ, t, grp, batch, row, n_blk)

    @cute.jit
    def row_stats(self, sStat: cute.Tensor, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
                  mSink: cute.Tensor, batch: Int32, row: Int32, grp: Int32, ctid: Int32):
        """sStat[0, h] = Delta (4 lanes a head, 16-byte loads side by side, quad-summed), [1, h] = lse+ log2 e,
        [2, h] = lse log2 e, [3, h] = dlse (0 without)."""
        h0 = grp * HG
        h = ctid // 4
        o_row = mO[self.vec_coord(batch, row, h0 + h, None)]
        do_row = mdO[self.vec_coord(batch, row, h0 + h, None)]
        ro = cute.make_rmem_tensor((PIECE,), self.dt)
        rdo = cute.make_rmem_tensor((PIECE,), self.dt)
        part = Float32(0.0)
        for i in cutlass.range_constexpr(self.Dv // (4 * PIECE)):     # 16-byte loads, 4 lanes side by side
            j = i * 4 + ctid % 4
            cute.autovec_copy(cute.local_tile(o_row, (PIECE,), (j,)), ro)
            cute.autovec_copy(cute.local_tile(do_row, (PIECE,), (j,)), rdo)
            for k in cutlass.range_constexpr(PIECE):
                part = part + Float32(ro[k]) * Float32(rdo[k])
        part = quad_sum(part)
        if ctid % 4 == 0:
            sStat[0, h] = part
        if ctid < HG:
            lse = mLSE[self.lse_coord(batch, row, h0 + ctid)]
            lsep = lse
            if cutlass.const_expr(self.has_sink):
                sk = mSink[h0 + ctid]
                hi = Float32(cutlass.select_(lse < sk, sk, lse))        # NaN in either reaches lsep
                lo = Float32(cutlass.select_(lse < sk, lse, sk))
                lsep = hi + cute.math.log(Float32(1.0) + cute.math.exp(lo - hi, fastmath=False), fastmath=False)
                lsep = Float32(cutlass.select_(lo == -Float32.inf or hi == Float32.inf, hi, lsep))   # no inf - inf
            sStat[1, ctid] = lsep * Float32(LOG2E)
            sStat[2, ctid] = lse * Float32(LOG2E)
            dl = Float32(0.0)
            if cutlass.const_expr(self.has_dlse):
                dl = mdLSE[self.lse_coord(batch, row, h0 + ctid)]
            sStat[3, ctid] = dl

    @cute.jit
    def consume_a(self, pipe, mmas, sv, mdKV: cute.Tensor, mdQ: cute.Tensor, mdSink: cute.Tensor, mSink: cute.Tensor,
                  scale: Float32, t: Int32, grp: Int32, batch: Int32, row: Int32, n_blk: Int32):
        """Consumer A: S, dP, P, dS; sP / sdS; dq[:, 0:256]; the dkv tiles of the last DKV_A chunks; the d_sink
        rows."""
        sQ2, sdO2, sK, sKt, sdS2, sP2, sStat, sRows, sQc, sdOc, sdSt2, sPt2 = sv
        mma_s, mma_s_acc, mma_dq, mma_dkv = mmas
        NC, NV = self.NC, self.NV
        thr_s = mma_s.get_slice(t)
        tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ2))
        tSrdO = thr_s.make_fragment_A(thr_s.partition_A(sdO2))
        tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK))
        s_id = acc_mn_view(thr_s.partition_C(cute.make_identity_tensor((HG, BK))))
        (tArdS, tQrK, q_id, acc_dq), (thr_kv, kfrags, k_id) = self.dq_dkv_operands(
            mma_dq, mma_dkv, t, (sdS2, sKt, sdSt2, sPt2, sQc, sdOc), DQ_A)
        n_cols = cute.size(s_id, mode=[1])
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dt), mma_s)
        thr_r2s = r2s.get_slice(t)
        valid = cute.make_rmem_tensor((n_cols,), cutlass.Boolean)
        c2 = scale * Float32(LOG2E)
        kpc = DC // 16
        krow_b = cute.make_rmem_tensor((2, 2), Int32)
        lane = cute.arch.lane_idx()
        for n in cutlass.range(n_blk, unroll=1):
            # ---- S = Q K^T and dP = dout V^T, chunk by chunk as the gather publishes them
            acc_s = thr_s.make_fragment_C(thr_s.partition_shape_C((HG, BK)))
            acc_dp = thr_s.make_fragment_C(thr_s.partition_shape_C((HG, BK)))
            for c in cutlass.range_constexpr(NC):
                s = self.state(n, c, False)
                pipe.consumer_wait(s)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(kpc):
                    mma = mma_s if c == 0 and kb == 0 else mma_s_acc
                    cute.gemm(mma, acc_s, tSrQ[None, None, c * kpc + kb], tSrK[None, None, kb, s.index], acc_s)
                    if cutlass.const_expr(c < NV):
                        cute.gemm(mma, acc_dp, tSrdO[None, None, c * kpc + kb], tSrK[None, None, kb, s.index], acc_dp)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            for ci in cutlass.range_constexpr(n_cols):     # the producer's gathered rows (chunk 0 waited)
                valid[ci] = sRows[n % 2, s_id[0, ci][1]] >= 0
            for c in cutlass.range_constexpr(DQ_A, NC):    # this consumer's last reads of chunks >= DQ_A
                pipe.consumer_release(self.state(n, c, False))
            rdS, rP = self.probs(acc_s, acc_dp, valid, s_id, sStat, c2, scale)
            if n > 0:           # consumer B's wgmmas of block n - 1 reading sP / sdS retired
                pipeline.NamedBarrier(barrier_id=PDS_FREE, num_threads=256).arrive_and_wait()
            cute.copy(r2s, thr_r2s.retile(rdS), thr_r2s.partition_D(sdS2))
            cute.copy(r2s, thr_r2s.retile(rP), thr_r2s.partition_D(sP2))
            cute.arch.fence_proxy("async.shared", space="cta")       # this thread's stores -> the wgmmas (async proxy)
            pipeline.NamedBarrier(barrier_id=PDS_FULL, num_threads=256).arrive()
            pipeline.NamedBarrier(barrier_id=PDS_A, num_threads=128).arrive_and_wait()    # all of A's stores, for A
            # ---- dq[:, 0:256] += dS K[:, 0:256]
            warpgroup.fence()
            for i in cutlass.range_constexpr(DQ_A):
                for kb in cutlass.range_constexpr(BK // 16):
                    cute.gemm(mma_dq, acc_dq[i], tArdS[None, None, kb], tQrK[None, None, kb, i], acc_dq[i])
            warpgroup.commit_group()
            if cutlass.const_expr(self.DKV_A > 0):
                self.dkv_rows(krow_b, sRows, n, k_id, lane)
            warpgroup.wait_group(0)
            for c in cutlass.range_constexpr(DQ_A):
                pipe.consumer_release(self.state(n, c, False))
            # ---- dkv tiles of the last DKV_A chunks (A's share of the reductions)
            if cutlass.const_expr(self.DKV_A > 0):
                self.dkv_tiles(mma_dkv, kfrags, thr_kv, krow_b, lane, mdKV, batch,
                               NC - self.DKV_A, NC, pipe, n, n + 1 < n_blk, False)

        # ---- epilogue: dq (scale already in dS), d_sink rows
        self.store_dq(acc_dq, q_id, mdQ, batch, row, grp, 0)
        h0 = grp * HG
        if cutlass.const_expr(self.has_sink):
            if t < HG:
                sk = mSink[h0 + t]
                arg = sk * Float32(LOG2E) - sStat[1, t]
                # a sink of -inf takes no share (its lse+ is -inf too in a row with no valid slot: no -inf - -inf)
                arg = Float32(cutlass.select_(sk == -Float32.inf, -Float32.inf, arg))
                arg = Float32(cutlass.select_(arg > Float32(0.0), Float32(0.0), arg))      # keeps NaN
                mdSink[self.head_coord(batch, row, h0 + t)] = -cute.math.exp2(arg, fastmath=False) * sStat[0, t]

    @cute.jit
    def consume_b(self, pipe, mmas, sv, mdKV: cute.Tensor, mdQ: cute.Tensor, t: Int32, grp: Int32, batch: Int32,
                  row: Int32, n_blk: Int32):
        """Consumer B: dq[:, 256:Dqk] (SS), then the block's dkv tiles (keys as M) and their reductions."""
        sQc, sdOc, sKt, sdS2, sdSt2, sPt2, sRows = sv
        _, _, mma_dq, mma_dkv = mmas
        NC, NV = self.NC, self.NV
        n_dq = NC - DQ_A
        (tQrdS, tQrK, q_id, acc_dq), (thr_kv, kfrags, k_id) = self.dq_dkv_operands(
            mma_dq, mma_dkv, t, (sdS2, sKt, sdSt2, sPt2, sQc, sdOc), n_dq)
        krow_b = cute.make_rmem_tensor((2, 2), Int32)
        lane = cute.arch.lane_idx()
        for n in cutlass.range(n_blk, unroll=1):
            pipeline.NamedBarrier(barrier_id=PDS_FULL, num_threads=256).arrive_and_wait()   # sP / sdS(n) written
            for c in cutlass.range_constexpr(NC):
                pipe.consumer_wait(self.state(n, c, False))       # (completed before PDS_FULL: returns at once)
            self.dkv_rows(krow_b, sRows, n, k_id, lane)
            warpgroup.fence()
            for i in cutlass.range_constexpr(n_dq):
                for kb in cutlass.range_constexpr(BK // 16):
                    cute.gemm(mma_dq, acc_dq[i], tQrdS[None, None, kb], tQrK[None, None, kb, DQ_A + i], acc_dq[i])
            warpgroup.commit_group()
            self.dkv_tiles(mma_dkv, kfrags, thr_kv, krow_b, lane, mdKV, batch, 0, NC - self.DKV_A,
                           pipe, n, n + 1 < n_blk, True)
        self.store_dq(acc_dq, q_id, mdQ, batch, row, grp, DQ_A)

    def dq_dkv_operands(self, mma_dq, mma_dkv, t, smem, n_dq: int):
        """Both consumers' dq and dkv operands: (A = sdS, B = the kv chunks (c, key), the dq coordinates, n_dq zeroed
        64 x 64 accumulators), (the dkv thread slice, (sdS^T, sP^T, Q chunks, dout chunks), the dkv coordinates)."""
        sdS2, sKt, sdSt2, sPt2, sQc, sdOc = smem
        thr_dq = mma_dq.get_slice(t)
        thr_kv = mma_dkv.get_slice(t)
        acc_dq = [thr_dq.make_fragment_C(thr_dq.partition_shape_C((HG, DC))) for _ in range(n_dq)]
        for acc in acc_dq:
            acc.fill(0.0)
        dq = (thr_dq.make_fragment_A(thr_dq.partition_A(sdS2)), thr_dq.make_fragment_B(thr_dq.partition_B(sKt)),
              acc_mn_view(thr_dq.partition_C(cute.make_identity_tensor((HG, DC)))), acc_dq)
        kfrags = (thr_kv.make_fragment_A(thr_kv.partition_A(sdSt2)), thr_kv.make_fragment_A(thr_kv.partition_A(sPt2)),
                  thr_kv.make_fragment_B(thr_kv.partition_B(sQc)), thr_kv.make_fragment_B(thr_kv.partition_B(sdOc)))
        return dq, (thr_kv, kfrags, acc_mn_view(thr_kv.partition_C(cute.make_identity_tensor((BK, DC)))))

    @cute.jit
    def dkv_tiles(self, mma_dkv, frags, thr_kv, krow_b, lane: Int32, mdKV: cute.Tensor, batch: Int32,
                  c0: cutlass.Constexpr, c1: cutlass.Constexpr, pipe, n: Int32, has_next, is_b: cutlass.Constexpr):
        """The dkv tiles of chunks [c0, c1), one at a time (wgmmas, wait, reductions). Consumer B (is_b) also
        releases every kv chunk at the first wait (its dq wgmmas, its only kv reads, retired there) and arrives on
        PDS_FREE at the last (its last reads of sP / sdS(n) retired)."""
        tKrdS, tKrP, tKrQ, tKrdO = frags
        acc_kv = thr_kv.make_fragment_C(thr_kv.partition_shape_C((BK, DC)))
        for c in cutlass.range_constexpr(c0, c1):
            self.issue_dkv(mma_dkv, acc_kv, tKrdS, tKrP, tKrQ, tKrdO, c)
            warpgroup.wait_group(0)
            if cutlass.const_expr(is_b and c == c0):
                for cc in cutlass.range_constexpr(self.NC):
                    pipe.consumer_release(self.state(n, cc, False))
            if cutlass.const_expr(is_b and c == c1 - 1):
                if has_next:
                    pipeline.NamedBarrier(barrier_id=PDS_FREE, num_threads=256).arrive()
            self.add_dkv(acc_kv, krow_b, lane, mdKV, batch, c * DC)

    @cute.jit
    def issue_dkv(self, mma_dkv, acc, tKrdS, tKrP, tKrQ, tKrdO, c: cutlass.Constexpr):
        """dkv tile of chunk c (64 keys x 64 columns) = dS^T Q_c (scale in dS) + P^T dout_c (c < Dv / 64): one
        committed group."""
        acc.fill(0.0)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(HG // 16):
            cute.gemm(mma_dkv, acc, tKrdS[None, None, kb], tKrQ[None, None, kb, c], acc)
        if cutlass.const_expr(c < self.NV):
            for kb in cutlass.range_constexpr(HG // 16):
                cute.gemm(mma_dkv, acc, tKrP[None, None, kb], tKrdO[None, None, kb, c], acc)
        warpgroup.commit_group()

    @cute.jit
    def add_dkv(self, acc_kv, krow_b, lane: Int32, mdKV: cute.Tensor, batch: Int32, col0: cutlass.Constexpr):
        """The retired dkv tile (64 keys x 64 columns from col0) added to global fp32 at the valid keys' rows
        (deterministic: stored to their staging rows)."""
        if cutlass.const_expr(self.stage):
            st_tile_pairs(acc_mn_view(acc_kv), krow_b[0, 0], krow_b[0, 1], lane, mdKV, col0)
        else:
            red_tile_lines(acc_mn_view(acc_kv), krow_b, lane, mdKV, batch, col0, DC // 32)

    def dkv_rows(self, krow_b, sRows, n, k_id, lane):
        """The dkv destination rows of block n for add_dkv (a plain function, traced inline): the rows line_rows
        hands this lane (partner_rows) from sRows (the kv rows), or deterministic its own two staging rows in
        krow_b[0, :] (publish_rows)."""
        own0, own1 = sRows[n % 2, k_id[0, 0][0]], sRows[n % 2, k_id[1, 0][0]]
        if self.stage:
            krow_b[0, 0] = own0
            krow_b[0, 1] = own1
        else:
            partner_rows(krow_b, own0, own1, lane)

    def publish_rows(self, sRows, rows, n, tidx, b=0):
        """The producer's slot rows of block n (gather_sm90.BlockGather.publish_rows, same threads, same ordering);
        deterministic (sRows = (the tensor, mKeys, ebase, n_slots, key_off, grp)): a valid slot's staging row
        (ebase + slot) G + grp instead of its kv row, and head group 0 writes mKeys[ebase + slot] = its global kv
        row (-1: invalid) for the slots < n_slots. A plain function, traced inline."""
        if not self.stage:
            return BlockGather.publish_rows(self, sRows, rows, n, tidx, b)
        return self.publish_stage_rows(*sRows, rows, n, tidx, b)

    @cute.jit
    def publish_stage_rows(self, sRows: cute.Tensor, mKeys: cute.Tensor, ebase: Int32, n_slots: Int32, key_off: Int32,
                           grp: Int32, rows, n: Int32, tidx: Int32, b: cutlass.Constexpr = 0):
        per_row = DC // PIECE
        if tidx % per_row == 0:
            for p in cutlass.range_constexpr(self.pieces):
                r = (tidx + 128 * p) // per_row
                slot = n * BK + r
                ok = rows[p, b] >= 0
                sRows[n % 2, r] = Int32(cutlass.select_(ok, (ebase + slot) * self.G + grp, Int32(-1)))
                if grp == 0:
                    if slot < n_slots:
                        mKeys[ebase + slot] = Int32(cutlass.select_(ok, rows[p, b] + key_off, Int32(-1)))

    @cute.jit
    def store_dq(self, acc_dq, q_id, mdQ: cute.Tensor, batch: Int32, row: Int32, grp: Int32, chunk0: cutlass.Constexpr):
        h0 = grp * HG
        for i in cutlass.range_constexpr(len(acc_dq)):
            o_mn = acc_mn_view(acc_dq[i])
            col0 = (i + chunk0) * DC
            for r in cutlass.range_constexpr(2):
                for ci in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                    mdQ[self.vec_coord(batch, row, h0 + q_id[r, ci][0], col0 + q_id[r, ci][1])] = self.dt(o_mn[r, ci])

    @cute.jit
    def probs(self, acc_s, acc_dp, valid, s_id, sStat, c2: Float32, scale: Float32):
        """Consumer A: P (and Pn) from S, dS = P (dP - Delta) + dlse Pn; returns (bf16(scale dS), bf16(P)) in the
        accumulator layout."""
        s_mn = acc_mn_view(acc_s)
        dp_mn = acc_mn_view(acc_dp)
        for r in cutlass.range_constexpr(2):
            h = s_id[r, 0][0]
            delta, lsep2, lse2, dl = sStat[0, h], sStat[1, h], sStat[2, h], sStat[3, h]
            for ci in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                x = s_mn[r, ci] * c2
                a = x - lsep2
                a = Float32(cutlass.select_(a > Float32(0.0), Float32(0.0), a))             # keeps NaN
                p = Float32(cutlass.select_(valid[ci], cute.math.exp2(a, fastmath=True), Float32(0.0)))
                ds = p * (dp_mn[r, ci] - delta)
                if cutlass.const_expr(self.has_dlse):
                    an = x - lse2
                    an = Float32(cutlass.select_(an > Float32(0.0), Float32(0.0), an))
                    pn = Float32(cutlass.select_(valid[ci], cute.math.exp2(an, fastmath=True), Float32(0.0)))
                    ds = ds + dl * pn
                ds = Float32(cutlass.select_(valid[ci], ds, Float32(0.0)))
                dp_mn[r, ci] = ds * scale
                s_mn[r, ci] = p
        rdS = cute.make_rmem_tensor(acc_dp.layout, self.dt)
        rdS.store(acc_dp.load().to(self.dt))
        rP = cute.make_rmem_tensor(acc_s.layout, self.dt)
        rP.store(acc_s.load().to(self.dt))
        return rdS, rP
