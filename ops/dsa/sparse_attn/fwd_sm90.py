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

Tiling. One CTA = one query row and one group of 64 heads (grid x = rows x H / 64: 128 heads = two CTAs adjacent in
launch order that gather the same rows, the second from L2; rows.SlotRows.launch_grid). Q tile (64 x Dqk, K-major)
resident in shared memory (one TMA load). Key slots in blocks of BK = 64, each block's kv rows gathered in NC = Dqk /
64 column chunks (64 keys x 64 columns, 8 KiB) into one of two block slots: block n in slot n % 2. A pipeline stage
(one full and one empty mbarrier) is a chunk group of a block: its V-left chunks 0-3, and the rest (V-right 4-7 and,
at Dqk 576, the rope chunk 8), as FlashMLA's sm90 kernel groups them: 4 stages a pair. The row's blocks are taken in
pairs (an odd count gets one more block, all slots invalid: zero rows, P = 0). 3 warpgroups:
  - warpgroup 0 (producer): warp 0 loads Q by TMA; all 128 threads gather 16-byte pieces of the rows with cp.async
    (indices loaded a pair ahead), zero-fill the pieces of invalid slots, write each block's gathered rows (sRows[n %
    2], -1 where invalid, before its chunk 0 is published) and publish group g LAG groups later, by cp.async.cg
    (L2 only: gather_sm90.gather_atom; gather_sm90.BlockGather). Fill order of a pair (a = 2i in slot 0, b = 2i + 1
    in slot 1): a's chunks 0-3, b's 4-8, a's 4-8, b's 0-3 (the order the two consumers free and read them).
  - warpgroups 1 and 2 (consumers W0, W1), ping-pong over the pair: W0 owns block a, W1 block b. Each takes its own
    block's S = Q K^T whole (wgmma m64 n64 k16 over the NC chunks; W1 starts at chunk 4), masks and scales it, and
    computes its P in fp32 against the running max chained through the pair: W0's max m0 = max(m_prev, max S_a),
    then W1's m1 = max(m0, max S_b) (sRed, handoff mbarriers M0 / M1). Each owns the output columns [256 w,
    256 w + 256) of every block: O_w += P_own V_own[w half] with P from registers (wgmma RS, m64 n256 k16), and
    O_w += P_other V_other[w half] with the other consumer's P from shared memory (SS): W1's P (at m1) in sS1, W0's
    P rescaled from m0 to m1 in fp32 then rounded, in sS0 (handoff mbarriers S1 / S0). W0's softmax runs under
    W1's Q K^T, W1's under W0's P V. Row sums l_w stay per consumer (of its own blocks, at the pair's max) and are
    added through sRed at the end (SUM_BAR). Epilogue: each consumer's 64 x 256 bf16 O goes by stmatrix into the Q
    tile's bytes (free: every Q K^T retired before SUM_BAR), then one TMA store per consumer (OUT_BAR).
