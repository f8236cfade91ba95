"""Lightning-indexer scores for Hopper (sm_90a), CuTe DSL: TMA loads, warpgroup MMA, head sum in registers.

Math (one sequence; query t, key j, index heads h = 0..H-1):

    I[t, j]  = sum_h w[t, h] * relu(q[t, h, :] . k[j, :])       fp32 (bf16 inputs, fp32 accumulate and sum)
    visible  : j < lim(t),  lim(t) = clamp((q_offset + t + 1) // ratio, 0, Sk)  (causal)  or  Sk
    score    = I[t, j] where visible, -inf elsewhere (every column of the output row is written)
    lse(t)   = ln sum_{visible j} exp(I[t, j])   (optional; 0 for a row that sees no key)

relu is the NaN-propagating maximum (a NaN in q, k or w reaches the scores and the lse it touches; an
invisible key's value is dropped by a select, never by arithmetic, so nothing leaks from it).

Tiling. The GEMM is laid out keys x (query, head): A = a block of BK = 64 keys (K-major, from the K
stream), B = the CTA's resident Q tile of N = 256 rows = QT = 256 / H queries x H heads (K-major; the
rows (t, h) of index_q are consecutive, which the seam checks). An accumulator row is then one key and
its 256 columns are the QT queries' heads, so the head sum is a thread-local sum over the thread's
H / 4 columns of a query plus a butterfly over the 4 lanes of a quad -- no shared memory, no cross-warp
reduction. One CTA = 3 warpgroups (384 threads):
  - warpgroup 0 (producer, few registers): warp 0 issues the TMA loads (Q tile once; then K blocks
    n = 0 .. n_hi-1 into a ring of STAGES stages); warps 1-3 fill the columns no key block covers
    ([n_hi * BK, W)) with -inf.
  - warpgroups 1 and 2 (consumers): warpgroup c takes the key blocks n = c, c + 2, ... (block n sits in
    ring position n, so its stages alternate between the two: one pipeline, 4 consumer warps per stage).
    Per block: S = K_n Q^T (wgmma m64n256k16, SS), then the epilogue: relu, * w (from shared memory,
    fp32), head sum, mask, direct stores; lane q of a quad stores (and keeps the lse state of) the
    queries t = q, q + 4, ...
  The two consumer warpgroups run out of phase, so one's epilogue overlaps the other's MMA.
Online lse: per owned query, running (max m, sum l) over the thread's keys (-inf-safe: m~ = 0 while m is
-inf); the end combines lanes (xor 4, 8, 16), then the 8 consumer warps through shared memory.

Layouts. Dense: index_q [B,Sq,H,D], index_k [B,Sk,D], weights [B,Sq,H] (bf16 or fp32), scores fp32
[B,Sq,Sk], lse fp32 [B,Sq], q_offsets int32 [B]. THD: index_q [Tq,H,D], index_k [Tk,D], weights [Tq,H],
scores [Tq,W], lse [Tq], cu_seqlens_q/k int32 [batch+1]; columns are local to the row's sequence, columns
at or past its key count are -inf; the grid gets one extra y-slice that writes the rows at or past
cu_seqlens_q[-1] (score -inf, lse 0). K tiles that run past a sequence's keys read the next sequence's
keys (masked by the select) or zero fill; Q tiles past a sequence's rows are computed and not stored.

Status: compiled for sm_90a on CPU; GPU verification in tests/gpu/test_dsa_indexer.py.
"""
import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ...common.softmax import LOG2E, acc_mn_view, quad_sum

BK = 64            # keys per consumer block (one wgmma M)
N = 256            # (query, head) columns per CTA
NUM_THREADS = 384
CONSUMER_WARPS = 8
LN2 = math.log(2.0)


def stages_for(head_dim):
    """K ring depth (both consumers together): 6 x 16 KiB at D = 128, 8 x 8 KiB at D = 64."""
    return 6 if head_dim > 64 else 8


def queries_per_cta(heads):
    return N // heads


