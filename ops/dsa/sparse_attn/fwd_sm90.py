"""Sparse MLA attention forward for Hopper (sm_90a), CuTe DSL: MQA over each query row's own top-k key rows.

Math (query row t, heads h, valid slots j of the row: 0 <= idx[t, j] < Skv of its sequence, j < topk_length[t];
kv row k_j = kv[idx[t, j]], K = k_j[:Dqk], V = k_j[:Dv]; c = softmax_scale * log2 e):

    x[h, j] = c * q[t, h] . k_j            fp32 wgmma accumulator of bf16 products, scaled once in fp32
    m[h]    = max_j x[h, j] (running, over both halves of every block: the two consumers share it)
    P[h, j] = 2^(x[h, j] - m~[h]),  m~ = 0 while m = -inf (no -inf - -inf)    invalid slot: x = -inf, P = 0
    l[h]    = sum_j P (fp32, unrounded),  O[h] = sum_j bf16(P[h, j]) V_j       (online: rescaled by 2^(m_old - m~))
    out[h]  = O[h] / (l[h] + 2^min(sink[h] log2 e - m[h], 126))     (no sink: / l[h])
    lse[h]  = ln 2 (m[h] + log2 l[h])      natural log, sink not included
A row with no valid slot (l = 0): out 0, lse -inf. A NaN in q, a gathered kv row or the sink reaches the outputs it
influences (l = NaN is not l = 0). An invalid slot's key row is never loaded: the producer zero-fills its shared-
memory row (so a stale or uninitialised row can never meet P = 0 as 0 x Inf), and its logit is replaced by a select.

Tiling. One CTA = one query row and one group of 64 heads (grid y = H / 64; 128 heads = two CTAs that gather the
same rows, the second from L2). Q tile (64 x Dqk, K-major) resident in shared memory (one TMA load). Key slots in
blocks of BK = 64, each block's kv rows gathered in NC = Dqk / 64 column chunks into one of two block slots; a
chunk is two 32-key halves (32 x 64, 4 KiB each) with one full and one empty mbarrier. 3 warpgroups:
  - warpgroup 0 (producer, 40 registers): warp 0 loads Q by TMA; all 128 threads gather 16-byte pieces of the
    block's rows with cp.async (indices loaded one block ahead), zero-fill the pieces of invalid slots, write the
    block's gathered rows (sRows[n % 2], -1 where invalid, before chunk 0 is published), and publish chunk g once
    its group retired, LAG chunks later (gather_sm90.publish: wait_group, proxy fence, arrive; all 128 writers
    arrive on the chunk's full barrier). Every block ends with all its chunks published before the next block's
    first acquire (so the producer never waits on a slot while holding chunks the consumers need).
  - warpgroups 1 and 2 (consumers w = 0, 1): per block, S_w = Q K_w^T over the w-th 32-key half (wgmma m64 n32 k16,
    B = the chunk halves, K-major), scale and mask; the row max of both halves is exchanged through sRed (named
    barrier MAX_BAR; the mask comes from sRows, not from the indices again); P (bf16, stmatrix) of both halves goes
    to sP (64 heads x 64 keys), fenced for the async proxy and ordered by named barrier P_BAR (every writer of sP
    arrives); then O_w += P V over Dv columns [256 w, 256 w + 256) (one 64 x 256 accumulator, wgmma m64 n256 k16,
    A = sP, B = the consumer's 4 consecutive chunks read as one MN-major 256 x 64 V tile: the same bytes as the K
    view); wait, release the block's chunks (256 consumer arrivals).
    Row sums l_w stay per consumer and are added through sRed at the end (named barrier SUM_BAR). Epilogue: each
    consumer's 64 x 256 bf16 O goes by stmatrix into the Q tile's bytes (free: every Q K^T retired before SUM_BAR),
    then one TMA store per consumer (named barrier OUT_BAR orders all writers first).
Shared-memory handoffs: sRed (row max) written by one lane per quad of each consumer, read by the other consumer
after MAX_BAR; rewritten only after P_BAR (which the reader passes after its read). sP written by all 256 consumer
threads (stmatrix, then fence.proxy.async) and read by wgmma after P_BAR; rewritten only after the next
MAX_BAR, which each consumer reaches after its P V wgmmas retired (wait_group 0). kv chunks: cp.async / zero stores
ordered by the full mbarrier (128 arrivals), reused after the empty mbarrier (256 arrivals, after wait_group 0).
sRows[n % 2]: written by 16 producer threads after chunk 0 of block n was acquired (every consumer has released
chunk 0 of block n - 2, after its last read of those words), read by the consumers after chunk 0's full barrier.
sO (in sQ): stmatrix stores of one consumer, fence.proxy.async, OUT_BAR (all 256 consumer threads), then the TMA
store issued by one elected lane of that consumer's first warp, which waits until the store has read shared memory.
Shared memory: Q 72 KiB + 2 block slots x NC x 8 KiB + sP 8 KiB + sRed / sRows / barriers (Dqk 576: ~225 KiB of 227).

Layouts. Dense: q [B,Sq,H,Dqk], kv [B,Skv,Dqk], idx int32 [B,Sq,K], topk_length int32 [B,Sq], sink fp32 [H],
out bf16 [B,Sq,H,Dv], lse fp32 [B,H,Sq]. THD: q [Tq,H,Dqk], kv [Tkv,Dqk], idx [Tq,K] (local to the row's sequence),
topk_length [Tq], out [Tq,H,Dv], lse [H,Tq], cu_seqlens_q/k int32 [batch+1]; a row finds its sequence by a warp-wide
search of cu_seqlens_q; rows at or past cu_seqlens_q[-1] get out 0, lse -inf.

Status (H200, 2026-12-04): tests/gpu/test_dsa_sparse_attn.py 33 passed (2x float32 floor gate, NaN poison, sinks,
THD tail, Skv < K, x5000 logits, bitwise reruns, CUDA graph, Sq 70000), racecheck/memcheck clean. Sq 4K, Skv 8K,
H 128, top-k 2048, 576/512: 6.10 ms = 383 TFLOP/s (issue 11 target 550; 7.61 ms before the mask moved to shared memory,
P to stmatrix and out to a TMA store (6.68 ms), then P V to one N = 256 wgmma a k-step; outputs bitwise the same).
With the gather removed (the producer only publishes) the 7.61 ms kernel ran 7.25 ms: the consumers, not the gather,
set the pace; ncu source sampling then showed them waiting on the index loads of the mask (long scoreboard) and on
scalar 2-byte stores of P and out.
Before (2026-12-03), ncu on that shape: tensor pipe 31 % of
elapsed cycles, L1/shared-memory pipe 76 % (the busiest unit), 47 M local-memory (spill) requests, stalls mostly
long-scoreboard (L1TEX); producer lag 3 / 6 / 8 within 1 % (not the limit); issuing Q K^T of the next block under
this block's softmax measured 1.5x slower (with two block slots its gather then waits in the critical path) and
was removed. Levers left: the spills (4 reloads a block left in the consumer's loop), Q K^T with N = 64 (Q is read
by both consumers), overlap of one consumer's softmax with the other's wgmmas (both wait at MAX_BAR / P_BAR today).
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

from ...common.gather_sm90 import BlockGather, find_sequence, gemm_chunks, load_resident_tiles
from .rows import SlotRows
from ...common.softmax import acc_mn_view, quad_max, quad_sum, rescale_rows, softmax_state

LN2 = math.log(2.0)
LOG2E = math.log2(math.e)
HG = 64              # heads per CTA (one wgmma M)
BK = 64              # key slots per block
HALF = 32            # key slots per consumer per block (its S tile's N)
DC = 64              # kv columns per chunk (one 128-byte swizzle atom)
NUM_THREADS = 384
PIECE = 8            # bf16 elements per 16-byte cp.async
MAX_BAR, P_BAR, SUM_BAR, OUT_BAR = 3, 4, 5, 6
SINK_EXP_MAX = 126.0


class SparseAttnFwdSm90(SlotRows, BlockGather):
    """One compiled variant: (Dqk, Dv, heads, varlen, has_length, has_sink)."""

    LAG = 3        # chunks of cp.async in flight per producer thread before the oldest is published (< NC);
    #                H200 2026-12-03: 3, 6 and 8 within 1 % (the producer is not what limits this kernel)

    def __init__(self, head_dim: int, v_head_dim: int, heads: int, varlen: bool, has_length: bool, has_sink: bool):
        assert head_dim in (512, 576) and v_head_dim == 512 and heads in (64, 128), (head_dim, v_head_dim, heads)
        self.D, self.Dv, self.H = head_dim, v_head_dim, heads
        self.NC = head_dim // DC
        self.stages = 2 * self.NC                 # pipeline stages: 2 block slots x NC chunks
        self.varlen, self.has_length, self.has_sink = varlen, has_length, has_sink
        self.dt = cutlass.BFloat16
        self.pieces = BK * DC // PIECE // 128     # cp.async pieces per producer thread per chunk (4)
        self.o_chunks = v_head_dim // DC // 2     # 64-column kv chunks of a consumer's 256 output columns (4)

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mKv: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor,
                 mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, scale_log2: Float32,
                 stream):
        D, H, dt = self.D, self.H, self.dt
        if cutlass.const_expr(self.varlen):
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D, 1), stride=(mQ.stride[1], 1, 0)))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[0], D, 1), stride=(mKv.stride[0], 1, 0)))
            o_v = cute.make_tensor(mO.iterator, cute.make_layout((mO.shape[0] * H, self.Dv, 1),
                                                                 stride=(mO.stride[1], 1, 0)))
            grid = (mQ.shape[0], H // HG, 1)
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[1], D, mKv.shape[0]),
                                                                   stride=(mKv.stride[1], 1, mKv.stride[0])))
            o_v = cute.make_tensor(mO.iterator, cute.make_layout((mO.shape[1] * H, self.Dv, mO.shape[0]),
                                                                 stride=(mO.stride[2], 1, mO.stride[0])))
            grid = (mQ.shape[1], H // HG, mQ.shape[0])
        K, MN = OperandMajorMode.K, OperandMajorMode.MN
        qk_mma = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (1, 1, 1), tiler_mn=(HG, HALF))
        qk_mma_acc = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (1, 1, 1), tiler_mn=(HG, HALF))
        VH = self.Dv // 2
        pv_mma = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (1, 1, 1), tiler_mn=(HG, VH))
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (HG, HALF, D), dt, 1)
        # one chunk half (32 keys x 64 columns, 128-byte rows) seen two ways over the same bytes:
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (HG, HALF, DC), dt, 2 * self.stages)
        # V of one consumer: 4 consecutive chunks (8 KiB each: the two 32-key halves back to back) read as one
        # MN-major 256-column x 64-key tile (the layout tiles K first, so its 64-column atoms sit 8 KiB apart)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (HG, VH, BK), dt, 1)
        sP_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (HG, DC, BK), dt, 1)
        tma_q, tQ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), q_v,
                                                cute.slice_(sQ_layout, (None, None, 0)), (HG, D))
        # out: each consumer's 64 heads x 256 columns, staged in the Q tile's bytes (free once both Q K^T retired)
        sO_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (HG, DC, VH), dt, 2)
        tma_o, tO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), o_v,
                                                cute.slice_(sO_layout, (None, None, 0)), (HG, VH))
        self.q_bytes = HG * D * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sRed: cute.struct.MemRange[Float32, 2 * HG]
            sRows: cute.struct.MemRange[Int32, 2 * BK]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sP_layout)], 1024]

        self.shared_storage = SharedStorage
        assert cute.cosize(sO_layout) <= cute.cosize(sQ_layout)
        self.kernel(tma_q, tQ, tma_o, tO, kv_v, mIdx, mLen, mSink, mO, mLSE, mCuQ, mCuK, scale_log2, qk_mma,
                    qk_mma_acc, pv_mma, sQ_layout, sK_layout, sV_layout, sP_layout, sO_layout).launch(
            grid=grid, block=(NUM_THREADS, 1, 1), stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_o: cute.CopyAtom, tO: cute.Tensor, mKv: cute.Tensor,
               mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mCuQ: cute.Tensor, mCuK: cute.Tensor, scale_log2: Float32, qk_mma: cute.TiledMma,
               qk_mma_acc: cute.TiledMma, pv_mma: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout,
               sO_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        row, grp, batch = cute.arch.block_idx()
        args = (tma_q, tQ, tma_o, tO, mKv, mIdx, mLen, mSink, mLSE, scale_log2, qk_mma, qk_mma_acc, pv_mma,
                sQ_layout, sK_layout, sV_layout, sP_layout, sO_layout, tidx, grp)
        if cutlass.const_expr(self.varlen):
            n_seq = mCuQ.shape[0] - 1
            if row >= mCuQ[n_seq]:
                self.clear_row(mO, mLSE, row, grp, tidx)
            else:
                b = find_sequence(mCuQ, n_seq, row, tidx % 32)
                k_off = mCuK[b]
                self.attend(*args, Int32(0), row, k_off, mCuK[b + 1] - k_off)
        else:
            self.attend(*args, batch, row, Int32(0), mKv.shape[0])

    # ---- addressing (dense: batch, row; THD: the flat row)
    def q_row(self, row, grp):
        return row * (self.H // HG) + grp

    @cute.jit
    def clear_row(self, mO: cute.Tensor, mLSE: cute.Tensor, row: Int32, grp: Int32, tidx: Int32):
        """A THD row at or past cu_seqlens_q[-1]: out 0 and lse -inf for this CTA's heads."""
        h0 = grp * HG
        for i in cutlass.range(tidx, HG * self.Dv, NUM_THREADS, unroll=1):
            mO[row, h0 + i // self.Dv, i % self.Dv] = self.dt(0.0)
        if tidx < HG:
            mLSE[h0 + tidx, row] = -Float32.inf

    GATHER_BK = BK

    def gather_dst(self, sK, r, col, index):
        """Row r of the block sits in half r // 32 of the chunk's two 32-row stages."""
        return cute.local_tile(sK[r % HALF, None, 2 * index + r // HALF], (PIECE,), (col,))

    @cute.jit
    def attend(self, tma_q, tQ, tma_o, tO, mKv, mIdx, mLen, mSink, mLSE, scale_log2: Float32,
               qk_mma: cute.TiledMma, qk_mma_acc: cute.TiledMma, pv_mma: cute.TiledMma, sQ_layout, sK_layout,
               sV_layout, sP_layout, sO_layout, tidx: Int32, grp: Int32, batch: Int32, row: Int32, k_off: Int32,
               seqlen_k: Int32):
        D = self.D
        n_slots = mIdx.shape[1] if cutlass.const_expr(self.varlen) else mIdx.shape[2]
        row_len = n_slots
        if cutlass.const_expr(self.has_length):
            row_len = cutlass.max(cutlass.min(n_slots, mLen[self.row_coord(batch, row)]), Int32(0))
        n_blk = (row_len + BK - 1) // BK

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = (storage.sKV.data_ptr(), sV_layout)          # the tile is placed per block (slot and consumer)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        sRed = storage.sRed.get_tensor(cute.make_layout((2, HG), stride=(HG, 1)))
        sRows = storage.sRows.get_tensor(cute.make_layout((2, BK), stride=(BK, 1)))
        sO = cute.make_tensor(cute.recast_ptr(storage.sQ.data_ptr(), sO_layout.inner, dtype=self.dt),
                              sO_layout.outer)
        sQ2 = sQ[None, None, 0]
        sP2 = sP[None, None, 0]
        q_bar = storage.mbar_q.data_ptr()
        gQ = cute.local_tile(tQ[None, None, batch], (HG, D), (self.q_row(row, grp), 0))
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ2, 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        pipe = self.gather_pipeline(storage.mbar.data_ptr(), 256, q_bar, tidx)

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            # ---------------- producer warpgroup: Q by TMA (warp 0), kv rows by cp.async (all 128 threads)
            cute.arch.setmaxregister_decrease(40)
            if warp == 0:
                load_resident_tiles(q_bar, self.q_bytes, ((tma_q, tQg, tQs),))
            self.produce(pipe, sK, mKv, mIdx, batch, row, row_len, n_blk, k_off, seqlen_k, tidx, sRows)
        else:
            cute.arch.setmaxregister_increase(232)
            self.consume(pipe, q_bar, sQ2, sK, sV, sP2, sRed, sRows, sO, tma_o, tO, mSink, mLSE, scale_log2, qk_mma,
                         qk_mma_acc, pv_mma, tidx - 128, wg - 1, grp, batch, row, n_blk)

    @cute.jit
    def consume(self, pipe, q_bar, sQ2, sK, sV, sP2, sRed, sRows, sO, tma_o, tO, mSink, mLSE, scale_log2: Float32,
                qk_mma: cute.TiledMma, qk_mma_acc: cute.TiledMma, pv_mma: cute.TiledMma, ctid: Int32, w: Int32,
                grp: Int32, batch: Int32, row: Int32, n_blk: Int32):
        quad = ctid % 4
        thr_qk = qk_mma.get_slice(ctid % 128)
        thr_pv = pv_mma.get_slice(ctid % 128)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ2))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
        tOrP = thr_pv.make_fragment_A(thr_pv.partition_A(sP2))
        r2s_p = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dt), qk_mma)
        thr_r2s_p = r2s_p.get_slice(ctid % 128)
        s_id = acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((HG, HALF))))
        qk_mma.set(warpgroup.Field.ACCUMULATE, False)
        qk_mma_acc.set(warpgroup.Field.ACCUMULATE, True)
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        acc_o = thr_pv.make_fragment_C(thr_pv.partition_shape_C((HG, self.Dv // 2)))
        acc_o.fill(0.0)
        row_max, row_sum = softmax_state(2)
        corr = cute.make_rmem_tensor((2,), Float32)
        n_cols = cute.size(s_id, mode=[1])
        valid = cute.make_rmem_tensor((n_cols,), cutlass.Boolean)

        cute.arch.mbarrier_wait(q_bar, 0)
        for n in cutlass.range(n_blk, unroll=1):
            acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((HG, HALF)))
            self.issue_qk(pipe, qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, n, w)
            for ci in cutlass.range_constexpr(n_cols):       # the producer's gathered rows (chunk 0 waited above)
                valid[ci] = sRows[n % 2, w * HALF + s_id[0, ci][1]] >= 0
            warpgroup.wait_group(0)
            self.softmax_pv(acc_s, valid, s_id, sRed, sP2, r2s_p, thr_r2s_p, row_max, row_sum, corr, acc_o, tOrP, sV,
                            thr_pv, pv_mma,
                            scale_log2, n, w, quad)
            warpgroup.wait_group(0)
            self.release(pipe, n)

        # ---- epilogue: l of both consumers, sink, normalise, store
        for r in cutlass.range_constexpr(2):
            l_part = quad_sum(row_sum[r])
            if quad == 0:
                sRed[w, s_id[r, 0][0]] = l_part
        pipeline.NamedBarrier(barrier_id=SUM_BAR, num_threads=256).arrive_and_wait()
        h0 = grp * HG
        inv = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            h = s_id[r, 0][0]
            l = sRed[0, h] + sRed[1, h]
            m = row_max[r]
            dead = l == Float32(0.0)                 # no valid slot (a NaN l is not dead: it reaches out and lse)
            den = l
            if cutlass.const_expr(self.has_sink):
                arg = mSink[h0 + h] * Float32(LOG2E) - m
                arg = Float32(cutlass.select_(arg > Float32(SINK_EXP_MAX), Float32(SINK_EXP_MAX), arg))   # keeps NaN
                den = l + cute.math.exp2(arg, fastmath=False)
            den_safe = Float32(cutlass.select_(dead, Float32(1.0), den))
            inv[r] = Float32(cutlass.select_(dead, Float32(0.0), Float32(1.0) / den_safe))
            l_safe = Float32(cutlass.select_(dead, Float32(1.0), l))
            lse = (m + cute.math.log2(l_safe, fastmath=False)) * Float32(LN2)
            if w == 0:
                if quad == 0:
                    mLSE[self.lse_coord(batch, row, h0 + h)] = Float32(cutlass.select_(dead, -Float32.inf, lse))
        self.store_o(acc_o, inv, sO, tma_o, tO, pv_mma, batch, row, grp, ctid, w)

    @cute.jit
    def store_o(self, acc_o, inv, sO, tma_o, tO, pv_mma: cute.TiledMma, batch: Int32, row: Int32, grp: Int32,
                ctid: Int32, w: Int32):
        """out[row, 64 heads, 256 w : 256 w + 256] = bf16(O x inv): stmatrix into stage w of sO (the Q tile's bytes:
        every Q K^T of both consumers retired before SUM_BAR, and the Q TMA load completed before either consumer's
        first wait), fence for the async proxy, both consumers' 256 threads at OUT_BAR, then the TMA store of the
        consumer's tile by one elected lane of its first warp, which waits until the store has read shared memory
        (the CTA may exit after that). The DSL puts no elect around this S2G copy itself (test_ptx checks ours)."""
        sOw = sO[None, None, w]
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dt), pv_mma)
        thr_r2s = r2s.get_slice(ctid % 128)
        rO = cute.make_rmem_tensor(acc_o.layout, self.dt)
        o_mn = acc_mn_view(acc_o)
        r_mn = acc_mn_view(rO)
        for r in cutlass.range_constexpr(2):
            for ci in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                r_mn[r, ci] = self.dt(o_mn[r, ci] * inv[r])
        cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sOw))
        cute.arch.fence_proxy("async.shared", space="cta")        # this thread's stmatrix stores -> TMA (async proxy)
        pipeline.NamedBarrier(barrier_id=OUT_BAR, num_threads=256).arrive_and_wait()   # every writer of sO
        if ctid % 128 < 32:
            gO = cute.local_tile(tO[None, None, batch], (HG, self.Dv // 2), (self.q_row(row, grp), w))
            tOs, tOg = cpasync.tma_partition(tma_o, 0, cute.make_layout(1), cute.group_modes(sOw, 0, 2),
                                             cute.group_modes(gO, 0, 2))
            with cute.arch.elect_one():                          # one lane issues, commits and waits
                cute.copy(tma_o, tOs, tOg)
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    # ------------------------------------------------------------------------------------------ consumer pieces
    @cute.jit
    def issue_qk(self, pipe, qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, n: Int32, w: Int32):
        """S_w(n) = Q K_w^T: for each chunk wait its full barrier, then its 4 k-blocks; one committed group."""
        kpc = DC // 16
        gemm_chunks(pipe, lambda c: self.state(n, c, False), tuple(range(self.NC)), qk_mma, qk_mma_acc, acc_s,
                    lambda c, kb, stage: (tSrQ[None, None, c * kpc + kb], tSrK[None, None, kb, 2 * stage + w]), kpc)

    @cute.jit
    def release(self, pipe, n: Int32):
        for c in cutlass.range_constexpr(self.NC):
            pipe.consumer_release(self.state(n, c, False))

    @cute.jit
    def softmax_pv(self, acc_s, valid, s_id, sRed, sP2, r2s, thr_r2s, row_max, row_sum, corr, acc_o, tOrP, sV,
                   thr_pv, pv_mma: cute.TiledMma, scale_log2: Float32, n: Int32, w: Int32, quad: Int32):
        """Block n after its S: scale and mask, the row max of both halves (MAX_BAR), P to sP (P_BAR), O rescaled and
        P V issued (committed, not waited)."""
        n_cols = cute.size(valid)
        s_mn = acc_mn_view(acc_s)
        for r in cutlass.range_constexpr(2):
            m_loc = -Float32.inf
            for ci in cutlass.range_constexpr(n_cols):
                x = Float32(cutlass.select_(valid[ci], s_mn[r, ci] * scale_log2, -Float32.inf))
                s_mn[r, ci] = x
                m_loc = cute.arch.fmax(m_loc, x)
            corr[r] = quad_max(m_loc)
            if quad == 0:
                sRed[w, s_id[r, 0][0]] = corr[r]
        pipeline.NamedBarrier(barrier_id=MAX_BAR, num_threads=256).arrive_and_wait()
        for r in cutlass.range_constexpr(2):
            m_blk = cute.arch.fmax(corr[r], sRed[1 - w, s_id[r, 0][0]])
            m_old = row_max[r]
            m_new = cute.arch.fmax(m_old, m_blk)
            m_use = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new))
            corr[r] = cute.math.exp2(m_old - m_use, fastmath=True)
            row_max[r] = m_new
            part = Float32(0.0)
            for ci in cutlass.range_constexpr(n_cols):
                p = cute.math.exp2(s_mn[r, ci] - m_use, fastmath=True)
                part = part + p
                s_mn[r, ci] = p
            row_sum[r] = row_sum[r] * corr[r] + part
        rP = cute.make_rmem_tensor(acc_s.layout, self.dt)          # bf16 P of this half, by stmatrix into sP
        rP.store(acc_s.load().to(self.dt))
        cute.copy(r2s, thr_r2s.retile(rP), thr_r2s.partition_D(cute.local_tile(sP2, (HG, HALF), (0, w))))
        cute.arch.fence_proxy("async.shared", space="cta")       # this thread's P stores -> wgmma (async proxy)
        pipeline.NamedBarrier(barrier_id=P_BAR, num_threads=256).arrive_and_wait()   # every writer of sP
        rescale_rows(acc_mn_view(acc_o), corr)
        kv_base, sV_layout = sV
        chunk = (n % 2) * self.NC + w * self.o_chunks              # the first of this consumer's 4 V chunks
        ptr = cute.recast_ptr(kv_base + chunk * BK * DC, sV_layout.inner, dtype=self.dt)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(
            cute.make_tensor(ptr, cute.slice_(sV_layout.outer, (None, None, 0)))))
        warpgroup.fence()
        for kb in cutlass.range_constexpr(BK // 16):
            cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb], acc_o)
        warpgroup.commit_group()