Online softmax of a pair (x = c S, masked -inf; m~ = 0 while m = -inf, so no -inf - -inf; every exp2 argument <= 0):
    W0: m0 = max(m, max x_a);  O0, l0 *= 2^(m - m0~);  P_a = 2^(x_a - m0~);  l0 += sum P_a;  O0 += bf16(P_a) V_a[:256]
    W1: m1 = max(m, m0, max x_b);  O1, l1 *= 2^(m - m1~);  P_b = 2^(x_b - m1~);  l1 += sum P_b;
        O1 += bf16(P_b) V_b[256:]
    W0: f = 2^(m0 - m1~);  P_a' = P_a f;  l0, O0 *= f;  O0 += bf16(P_b) V_b[:256]      W1: O1 += bf16(P_a') V_a[256:]
    (m: the max both O halves are scaled to after the previous pair; m1 is the next pair's m.)
Shared-memory handoffs between the consumers: four mbarriers (M0, M1, S1, S0), each completed by the 128 threads of its
writer (every thread arrives after its own stores: release), waited by the other consumer with the pair's parity
(acquire); no named barrier is arrived on without a wait (compute-sanitizer racecheck does not take such an arrive as
ordering: 12 hazards on the H200, 2026-12-05, with named barriers here). A handoff never runs two phases ahead of its
waiter: each arrival of pair i + 1 comes after its writer waited on a barrier the reader completes after its wait of
pair i (M0(i+1) after M1(i), M1(i+1) after S0(i), S1(i+1) after M0(i+1), S0(i+1) after M1(i+1)). sRed[0] (m0): written
by one lane per quad of W0 before M0, read by W1 after it; rewritten (next pair, or l in the epilogue) only after M1,
which W1 arrives after its read. sRed[1] (m1): written by W1 before M1, read by W0 after it; W0 reads it before its S0
arrival, and W1 rewrites it (next pair, or l) only after its S0 wait. sS1 (its own 8 KiB): written by W1 (stmatrix,
fence.proxy.async) before S1, read by W0's wgmma after it; rewritten only after the next M0, which W0 arrives after its
P V on sS1 retired. sS0: Dqk 576 puts it in the bytes of slot 0's chunk 8 (block a's rope columns: read only by W0's own
Q K^T, retired before the write; V never reads them); Dqk 512 gives it 8 KiB of its own. Written by W0 before S0, read
by W1's wgmma after it; its bytes are refilled (576) or rewritten (512) only after W1's P V on it retired (W1 releases
slot 0's chunks after that wait; 512: the next M1). kv chunk groups: cp.async / zero stores ordered by the group's full
mbarrier (128 producer arrivals); every consumer thread arrives once on each group's empty mbarrier per block (256
arrivals), after its last read of every chunk of the group (released_groups: the done() call that covers the group's
last chunk) and only after waiting on the group's full barrier of the same block itself (so an arrival can never count
toward the block before: a group a consumer never reads it waits on, already complete, and frees at once); a consumer
also waits itself on the other slot's groups before its SS P V reads them. W1 stores its P to sS1 before issuing the RS
wgmma that reads the same registers (no instruction reads an in-flight wgmma's A registers). No wait of pair i + 1 comes
before a release of pair i that the producer needs to publish it (the fill order, LAG and the release points together);
the model in tests/test_sparse_attn_pingpong_protocol.py runs the whole protocol for every LAG, Dqk and pair count.
sRows[n % 2]: written by 16 producer threads after chunk 0 of block n was acquired, read by the block's owner after its
Q K^T waits, before it frees the group of chunk 0. sO (in sQ): stmatrix stores of one consumer, fence.proxy.async,
OUT_BAR (all 256 consumer threads), then the TMA store issued by one elected lane of that consumer's first warp, which
waits until the store has read shared memory.
Shared memory: Q 72 KiB + 2 block slots x NC x 8 KiB + sS1 8 KiB (+ sS0 8 KiB at Dqk 512) + sRed / sRows / barriers
(Dqk 576: ~225 KiB of 227).

Layouts. Dense: q [B,Sq,H,Dqk], kv [B,Skv,Dqk], idx int32 [B,Sq,K], topk_length int32 [B,Sq], sink fp32 [H],
out bf16 [B,Sq,H,Dv], lse fp32 [B,H,Sq]. THD: q [Tq,H,Dqk], kv [Tkv,Dqk], idx [Tq,K] (local to the row's sequence),
topk_length [Tq], out [Tq,H,Dv], lse [H,Tq], cu_seqlens_q/k int32 [batch+1]; a row finds its sequence by a warp-wide
search of cu_seqlens_q; rows at or past cu_seqlens_q[-1] get out 0, lse -inf.

Status: the ping-pong with mbarrier handoffs verified on an H100 (2026-12-05 14:56, perf/device_2026-12-05T1456.txt):
tests/gpu/test_dsa_sparse_attn.py 36 passed, racecheck 0 hazards, memcheck 0 errors (named-barrier handoffs had given 4
/ 12 racecheck hazards on sRed, H100 / H200). Chunk groups and cp.async.cg (2026-12-05 17:02, H100,
perf/gather_trials_2026-12-05T1700.txt; knobs then, bitwise equal to the per-chunk .ca form in the tests, racecheck 0
and memcheck 0 with them on): Sq 4K, Skv 8K, top-k 2048, 576/512, H 128, same run: per-chunk .ca 5.66 ms = 413 TFLOP/s,
.cg 515, groups 455, both 556. This form, H100 17:13 (perf/gather_defaults_2026-12-05T1709.txt): tests 35 passed,
racecheck 0, memcheck 0; bench/sparse_attention.py 553 TFLOP/s at Skv 8K, 507 at 32K, 431 at 64K. Tried and dropped: one
lane a warp arriving with a count of 32 (562 vs 556 with both, within run-to-run spread; 395 vs 411 alone), releases
moved behind an issued P V (532 vs 556), W0's next S behind its last P V (383-400 vs 406), producer lags of 6 and 8
chunks (within 1 %). A row's head-group CTAs adjacent in launch order (2026-12-05 19:20, H100,
perf/launch_order_2026-12-05T1920.txt; bitwise equal; tests of both orders passed): 523 -> 551 TFLOP/s at Skv 8K, 478 ->
491 at 32K, 429 -> 480 at 64K. The gather's L2 hints (gather_sm90.GatherHints): form 3 the default since 2026-12-05
22:00 (H200, two same-run A/Bs against the DSL copies, outputs bitwise equal: Skv 8K 530 -> 578 and 509 -> 542 TFLOP/s,
32K 531 -> 525 and 530 -> 486, 64K 473 -> 477 and 460 -> 504; tests and racecheck / memcheck clean with it). Issue 11
target: 550 TFLOP/s.
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
from ...common.softmax import acc_mn_view, p_operand_view, quad_max, quad_sum, rescale_rows, softmax_state

LN2 = math.log(2.0)
LOG2E = math.log2(math.e)
HG = 64              # heads per CTA (one wgmma M)
BK = 64              # key slots per block (the S tile's N)
DC = 64              # kv columns per chunk (one 128-byte swizzle atom)
VQ = 4               # kv chunks of one consumer's 256 output columns
NUM_THREADS = 384
PIECE = 8            # bf16 elements per 16-byte cp.async
SUM_BAR, OUT_BAR = 7, 8                          # named barriers of both consumers (256 threads, both wait)
M0, M1, S1, S0 = 0, 1, 2, 3                      # the consumers' handoff mbarriers (128 arrivals: the writer)
SINK_EXP_MAX = 126.0
PRODUCER_REGS, CONSUMER_REGS = 56, 224          # 56 + 2 x 224 = 504 = 3 x 168: the pool a 384-thread CTA gets


class SparseAttnFwdSm90(SlotRows, BlockGather):
    """One compiled variant: (Dqk, Dv, heads, varlen, has_length, has_sink)."""

    LAG = 1        # chunk groups of cp.async in flight per producer thread before the oldest is published (1..4)
    GATHER_PERIOD = 2
    GATHER_PREFETCH = 3   # the L2::256B hint, evict_last while the kv fits EVICT_LAST_KV_BYTES (module docstring)

    def __init__(self, head_dim: int, v_head_dim: int, heads: int, varlen: bool, has_length: bool, has_sink: bool):
        assert head_dim in (512, 576) and v_head_dim == 512 and heads in (64, 128), (head_dim, v_head_dim, heads)
        self.D, self.Dv, self.H = head_dim, v_head_dim, heads
        self.NC = head_dim // DC
        self.G = len(self.gather_groups())        # pipeline stages a block (2: V-left and the rest)
        self.stages = 2 * self.G                  # pipeline stages: 2 block slots x G
        self.bufs = 2 * self.NC                   # chunk buffers: 2 block slots x NC chunks
        self.varlen, self.has_length, self.has_sink = varlen, has_length, has_sink
        self.dt = cutlass.BFloat16
        self.pieces = BK * DC // PIECE // 128     # cp.async pieces per producer thread per chunk (4)
        self.s0_in_rope = self.NC == 9            # sS0 in slot 0's chunk 8 (Dqk 576), else its own buffer

    def gather_order(self):
        """A pair's fill order, (block of the pair, group): block a's V-left chunks (W0 reads them first and frees
        them first), block b's chunks 4.. (W1's Q K^T starts there), a's chunks 4.., b's V-left chunks (read last,
        by W0's second P V)."""
        return ((0, 0), (1, 1), (0, 1), (1, 0))

    def gather_groups(self):
        """Two pipeline stages a block: the V-left chunks 0-3 and the rest (V-right and, at Dqk 576, the rope)."""
        return (tuple(range(VQ)), tuple(range(VQ, self.NC)))

    def group_of(self, c):
        return int(c >= VQ)

    def buffer_index(self, n, c, st):
        """Chunk c of block n lives in chunk buffer (n % 2) NC + c."""
        return (n % 2) * self.NC + c

    def released_groups(self, chunks, prior=()):
        """The groups a consumer frees when its last reads of `chunks` of a block are behind it, `prior` the chunks of
        that block it freed before: each group all of whose chunks are in prior + chunks, not all in prior (in order
        of first appearance)."""
        groups, out = self.gather_groups(), []
        for c in chunks:
            g = self.group_of(c)
            if g not in out and set(groups[g]) <= set(prior) | set(chunks) and not set(groups[g]) <= set(prior):
                out.append(g)
        return tuple(out)

    def touched_groups(self, chunks):
        """The groups of `chunks`, in order of first appearance."""
        return tuple(dict.fromkeys(self.group_of(c) for c in chunks))

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
            grid = self.launch_grid(mQ.shape[0], 1)
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            kv_v = cute.make_tensor(mKv.iterator, cute.make_layout((mKv.shape[1], D, mKv.shape[0]),
                                                                   stride=(mKv.stride[1], 1, mKv.stride[0])))
            o_v = cute.make_tensor(mO.iterator, cute.make_layout((mO.shape[1] * H, self.Dv, mO.shape[0]),
                                                                 stride=(mO.stride[2], 1, mO.stride[0])))
            grid = self.launch_grid(mQ.shape[1], mQ.shape[0])
        K, MN = OperandMajorMode.K, OperandMajorMode.MN
        qk_mma = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (1, 1, 1), tiler_mn=(HG, BK))
        qk_mma_acc = sm90_utils.make_trivial_tiled_mma(dt, dt, K, K, Float32, (1, 1, 1), tiler_mn=(HG, BK))
        VH = self.Dv // 2
        pv_rs = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (1, 1, 1), tiler_mn=(HG, VH),
                                                  a_source=warpgroup.OperandSource.RMEM)
        pv_ss = sm90_utils.make_trivial_tiled_mma(dt, dt, K, MN, Float32, (1, 1, 1), tiler_mn=(HG, VH))
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (HG, BK, D), dt, 1)
        # one chunk: 64 keys x 64 columns, 128-byte rows (K-major for Q K^T)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (HG, BK, DC), dt, self.bufs)
        # V of one consumer: 4 consecutive chunks read as one MN-major 256-column x 64-key tile (the layout tiles K
        # first, so its 64-column atoms sit 8 KiB apart: the chunks)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (HG, VH, BK), dt, 1)
        # P of one block: 64 heads x 64 keys, K-major (the A operand of the SS P V), one chunk's bytes
        sS_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (HG, DC, BK), dt, 1)
        assert cute.cosize(sS_layout) == BK * DC
        tma_q, tQ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), q_v,
                                                cute.slice_(sQ_layout, (None, None, 0)), (HG, D))
        # out: each consumer's 64 heads x 256 columns, staged in the Q tile's bytes (free once both Q K^T retired)
        sO_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (HG, DC, VH), dt, 2)
        tma_o, tO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), o_v,
                                                cute.slice_(sO_layout, (None, None, 0)), (HG, VH))
        self.q_bytes = HG * D * dt.width // 8
        n_sbuf = 1 if self.s0_in_rope else 2

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_x: cute.struct.MemRange[cutlass.Int64, 4]
            sRed: cute.struct.MemRange[Float32, 2 * HG]
            sRows: cute.struct.MemRange[Int32, 2 * BK]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sS: cute.struct.Align[cute.struct.MemRange[dt, n_sbuf * cute.cosize(sS_layout)], 1024]

        self.shared_storage = SharedStorage
        assert cute.cosize(sO_layout) <= cute.cosize(sQ_layout)
        self.kernel(tma_q, tQ, tma_o, tO, kv_v, mIdx, mLen, mSink, mO, mLSE, mCuQ, mCuK, scale_log2, qk_mma,
                    qk_mma_acc, pv_rs, pv_ss, sQ_layout, sK_layout, sV_layout, sS_layout, sO_layout).launch(
            grid=grid, block=(NUM_THREADS, 1, 1), stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_o: cute.CopyAtom, tO: cute.Tensor, mKv: cute.Tensor,
               mIdx: cute.Tensor, mLen: cute.Tensor, mSink: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mCuQ: cute.Tensor, mCuK: cute.Tensor, scale_log2: Float32, qk_mma: cute.TiledMma,
               qk_mma_acc: cute.TiledMma, pv_rs: cute.TiledMma, pv_ss: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout, sS_layout: cute.ComposedLayout,
               sO_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        row, grp, batch = self.grid_coords()
        args = (tma_q, tQ, tma_o, tO, mKv, mIdx, mLen, mSink, mLSE, scale_log2, (qk_mma, qk_mma_acc, pv_rs, pv_ss),
                (sQ_layout, sK_layout, sV_layout, sS_layout, sO_layout), tidx, grp)
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
        return cute.local_tile(sK[r, None, index], (PIECE,), (col,))

    @cute.jit
    def attend(self, tma_q, tQ, tma_o, tO, mKv, mIdx, mLen, mSink, mLSE, scale_log2: Float32, mmas, layouts,
               tidx: Int32, grp: Int32, batch: Int32, row: Int32, k_off: Int32, seqlen_k: Int32):
        D = self.D
        sQ_layout, sK_layout, sV_layout, sS_layout, sO_layout = layouts
        n_slots = mIdx.shape[1] if cutlass.const_expr(self.varlen) else mIdx.shape[2]
        row_len = n_slots
        if cutlass.const_expr(self.has_length):
            row_len = cutlass.max(cutlass.min(n_slots, mLen[self.row_coord(batch, row)]), Int32(0))
        n_pair = (row_len + 2 * BK - 1) // (2 * BK)

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        kv_base = storage.sKV.data_ptr()
        sRed = storage.sRed.get_tensor(cute.make_layout((2, HG), stride=(HG, 1)))
        sRows = storage.sRows.get_tensor(cute.make_layout((2, BK), stride=(BK, 1)))
        sO = cute.make_tensor(cute.recast_ptr(storage.sQ.data_ptr(), sO_layout.inner, dtype=self.dt),
                              sO_layout.outer)
        chunk = BK * DC
        s1_ptr = storage.sS.data_ptr()
        s0_ptr = kv_base + (self.NC - 1) * chunk if cutlass.const_expr(self.s0_in_rope) else s1_ptr + chunk
        sS = tuple(cute.make_tensor(cute.recast_ptr(p, sS_layout.inner, dtype=self.dt),
                                    cute.slice_(sS_layout.outer, (None, None, 0))) for p in (s0_ptr, s1_ptr))
        # V of consumer w's columns in slot s: chunks s NC + w VQ .. + VQ, one MN-major tile
        sV = tuple(tuple(cute.make_tensor(cute.recast_ptr(kv_base + (s * self.NC + w * VQ) * chunk, sV_layout.inner,
                                                          dtype=self.dt), cute.slice_(sV_layout.outer, (None, None, 0)))
                         for s in range(2)) for w in range(2))
        sQ2 = sQ[None, None, 0]
        q_bar = storage.mbar_q.data_ptr()
        gQ = cute.local_tile(tQ[None, None, batch], (HG, D), (self.q_row(row, grp), 0))
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ2, 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        x_bar = storage.mbar_x.data_ptr()
        if tidx == 0:
            for b in cutlass.range_constexpr(4):
                cute.arch.mbarrier_init(x_bar + b, 128)
        pipe = self.gather_pipeline(storage.mbar.data_ptr(), 256, q_bar, tidx)   # (its sync covers x_bar's init)

        # the MMAs' ACCUMULATE fields, fixed once outside all staged control flow (both consumers' branches use them)
        qk_mma, qk_mma_acc, pv_rs, pv_ss = mmas
        qk_mma.set(warpgroup.Field.ACCUMULATE, False)
        qk_mma_acc.set(warpgroup.Field.ACCUMULATE, True)
        pv_rs.set(warpgroup.Field.ACCUMULATE, True)
        pv_ss.set(warpgroup.Field.ACCUMULATE, True)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            # ---------------- producer warpgroup: Q by TMA (warp 0), kv rows by cp.async (all 128 threads)
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                load_resident_tiles(q_bar, self.q_bytes, ((tma_q, tQg, tQs),))
            self.produce(pipe, sK, mKv, mIdx, batch, row, row_len, 2 * n_pair, k_off, seqlen_k, tidx, sRows)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            ctx = (pipe, (q_bar, x_bar), sQ2, sK, sV, sS, sRed, sRows, mmas, scale_log2, tidx % 128, n_pair)
            if wg == 1:
                acc_o, row_max, row_sum, s_id = self.consume_first(*ctx)
                self.epilogue(acc_o, row_max, row_sum, s_id, sRed, sO, tma_o, tO, mSink, mLSE, mmas[2], tidx % 128,
                              Int32(0), grp, batch, row)
            else:
                acc_o, row_max, row_sum, s_id = self.consume_second(*ctx)
                self.epilogue(acc_o, row_max, row_sum, s_id, sRed, sO, tma_o, tO, mSink, mLSE, mmas[2], tidx % 128,
                              Int32(1), grp, batch, row)

    # ------------------------------------------------------------------------------------------ consumers
    @cute.jit
    def consumer_setup(self, sQ2, sK, sV, sS, mmas, ctid: Int32, w: cutlass.Constexpr):
        """Consumer w's fragments and register state: Q / K operands of S, the identity view of S, O (64 x 256),
        V of its columns in its own slot (RS P V) and in the other slot (SS P V, A = the other's sS), the stmatrix
        copy of P, and the softmax state."""
        qk_mma, _, pv_rs, pv_ss = mmas
        thr_qk = qk_mma.get_slice(ctid)
        thr_rs = pv_rs.get_slice(ctid)
        thr_ss = pv_ss.get_slice(ctid)
        frags = (thr_qk.make_fragment_A(thr_qk.partition_A(sQ2)), thr_qk.make_fragment_B(thr_qk.partition_B(sK)),
                 acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((HG, BK)))),
                 thr_rs.make_fragment_B(thr_rs.partition_B(sV[w][w])),
                 thr_ss.make_fragment_B(thr_ss.partition_B(sV[w][1 - w])),
                 thr_ss.make_fragment_A(thr_ss.partition_A(sS[1 - w])))
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dt), qk_mma)
        acc_o = thr_rs.make_fragment_C(thr_rs.partition_shape_C((HG, self.Dv // 2)))
        acc_o.fill(0.0)
        row_max, row_sum = softmax_state(2)
        corr = cute.make_rmem_tensor((2,), Float32)
        m_use = cute.make_rmem_tensor((2,), Float32)
        return thr_qk, frags, (r2s, r2s.get_slice(ctid)), acc_o, (row_max, row_sum, corr, m_use)

    @cute.jit
    def consume_first(self, pipe, bars, sQ2, sK, sV, sS, sRed, sRows, mmas, scale_log2: Float32, ctid: Int32,
                      n_pair: Int32):
        """W0: block a = 2i of each pair (slot 0) and output columns [0, 256)."""
        q_bar, x_bar = bars
        thr_qk, frags6, (r2s, thr_r2s), acc_o, (row_max, row_sum, corr, m_use) = self.consumer_setup(
            sQ2, sK, sV, sS, mmas, ctid, 0)
        s_id = frags6[2]
        acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((HG, BK)))
        rP = cute.make_rmem_tensor(acc_s.layout, self.dt)                  # bf16 P: the RS operand, then stmatrix
        st = (row_max, row_sum, corr, m_use, acc_s, rP, acc_o)
        frags = frags6 + (r2s, thr_r2s, x_bar)
        cute.arch.mbarrier_wait(q_bar, 0)
        for i in cutlass.range(n_pair, unroll=1):
            self.first_pair(pipe, sS, sRed, sRows, mmas, scale_log2, ctid, 2 * i, st, frags)
        return acc_o, row_max, row_sum, s_id

    @cute.jit
    def first_pair(self, pipe, sS, sRed, sRows, mmas, scale_log2: Float32, ctid: Int32, n: Int32, st, frags):
        """W0's part of the pair (n, n + 1)."""
        qk_mma, qk_mma_acc, pv_rs, pv_ss = mmas
        NC = self.NC
        row_max, row_sum, corr, m_use, acc_s, rP, acc_o = st
        tSrQ, tSrK, s_id, tOrV_own, tOrV_other, tOrS_other, r2s, thr_r2s, x_bar = frags
        ph = (n // 2) % 2                                          # pair n // 2's phase of each handoff barrier
        self.issue_qk(pipe, qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, n, tuple(range(NC)))
        warpgroup.wait_group(0)
        s_mn = acc_mn_view(acc_s)
        self.mask_scale(s_mn, s_id, sRows, 0, scale_log2, corr)          # corr: the block's row max
        for r in cutlass.range_constexpr(2):
            m_new = cute.arch.fmax(row_max[r], corr[r])
            self.exp_row(s_mn, r, m_new, row_max, row_sum, corr, m_use)
            if ctid % 4 == 0:
                sRed[0, s_id[r, 0][0]] = m_new
        cute.arch.mbarrier_arrive(x_bar + M0)                      # m0 -> W1 (release: this thread's stores)
        rescale_rows(acc_mn_view(acc_o), corr)
        rP.store(acc_s.load().to(self.dt))
        warpgroup.fence()
        self.issue_pv(pv_rs, acc_o, p_operand_view(rP, BK), tOrV_own)
        cute.arch.mbarrier_wait(x_bar + M1, ph)                    # m1 written by W1
        warpgroup.wait_group(0)                                    # own P V retired: rP and acc_o free
        self.release_first(pipe, n)
        for r in cutlass.range_constexpr(2):
            m1 = sRed[1, s_id[r, 0][0]]
            m1_use = Float32(cutlass.select_(m1 == -Float32.inf, Float32(0.0), m1))
            corr[r] = cute.math.exp2(row_max[r] - m1_use, fastmath=True)     # <= 1 (0 while m0 = -inf)
            row_max[r] = m1
            row_sum[r] = row_sum[r] * corr[r]
        s_mn2 = acc_mn_view(acc_s)
        rP_mn = acc_mn_view(rP)
        for r in cutlass.range_constexpr(2):
            for ci in cutlass.range_constexpr(cute.size(s_mn2, mode=[1])):
                rP_mn[r, ci] = self.dt(s_mn2[r, ci] * corr[r])
        cute.copy(r2s, thr_r2s.retile(rP), thr_r2s.partition_D(sS[0]))
        cute.arch.fence_proxy("async.shared", space="cta")       # this thread's P stores -> wgmma (async proxy)
        if cutlass.const_expr(self.s0_in_rope):
            self.done(pipe, n, (NC - 1,), tuple(range(2 * VQ)))   # chunk 8 now holds sS0 (W1 frees it last)
        cute.arch.mbarrier_arrive(x_bar + S0)                      # sS0 -> W1, and this thread's m1 reads are behind
        cute.arch.mbarrier_wait(x_bar + S1, ph)                    # sS1 complete
        self.wait_chunks(pipe, n + 1, tuple(range(VQ)))            # slot 1's V-left (complete: W1 read them)
        rescale_rows(acc_mn_view(acc_o), corr)
        warpgroup.fence()
        self.issue_pv(pv_ss, acc_o, tOrS_other, tOrV_other)
        warpgroup.wait_group(0)
        self.done(pipe, n + 1, tuple(range(VQ)), tuple(range(VQ, NC)))     # slot 1's V-left read

    @cute.jit
    def release_first(self, pipe, n: Int32):
        """W0's releases of the pair once its own P V retired: slot 0's chunks 0-7 (Q K^T and V-left read, V-right
        never) and slot 1's chunks VQ.. (never read by W0)."""
        self.done(pipe, n, tuple(range(2 * VQ)))
        self.done(pipe, n + 1, tuple(range(VQ, self.NC)))

    @cute.jit
    def consume_second(self, pipe, bars, sQ2, sK, sV, sS, sRed, sRows, mmas, scale_log2: Float32, ctid: Int32,
                       n_pair: Int32):
        """W1: block b = 2i + 1 of each pair (slot 1) and output columns [256, 512)."""
        q_bar, x_bar = bars
        qk_mma, qk_mma_acc, pv_rs, pv_ss = mmas
        NC = self.NC
        thr_qk, frags6, (r2s, thr_r2s), acc_o, (row_max, row_sum, corr, m_use) = self.consumer_setup(
            sQ2, sK, sV, sS, mmas, ctid, 1)
        tSrQ, tSrK, s_id, tOrV_own, tOrV_other, tOrS_other = frags6
        cute.arch.mbarrier_wait(q_bar, 0)
        for i in cutlass.range(n_pair, unroll=1):
            n = 2 * i + 1
            ph = i % 2                                                 # pair i's phase of each handoff barrier
            acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((HG, BK)))
            rP = cute.make_rmem_tensor(acc_s.layout, self.dt)              # bf16 P: the RS operand, then stmatrix
            self.issue_qk(pipe, qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, n,
                          tuple(range(VQ, NC)) + tuple(range(VQ)))
            warpgroup.wait_group(0)
            s_mn = acc_mn_view(acc_s)
            self.mask_scale(s_mn, s_id, sRows, 1, scale_log2, corr)          # reads sRows[1] before chunk 0 is freed
            self.release_second(pipe, n)
            cute.arch.mbarrier_wait(x_bar + M0, ph)                    # m0 written by W0
            for r in cutlass.range_constexpr(2):
                m_new = cute.arch.fmax(cute.arch.fmax(row_max[r], sRed[0, s_id[r, 0][0]]), corr[r])
                self.exp_row(s_mn, r, m_new, row_max, row_sum, corr, m_use)
                if ctid % 4 == 0:
                    sRed[1, s_id[r, 0][0]] = m_new
            cute.arch.mbarrier_arrive(x_bar + M1)                      # m1 -> W0; this thread's m0 reads behind
            rescale_rows(acc_mn_view(acc_o), corr)
            rP.store(acc_s.load().to(self.dt))
            # sS1 first: no instruction may read rP while the RS wgmma below (A = rP) is in flight (PTX: undefined)
            cute.copy(r2s, thr_r2s.retile(rP), thr_r2s.partition_D(sS[1]))
            cute.arch.fence_proxy("async.shared", space="cta")       # this thread's P stores -> wgmma (async proxy)
            cute.arch.mbarrier_arrive(x_bar + S1)                      # sS1 -> W0
            warpgroup.fence()
            self.issue_pv(pv_rs, acc_o, p_operand_view(rP, BK), tOrV_own)
            cute.arch.mbarrier_wait(x_bar + S0, ph)                    # sS0 complete
            self.wait_chunks(pipe, n - 1, tuple(range(VQ, 2 * VQ)))    # slot 0's V-right (complete: W0 read them)
            warpgroup.fence()
            self.issue_pv(pv_ss, acc_o, tOrS_other, tOrV_other)
            warpgroup.wait_group(1)                                    # own P V retired
            self.done(pipe, n, tuple(range(VQ, 2 * VQ)),                 # slot 1's V-right
                      tuple(range(VQ)) + ((NC - 1,) if self.s0_in_rope else ()))
            warpgroup.wait_group(0)                                    # P V on sS0 retired
            self.done(pipe, n - 1, tuple(range(VQ, NC)), tuple(range(VQ)))   # slot 0's V-right (and sS0 in its rope)
        return acc_o, row_max, row_sum, s_id

    @cute.jit
    def release_second(self, pipe, n: Int32):
        """W1's releases once its Q K^T of block n retired: slot 1's V-left (W0's to read) and rope (Q K^T only),
        slot 0's V-left (W1 never reads it)."""
        self.done(pipe, n, tuple(range(VQ)))
        if cutlass.const_expr(self.s0_in_rope):
            self.done(pipe, n, (self.NC - 1,), tuple(range(VQ)))
        self.done(pipe, n - 1, tuple(range(VQ)))

    # ------------------------------------------------------------------------------------------ consumer pieces
    @cute.jit
    def issue_qk(self, pipe, qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, n: Int32, chunks: cutlass.Constexpr):
        """S(n) = Q K_n^T over the chunks in the given order (whole groups, contiguous): wait each group's full barrier
        before its first chunk, then the chunks' 4 k-blocks each; one committed group."""
        kpc = DC // 16
        waits = tuple(j == 0 or self.group_of(chunks[j]) != self.group_of(chunks[j - 1]) for j in range(len(chunks)))
        gemm_chunks(pipe, lambda c: self.state(n, self.group_of(c), False), chunks, qk_mma, qk_mma_acc, acc_s,
                    lambda c, kb, _stage: (tSrQ[None, None, c * kpc + kb],
                                           tSrK[None, None, kb, self.buffer_index(n, c, None)]),
                    kpc, waits)

    @cute.jit
    def issue_pv(self, pv_mma: cute.TiledMma, acc_o, tOrP, tOrV):
        """O += P V over the block's 64 keys (4 k-steps of m64 n256 k16); one committed group."""
        for kb in cutlass.range_constexpr(BK // 16):
            cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb], acc_o)
        warpgroup.commit_group()

    @cute.jit
    def wait_chunks(self, pipe, n: Int32, chunks: cutlass.Constexpr):
        """Wait on block n's full barriers of these chunks, before reading chunks the other consumer waited on (the
        handoff mbarrier already orders them: this makes each read's own wait local)."""
        groups = self.touched_groups(chunks)
        for j in cutlass.range_constexpr(len(groups)):
            pipe.consumer_wait(self.state(n, groups[j], False))

    @cute.jit
    def done(self, pipe, n: Int32, chunks: cutlass.Constexpr, prior: cutlass.Constexpr = ()):
        """This thread's last read of block n's chunks is behind it (`prior`: the chunks of block n it freed before):
        for each group this completes (released_groups), wait its full barrier of block n (already complete when
        read before; a group never read is published by then too, the fill order being ahead), then arrive on its
        empty barrier."""
        groups = self.released_groups(chunks, prior)
        for j in cutlass.range_constexpr(len(groups)):
            st = self.state(n, groups[j], False)
            pipe.consumer_wait(st)
            pipe.consumer_release(st)

    @cute.jit
    def mask_scale(self, s_mn, s_id, sRows, slot: cutlass.Constexpr, scale_log2: Float32, blk_max):
        """x = c S where the slot is valid (sRows[slot, key] >= 0), else -inf; blk_max[r] = the quad's row max."""
        for r in cutlass.range_constexpr(2):
            m_loc = -Float32.inf
            for ci in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                ok = sRows[slot, s_id[0, ci][1]] >= 0
                x = Float32(cutlass.select_(ok, s_mn[r, ci] * scale_log2, -Float32.inf))
                s_mn[r, ci] = x
                m_loc = cute.arch.fmax(m_loc, x)
            blk_max[r] = quad_max(m_loc)

    @cute.jit
    def exp_row(self, s_mn, r: cutlass.Constexpr, m_new: Float32, row_max, row_sum, corr, m_use):
        """Row r against the new max: corr[r] = 2^(m_old - m~) (<= 1; 0 while m_old = -inf), P = 2^(x - m~) in
        place, row_sum = row_sum corr + sum P (this thread's columns), row_max = m_new."""
        m_use[r] = Float32(cutlass.select_(m_new == -Float32.inf, Float32(0.0), m_new))
        corr[r] = cute.math.exp2(row_max[r] - m_use[r], fastmath=True)
        row_max[r] = m_new
        part = Float32(0.0)
        for ci in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            p = cute.math.exp2(s_mn[r, ci] - m_use[r], fastmath=True)
            part = part + p
            s_mn[r, ci] = p
        row_sum[r] = row_sum[r] * corr[r] + part

    # ------------------------------------------------------------------------------------------ epilogue
    @cute.jit
    def epilogue(self, acc_o, row_max, row_sum, s_id, sRed, sO, tma_o, tO, mSink, mLSE, pv_mma: cute.TiledMma,
                 ctid: Int32, w: Int32, grp: Int32, batch: Int32, row: Int32):
        """l of both consumers through sRed (SUM_BAR: W0's last read of sRed[1] (m1) came before its S0 arrival, W1's
        of sRed[0] before its M1 arrival, both waited on by the other before it gets here), sink, lse (W0), out."""
        quad = ctid % 4
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
