# ab_sparse_attn.py --prepare main: the base kernel (untracked; --clean removes it)
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

Tiling. One CTA = one query row and 64 heads (grid y = H / 64). Resident: Q (64 x Dqk, 72 KiB) and dout (64 x Dv,
64 KiB), both by TMA. Slots in blocks of BK = 32; a block's kv rows gathered by cp.async (producer warpgroup, as in
the forward; invalid slots zero-filled; the block's gathered rows, -1 where invalid, to sRows) into one of two slots
of NC = Dqk / 64 chunks of 32 x 64 (4 KiB).
Consumer warpgroups:
  - w = 0: S = Q K^T (m64 n32 k16, 9 x 4 k-steps), P (and Pn with dlse), then, once sdP(n) is full (mbarrier), dS
    from sdP, writes sdS = bf16(c dS) and sP = bf16(P) (stmatrix, fence.proxy.async, DS_BAR);
  - w = 1: dP = dout V^T (m64 n32 k16, 8 x 4 k-steps) one block ahead: dP(n + 1) is issued before DS_BAR(n), so it
    runs on the tensor pipe while w = 0 turns S(n) into dS(n); after DS_BAR(n) it goes to sdP (fp32, in its
    accumulator order: w = 0 reads the same (row, col) at the same index) and each thread arrives on the sdP-full
    mbarrier (dP(0) before the loop);
  - both: dq chunks (w = 0: 0-4, w = 1: 5-8; accumulators 64 x 64 in registers over all blocks; A = sdS, B = the kv
    chunk read MN-major) and dkv^T chunks (w = 0: 5-8, w = 1: 0-4; 64 columns x 32 keys: A = Q^T / dout^T read
    MN-major from the resident tiles, B = sdS / sP read MN-major), each dkv tile added to global fp32 with
    red.global.add.v4.f32 (valid keys only; a 4 x 4 lane transpose first: ops/common/vector_red_sm90.py
    transpose_quad; one tile at a time: a second accumulator to overlap them measured no faster on the H200 and
    made ptxas serialize the wgmmas of the topk_length variants for want of registers); then the slot's chunks are
    released.
Shared-memory handoffs: sdP(n) written by w = 1 (generic stores), then its 128 arrivals on the sdP-full mbarrier
(phase n % 2), read by w = 0 after waiting that phase; rewritten (n + 1) only after DS_BAR(n), which w = 0 passes after
its reads. sdS / sP(n) written by w = 0 (then fence.proxy.async), read by both warpgroups' wgmmas after DS_BAR(n);
rewritten (n + 1) only after w = 0's own wgmmas of block n retired (its wait_group 0) and, through DS_FREE (w = 1
arrives after its wait_group 0 of block n, w = 0 syncs before its stores), after w = 1's. sStat (Delta, lse+, lse,
dlse) written by 64 threads before the loop, read after PRE_BAR. kv chunks: as the forward (full: 128 producer
arrivals; empty: 256 consumer arrivals; w = 1 waits block n + 1's full barriers early, the producer refills a slot
only after both consumers released it). sRows[n % 2] (slot validity and the dkv rows): as the forward's, written
before chunk 0 of block n is published, read after its full barrier, rewritten only after both consumers released
chunk 0 of block n.
Shared memory (Dqk 576): 72 + 64 + 72 + 4 + 4 + 8 KiB = 224 KiB of 227.

Layouts: as the forward; out/dout bf16 [B,Sq,H,Dv] / [Tq,H,Dv], dq bf16 like q, dkv fp32 [B,Skv,Dqk] / [Tkv,Dqk]
(accumulated: zero it first; the seam does), dlse like lse, d_sink_rows fp32 [B,Sq,H] / [Tq,H] (every element
written). Not deterministic: dkv sums arrive in any order (fp32 atomics).

