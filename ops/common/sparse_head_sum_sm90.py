"""Head-summed scores over each query's own top-k keys for Hopper (sm_90a), CuTe DSL: the shared core of the
sparse score recompute kernels (ops/dsa/indexer/sparse_sm90.py, ops/dsa/attn_score/sparse_sm90.py).

Math (query row t with slots s = 0..K-1, gathered key rows k[idx[t, s]], heads h, per-(t, h) constant c[t, h]):

    score[t, s] = sum_h f(q[t, h, :] . k[idx[t, s], :], c[t, h])    for a valid slot, MASK for an invalid one
    valid slot  : 0 <= idx[t, s] < Sk (of the row's sequence) and s < topk_length[t] (when given)
    stat[t]     = the subclass's row statistic over the valid slots (lse, sum)
f, MASK, c and the statistic come from the epilogue mixin (the same ones the dense core uses). An invalid slot's
key row is never loaded (its shared-memory rows keep whatever they held and its score is replaced by a select,
never by arithmetic), so nothing reaches an output through it.

Tiling. One CTA = one query row (all H heads: the B operand is the resident Q tile of N = H rows, K-major, one
TMA load) and its K slots in blocks of BK = 64; A = the gathered key rows of a block, streamed in chunks of DC
columns through a ring of STAGES shared-memory buffers. 3 warpgroups (384 threads):
  - warpgroup 0 (producer): each of its 128 threads gathers 16-byte pieces of the block's rows with cp.async (rows:
    its slots' idx, loaded IDX_AHEAD blocks ahead so their latency hides behind copies; invalid slots skipped; with
    LEAN_GATHER by addresses formed once: produce_block), commits a cp.async group per chunk, and `lag` chunks later
    (that group retired, cp.async.wait_group(lag); lag() is the class's LAG: 3 for the indexer, 1 for the attention
    variant; 1 where a consumer holds a chunk until the next one arrives) fences the async proxy
    (fence.proxy.async.shared::cta, its writes become visible to wgmma) and arrives on the chunk's full barrier (128
    arrivals: all writers, so the consumer's wait orders every lane's stores, not only a fence).
  - warpgroups 1 and 2 (consumers): block n goes to consumer n % 2, each owning half of the ring (the dense core's
    ring_state: no consumer skips a fill of its stages); per chunk: wait full, wgmma (m64 x H x 16), commit, release
    the previous chunk once retired; then the epilogue: f, head sum over the thread's columns and its quad, mask by
    the slot's validity (the thread's two slots' idx loaded one block ahead, before the block's wgmmas: prefetch_idx;
    topk_length read once), store (lanes quad 0 and 1 store rows r and r + 8), statistic (every lane of a quad holds
    the same value; merged over lanes xor 4, 8, 16 and over the 8 consumer warps through sRed after named barrier 2).
HEAD_SPLIT (a class knob: on for the attention variant, off for the indexer, whose PROMOTE is 0;
bench/ab_attn_score.py is the A/B of the two schedules): both consumers take every block, consumer w the heads [w H/2,
w H/2 + H/2) (B = its half of Q, loaded as two TMA tiles; wgmma N = H/2); the ring is one ring both read (256 arrivals
a chunk, chunk g in stage g % STAGES), and the fp32 promotion is the pipelined form (mma_block with a second partial
accumulator, 3 x 32 registers at N = 64: no wait per group, which the lockstep schedule's 64-register accumulators
cannot afford). W1 sums f over its heads per slot and hands the 64 sums of a block to W0 through sPart[n % 2] (a
2-stage PipelineAsync on mbarriers: W1's 128 threads arrive on the full barrier after their stores, W0 waits, reads
and arrives on the empty barrier W1 waits on before rewriting the stage); W0 adds them to its own, masks, stores and
keeps the statistic (W1's stays the empty one, the merge's identity). The lag condition and the handoff are modelled
in tests/test_sparse_head_sum_split_protocol.py. H200 2026-12-05: 1.5x the lockstep schedule on the attention
recompute (ops/dsa/attn_score/sparse_sm90.py has the figures), tests and sanitizers clean; all 8 attention variants
compile without spills.
Layouts. Dense: q [B,Sq,H,D], k [B,Sk,D], idx int32 [B,Sq,K], topk_length int32 [B,Sq], scores fp32 [B,Sq,K],
stat fp32 [B,Sq]. THD: q [Tq,H,D], k [Tk,D], idx [Tq,K] (local to the row's sequence), topk_length [Tq], scores
[Tq,K], stat [Tq], cu_seqlens_q/k int32 [batch+1]; a row finds its sequence by a warp-wide 32-ary search of
cu_seqlens_q (no host data); rows at or past cu_seqlens_q[-1] get MASK scores and the empty statistic.
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from .gather_sm90 import GatherHints, find_sequence, pinned, publish, swizzled_address
from .head_sum_sm90 import block_accumulators, consumer_operands, mma_block, ring_state
from .softmax import acc_mn_view, quad_sum

BK = 64
NUM_THREADS = 384
CONSUMER_WARPS = 8
PIECE = 8            # bf16 elements per 16-byte cp.async


class SparseHeadSumSm90(GatherHints):
    """Base of one compiled variant; the epilogue mixin supplies MASK, STAT_EMPTY, column_value, element and
    stat_init / stat_update / stat_merge / stat_final (the dense core's interface, with one owned query)."""

    PROMOTE = 0        # k-blocks per fp32 promotion of the wgmma sums (head_sum_sm90.mma_block); 0: none
    PROMOTE_LAG = False  # pipeline the promoted groups (a third accumulator)
    MIN_BLOCKS = 1       # CTAs resident per SM (the launch bound: registers per thread <= 64 K / (384 MIN_BLOCKS))
    HEAD_SPLIT = False   # both consumers on every block, half of the heads each (module docstring); attention: on
    REGS = (40, 232)     # setmaxnreg of the producer / consumer warpgroups: 128 p + 256 c <= 384 x the bound
    LAG = 3              # chunks of cp.async in flight per producer thread before the oldest is published (lag())
    IDX_AHEAD = 1        # blocks ahead the producer loads its pieces' idx (> 1: its loop unrolled by it)
    LEAN_GATHER = False  # the producer's copies by addresses formed once (produce_block's lean): on for the indexer,
    #                      off for the attention variant (36 pieces a thread: H100 12-06, 3.18 -> 3.50 ms lean)

    def __init__(self, head_dim: int, heads: int, chunk: int, stages: int, varlen: bool, has_length: bool):
        assert heads % 8 == 0 and heads <= 256 and head_dim % chunk == 0 and chunk % 64 == 0, (head_dim, heads)
        assert stages % 2 == 0 and stages >= 4
        bound = 65536 // (NUM_THREADS * self.MIN_BLOCKS) // 8 * 8
        assert 128 * self.REGS[0] + 256 * self.REGS[1] <= NUM_THREADS * min(bound, 168), (self.REGS, bound)
        self.D, self.H, self.DC, self.NC = head_dim, heads, chunk, head_dim // chunk
        self.stages, self.varlen, self.has_length = stages, varlen, has_length
        self.with_stat = True
        self.dt = cutlass.BFloat16
        self.pieces = BK * chunk // PIECE // 128      # cp.async pieces per producer thread per chunk
        if self.HEAD_SPLIT:
            assert heads % 32 == 0 and self.PROMOTE > 0 and self.MIN_BLOCKS == 1, (heads, self.PROMOTE)
        self.NQ = heads // 2 if self.HEAD_SPLIT else heads     # wgmma N: the heads one consumer multiplies

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mC: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor,
                 mS: cute.Tensor, mStat: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, scale: Float32,
                 stream):
        D, H, DC, dt = self.D, self.H, self.DC, self.dt
        if cutlass.const_expr(self.varlen):
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D), stride=(mQ.stride[1], 1)))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[0], D, 1), stride=(mK.stride[0], 1, 0)))
            grid = (mQ.shape[0], 1, 1)
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[1], D, mK.shape[0]),
                                                                 stride=(mK.stride[1], 1, mK.stride[0])))
            grid = (mQ.shape[1], mQ.shape[0], 1)
        NQ = self.NQ              # H, or H / 2 a consumer with HEAD_SPLIT (then Q is two tiles of NQ rows)
        mma = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                (1, 1, 1), tiler_mn=(BK, NQ))
        mma_acc = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                    (1, 1, 1), tiler_mn=(BK, NQ))
        sK_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (BK, H, DC), dt, self.stages)
        sQ_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (BK, NQ, D), dt, H // NQ)
        tma_q, tQ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), q_v,
                                                cute.slice_(sQ_layout, (None, None, 0)), (NQ, D))
        self.q_bytes = H * D * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sC: cute.struct.MemRange[Float32, H]
            sRed: cute.struct.MemRange[Float32, 2 * CONSUMER_WARPS]
            # HEAD_SPLIT's handoff of W1's head sums to W0 (2 stages; a stub without it), before the 1024-aligned
            # tiles: the indexer's members up to here fit the first KiB, so two of its CTAs of 6 stages at Di 128,
            # H 64 (2 x (113 + 1 reserved) KiB) fill an SM's 228 KiB exactly
            mbar_part: cute.struct.MemRange[cutlass.Int64, 4 if self.HEAD_SPLIT else 1]
            sPart: cute.struct.MemRange[Float32, 2 * BK if self.HEAD_SPLIT else 1]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(tma_q, tQ, k_v, mC, mIdx, mLen, mS, mStat, mCuQ, mCuK, scale, mma, mma_acc, sQ_layout,
                    sK_layout).launch(grid=grid, block=(NUM_THREADS, 1, 1), stream=stream,
                                    min_blocks_per_mp=self.MIN_BLOCKS, preferred_smem_carveout=100)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, mKv: cute.Tensor, mC: cute.Tensor, mIdx: cute.Tensor,
               mLen: cute.Tensor, mS: cute.Tensor, mStat: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
               scale: Float32, mma: cute.TiledMma, mma_acc: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        row, batch, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.varlen):
            n_seq = mCuQ.shape[0] - 1
            if row >= mCuQ[n_seq]:
                self.clear_row(mS, mStat, batch, row, tidx)
            else:
                b = find_sequence(mCuQ, n_seq, row, tidx % 32)
                k_off = mCuK[b]
                self.score_row(tma_q, tQ, mKv, mC, mIdx, mLen, mS, mStat, scale, mma, mma_acc, sQ_layout,
                               sK_layout, tidx, Int32(0), row, row, k_off, mCuK[b + 1] - k_off)
        else:
            self.score_row(tma_q, tQ, mKv, mC, mIdx, mLen, mS, mStat, scale, mma, mma_acc, sQ_layout,
                           sK_layout, tidx, batch, row, row, Int32(0), mKv.shape[0])

    @cute.jit
    def clear_row(self, mS: cute.Tensor, mStat: cute.Tensor, batch: Int32, row: Int32, tidx: Int32):
        """A row with nothing to score: MASK in every slot, the empty statistic."""
        for j in cutlass.range(tidx, self.width(mS), NUM_THREADS, unroll=1):
            mS[self.out_coord(batch, row, j)] = Float32(self.MASK)
        if tidx == 0:
            mStat[self.stat_coord(batch, row)] = Float32(self.STAT_EMPTY)

    def width(self, mS):
        return mS.shape[1] if cutlass.const_expr(self.varlen) else mS.shape[2]

    def out_coord(self, batch, row, j):
        if cutlass.const_expr(self.varlen):
            return (row, j)
        return (batch, row, j)

    def stat_coord(self, batch, row):
        if cutlass.const_expr(self.varlen):
            return row
        return (batch, row)

    @cute.jit
    def prefetch_idx(self, praw, mIdx: cute.Tensor, batch: Int32, row: Int32, n: Int32, c_mn, n_slots: Int32):
        """praw[r] = the idx of this thread's slot r of block n (< n_blk, so n_slots >= 1), loaded at min(j, n_slots -
        1) without a condition: nothing waits on the load until the block's epilogue tests j and the value."""
        for r in cutlass.range_constexpr(2):
            praw[r] = mIdx[self.out_coord(batch, row, cutlass.min(n * BK + c_mn[r, 0][0], n_slots - 1))]

    @cute.jit
    def score_row(self, tma_q, tQ, mKv, mC, mIdx, mLen, mS, mStat, scale: Float32, mma: cute.TiledMma,
                  mma_acc: cute.TiledMma, sQ_layout, sK_layout, tidx: Int32, batch: Int32, row: Int32, q_row: Int32,
                  k_off: Int32, seqlen_k: Int32):
        D, H, DC, NC = self.D, self.H, self.DC, self.NC
        n_slots = self.width(mS)
        n_blk = (n_slots + BK - 1) // BK

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sC = storage.sC.get_tensor(cute.make_layout(H))
        sRed = storage.sRed.get_tensor(cute.make_layout((2, CONSUMER_WARPS), stride=(CONSUMER_WARPS, 1)))
        sQ2 = sQ[None, None, 0]
        q_bar = storage.mbar_q.data_ptr()
        if cutlass.const_expr(self.varlen):
            gQr = tQ
        else:
            gQr = tQ[None, None, batch]
        readers = 128       # consumer threads that read (and release) each chunk
        sPart, hpipe = None, None
        if cutlass.const_expr(self.HEAD_SPLIT):
            # Q as two tiles of NQ rows (query row q_row's rows (q_row, h) are rows q_row H + h of the 2-D view)
            q_tiles = []
            for t in cutlass.range_constexpr(2):
                gQ = cute.local_tile(gQr, (self.NQ, D), (q_row * 2 + t, 0))
                q_tiles.append(cpasync.tma_partition(tma_q, 0, cute.make_layout(1),
                                                     cute.group_modes(sQ[None, None, t], 0, 2),
                                                     cute.group_modes(gQ, 0, 2)))
            readers = 256
            sPart = storage.sPart.get_tensor(cute.make_layout((2, BK), stride=(BK, 1)))
            hpipe = pipeline.PipelineAsync.create(barrier_storage=storage.mbar_part.data_ptr(), num_stages=2,
                                                  producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                                                  consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                                                  defer_sync=True)
        else:
            gQ = cute.local_tile(gQr, (H, D), (q_row, 0))
            q_tiles = [cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ2, 0, 2),
                                             cute.group_modes(gQ, 0, 2))]
        pipe = pipeline.PipelineAsync.create(barrier_storage=storage.mbar.data_ptr(), num_stages=self.stages,
                                             producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                                             consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, readers),
                                             defer_sync=True)
        if tidx == 0:
            cute.arch.mbarrier_init(q_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            # ---------------- producer warpgroup: Q by TMA (warp 0), key rows by cp.async (all 128 threads)
            cute.arch.setmaxregister_decrease(self.REGS[0])   # within the CTA's allocation (REGS)
            if warp == 0:
                cpasync.prefetch_descriptor(tma_q)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(q_bar, self.q_bytes)
                for tQs, tQg in q_tiles:
                    cute.copy(tma_q, tQg, tQs, tma_bar_ptr=q_bar)
            copy = self.gather_copy(mKv)
            if cutlass.const_expr(self.varlen):
                gKv = mKv[None, None, 0]
            else:
                gKv = mKv[None, None, batch]
            lag = self.lag()
            row_len = n_slots
            if cutlass.const_expr(self.has_length):
                row_len = cutlass.min(n_slots, mLen[self.stat_coord(batch, row)])
            raw = cute.make_rmem_tensor((self.pieces,), Int32)           # next block's idx (loads in flight)
            rows = cute.make_rmem_tensor((self.pieces,), Int32)          # this block's gather rows (-1: skip)
            self.load_slots(raw, mIdx, batch, row, Int32(0), row_len, tidx)
            lean = None
            if cutlass.const_expr(self.LEAN_GATHER):
                # the thread's addresses formed once (produce_block's lean copies)
                per_row, el = self.DC // PIECE, self.dt.width // 8
                lean = (self.gather_copy_raw(mKv),
                        pinned(swizzled_address(cute.local_tile(sK[tidx // per_row, None, 0], (PIECE,),
                                                                (tidx % per_row,)))),
                        pinned(gKv.iterator.toint() + Int64(tidx % per_row * PIECE * el)),
                        pinned(Int64(gKv.stride[0]) * el))
            if cutlass.const_expr(self.IDX_AHEAD > 1):
                # idx of the next IDX_AHEAD blocks in flight, raws[a] serving the blocks n = a mod IDX_AHEAD of the
                # loop unrolled by IDX_AHEAD
                raws = [raw] + [cute.make_rmem_tensor((self.pieces,), Int32) for _ in range(self.IDX_AHEAD - 1)]
                for a in cutlass.range_constexpr(1, self.IDX_AHEAD):
                    self.load_slots(raws[a], mIdx, batch, row, Int32(a), row_len, tidx)
                for n0 in cutlass.range(0, n_blk, self.IDX_AHEAD, unroll=1):
                    for a in cutlass.range_constexpr(self.IDX_AHEAD):
                        if n0 + a < n_blk:
                            self.produce_block(pipe, copy, gKv, sK, raws[a], rows, mIdx, batch, row, n0 + a, row_len,
                                               seqlen_k, k_off, lag, tidx, lean)
            else:
                for n in cutlass.range(n_blk, unroll=1):
                    self.produce_block(pipe, copy, gKv, sK, raw, rows, mIdx, batch, row, n, row_len, seqlen_k, k_off,
                                       lag, tidx, lean)
            total = n_blk * NC
            for j in cutlass.range_constexpr(lag):                 # drain: the last `lag` chunks, oldest first
                if total - lag + j >= 0:
                    publish(pipe, self.stages, self.chunk_state(total - lag + j, True).index, lag - 1 - j)
        else:
            # ---------------- consumer warpgroups (the dense core's schedule, one query)
            cute.arch.setmaxregister_increase(self.REGS[1])
            ctid = tidx - 128
            cwg = wg - 1
            lane = ctid % 32
            quad = lane % 4
            if ctid < H:
                sC[ctid] = self.column_value(mC, batch, q_row, ctid)
            pipeline.NamedBarrier(barrier_id=1, num_threads=256).arrive_and_wait()   # sC written by H threads

            stat = self.stat_init(1)
            if cutlass.const_expr(self.HEAD_SPLIT):
                self.blocks_split(pipe, hpipe, sK, sQ, sC, sPart, mma, mma_acc, mIdx, mLen, mS, stat, scale, batch,
                                  row, n_slots, n_blk, seqlen_k, q_bar, ctid, cwg)
            else:
                thr, tSrK, tSrQ, c_mn = consumer_operands(mma, mma_acc, ctid, sK, sQ2, (BK, H))
                kpc = DC // 16
                n_valid = n_slots                     # slots past topk_length are invalid (loaded once, not per block)
                if cutlass.const_expr(self.has_length):
                    n_valid = cutlass.min(n_slots, cutlass.max(mLen[self.stat_coord(batch, row)], Int32(0)))
                praw = cute.make_rmem_tensor((2,), Int32)   # the thread's two slots' idx, loaded one block ahead
                if cwg < n_blk:
                    self.prefetch_idx(praw, mIdx, batch, row, cwg, c_mn, n_slots)

                cute.arch.mbarrier_wait(q_bar, 0)
                for n in cutlass.range(cwg, n_blk, 2, unroll=1):
                    kcur = cute.make_rmem_tensor((2,), Int32)
                    for r in cutlass.range_constexpr(2):
                        kcur[r] = praw[r]
                    if n + 2 < n_blk:                 # next block's idx in flight during this block's wgmmas
                        self.prefetch_idx(praw, mIdx, batch, row, n + 2, c_mn, n_slots)
                    acc, part, part2 = block_accumulators(thr, (BK, H), self.PROMOTE, self.PROMOTE_LAG)
                    mma_block(pipe, mma, mma_acc, acc, part, tSrK, tSrQ, self.stages, cwg, (n // 2) * NC, NC, kpc,
                              self.PROMOTE, part2)
                    s_mn = acc_mn_view(acc)
                    sums = cute.make_rmem_tensor((2,), Float32)
                    sums.fill(0.0)
                    for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                        cv = sC[c_mn[0, c][1]]
                        for r in cutlass.range_constexpr(2):
                            sums[r] = sums[r] + self.element(s_mn[r, c], cv, scale)
                    self.store_block(sums, kcur, c_mn, n, n_valid, n_slots, seqlen_k, quad, mS, stat, batch, row, True)
            # statistic: lanes xor 4, 8, 16 (rows), then the 8 consumer warps
            a, bb = stat[0, 0], stat[1, 0]
            for off in cutlass.range_constexpr(3):
                a, bb = self.stat_merge(a, bb, cute.arch.shuffle_sync_bfly(a, offset=4 << off),
                                        cute.arch.shuffle_sync_bfly(bb, offset=4 << off))
            if lane == 0:
                sRed[0, ctid // 32] = a
                sRed[1, ctid // 32] = bb
            pipeline.NamedBarrier(barrier_id=2, num_threads=256).arrive_and_wait()   # sRed written by 8 warps
            if ctid == 0:
                a, bb = sRed[0, 0], sRed[1, 0]
                for w in cutlass.range_constexpr(1, CONSUMER_WARPS):
                    a, bb = self.stat_merge(a, bb, sRed[0, w], sRed[1, w])
                mStat[self.stat_coord(batch, row)] = self.stat_final(a, bb)

    @cute.jit
    def blocks_split(self, pipe, hpipe, sK, sQ, sC, sPart, mma: cute.TiledMma, mma_acc: cute.TiledMma,
                     mIdx: cute.Tensor, mLen: cute.Tensor, mS: cute.Tensor, stat, scale: Float32, batch: Int32,
                     row: Int32, n_slots: Int32, n_blk: Int32, seqlen_k: Int32, q_bar, ctid: Int32, cwg: Int32):
        """HEAD_SPLIT: consumer cwg takes heads [cwg NQ, cwg NQ + NQ) of every block (A = the block's chunks, read by
        both; B = its Q tile), the wgmma sums promoted to fp32 in pipelined groups (mma_block with a second partial
        accumulator: no wait per group), then the f-sum over its heads per slot. W1 hands its 64 slot sums to W0
        through sPart[n % 2] (hpipe: 128 arrivals on the full mbarrier after the stores, W0 waits, reads, and
        arrives on the empty one that W1 waits on before rewriting the stage two blocks later); W0 adds them, masks,
        stores the scores and keeps the statistic (W1's stays the empty one)."""
        NQ, NC = self.NQ, self.NC
        quad = ctid % 4
        thr, tSrK, tSrQ, c_mn = consumer_operands(mma, mma_acc, ctid, sK, sQ[None, None, cwg], (BK, NQ))
        kpc = self.DC // 16
        n_valid = n_slots
        if cutlass.const_expr(self.has_length):
            n_valid = cutlass.min(n_slots, cutlass.max(mLen[self.stat_coord(batch, row)], Int32(0)))
        praw = cute.make_rmem_tensor((2,), Int32)       # W0: the thread's two slots' idx, loaded one block ahead
        if cwg == 0:
            if n_blk > 0:
                self.prefetch_idx(praw, mIdx, batch, row, Int32(0), c_mn, n_slots)
        h0 = cwg * NQ
        cute.arch.mbarrier_wait(q_bar, 0)
        for n in cutlass.range(n_blk, unroll=1):
            kcur = cute.make_rmem_tensor((2,), Int32)
            for r in cutlass.range_constexpr(2):
                kcur[r] = praw[r]
            if cwg == 0:
                if n + 1 < n_blk:
                    self.prefetch_idx(praw, mIdx, batch, row, n + 1, c_mn, n_slots)
            acc, part, part2 = block_accumulators(thr, (BK, NQ), self.PROMOTE, True)
            mma_block(pipe, mma, mma_acc, acc, part, tSrK, tSrQ, self.stages, Int32(0), n * NC, NC, kpc,
                      self.PROMOTE, part2, 1)
            s_mn = acc_mn_view(acc)
            sums = cute.make_rmem_tensor((2,), Float32)
            sums.fill(0.0)
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                cv = sC[h0 + c_mn[0, c][1]]
                for r in cutlass.range_constexpr(2):
                    sums[r] = sums[r] + self.element(s_mn[r, c], cv, scale)
            for r in cutlass.range_constexpr(2):
                sums[r] = quad_sum(sums[r])
            if cwg == 1:
                st = ring_state(2, Int32(0), n, True, 1)
                hpipe.producer_acquire(st)
                if quad == 0:
                    for r in cutlass.range_constexpr(2):
                        sPart[st.index, c_mn[r, 0][0]] = sums[r]
                hpipe.producer_commit(st)            # every W1 thread arrives after its stores (release)
            else:
                st = ring_state(2, Int32(0), n, False, 1)
                hpipe.consumer_wait(st)
                for r in cutlass.range_constexpr(2):
                    sums[r] = sums[r] + sPart[st.index, c_mn[r, 0][0]]
                hpipe.consumer_release(st)           # after this thread's reads
                self.store_block(sums, kcur, c_mn, n, n_valid, n_slots, seqlen_k, quad, mS, stat, batch, row)

    @cute.jit
    def produce_block(self, pipe, copy, gKv: cute.Tensor, sK: cute.Tensor, raw, rows, mIdx: cute.Tensor,
                      batch: Int32, row: Int32, n: Int32, row_len: Int32, seqlen_k: Int32, k_off: Int32,
                      lag: cutlass.Constexpr, tidx: Int32, lean=None):
        """The producer's block n: validate its pieces' idx (raw, loaded IDX_AHEAD blocks earlier: the one wait on
        them), reload raw with block n + IDX_AHEAD's (no wait), then per chunk: acquire its stage, one 16-byte
        cp.async per valid piece, commit, and publish the chunk `lag` groups back.

        lean (LEAN_GATHER): (copy_raw, a0, gcol, rsb), the copies by addresses formed once, the same pieces into the
        same swizzled shared-memory bytes by the same cp.async (p_bytes, s_bytes: lean_strides, trace-time integers
        here, where they stay constants of the IR). A thread's piece p is row tidx // per_row +
        p x step (step = 128 // per_row rows), column tidx % per_row, so its shared address is a0 (piece 0 of stage 0)
        + p x p_bytes + the stage x s_bytes (lean_strides: multiples of 1024, which leave the swizzle's bits [4, 10)
        alone), and its global address gcol (the thread's column) + the row x rsb (row stride in bytes) + the
        chunk's column bytes: ~8 instructions a copy instead of ~25 (PTX)."""
        per_row = self.DC // PIECE
        for p in cutlass.range_constexpr(self.pieces):
            rows[p] = Int32(cutlass.select_(raw[p] >= 0 and raw[p] < seqlen_k, k_off + raw[p], Int32(-1)))
        self.load_slots(raw, mIdx, batch, row, n + self.IDX_AHEAD, row_len, tidx)
        for c in cutlass.range_constexpr(self.NC):
            g = n * self.NC + c
            st = self.chunk_state(g, True)
            pipe.producer_acquire(st)
            if cutlass.const_expr(lean is None):
                sKs = sK[None, None, st.index]
                for p in cutlass.range_constexpr(self.pieces):
                    piece = tidx + 128 * p
                    if rows[p] >= 0:
                        # one 16-byte atom: 8 contiguous elements of the key row into the (swizzled) smem row
                        src = cute.local_tile(gKv[rows[p], None], (PIECE,), (c * per_row + piece % per_row,))
                        dst = cute.local_tile(sKs[piece // per_row, None], (PIECE,), (piece % per_row,))
                        copy(src, dst)
            else:
                copy_raw, a0, gcol, rsb = lean
                p_bytes, s_bytes = self.lean_strides(sK.layout)
                el = self.dt.width // 8
                a_s = a0 + st.index * s_bytes
                for p in cutlass.range_constexpr(self.pieces):
                    if rows[p] >= 0:
                        copy_raw(a_s + p * p_bytes, gcol + Int64(rows[p]) * rsb + c * self.DC * el)
            cute.arch.cp_async_commit_group()
            if g >= lag:
                publish(pipe, self.stages, self.chunk_state(g - lag, True).index, lag)

    def lean_strides(self, layout):
        """(bytes from a thread's piece p to piece p + 1, bytes from stage s to s + 1) of the static ring layout,
        checked while tracing to be the same for every producer thread, piece and stage (the layout is affine there)
        and multiples of 1024 bytes (so adding them commutes with the 128-byte swizzle): the premise of
        produce_block's lean copies."""
        per_row = self.DC // PIECE
        step = 128 // per_row
        el = self.dt.width // 8
        p_bytes = (cute.crd2idx((step, 0, 0), layout) - cute.crd2idx((0, 0, 0), layout)) * el
        s_bytes = (cute.crd2idx((0, 0, 1), layout) - cute.crd2idx((0, 0, 0), layout)) * el
        assert isinstance(p_bytes, int) and isinstance(s_bytes, int), (p_bytes, s_bytes)
        assert p_bytes % 1024 == 0 and s_bytes % 1024 == 0, (p_bytes, s_bytes)
        for r0 in range(step):
            for col in range(per_row):
                base = cute.crd2idx((r0, col * PIECE, 0), layout)
                for p in range(self.pieces):
                    for st in range(self.stages):
                        off = cute.crd2idx((r0 + step * p, col * PIECE, st), layout)
                        assert (off - base) * el == p * p_bytes + st * s_bytes, (r0, col, p, st)
        return p_bytes, s_bytes

    @cute.jit
    def store_block(self, sums, kcur, c_mn, n: Int32, n_valid: Int32, n_slots: Int32, seqlen_k: Int32, quad: Int32,
                    mS: cute.Tensor, stat, batch: Int32, row: Int32, quad_reduce: cutlass.Constexpr = False):
        """Block n's head sums of this thread's two slots (summed over the quad here when quad_reduce, else already)
        -> MASK where the slot is invalid (past topk_length, idx < 0 or >= Sk: a select, never arithmetic), stored by
        lanes quad 0 and 1 (rows r and r + 8), and added to the row statistic."""
        for r in cutlass.range_constexpr(2):
            j = n * BK + c_mn[r, 0][0]
            valid = j < n_valid and kcur[r] >= 0 and kcur[r] < seqlen_k
            h = quad_sum(sums[r]) if cutlass.const_expr(quad_reduce) else sums[r]
            v = Float32(cutlass.select_(valid, h, Float32(self.MASK)))
            if quad == r:
                if j < n_slots:
                    mS[self.out_coord(batch, row, j)] = v
            sums[r] = v
        self.stat_update(stat, 0, sums[0], sums[1])

    @cute.jit
    def load_slots(self, raw, mIdx: cute.Tensor, batch: Int32, row: Int32, n: Int32, row_len: Int32, tidx: Int32):
        """raw[p] = idx of the slot whose key row piece p of block n gathers, -1 past the row's slots (past
        topk_length or K); plain loads whose latency the caller hides behind a block of copies."""
        per_row = self.DC // PIECE
        for p in cutlass.range_constexpr(self.pieces):
            j = n * BK + (tidx + 128 * p) // per_row
            v = Int32(-1)
            if j < row_len:
                v = mIdx[self.out_coord(batch, row, j)]
            raw[p] = v

    def lag(self):
        """Chunks a producer thread keeps in flight before publishing the oldest. Deadlock-free when the chunk a
        stage held last is published before the producer waits for that stage to empty. A consumer that releases
        each chunk on its own (PROMOTE > 0, or one chunk a block) frees a stage whose previous chunk is the
        producer's chunk g - stages when a half ring of stages / 2 holds whole blocks (any LAG < stages holds), at
        least g - stages / 2 otherwise (LAG < stages / 2). A
        consumer that releases chunk c only once chunk c + 1 arrived (PROMOTE = 0, head_sum_sm90.mma_block, several
        chunks a block) needs the lag of 1 (LAG with two chunks a block; shown for half rings of 4). HEAD_SPLIT: both
        consumers read every chunk of one ring and release chunk c at the latest once chunk c + 1 arrived (the
        pipelined promotion retires a chunk's last group behind the next group's issue), so the producer's acquire
        of chunk g + LAG (stage of chunk g + LAG - stages, freed once chunk g + LAG - stages + 1 was published) never
        waits on its own unpublished chunks while LAG <= stages - 2."""
        if self.HEAD_SPLIT:
            assert self.LAG <= self.stages - 2, self.stages
            return self.LAG
        if self.PROMOTE > 0 or self.NC == 1:
            # the other consumer's chunks interleave: the gap is >= stages / 2, exactly stages when whole blocks fill
            # a half ring
            gap = self.stages if (self.stages // 2) % self.NC == 0 else self.stages // 2
            assert self.LAG < gap, (self.stages, self.NC)
            return self.LAG
        assert self.stages == 8, self.stages      # the chained release was shown for half rings of 4
        return self.LAG if self.NC <= 2 else 1

    def chunk_state(self, g, producer):
        """Ring state of the producer's g-th chunk (block g // NC, chunk g % NC): the consumer n % 2's half ring
        (HEAD_SPLIT: one ring both consumers read, chunk g in stage g % stages)."""
        if self.HEAD_SPLIT:
            return ring_state(self.stages, 0, g, producer, 1)
        n = g // self.NC
        return ring_state(self.stages, n % 2, (n // 2) * self.NC + g % self.NC, producer)