class IndexerScoreSm90:
    """One compiled variant: (head_dim, heads, weight dtype, varlen, with_lse, has_offsets)."""

    def __init__(self, head_dim: int, heads: int, w_dtype, varlen: bool, with_lse: bool, has_offsets: bool):
        assert head_dim in (64, 128) and heads in (16, 32, 64), (head_dim, heads)
        self.D = head_dim
        self.H = heads
        self.QT = queries_per_cta(heads)
        self.w_dtype = w_dtype
        self.varlen = varlen
        self.with_lse = with_lse
        self.has_offsets = has_offsets
        self.stages = stages_for(head_dim)
        self.dt = cutlass.BFloat16

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mL: cute.Tensor,
                 mOff: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, causal: Int32, ratio: Int32,
                 grid_x: Int32, stream):
        D, H, dt = self.D, self.H, self.dt
        if cutlass.const_expr(self.varlen):
            # [Tq,H,D] -> rows (t, h) x D; [Tk,D] -> keys x D
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D), stride=(mQ.stride[1], 1)))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[0], D), stride=(mK.stride[0], 1)))
            grid_y = mCuQ.shape[0]       # batch + 1: the last slice writes the rows past cu_seqlens_q[-1]
        else:
            # [B,Sq,H,D] -> (rows (t, h), D, B); [B,Sk,D] -> (Sk, D, B)
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[1], D, mK.shape[0]),
                                                                 stride=(mK.stride[1], 1, mK.stride[0])))
            grid_y = mQ.shape[0]

        # the same MMA twice: one fixed to overwrite (first k-block), one to accumulate (the field is set once,
        # outside all staged control flow)
        mma = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                (1, 1, 1), tiler_mn=(BK, N))
        mma_acc = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                    (1, 1, 1), tiler_mn=(BK, N))
        sK_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (BK, N, D), dt, self.stages)
        sQ_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (BK, N, D), dt, 1)
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, q_v, cute.slice_(sQ_layout, (None, None, 0)), (N, D))
        tma_k, tK = cpasync.make_tiled_tma_atom(g2s, k_v, cute.slice_(sK_layout, (None, None, 0)), (BK, D))
        self.q_bytes = N * D * dt.width // 8
        self.k_bytes = BK * D * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sW: cute.struct.MemRange[Float32, N]
            sRed: cute.struct.MemRange[Float32, 2 * CONSUMER_WARPS * self.QT]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(tma_q, tQ, tma_k, tK, mW, mS, mL, mOff, mCuQ, mCuK, causal, ratio, grid_x, mma,
                    mma_acc, sQ_layout, sK_layout).launch(grid=(grid_x, grid_y, 1), block=(NUM_THREADS, 1, 1),
                                                 stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_k: cute.CopyAtom, tK: cute.Tensor, mW: cute.Tensor,
               mS: cute.Tensor, mL: cute.Tensor, mOff: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
               causal: Int32, ratio: Int32, grid_x: Int32, mma: cute.TiledMma, mma_acc: cute.TiledMma,
               sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bx, batch, _ = cute.arch.block_idx()
        qt = bx
        if causal != 0:
            qt = grid_x - 1 - bx   # longest rows first
        if cutlass.const_expr(self.varlen):
            if batch == mCuQ.shape[0] - 1:
                self.clear_tail(mS, mL, mCuQ, bx, grid_x, tidx)
            else:
                q_off = mCuQ[batch]
                k_off = mCuK[batch]
                seqlen_q = mCuQ[batch + 1] - q_off
                seqlen_k = mCuK[batch + 1] - k_off
                if qt * self.QT < seqlen_q:
                    self.score_tile(tma_q, tQ, tma_k, tK, mW, mS, mL, mOff, causal, ratio, mma, mma_acc, sQ_layout, sK_layout,
                                    tidx, batch, qt, q_off, seqlen_q, k_off, seqlen_k, mS.shape[1])
        else:
            if qt * self.QT < mS.shape[1]:
                self.score_tile(tma_q, tQ, tma_k, tK, mW, mS, mL, mOff, causal, ratio, mma, mma_acc, sQ_layout, sK_layout,
                                tidx, batch, qt, Int32(0), mS.shape[1], Int32(0), tK.shape[0], mS.shape[2])

    @cute.jit
    def clear_tail(self, mS: cute.Tensor, mL: cute.Tensor, mCuQ: cute.Tensor, bx: Int32, grid_x: Int32, tidx: Int32):
        """THD rows at or past cu_seqlens_q[-1]: every score -inf, lse 0 (grid-stride over QT-row chunks)."""
        total = mS.shape[0]
        width = mS.shape[1]
        start = mCuQ[mCuQ.shape[0] - 1] + bx * self.QT
        for row0 in cutlass.range(start, total, grid_x * self.QT, unroll=1):
            for t in cutlass.range_constexpr(self.QT):
                if row0 + t < total:
                    for j in cutlass.range(tidx, width, NUM_THREADS, unroll=1):
                        mS[row0 + t, j] = -Float32.inf
            if cutlass.const_expr(self.with_lse):
                if tidx < self.QT:
                    if row0 + tidx < total:
                        mL[row0 + tidx] = Float32(0.0)

    @cute.jit
    def limit(self, t: Int32, pos0: Int32, causal: Int32, ratio: Int32, seqlen_k: Int32):
        """Keys [0, lim) are visible to local query t (causal: clamp((pos0 + t + 1) // ratio, 0, Sk))."""
        lim = seqlen_k
        if causal != 0:
            lim = cutlass.max(cutlass.min((pos0 + t + 1) // ratio, seqlen_k), 0)
        return lim

    @cute.jit
    def score_tile(self, tma_q, tQ, tma_k, tK, mW, mS, mL, mOff, causal: Int32, ratio: Int32, mma: cute.TiledMma,
                   mma_acc: cute.TiledMma, sQ_layout, sK_layout, tidx: Int32, batch: Int32, qt: Int32, q_off: Int32, seqlen_q: Int32,
                   k_off: Int32, seqlen_k: Int32, width: Int32):
        D, H, QT = self.D, self.H, self.QT
        t0 = qt * QT
        pos0 = Int32(0)
        if cutlass.const_expr(self.has_offsets):
            pos0 = mOff[batch]
        t_last = cutlass.min(t0 + QT, seqlen_q) - 1
        lim_lo = self.limit(t0, pos0, causal, ratio, seqlen_k)
        lim_hi = self.limit(t_last, pos0, causal, ratio, seqlen_k)
        n_hi = (lim_hi + BK - 1) // BK      # key blocks computed; columns [n_hi * BK, width) are -inf
        n_full = lim_lo // BK               # blocks below this need no mask

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sW = storage.sW.get_tensor(cute.make_layout(N))
        sRed = storage.sRed.get_tensor(cute.make_layout((2, CONSUMER_WARPS, QT), stride=(CONSUMER_WARPS * QT, QT, 1)))
        sQ2 = sQ[None, None, 0]
        q_bar = storage.mbar_q.data_ptr()

        if cutlass.const_expr(self.varlen):
            gQr = cute.domain_offset((q_off * H, 0), tQ)
            gKr = cute.domain_offset((k_off, 0), tK)
        else:
            gQr = tQ[None, None, batch]
            gKr = tK[None, None, batch]
        gQ = cute.local_tile(gQr, (N, D), (qt, 0))
        gK = cute.local_tile(gKr, (BK, D), (None, 0))     # (BK, D, n)
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ2, 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        tKs, tKg = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                         cute.group_modes(gK, 0, 2))

        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4)   # one warpgroup consumes a stage
        pipe = pipeline.PipelineTmaAsync.create(barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.stages,
                                                producer_group=producer, consumer_group=consumers,
                                                tx_count=self.k_bytes, defer_sync=True)
        if tidx == 0:
            cute.arch.mbarrier_init(q_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            # ---------------- producer warpgroup
            cute.arch.setmaxregister_decrease(24)
            if warp == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(q_bar, self.q_bytes)
                cute.copy(tma_q, tQg, tQs, tma_bar_ptr=q_bar)
                st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for n in cutlass.range(n_hi, unroll=1):
                    pipe.producer_acquire(st)
                    cute.copy(tma_k, tKg[None, n], tKs[None, st.index], tma_bar_ptr=pipe.producer_get_barrier(st))
                    st.advance()
            else:
                # columns no key block covers: -inf (rows of this sequence only)
                ftid = tidx - 32
                for t in cutlass.range_constexpr(QT):
                    if t0 + t < seqlen_q:
                        for j in cutlass.range(n_hi * BK + ftid, width, 96, unroll=1):
                            mS[self.row_coord(batch, q_off + t0 + t, j)] = -Float32.inf
        else:
            # ---------------- consumer warpgroups
            cute.arch.setmaxregister_increase(240)
            ctid = tidx - 128
            cwg = wg - 1
            lane = ctid % 32
            quad = lane % 4
            # weights of the CTA's QT queries, fp32, column (t, h) = t * H + h (0 for rows past the sequence)
            t_w = ctid // H
            w_val = Float32(0.0)
            if t0 + t_w < seqlen_q:
                w_val = Float32(mW[self.w_coord(batch, q_off + t0 + t_w, ctid % H)])
            sW[ctid] = w_val
            pipeline.NamedBarrier(barrier_id=1, num_threads=256).arrive_and_wait()   # sW written by all 256

            thr = mma.get_slice(ctid % 128)
            tSrK = thr.make_fragment_A(thr.partition_A(sK))
            tSrQ = thr.make_fragment_B(thr.partition_B(sQ2))
            c_mn = acc_mn_view(thr.partition_C(cute.make_identity_tensor((BK, N))))
            mma.set(warpgroup.Field.ACCUMULATE, False)
            mma_acc.set(warpgroup.Field.ACCUMULATE, True)
            n_kb = cute.size(tSrQ, mode=[2])

            # per owned query i (t = 4 i + quad): visible limit, running lse state
            NO = QT // 4
            lim_own = cute.make_rmem_tensor((NO,), Int32)
            m_own = cute.make_rmem_tensor((NO,), Float32)
            l_own = cute.make_rmem_tensor((NO,), Float32)
            for i in cutlass.range_constexpr(NO):
                lim_own[i] = self.limit(t0 + 4 * i + quad, pos0, causal, ratio, seqlen_k)
            m_own.fill(-Float32.inf)
            l_own.fill(0.0)
            sums = cute.make_rmem_tensor((2, QT), Float32)

            cute.arch.mbarrier_wait(q_bar, 0)
            st = pipeline.PipelineState(self.stages, cwg, cwg, Int32(0))
            for n in cutlass.range(cwg, n_hi, 2, unroll=1):
                acc = thr.make_fragment_C(thr.partition_shape_C((BK, N)))
                pipe.consumer_wait(st)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(n_kb):
                    cute.gemm(mma if kb == 0 else mma_acc, acc, tSrK[None, None, kb, st.index], tSrQ[None, None, kb],
                              acc)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe.consumer_release(st)
                st.advance(2)
                # ---- epilogue: relu * w, head sum per (key row, query)
                s_mn = acc_mn_view(acc)
                sums.fill(0.0)
                for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                    t = (c // 2) // (H // 8)            # compile time: the thread's columns of query t
                    w = sW[c_mn[0, c][1]]
                    for r in cutlass.range_constexpr(2):
                        x = cute.arch.fmax(s_mn[r, c], Float32(0.0), nan=True)
                        sums[r, t] = sums[r, t] + x * w
                for r in cutlass.range_constexpr(2):
                    for t in cutlass.range_constexpr(QT):
                        sums[r, t] = quad_sum(sums[r, t])
                need_mask = n >= n_full
                for i in cutlass.range_constexpr(NO):
                    t_loc = t0 + 4 * i + quad
                    for r in cutlass.range_constexpr(2):
                        j = n * BK + c_mn[r, 0][0]
                        v = sums[r, 4 * i]
                        for q in cutlass.range_constexpr(1, 4):
                            v = Float32(cutlass.select_(quad == q, sums[r, 4 * i + q], v))
                        if need_mask:
                            v = Float32(cutlass.select_(j < lim_own[i], v, -Float32.inf))
                        if t_loc < seqlen_q:
                            if j < width:
                                mS[self.row_coord(batch, q_off + t_loc, j)] = v
                        sums[r, 4 * i] = v     # keep the masked value for the lse
                    if cutlass.const_expr(self.with_lse):
                        self.lse_update(sums[0, 4 * i], sums[1, 4 * i], m_own, l_own, i)

            if cutlass.const_expr(self.with_lse):
                self.lse_finish(m_own, l_own, sRed, mL, batch, q_off, t0, seqlen_q, ctid, lane, quad)

    # ------------------------------------------------------------------------------------------ pieces
    def row_coord(self, batch, row, j):
        """Coordinate of score (row, column j): dense [B,Sq,Sk] or THD [Tq,W]."""
        if cutlass.const_expr(self.varlen):
            return (row, j)
        return (batch, row, j)

    def w_coord(self, batch, row, h):
        if cutlass.const_expr(self.varlen):
            return (row, h)
        return (batch, row, h)

    @cute.jit
    def lse_update(self, x0: Float32, x1: Float32, m_own: cute.Tensor, l_own: cute.Tensor, i: cutlass.Constexpr):
        """Running (max, sum of exp) over two more values (-inf = invisible; a NaN reaches l)."""
        m_old = m_own[i]
        m_new = cute.arch.fmax(m_old, cute.arch.fmax(x0, x1))
        m_use = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new))
        l_own[i] = (l_own[i] * cute.math.exp2((m_old - m_use) * LOG2E, fastmath=True)
                    + cute.math.exp2((x0 - m_use) * LOG2E, fastmath=True)
                    + cute.math.exp2((x1 - m_use) * LOG2E, fastmath=True))
        m_own[i] = m_new

    @cute.jit
    def lse_merge(self, m_a: Float32, l_a: Float32, m_b: Float32, l_b: Float32):
        m = cute.arch.fmax(m_a, m_b)
        m_use = Float32(cutlass.select_(m == -Float32.inf, Float32(0.0), m))
        l = (l_a * cute.math.exp2((m_a - m_use) * LOG2E, fastmath=True)
             + l_b * cute.math.exp2((m_b - m_use) * LOG2E, fastmath=True))
        return m, l

    @cute.jit
    def lse_finish(self, m_own, l_own, sRed, mL, batch: Int32, q_off: Int32, t0: Int32, seqlen_q: Int32, ctid: Int32,
                   lane: Int32, quad: Int32):
        """Combine the per-thread (max, sum) of each query over the lanes of a warp, then over the 8 consumer
        warps (shared memory, one barrier of the 256 consumer threads), and write lse = m + ln(l) (0 if l == 0)."""
        cwarp = ctid // 32
        for i in cutlass.range_constexpr(self.QT // 4):
            m = m_own[i]
            l = l_own[i]
            for off in cutlass.range_constexpr(3):
                m_o = cute.arch.shuffle_sync_bfly(m, offset=4 << off)
                l_o = cute.arch.shuffle_sync_bfly(l, offset=4 << off)
                m, l = self.lse_merge(m, l, m_o, l_o)
            if lane < 4:
                sRed[0, cwarp, 4 * i + quad] = m
                sRed[1, cwarp, 4 * i + quad] = l
        pipeline.NamedBarrier(barrier_id=2, num_threads=256).arrive_and_wait()   # sRed written by 8 warps
        if ctid < self.QT:
            m = sRed[0, 0, ctid]
            l = sRed[1, 0, ctid]
            for w in cutlass.range_constexpr(1, CONSUMER_WARPS):
                m, l = self.lse_merge(m, l, sRed[0, w, ctid], sRed[1, w, ctid])
            alive = l > Float32(0.0)
            l_safe = Float32(cutlass.select_(alive, l, Float32(1.0)))
            lse = m + cute.math.log2(l_safe, fastmath=False) * Float32(LN2)
            lse = Float32(cutlass.select_(alive, lse, Float32(0.0)))
            lse = Float32(cutlass.select_(l == l, lse, l))        # a NaN sum stays NaN
            if t0 + ctid < seqlen_q:
                if cutlass.const_expr(self.varlen):
                    mL[q_off + t0 + ctid] = lse
                else:
                    mL[batch, t0 + ctid] = lse