Status: H200 2026-12-04 (16:35-16:47 UTC): tests/gpu/test_dsa_sparse_attn_bwd.py passed (23), racecheck / memcheck
clean; Sq 4K, Skv 8K, top-k 2048, 576 / 512, H 64 with a sink: 13.79 ms (212 TFLOP/s; 14.77 in an A/B run with the
kernel before dP ran a block ahead) against cuDNN frontend's 6.36 ms in the same run (docs/performance.md). The dkv
reductions are the largest single cost: without them (a knockout) the same call takes 9.13 ms.
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
from ...common.vector_red_sm90 import red_add_v4, transpose_quad

LOG2E = math.log2(math.e)
HG = 64              # heads per CTA
BK = 32              # key slots per block
DC = 64              # kv columns per chunk
NUM_THREADS = 384
PIECE = 8            # bf16 elements per 16-byte cp.async
PRE_BAR, DS_BAR, DS_FREE = 3, 5, 6
DQ_SPLIT = 5         # dq chunks [0, 5) on consumer 0, [5, NC) on consumer 1; dkv chunks the other way round


class SparseAttnBwdSm90(SlotRows, BlockGather):
    """One compiled variant: (Dqk, Dv, heads, varlen, has_length, has_sink, has_dlse)."""

    LAG = 3

    def __init__(self, head_dim: int, v_head_dim: int, heads: int, varlen: bool, has_length: bool, has_sink: bool,
                 has_dlse: bool):
        assert head_dim in (512, 576) and v_head_dim == 512 and heads in (64, 128), (head_dim, v_head_dim, heads)
        self.D, self.Dv, self.H = head_dim, v_head_dim, heads
        self.NC, self.NV = head_dim // DC, v_head_dim // DC
        self.stages = 2 * self.NC
        self.varlen, self.has_length, self.has_sink, self.has_dlse = varlen, has_length, has_sink, has_dlse
        self.dt = cutlass.BFloat16
        self.pieces = BK * DC // PIECE // 128     # 2

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKv: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor,
                 mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor, mdQ: cute.Tensor,
                 mdKV: cute.Tensor, mdSink: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, scale: Float32,
                 stream):
        D, Dv, H, dt = self.D, self.Dv, self.H, self.dt
        if cutlass.const_expr(self.varlen):
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D, 1), stride=(mQ.stride[1], 1, 0)))
            do_v = cute.make_tensor(mdO.iterator, cute.make_layout((mdO.shape[0] * H, Dv, 1),
                                                                   stride=(mdO.stride[1], 1, 0)))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[0], D, 1), stride=(mKv.stride[0], 1, 0)))
            dkv_v = cute.make_tensor(mdKV.iterator, cute.make_layout((mdKV.shape[0], D, 1),
                                                                     stride=(mdKV.stride[0], 1, 0)))
            grid = (mQ.shape[0], H // HG, 1)
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            do_v = cute.make_tensor(mdO.iterator, cute.make_layout((mdO.shape[1] * H, Dv, mdO.shape[0]),
                                                                   stride=(mdO.stride[2], 1, mdO.stride[0])))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[1], D, mKv.shape[0]),
                                                                   stride=(mKv.stride[1], 1, mKv.stride[0])))
            dkv_v = cute.make_tensor(mdKV.iterator, cute.make_layout((mdKV.shape[1], D, mdKV.shape[0]),
                                                                     stride=(mdKV.stride[1], 1, mdKV.stride[0])))
            grid = (mQ.shape[1], H // HG, mQ.shape[0])
        K, MN, L = OperandMajorMode.K, OperandMajorMode.MN, LayoutEnum
        mma = lambda a, b, n: sm90_utils.make_trivial_tiled_mma(dt, dt, a, b, Float32, (1, 1, 1),  # noqa: E731
                                                                 tiler_mn=(64, n))
        mmas = (mma(K, K, BK), mma(K, K, BK), mma(K, MN, DC), mma(MN, MN, BK))   # S/dP, S/dP accumulate, dq, dkv^T
        layouts = (
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (HG, BK, D), dt, 1),             # Q (h, c): Q K^T A
            sm90_utils.make_smem_layout_a(L.COL_MAJOR, (DC, BK, HG), dt, self.NC),      # Q^T chunks (c, h): dkv A
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (HG, BK, Dv), dt, 1),            # dout (h, v): dP A
            sm90_utils.make_smem_layout_a(L.COL_MAJOR, (DC, BK, HG), dt, self.NV),      # dout^T chunks: dkv A
            sm90_utils.make_smem_layout_b(L.ROW_MAJOR, (HG, BK, DC), dt, self.stages),  # kv (key, c): S / dP B
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (HG, DC, BK), dt, self.stages),  # kv (c, key): dq B
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (HG, DC, BK), dt, 1),            # dS / P (h, key): dq A
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (DC, BK, HG), dt, 1))            # dS / P (key, h): dkv B
        sQ_l, _, sdO_l, _, sK_l, _, sS_l, _ = layouts
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, q_v, cute.slice_(sQ_l, (None, None, 0)), (HG, D))
        tma_do, tdO = cpasync.make_tiled_tma_atom(g2s, do_v, cute.slice_(sdO_l, (None, None, 0)), (HG, Dv))
        self.tma_bytes = HG * (D + Dv) * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_dp: cute.struct.MemRange[cutlass.Int64, 1]
            sStat: cute.struct.MemRange[Float32, 4 * HG]
            sRows: cute.struct.MemRange[Int32, 2 * BK]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_l)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdO_l)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_l)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sS_l)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sS_l)], 1024]
            sdP: cute.struct.Align[cute.struct.MemRange[Float32, HG * BK], 16]

        self.shared_storage = SharedStorage
        self.kernel(tma_q, tQ, tma_do, tdO, kv_v, dkv_v, mIdx, mLen, mSink, mO, mdO, mLSE, mdLSE, mdQ, mdSink, mCuQ,
                    mCuK, scale, mmas, layouts).launch(grid=grid, block=(NUM_THREADS, 1, 1), stream=stream,
                                                       min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_do: cute.CopyAtom, tdO: cute.Tensor,
               mKv: cute.Tensor, mdKV: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor,
               mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor, mdQ: cute.Tensor,
               mdSink: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, scale: Float32, mmas, layouts):
        tidx, _, _ = cute.arch.thread_idx()
        row, grp, batch = cute.arch.block_idx()
        g = (tma_q, tQ, tma_do, tdO, mKv, mdKV, mIdx, mLen, mSink, mO, mdO, mLSE, mdLSE, mdQ, mdSink, scale)
        if cutlass.const_expr(self.varlen):
            n_seq = mCuQ.shape[0] - 1
            if row >= mCuQ[n_seq]:
                self.clear_row(mdQ, mdSink, row, grp, tidx)
            else:
                b = find_sequence(mCuQ, n_seq, row, tidx % 32)
                k_off = mCuK[b]
                self.backward_row(g, mmas, layouts, tidx, grp, Int32(0), row, k_off, mCuK[b + 1] - k_off)
        else:
            self.backward_row(g, mmas, layouts, tidx, grp, batch, row, Int32(0), mKv.shape[0])

    @cute.jit
    def clear_row(self, mdQ: cute.Tensor, mdSink: cute.Tensor, row: Int32, grp: Int32, tidx: Int32):
        """A THD row at or past cu_seqlens_q[-1]: dq 0 and d_sink_rows 0 for this CTA's heads."""
        h0 = grp * HG
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
        tma_q, tQ, tma_do, tdO, mKv, mdKV, mIdx, mLen, mSink, mO, mdO, mLSE, mdLSE, mdQ, mdSink, scale = g
        sQ_l, sQt_l, sdO_l, sdOt_l, sK_l, sKt_l, sS_l, sSt_l = layouts
        D, Dv = self.D, self.Dv
        n_slots = mIdx.shape[1] if cutlass.const_expr(self.varlen) else mIdx.shape[2]
        row_len = n_slots
        if cutlass.const_expr(self.has_length):
            row_len = cutlass.max(cutlass.min(n_slots, mLen[self.row_coord(batch, row)]), Int32(0))
        n_blk = (row_len + BK - 1) // BK

        smem = SmemAllocator()
        st = smem.allocate(self.shared_storage)
        sQ = st.sQ.get_tensor(sQ_l.outer, swizzle=sQ_l.inner)
        sQt = st.sQ.get_tensor(sQt_l.outer, swizzle=sQt_l.inner)
        sdO = st.sdO.get_tensor(sdO_l.outer, swizzle=sdO_l.inner)
        sdOt = st.sdO.get_tensor(sdOt_l.outer, swizzle=sdOt_l.inner)
        sK = st.sKV.get_tensor(sK_l.outer, swizzle=sK_l.inner)
        sKt = st.sKV.get_tensor(sKt_l.outer, swizzle=sKt_l.inner)
        sdS = st.sdS.get_tensor(sS_l.outer, swizzle=sS_l.inner)
        sdSt = st.sdS.get_tensor(sSt_l.outer, swizzle=sSt_l.inner)
        sP = st.sP.get_tensor(sS_l.outer, swizzle=sS_l.inner)
        sPt = st.sP.get_tensor(sSt_l.outer, swizzle=sSt_l.inner)
        sdP = st.sdP.get_tensor(cute.make_layout(HG * BK))
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
        dp_bar = st.mbar_dp.data_ptr()
        if tidx == 0:
            cute.arch.mbarrier_init(dp_bar, 128)     # sdP full: consumer 1's 128 threads arrive
        pipe = self.gather_pipeline(st.mbar.data_ptr(), 256, q_bar, tidx)   # (its init fence and sync cover dp_bar)

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            cute.arch.setmaxregister_decrease(40)
            if warp == 0:
                load_resident_tiles(q_bar, self.tma_bytes, ((tma_q, tQg, tQs), (tma_do, tdOg, tdOs)))
            self.produce(pipe, sK, mKv, mIdx, batch, row, row_len, n_blk, k_off, seqlen_k, tidx, sRows)
        else:
            cute.arch.setmaxregister_increase(232)
            ctid = tidx - 128
            w = wg - 1
            self.row_stats(sStat, mO, mdO, mLSE, mdLSE, mSink, batch, row, grp, ctid)
            pipeline.NamedBarrier(barrier_id=PRE_BAR, num_threads=256).arrive_and_wait()   # sStat by 64 + 256 lanes
            sv = (sQ[None, None, 0], sQt, sdO[None, None, 0], sdOt, sK, sKt, sdS[None, None, 0], sdSt[None, None, 0],
                  sP[None, None, 0], sPt[None, None, 0], sdP, sStat, sRows)
            mma_s, mma_s_acc, mma_dq, mma_dkv = mmas     # MMA fields fixed once, outside the per-consumer branches
            mma_s.set(warpgroup.Field.ACCUMULATE, False)
            mma_s_acc.set(warpgroup.Field.ACCUMULATE, True)
            mma_dq.set(warpgroup.Field.ACCUMULATE, True)
            mma_dkv.set(warpgroup.Field.ACCUMULATE, True)
            args = (pipe, (q_bar, dp_bar), sv, mmas, mdKV, mdQ, mdSink, mSink, scale, ctid)
            rest = (grp, batch, row, n_blk)
            if w == 0:      # one code path per consumer: its own register accumulators (4 or 5 dq chunks)
                self.consume(*args, 0, *rest)
            else:
                self.consume(*args, 1, *rest)

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
    def consume(self, pipe, bars, sv, mmas, mdKV, mdQ, mdSink, mSink, scale: Float32, ctid: Int32,
                w: cutlass.Constexpr,
                grp: Int32, batch: Int32, row: Int32, n_blk: Int32):
        sQ2, sQt, sdO2, sdOt, sK, sKt, sdS2, sdSt2, sP2, sPt2, sdP, sStat, sRows = sv
        mma_s, mma_s_acc, mma_dq, mma_dkv = mmas
        NC = self.NC
        t = ctid % 128
        thr_s = mma_s.get_slice(t)
        thr_dq = mma_dq.get_slice(t)
        thr_kv = mma_dkv.get_slice(t)
        tSrQ = thr_s.make_fragment_A(thr_s.partition_A(sQ2))
        tSrdO = thr_s.make_fragment_A(thr_s.partition_A(sdO2))
        tSrK = thr_s.make_fragment_B(thr_s.partition_B(sK))
        tQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS2))
        tQrK = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))
        tKrQt = thr_kv.make_fragment_A(thr_kv.partition_A(sQt))
        tKrdOt = thr_kv.make_fragment_A(thr_kv.partition_A(sdOt))
        tKrdS = thr_kv.make_fragment_B(thr_kv.partition_B(sdSt2))
        tKrP = thr_kv.make_fragment_B(thr_kv.partition_B(sPt2))
        s_id = acc_mn_view(thr_s.partition_C(cute.make_identity_tensor((HG, BK))))
        q_id = acc_mn_view(thr_dq.partition_C(cute.make_identity_tensor((HG, DC))))
        k_id = acc_mn_view(thr_kv.partition_C(cute.make_identity_tensor((DC, BK))))
        n_dq = DQ_SPLIT if w == 0 else NC - DQ_SPLIT             # this consumer's dq chunks (the rest: dkv)
        n_kv = NC - n_dq
        acc_dq = [thr_dq.make_fragment_C(thr_dq.partition_shape_C((HG, DC))) for _ in range(n_dq)]
        for i in cutlass.range_constexpr(n_dq):
            acc_dq[i].fill(0.0)
        n_cols = cute.size(s_id, mode=[1])
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dt), mma_s)
        thr_r2s = r2s.get_slice(t)
        valid = cute.make_rmem_tensor((n_cols,), cutlass.Boolean)
        krow = cute.make_rmem_tensor((n_cols,), Int32)
        c2 = scale * Float32(LOG2E)
        q_bar, dp_bar = bars
        cute.arch.mbarrier_wait(q_bar, 0)
        acc_dp = thr_s.make_fragment_C(thr_s.partition_shape_C((HG, BK)))     # consumer 1: dP one block ahead
        if cutlass.const_expr(w == 1):
            if n_blk > 0:
                self.issue_rows(pipe, mma_s, mma_s_acc, acc_dp, tSrdO, tSrK, Int32(0), self.NV)
                warpgroup.wait_group(0)
                self.put_dp(acc_dp, sdP, dp_bar)
        for n in cutlass.range(n_blk, unroll=1):
            has_next = n + 1 < n_blk
            if cutlass.const_expr(w == 0):      # ---- S = Q K^T, P
                acc_s = thr_s.make_fragment_C(thr_s.partition_shape_C((HG, BK)))
                self.issue_rows(pipe, mma_s, mma_s_acc, acc_s, tSrQ, tSrK, n, NC)
                for ci in cutlass.range_constexpr(n_cols):     # the producer's gathered rows (chunk 0 waited)
                    valid[ci] = sRows[n % 2, s_id[0, ci][1]] >= 0
                warpgroup.wait_group(0)
                cute.arch.mbarrier_wait(dp_bar, n % 2)                 # sdP(n) written (consumer 1's arrivals)
                self.write_ds(acc_s, valid, s_id, sStat, sdP, sdS2, sP2, r2s, thr_r2s, c2, scale, t, n)
            else:           # ---- dP(n + 1) = dout V^T on the tensor pipe while consumer 0 turns block n's S into dS
                if has_next:
                    self.issue_rows(pipe, mma_s, mma_s_acc, acc_dp, tSrdO, tSrK, n + 1, self.NV)
            pipeline.NamedBarrier(barrier_id=DS_BAR, num_threads=256).arrive_and_wait()      # sdS, sP written
            if cutlass.const_expr(w == 1):
                if has_next:            # consumer 0 read sdP(n) before DS_BAR: sdP(n + 1) may go in now
                    warpgroup.wait_group(0)                       # dP(n + 1) retired
                    self.put_dp(acc_dp, sdP, dp_bar)
            # ---- dq (register accumulators over all blocks) and this block's dkv tiles
            for c in cutlass.range_constexpr(NC):
                pipe.consumer_wait(self.state(n, c, False))       # (a completed phase: returns at once)
            warpgroup.fence()
            for i in cutlass.range_constexpr(n_dq):
                stage = (n % 2) * NC + i + w * DQ_SPLIT
                for kb in cutlass.range_constexpr(BK // 16):
                    cute.gemm(mma_dq, acc_dq[i], tQrdS[None, None, kb], tQrK[None, None, kb, stage], acc_dq[i])
            warpgroup.commit_group()
            for ci in cutlass.range_constexpr(n_cols):
                krow[ci] = sRows[n % 2, k_id[0, ci][1]]          # the sequence's offset included
                valid[ci] = krow[ci] >= 0
            acc_kv = thr_kv.make_fragment_C(thr_kv.partition_shape_C((DC, BK)))
            for i in cutlass.range_constexpr(n_kv):
                self.issue_dkv(mma_dkv, acc_kv, tKrQt, tKrdOt, tKrdS, tKrP, i + (1 - w) * DQ_SPLIT)
                warpgroup.wait_group(0)
                if cutlass.const_expr(w == 1 and i == n_kv - 1):
                    if has_next:        # this consumer's last reads of sdS(n) / sP(n) retired: consumer 0 may rewrite
                        pipeline.NamedBarrier(barrier_id=DS_FREE, num_threads=256).arrive()
                self.add_dkv(acc_kv, k_id, valid, krow, mdKV, batch, i + (1 - w) * DQ_SPLIT)
            for c in cutlass.range_constexpr(NC):
                pipe.consumer_release(self.state(n, c, False))

        # ---- epilogue: dq (scale already in dS), d_sink rows
        h0 = grp * HG
        for i in cutlass.range_constexpr(n_dq):
            o_mn = acc_mn_view(acc_dq[i])
            col0 = (i + w * DQ_SPLIT) * DC
            for r in cutlass.range_constexpr(2):
                for ci in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                    mdQ[self.vec_coord(batch, row, h0 + q_id[r, ci][0], col0 + q_id[r, ci][1])] = self.dt(o_mn[r, ci])
        if cutlass.const_expr(self.has_sink and w == 0):
            if t < HG:
                sk = mSink[h0 + t]
                arg = sk * Float32(LOG2E) - sStat[1, t]
                # a sink of -inf takes no share (its lse+ is -inf too in a row with no valid slot: no -inf - -inf)
                arg = Float32(cutlass.select_(sk == -Float32.inf, -Float32.inf, arg))
                arg = Float32(cutlass.select_(arg > Float32(0.0), Float32(0.0), arg))      # keeps NaN
                mdSink[self.head_coord(batch, row, h0 + t)] = -cute.math.exp2(arg, fastmath=False) * sStat[0, t]

    @cute.jit
    def write_ds(self, acc_s, valid, s_id, sStat, sdP, sdS2, sP2, r2s, thr_r2s, c2: Float32, scale: Float32,
                 t: Int32, n: Int32):
        """Consumer 0: P (and Pn) from S, dS = P (dP - Delta) + dlse Pn, sdS = bf16(scale dS), sP = bf16(P) (by
        stmatrix); fenced for the async proxy, then DS_BAR is the caller's."""
        s_mn = acc_mn_view(acc_s)
        dP = cute.make_rmem_tensor(acc_s.layout, Float32)
        for e in cutlass.range_constexpr(cute.size(acc_s)):
            dP[e] = sdP[e * 128 + t]
        dp_mn = acc_mn_view(dP)
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
                dp_mn[r, ci] = ds * scale                        # in place: dP and S are not read again
                s_mn[r, ci] = p
        rdS = cute.make_rmem_tensor(acc_s.layout, self.dt)
        rdS.store(dP.load().to(self.dt))
        if n > 0:           # consumer 1's wgmmas of block n - 1 (dq, dkv: they read sdS / sP) retired
            pipeline.NamedBarrier(barrier_id=DS_FREE, num_threads=256).arrive_and_wait()
        cute.copy(r2s, thr_r2s.retile(rdS), thr_r2s.partition_D(sdS2))
        rP = cute.make_rmem_tensor(acc_s.layout, self.dt)
        rP.store(acc_s.load().to(self.dt))
        cute.copy(r2s, thr_r2s.retile(rP), thr_r2s.partition_D(sP2))
        cute.arch.fence_proxy("async.shared", space="cta")       # this thread's stores -> the wgmmas (async proxy)

    @cute.jit
    def issue_rows(self, pipe, mma_s, mma_s_acc, acc, tA, tSrK, n: Int32, n_chunks: cutlass.Constexpr):
        """acc = A K(n)^T over the first n_chunks chunks of block n (S = Q K^T: Dqk / 64 chunks, consumer 0; dP =
        dout V^T: Dv / 64, consumer 1), each chunk's full barrier waited; one committed group."""
        for c in cutlass.range_constexpr(n_chunks):
            s = self.state(n, c, False)
            pipe.consumer_wait(s)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(DC // 16):
                cute.gemm(mma_s if c == 0 and kb == 0 else mma_s_acc, acc, tA[None, None, c * (DC // 16) + kb],
                          tSrK[None, None, kb, s.index], acc)
        warpgroup.commit_group()

    @cute.jit
    def put_dp(self, acc_dp, sdP: cute.Tensor, dp_bar):
        """Consumer 1: the retired dP tile to sdP (fp32, accumulator order: consumer 0 reads the same (row, col) at
        the same index), then each thread's arrival on the sdP-full mbarrier (consumer 0 waits on it)."""
        t = cute.arch.thread_idx()[0] % 128
        for e in cutlass.range_constexpr(cute.size(acc_dp)):
            sdP[e * 128 + t] = acc_dp[e]
        cute.arch.mbarrier_arrive(dp_bar)

    @cute.jit
    def issue_dkv(self, mma_dkv, acc, tKrQt, tKrdOt, tKrdS, tKrP, chunk: cutlass.Constexpr):
        """dkv^T tile (64 columns of chunk x 32 keys) = Q^T dS (scale in dS) + dout^T P (chunks < NV): one
        committed group."""
        acc.fill(0.0)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(HG // 16):
            cute.gemm(mma_dkv, acc, tKrQt[None, None, kb, chunk], tKrdS[None, None, kb], acc)
        if cutlass.const_expr(chunk < self.NV):
            for kb in cutlass.range_constexpr(HG // 16):
                cute.gemm(mma_dkv, acc, tKrdOt[None, None, kb, chunk], tKrP[None, None, kb], acc)
        warpgroup.commit_group()

    @cute.jit
    def add_dkv(self, acc, k_id, valid, krow, mdKV: cute.Tensor, batch: Int32, chunk: cutlass.Constexpr):
        """The retired dkv^T tile added to global fp32 at the valid keys' rows (v4 reductions after a 4 x 4 lane
        transpose)."""
        a_mn = acc_mn_view(acc)
        sub = (cute.arch.lane_idx() >> 2) & 3       # this lane's place in its quad of consecutive columns
        for r in cutlass.range_constexpr(2):
            col = chunk * DC + k_id[r, 0][0] - sub   # the quad's first column (a multiple of 4)
            for g in cutlass.range_constexpr(cute.size(a_mn, mode=[1]) // 4):
                y0, y1, y2, y3 = transpose_quad(a_mn[r, 4 * g], a_mn[r, 4 * g + 1], a_mn[r, 4 * g + 2],
                                                a_mn[r, 4 * g + 3], sub)
                ok, kr = valid[4 * g], krow[4 * g]   # the slot this lane now holds: 4 g + sub
                for i in cutlass.range_constexpr(1, 4):
                    ok = cutlass.select_(sub == i, valid[4 * g + i], ok)
                    kr = cutlass.select_(sub == i, krow[4 * g + i], kr)
                if ok:
                    red_add_v4(mdKV.iterator + cute.crd2idx((kr, col, batch), mdKV.layout), y0, y1, y2, y3)
