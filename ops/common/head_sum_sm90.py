"""Head-summed key scores for Hopper (sm_90a), CuTe DSL: the shared core of the DSA dense score kernels.

Math (one sequence; query t, key j, heads h = 0..H-1, a per-(t, h) constant c[t, h]):

    X[t, h, j] = q[t, h, :] . k[j, :]                       fp32 accumulate of bf16 products (wgmma)
    score[t, j] = sum_h f(X[t, h, j], c[t, h])  where key j is visible to t, else MASK (every column written)
    stat[t]     = a row statistic of the visible scores (an online lse, a sum, ...)
    visible: j < lim(t),  lim(t) = clamp((q_offset + t + 1) // ratio, 0, Sk) when causal, else Sk

The subclass gives f, MASK, c's source and the statistic (ops/dsa/indexer/score_sm90.py: f = c * relu(X), -inf,
lse; ops/dsa/attn_score/dense_sm90.py: f = 2^min(s X - c, 120), 0, sum).

Tiling. The GEMM is laid out keys x (query, head): A = a block of BK = 64 keys (K-major) streamed in chunks of DC
columns, B = the CTA's resident Q tile of N rows = QT = N / H queries x H heads (K-major; index rows (t, h) are
consecutive, which the seams check). An accumulator row is one key and its N columns are the QT queries' heads, so
the head sum is a thread-local sum over the thread's H / 4 columns of a query plus a butterfly over the 4 lanes of
a quad: no shared memory, no cross-warp reduction. One CTA = 3 warpgroups (384 threads):
  - warpgroup 0 (producer, few registers): warp 0 issues the TMA loads (the Q tile once; then, for key blocks
    n = 0 .. n_hi-1 and chunks c = 0 .. NC-1, K[n, c] into a ring of STAGES chunk buffers); warps 1-3 write MASK
    into the columns no key block covers ([n_hi * BK, W)).
  - warpgroups 1 and 2 (consumers): warpgroup w takes the key blocks n = w, w + 2, ... and owns half of the ring
    (ring_state: chunk i of its blocks sits in stage w * STAGES/2 + i % (STAGES/2)), so one pipeline serves both
    (4 consumer warps per stage) and no consumer ever skips a fill of its stages. Per block: for each chunk, wait, issue its
    wgmmas (m64 x N x 16), commit, and release the previous chunk once its wgmmas retired (wait_group(1)); then
    the epilogue: f per element (c from shared memory, fp32), head sum, mask, direct stores; lane q of a quad
    stores, and keeps the statistic of, the queries t = q, q + 4, ...
  The two consumer warpgroups run out of phase, so one's epilogue overlaps the other's MMA.
Shared-memory handoffs: sC (column constants) is written by the 256 consumer threads and read by all of them
after named barrier 1 (256 threads); the statistic's cross-warp partials sRed are written by lane 0-3 of each
consumer warp and read after named barrier 2 (256 threads). Q and K tiles arrive by TMA on mbarriers.

Layouts. Dense: q [B,Sq,H,D], k [B,Sk,D], scores fp32 [B,Sq,Sk], stat fp32 [B,Sq], q_offsets int32 [B]. THD: q
[Tq,H,D], k [Tk,D], scores [Tq,W], stat [Tq], cu_seqlens_q/k int32 [batch+1]; columns are local to the row's
sequence (MASK at or past its key count); one extra grid y-slice writes the rows at or past cu_seqlens_q[-1]
(MASK scores, the statistic's empty value). K tiles past a sequence's keys read the next sequence's keys (masked
by a select, never by arithmetic) or zero fill; Q tiles past a sequence's rows are computed and not stored.
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from .softmax import acc_mn_view, quad_sum

BK = 64            # keys per consumer block (one wgmma M)
NUM_THREADS = 384
CONSUMER_WARPS = 8


def ring_state(stages: int, ring: Int32, i: Int32, producer: bool, parts: int = 2):
    """Pipeline state of chunk i (counted within one consumer's part of the ring) of consumer `ring` of `parts`:
    stage ring * stages/parts + i % (stages/parts), phase parity from the lap. Each consumer owns its part of the
    stages, so it consumes every fill of each of its stages and can never wait on a barrier one whole lap ahead (a
    consumer that skipped another's fills of a shared stage could pass an mbarrier parity check one phase early: ABA)."""
    part = stages // parts
    lap = (i // part) % 2
    return pipeline.PipelineState(stages, i, ring * part + i % part, lap ^ 1 if producer else lap)


@cute.jit
def issue_group(mma: cute.TiledMma, mma_acc: cute.TiledMma, dst: cute.Tensor, tSrK: cute.Tensor, tSrQ: cute.Tensor,
                stage: Int32, c: cutlass.Constexpr, g: cutlass.Constexpr, promote: cutlass.Constexpr,
                kpc: cutlass.Constexpr):
    """One promotion group of mma_block: dst = the sum over k-blocks g*promote .. of chunk c (K from ring stage
    `stage`), a fresh wgmma accumulation (the first k-block overwrites), committed as one group."""
    warpgroup.fence()
    for kb in cutlass.range_constexpr(promote):
        k = g * promote + kb
        cute.gemm(mma if kb == 0 else mma_acc, dst, tSrK[None, None, k, stage], tSrQ[None, None, c * kpc + k], dst)
    warpgroup.commit_group()


@cute.jit
def mma_block(pipe, mma: cute.TiledMma, mma_acc: cute.TiledMma, acc: cute.Tensor, part: cute.Tensor,
              tSrK: cute.Tensor, tSrQ: cute.Tensor, stages: cutlass.Constexpr, ring: Int32, i0: Int32,
              n_chunks: cutlass.Constexpr, kpc: cutlass.Constexpr, promote: cutlass.Constexpr,
              part2: cute.Tensor = None, parts: cutlass.Constexpr = 2):
    """acc = K block x Q^T over n_chunks chunks of kpc k-blocks, chunk c from ring stage ring_state(ring, i0 + c)
    (the ring split in `parts` consumers' parts; 1: one ring every consumer reads).

    promote = 0: one wgmma accumulator for the whole block; for each chunk wait, issue its wgmmas, commit, and
    release the previous chunk once its wgmmas retired (wait_group(1): groups retire in order); the last chunk is
    released after wait_group(0).
    promote = p > 0: every p k-blocks (16 p products a dot) start a fresh wgmma sum in `part`, wait for it and add
    it to acc with a round-to-nearest fp32 add. The tensor core's fp32 accumulation aligns its addends to the
    largest and truncates, a bias that grows with the number of k-blocks summed into one accumulator; promoting
    bounds each truncation by a partial sum of 16 p products (the float32 floor's own rounding dominates then).
    The wait per group costs this warpgroup's overlap; the other consumer warpgroup keeps the tensor core busy.
    With part2 (a second partial accumulator) the groups are pipelined instead: group i sums into part / part2
    alternately and is added once group i + 1 is issued (wait_group(1)), at the price of a third accumulator."""
    if cutlass.const_expr(promote == 0):
        for c in cutlass.range_constexpr(n_chunks):
            st = ring_state(stages, ring, i0 + c, False, parts)
            pipe.consumer_wait(st)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(kpc):
                cute.gemm(mma if c == 0 and kb == 0 else mma_acc, acc, tSrK[None, None, kb, st.index],
                          tSrQ[None, None, c * kpc + kb], acc)
            warpgroup.commit_group()
            if cutlass.const_expr(c > 0):
                warpgroup.wait_group(1)
                pipe.consumer_release(ring_state(stages, ring, i0 + c - 1, False, parts))
        warpgroup.wait_group(0)
        pipe.consumer_release(ring_state(stages, ring, i0 + n_chunks - 1, False, parts))
    elif cutlass.const_expr(part2 is not None):
        groups = kpc // promote
        total = n_chunks * groups
        for i in cutlass.range_constexpr(total):
            c, g = i // groups, i % groups
            st = ring_state(stages, ring, i0 + c, False, parts)
            if cutlass.const_expr(g == 0):
                pipe.consumer_wait(st)
            dst = acc if i == 0 else (part if i % 2 == 1 else part2)
            issue_group(mma, mma_acc, dst, tSrK, tSrQ, st.index, c, g, promote, kpc)
            if cutlass.const_expr(i > 0):
                warpgroup.wait_group(1)          # group i - 1 retired
                if cutlass.const_expr((i - 1) % groups == groups - 1):
                    pipe.consumer_release(ring_state(stages, ring, i0 + (i - 1) // groups, False, parts))
                if cutlass.const_expr(i > 1):
                    prev = part if (i - 1) % 2 == 1 else part2
                    acc.store(acc.load() + prev.load())
        warpgroup.wait_group(0)
        pipe.consumer_release(ring_state(stages, ring, i0 + n_chunks - 1, False, parts))
        if cutlass.const_expr(total > 1):
            last = part if (total - 1) % 2 == 1 else part2
            acc.store(acc.load() + last.load())
    else:
        groups = kpc // promote
        for c in cutlass.range_constexpr(n_chunks):
            st = ring_state(stages, ring, i0 + c, False, parts)
            pipe.consumer_wait(st)
            for g in cutlass.range_constexpr(groups):
                first = c == 0 and g == 0
                dst = acc if first else part
                issue_group(mma, mma_acc, dst, tSrK, tSrQ, st.index, c, g, promote, kpc)
                warpgroup.wait_group(0)
                if cutlass.const_expr(g == groups - 1):
                    pipe.consumer_release(st)
                if cutlass.const_expr(not first):
                    acc.store(acc.load() + part.load())


@cute.jit
def visible_limit(t: Int32, pos0: Int32, causal: Int32, ratio: Int32, seqlen_k: Int32):
    """Keys [0, lim) are visible to local query t: lim = clamp((pos0 + t + 1) // ratio, 0, seqlen_k) when causal,
    else seqlen_k (the dense DSA ops' ratio-causal mask; pos0 = the sequence's q_offset)."""
    lim = seqlen_k
    if causal != 0:
        lim = cutlass.max(cutlass.min((pos0 + t + 1) // ratio, seqlen_k), 0)
    return lim


class HeadSumScoresSm90:
    """Base of one compiled variant. Subclasses set MASK (a float) and implement ``column_value``,
    ``element``, ``stat_init``, ``stat_update``, ``stat_merge``, ``stat_final`` and ``STAT_EMPTY``."""

    MASK = 0.0
    STAT_EMPTY = 0.0
    PROMOTE = 0        # k-blocks per fp32 promotion of the wgmma sums (mma_block); 0: none
    PROMOTE_LAG = False  # pipeline the promoted groups (a third accumulator)

    def __init__(self, head_dim: int, heads: int, n_cols: int, chunk: int, stages: int, varlen: bool,
                 with_stat: bool, has_offsets: bool):
        assert n_cols % heads == 0 and heads % 8 == 0 and head_dim % chunk == 0 and chunk % 16 == 0, \
            (head_dim, heads, n_cols, chunk)
        self.D, self.H, self.N, self.DC = head_dim, heads, n_cols, chunk
        self.NC = head_dim // chunk
        self.QT = n_cols // heads
        self.NO = (self.QT + 3) // 4          # queries a lane owns (t = 4 i + quad)
        self.stages = stages
        self.varlen, self.with_stat, self.has_offsets = varlen, with_stat, has_offsets
        self.dt = cutlass.BFloat16
        assert stages % 2 == 0 and stages >= 4, "two half rings of >= 2 stages (a consumer holds two chunks)"

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mC: cute.Tensor, mS: cute.Tensor, mStat: cute.Tensor,
                 mOff: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, scale: Float32, causal: Int32,
                 ratio: Int32, grid_x: Int32, stream):
        D, H, N, DC, dt = self.D, self.H, self.N, self.DC, self.dt
        if cutlass.const_expr(self.varlen):
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D), stride=(mQ.stride[1], 1)))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[0], D), stride=(mK.stride[0], 1)))
            grid_y = mCuQ.shape[0]       # batch + 1: the last slice writes the rows past cu_seqlens_q[-1]
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[1], D, mK.shape[0]),
                                                                 stride=(mK.stride[1], 1, mK.stride[0])))
            grid_y = mQ.shape[0]
        # the same MMA twice: one fixed to overwrite (first k-block of a block), one to accumulate (the field is
        # set once, outside all staged control flow)
        mma = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                (1, 1, 1), tiler_mn=(BK, N))
        mma_acc = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                    (1, 1, 1), tiler_mn=(BK, N))
        sK_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (BK, N, DC), dt, self.stages)
        sQ_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (BK, N, D), dt, 1)
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, q_v, cute.slice_(sQ_layout, (None, None, 0)), (N, D))
        tma_k, tK = cpasync.make_tiled_tma_atom(g2s, k_v, cute.slice_(sK_layout, (None, None, 0)), (BK, DC))
        self.q_bytes = N * D * dt.width // 8
        self.k_bytes = BK * DC * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sC: cute.struct.MemRange[Float32, N]
            sRed: cute.struct.MemRange[Float32, 2 * CONSUMER_WARPS * 4 * self.NO]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(tma_q, tQ, tma_k, tK, mC, mS, mStat, mOff, mCuQ, mCuK, scale, causal, ratio, grid_x, mma,
                    mma_acc, sQ_layout, sK_layout).launch(grid=(grid_x, grid_y, 1), block=(NUM_THREADS, 1, 1),
                                                          stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_k: cute.CopyAtom, tK: cute.Tensor, mC: cute.Tensor,
               mS: cute.Tensor, mStat: cute.Tensor, mOff: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
               scale: Float32, causal: Int32, ratio: Int32, grid_x: Int32, mma: cute.TiledMma,
               mma_acc: cute.TiledMma, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bx, batch, _ = cute.arch.block_idx()
        qt = bx
        if causal != 0:
            qt = grid_x - 1 - bx   # longest rows first
        args = (tma_q, tQ, tma_k, tK, mC, mS, mStat, mOff, scale, causal, ratio, mma, mma_acc, sQ_layout,
                sK_layout, tidx, batch, qt)
        if cutlass.const_expr(self.varlen):
            if batch == mCuQ.shape[0] - 1:
                self.clear_tail(mS, mStat, mCuQ, bx, grid_x, tidx)
            else:
                q_off = mCuQ[batch]
                k_off = mCuK[batch]
                seqlen_q = mCuQ[batch + 1] - q_off
                if qt * self.QT < seqlen_q:
                    self.score_tile(*args, q_off, seqlen_q, k_off, mCuK[batch + 1] - k_off, mS.shape[1])
        else:
            if qt * self.QT < mS.shape[1]:
                self.score_tile(*args, Int32(0), mS.shape[1], Int32(0), tK.shape[0], mS.shape[2])

    @cute.jit
    def clear_tail(self, mS: cute.Tensor, mStat: cute.Tensor, mCuQ: cute.Tensor, bx: Int32, grid_x: Int32,
                   tidx: Int32):
        """THD rows at or past cu_seqlens_q[-1]: every score MASK, stat STAT_EMPTY (grid-stride over QT rows)."""
        total = mS.shape[0]
        start = mCuQ[mCuQ.shape[0] - 1] + bx * self.QT
        for row0 in cutlass.range(start, total, grid_x * self.QT, unroll=1):
            for t in cutlass.range_constexpr(self.QT):
                if row0 + t < total:
                    for j in cutlass.range(tidx, mS.shape[1], NUM_THREADS, unroll=1):
                        mS[row0 + t, j] = Float32(self.MASK)
            if cutlass.const_expr(self.with_stat):
                if tidx < self.QT:
                    if row0 + tidx < total:
                        mStat[row0 + tidx] = Float32(self.STAT_EMPTY)

    @cute.jit
    def score_tile(self, tma_q, tQ, tma_k, tK, mC, mS, mStat, mOff, scale: Float32, causal: Int32, ratio: Int32,
                   mma: cute.TiledMma, mma_acc: cute.TiledMma, sQ_layout, sK_layout, tidx: Int32, batch: Int32,
                   qt: Int32, q_off: Int32, seqlen_q: Int32, k_off: Int32, seqlen_k: Int32, width: Int32):
        D, H, N, DC, NC, QT, NO = self.D, self.H, self.N, self.DC, self.NC, self.QT, self.NO
        t0 = qt * QT
        pos0 = Int32(0)
        if cutlass.const_expr(self.has_offsets):
            pos0 = mOff[batch]
        lim_lo = visible_limit(t0, pos0, causal, ratio, seqlen_k)
        lim_hi = visible_limit(cutlass.min(t0 + QT, seqlen_q) - 1, pos0, causal, ratio, seqlen_k)
        n_hi = (lim_hi + BK - 1) // BK      # key blocks computed; columns [n_hi * BK, width) are MASK
        n_full = lim_lo // BK               # blocks below this need no mask

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sC = storage.sC.get_tensor(cute.make_layout(N))
        sRed = storage.sRed.get_tensor(cute.make_layout((2, CONSUMER_WARPS, 4 * NO),
                                                        stride=(CONSUMER_WARPS * 4 * NO, 4 * NO, 1)))
        sQ2 = sQ[None, None, 0]
        q_bar = storage.mbar_q.data_ptr()

        if cutlass.const_expr(self.varlen):
            gQr = cute.domain_offset((q_off * H, 0), tQ)
            gKr = cute.domain_offset((k_off, 0), tK)
        else:
            gQr = tQ[None, None, batch]
            gKr = tK[None, None, batch]
        gQ = cute.local_tile(gQr, (N, D), (qt, 0))
        gK = cute.local_tile(gKr, (BK, DC), (None, None))     # (BK, DC, n, c)
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
                for n in cutlass.range(n_hi, unroll=1):
                    for c in cutlass.range_constexpr(NC):
                        st = ring_state(self.stages, n % 2, (n // 2) * NC + c, True)
                        pipe.producer_acquire(st)
                        cute.copy(tma_k, tKg[None, n, c], tKs[None, st.index],
                                  tma_bar_ptr=pipe.producer_get_barrier(st))
            else:
                ftid = tidx - 32
                for t in cutlass.range_constexpr(QT):
                    if t0 + t < seqlen_q:
                        for j in cutlass.range(n_hi * BK + ftid, width, 96, unroll=1):
                            mS[self.out_coord(batch, q_off + t0 + t, j)] = Float32(self.MASK)
        else:
            # ---------------- consumer warpgroups
            cute.arch.setmaxregister_increase(240)
            ctid = tidx - 128
            cwg = wg - 1
            lane = ctid % 32
            quad = lane % 4
            for col0 in cutlass.range_constexpr(0, N, 256):
                col = ctid + col0
                if col < N:
                    t_c = col // H
                    v = Float32(0.0)
                    if t0 + t_c < seqlen_q:
                        v = self.column_value(mC, batch, q_off + t0 + t_c, col % H)
                    sC[col] = v
            pipeline.NamedBarrier(barrier_id=1, num_threads=256).arrive_and_wait()   # sC written by all 256

            thr = mma.get_slice(ctid % 128)
            tSrK = thr.make_fragment_A(thr.partition_A(sK))
            tSrQ = thr.make_fragment_B(thr.partition_B(sQ2))
            c_mn = acc_mn_view(thr.partition_C(cute.make_identity_tensor((BK, N))))
            mma.set(warpgroup.Field.ACCUMULATE, False)
            mma_acc.set(warpgroup.Field.ACCUMULATE, True)
            kpc = DC // 16       # k-blocks per chunk

            lim_own = cute.make_rmem_tensor((NO,), Int32)
            for i in cutlass.range_constexpr(NO):
                lim_own[i] = visible_limit(t0 + 4 * i + quad, pos0, causal, ratio, seqlen_k)
            stat = self.stat_init(NO)
            sums = cute.make_rmem_tensor((2, 4 * NO), Float32)

            cute.arch.mbarrier_wait(q_bar, 0)
            for n in cutlass.range(cwg, n_hi, 2, unroll=1):
                acc = thr.make_fragment_C(thr.partition_shape_C((BK, N)))
                part, part2 = acc, None
                if cutlass.const_expr(self.PROMOTE > 0):
                    part = thr.make_fragment_C(thr.partition_shape_C((BK, N)))
                    if cutlass.const_expr(self.PROMOTE_LAG):
                        part2 = thr.make_fragment_C(thr.partition_shape_C((BK, N)))
                # chunks this consumer's half ring served before block n: (n // 2) * NC
                mma_block(pipe, mma, mma_acc, acc, part, tSrK, tSrQ, self.stages, cwg, (n // 2) * NC, NC, kpc,
                          self.PROMOTE, part2)
                # ---- epilogue: f per element, head sum per (key row, query), mask, store, statistic
                s_mn = acc_mn_view(acc)
                sums.fill(0.0)
                for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                    t = (c // 2) // (H // 8)             # compile time: the thread's columns of query t
                    cv = sC[c_mn[0, c][1]]
                    for r in cutlass.range_constexpr(2):
                        sums[r, t] = sums[r, t] + self.element(s_mn[r, c], cv, scale)
                for r in cutlass.range_constexpr(2):
                    for t in cutlass.range_constexpr(QT):
                        sums[r, t] = quad_sum(sums[r, t])
                need_mask = n >= n_full
                for i in cutlass.range_constexpr(NO):
                    t_loc = t0 + 4 * i + quad
                    owns = t_loc < seqlen_q
                    if cutlass.const_expr(4 * i + 4 > QT):
                        owns = owns and 4 * i + quad < QT
                    for r in cutlass.range_constexpr(2):
                        j = n * BK + c_mn[r, 0][0]
                        v = sums[r, 4 * i]
                        for q in cutlass.range_constexpr(1, min(4, QT - 4 * i)):
                            v = Float32(cutlass.select_(quad == q, sums[r, 4 * i + q], v))
                        if need_mask:
                            v = Float32(cutlass.select_(j < lim_own[i], v, Float32(self.MASK)))
                        if owns:
                            if j < width:
                                mS[self.out_coord(batch, q_off + t_loc, j)] = v
                        sums[r, 4 * i] = v
                    if cutlass.const_expr(self.with_stat):
                        self.stat_update(stat, i, sums[0, 4 * i], sums[1, 4 * i])

            if cutlass.const_expr(self.with_stat):
                self.stat_finish(stat, sRed, mStat, batch, q_off, t0, seqlen_q, ctid, lane, quad)

    # ------------------------------------------------------------------------------------------ pieces
    def out_coord(self, batch, row, j):
        """Coordinate of score (row, column j): dense [B,Sq,Sk] or THD [Tq,W]."""
        if cutlass.const_expr(self.varlen):
            return (row, j)
        return (batch, row, j)

    @cute.jit
    def stat_finish(self, stat, sRed, mStat, batch: Int32, q_off: Int32, t0: Int32, seqlen_q: Int32, ctid: Int32,
                    lane: Int32, quad: Int32):
        """Merge each owned query's partial statistic over the lanes of a warp (xor 4, 8, 16), then over the 8
        consumer warps through sRed (named barrier 2 of the 256 consumer threads); write stat_final."""
        cwarp = ctid // 32
        for i in cutlass.range_constexpr(self.NO):
            a, b = stat[0, i], stat[1, i]
            for off in cutlass.range_constexpr(3):
                a, b = self.stat_merge(a, b, cute.arch.shuffle_sync_bfly(a, offset=4 << off),
                                       cute.arch.shuffle_sync_bfly(b, offset=4 << off))
            if lane < 4:
                sRed[0, cwarp, 4 * i + quad] = a
                sRed[1, cwarp, 4 * i + quad] = b
        pipeline.NamedBarrier(barrier_id=2, num_threads=256).arrive_and_wait()   # sRed written by 8 warps
        if ctid < self.QT:
            a, b = sRed[0, 0, ctid], sRed[1, 0, ctid]
            for w in cutlass.range_constexpr(1, CONSUMER_WARPS):
                a, b = self.stat_merge(a, b, sRed[0, w, ctid], sRed[1, w, ctid])
            if t0 + ctid < seqlen_q:
                v = self.stat_final(a, b)
                if cutlass.const_expr(self.varlen):
                    mStat[q_off + t0 + ctid] = v
                else:
                    mStat[batch, t0 + ctid] = v
