"""Sparse indexer backward for Hopper (sm_90a), CuTe DSL: gradients of the sparse-stage indexer KL loss through
I[t, s] = sum_h w[t, h] relu(q[t, h] . k[idx[t, s]]) (docs/dsa.md, paddle_dsa/reference/dsa/indexer_loss.py).

Math (query row t, its valid slots s; c = loss_coeff * grad_loss / N, a device scalar given by the caller):

    x[s] = index_score[s] - index_lse                    p[s] = e^min(x, 0), 0 where x < -126 ln 2
    T[s] = max(attn_score[s] / max(attn_l1norm, 1e-10), e^-100)
    g[s] = -c T[s] where x[s] >= -100, else 0;           G[s] = g[s] - p[s] sum_s' g[s']      (0 at invalid slots)
    X[s, h] = k_s . q_h   (recomputed, fp32 wgmma)
    d_weights[t, h] = sum_s G[s] relu(X[s, h]);   dA[s, h] = G[s] w[h] 1[X[s, h] > 0]
    d_index_q[t, h] = sum_s dA[s, h] k_s;          d_index_k[idx_s] += sum_h dA[s, h] q_h     (fp32 atomics)
relu and its slope keep NaN (a NaN X reaches d_weights, dA and through it dq / dk); min / max clamps are selects that
keep NaN. A row with index_lse = +inf has x = -inf: p = 0, g = 0, zero gradients.

Tiling. One CTA = one query row, all Hi (16 / 32 / 64) index heads; slots in blocks of 64, each block's key rows
gathered by cp.async (producer warpgroup, invalid slots zero-filled) in Di / 64 chunks of 64 x 64 into its consumer's
part of a 4 W-stage ring (W = CONSUMERS consumer warpgroups, 2 by default; ring_state, as
ops/common/sparse_head_sum_sm90.py). Before the loop all 128 W consumer threads reduce sum_s g over the row (sRed,
PRE_BAR; four slots' loads in flight a thread) and load w (sW). Consumer warpgroup w takes blocks n = w, w + W, ... on
its own (no per-block cross-warpgroup barrier):
  X^T = K Q^T (m64 nHi k16; A = the chunks, B = the resident Q tile) -> G for the thread's two slots (their idx,
  index_score and attn_score loaded one block ahead, at a clamped slot and all three together, validity tested at
  use, so no load latency sits between the wgmma and the epilogue: slot_loads), d_weights partials, dA written over
  the X tile in the registers (relu by max.NaN, its slope selected from it: 1, 0 or NaN), converted to bf16 pairs and
  stored to its own sdA[w] by stmatrix (fence.proxy.async, named barrier DA_BAR + w over its 128 threads);
  dq^T (Di x Hi, registers over the warpgroup's blocks) += K^T dA (A = the chunks read MN-major, B = sdA read
  MN-major), issued first; then per chunk the dk tile (64 keys x 64 columns) = dA Q (A = sdA, B = Q read MN-major),
  waited and added to global fp32 with red.global.add.v4.f32 at the valid keys' rows (two lane-bit swaps first, so
  one warp instruction adds a whole 128-byte line to each of 4 keys: ops/common/vector_red_sm90.py red_tile_lines;
  each lane takes the dk rows of its partner lane ^ 4 once a block); wait_group 0, release the block's chunks.
Epilogue forms measured on the H100 (2026-12-06 08:50, bench/indexer_bwd_shapes.py, same run; dq / d_weights bitwise
equal, dk within the atomics' order): one 16-bit store an element with sW read and two selects an element 1.899 ms
(sparse 4K/8K k 2048 H 64) / 7.095 ms (dense causal 8K H 64); the same stores with one select 1.882 / 6.561; stmatrix
1.600 / 6.058 (this form); stmatrix with the block's two dk tiles issued together (a second accumulator, each reduced
under the other's wgmmas) 1.619 / 6.070, not kept. d_index_k by bulk reductions (DK_BULK, commit 08f578e: the dk tile
written to a padded fp32 staging tile as it lies in the registers, one 512-byte cp.reduce.async.bulk .add.f32 a key
row; tests and sanitizers clean) measured slower on the H200 (2026-12-06 10:15, same run: 1.714 vs 1.579 ms sparse,
6.346 vs 5.945 dense causal 8K) and was removed.
A consumer's next block's X^T issued behind this block's first dk tile (the loop peeled, so the dk reductions run
under it) measured slower on the H100 (2026-12-05, same run: sparse 4K/8K k 2048 H 64 1.99 vs 1.90 ms, dense causal
8K H 64 7.41 vs 6.96 ms) and was taken out again (it lives in the history as the X_EARLY knob, commit c02e5ec).
After the loop: d_weights partials reduced over the lanes of a warp (xor 4, 8, 16), then over the 4 W consumer warps
through sDW in a fixed order; consumers 1 .. W - 1 put their dq^T partials in sDQ (fp32, accumulator order) and
consumer 0 adds them in that order and stores d_index_q (bf16): both deterministic. d_index_k is not (fp32 atomics
in any order).
Shared-memory handoffs: sRed / sW written before PRE_BAR (all 128 W consumer threads), read after; sdA[w] written by
the 128 threads of warpgroup w, read by its wgmmas after DA_BAR + w, rewritten only after its wgmmas retired
(wait_group 0 by every thread of the warpgroup); sDW, sDQ written before END_BAR (128 W), read after.

Layouts. Dense: index_q [B,Sq,Hi,Di], index_k [B,Sk,Di], weights [B,Sq,Hi] (bf16 or fp32), topk_indices int32
[B,Sq,K], index_score / attn_score fp32 [B,Sq,K], index_lse / attn_l1norm fp32 [B,Sq], grad_scale fp32 [1],
d_index_q bf16 like index_q, d_index_k fp32 like index_k (zeroed by the seam, accumulated), d_weights fp32 [B,Sq,Hi].
THD: the same without B, cu_seqlens_q/k int32 [batch+1]; rows at or past cu_seqlens_q[-1]: dq 0, d_weights 0.

Deterministic variant (deterministic=True; the seam sums d_index_k per key: ops/common/deterministic_rows.py): the
grid covers the query rows [row0, row0 + R); entry e = ((row - row0) B + batch) K + slot; mdK is a staging buffer
fp32 [E, Di] and each valid slot's dk rows go to row e with plain stores as the tile lies in the registers
(vector_red_sm90.st_tile_pairs, no row exchange); mKeys[e] = the slot's global key row (b Sk + key, or the THD row),
-1 where it adds nothing, written by the producer as it gathers the block (publish_rows: the producer's validity
test is the consumers'), -1 for the slots past the last block (producer) and for a THD tail row (clear_row).
H200 2026-12-05 (perf/device_2026-12-05T0155.txt): tests/gpu/test_dsa_indexer_bwd.py and test_dsa_indexer_dense_bwd.py
deterministic cases pass (bitwise reruns, every chunking) but one d_weights gate on a cancelling row (output bitwise
the default mode's; the gate now scales by sum |G| relu), racecheck / memcheck clean; Sq 4K, Sk 8K, top-k 2048:
5.09 ms against the default's 1.89. Rerun with the new gate (2026-12-05 03:23, perf/device_2026-12-05T0323.txt):
test_dsa_indexer_bwd 26 passed, test_dsa_indexer_dense_bwd 38 passed, sanitizers clean.

Status: H100 2026-12-06 08:50 and 09:05-09:15 (the stmatrix epilogue; the whole suite at 09:05):
tests/gpu/test_dsa_indexer_bwd.py (28) and test_dsa_indexer_dense_bwd.py (39) pass, racecheck / memcheck clean; Sq 4K,
Sk 8K, top-k 2048, Hi 64, Di 128: 1.58-1.61 ms against cuDNN frontend's 1.93 ms in the same run (1.20-1.23x; 1.87 vs
1.95, 1.04x, before). H200 2026-12-06 10:14-10:23 (perf/device_2026-12-06T1017_h200_*): the whole suite, both
indexer backward files (every test also with the DK_BULK form, since removed) and their sanitizers pass; 1.57 ms
against cuDNN frontend's 1.93 in the same run (1.23x). Earlier, H200 2026-12-04: tests/gpu/test_dsa_indexer_bwd.py
passed (20), racecheck / memcheck clean; Sq 4K, Sk 8K, top-k 2048, Hi 64, Di 128: 2.28 ms against cuDNN frontend's
1.93 ms in the same run (2.59 before the slot loads moved a block ahead; bench/indexer_bwd_shapes.py sweeps the
launch shape; docs/performance.md). 2026-12-04 19:30 UTC (d_index_k by whole 128-byte lines, line_rows): the same
tests and sanitizers pass; 1.89 ms against cuDNN's 1.94.
Since (CPU only, 2026-12-04 21:58): the row exchange and the line reductions call vector_red_sm90.partner_rows /
red_tile_lines instead of their inline copies; PTX equal to the H200-run code but for 8 reordered instructions.
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
from ...common.head_sum_sm90 import ring_state
from ...common.vector_red_sm90 import partner_rows, red_tile_lines, st_tile_pairs
from ...common.softmax import acc_mn_view

BK = 64
DC = 64
PIECE = 8
PART = 4                 # chunk buffers per consumer warpgroup: two blocks of Di = 128
PRE_BAR, DA_BAR, END_BAR = 3, 4, 8     # DA_BAR + w: 4 .. 3 + CONSUMERS
EXP_ARG_MIN = -126.0 * math.log(2.0)
LOG_MIN = -100.0
PROB_MIN = math.exp(-100.0)
L1_EPS = 1e-10


class SparseIndexerBwdSm90(BlockGather):
    """One compiled variant: (Di, Hi, weights dtype name, varlen, has_length). Launch shape (class knobs, read at
    construction): CONSUMERS warpgroups (2 or 3) behind the producer, setmaxnreg REGS[CONSUMERS] = (producer,
    consumers)."""

    LAG = 3
    CONSUMERS = 2
    REGS = {2: (40, 232), 3: (24, 160)}

    def __init__(self, head_dim: int, heads: int, w_dtype: str, varlen: bool, has_length: bool,
                 deterministic: bool = False):
        assert head_dim in (64, 128) and heads in (16, 32, 64), (head_dim, heads)
        self.stage = deterministic      # d_index_k rows to a staging buffer (st.v2), keys to mKeys
        self.D, self.H, self.NC = head_dim, heads, head_dim // DC
        self.w_dtype, self.varlen, self.has_length = w_dtype, varlen, has_length
        self.dt = cutlass.BFloat16
        self.W = self.CONSUMERS
        assert self.W in self.REGS and 128 * (self.W * self.REGS[self.W][1] + self.REGS[self.W][0]) <= 65536
        self.threads = 128 * (1 + self.W)
        self.stages = PART * self.W
        smem = (heads * head_dim * 2 + self.stages * BK * DC * 2 + self.W * BK * heads * 2
                + (self.W - 1) * head_dim * heads * 4)
        assert smem <= 225 * 1024, f"launch shape {self.W} consumers: {smem} B of shared memory"
        self.pieces = BK * DC // PIECE // 128      # 4

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mW: cute.Tensor, mIdx: cute.Tensor, mLen: cute.Tensor,
                 mS: cute.Tensor, mLse: cute.Tensor, mA: cute.Tensor, mL1: cute.Tensor, mC: cute.Tensor,
                 mdQ: cute.Tensor, mdK: cute.Tensor, mdW: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
                 mKeys: cute.Tensor, row0: Int32, stream):
        """Deterministic variant: mdK is the staging buffer fp32 [E, Di] and mKeys int32 [E] of the rows
        [row0, row0 + E / (B K)); otherwise mKeys is None and row0 0."""
        tma_q, tQ, k_v, dk_v, grid, mmas, layouts = self.setup(mQ, mK, mdK, mKeys, mIdx)
        self.kernel(tma_q, tQ, k_v, dk_v, mW, mIdx, mLen, mS, mLse, mA, mL1, mC, mdQ, mdW, mCuQ, mCuK, mKeys, row0,
                    mmas, layouts).launch(grid=grid, block=(self.threads, 1, 1), stream=stream, min_blocks_per_mp=1)

    @cute.jit
    def setup(self, mQ: cute.Tensor, mK: cute.Tensor, mdK: cute.Tensor, mKeys: cute.Tensor, mSlots: cute.Tensor):
        """(Q's TMA atom and tensor, key and d_index_k views (rows, Di, batch; deterministic: the staging buffer
        (rows, Di)), grid (deterministic: the chunk's rows, from mKeys and mSlots' slot count), MMAs, shared layouts);
        sets self.shared_storage and self.q_bytes."""
        D, H, dt = self.D, self.H, self.dt
        if cutlass.const_expr(self.varlen):
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0] * H, D, 1), stride=(mQ.stride[1], 1, 0)))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[0], D, 1), stride=(mK.stride[0], 1, 0)))
            dk_v = None
            if cutlass.const_expr(not self.stage):
                dk_v = cute.make_tensor(mdK.iterator, cute.make_layout((mdK.shape[0], D, 1),
                                                                       stride=(mdK.stride[0], 1, 0)))
            grid = (mQ.shape[0], 1, 1)
        else:
            q_v = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[1] * H, D, mQ.shape[0]),
                                                                 stride=(mQ.stride[2], 1, mQ.stride[0])))
            k_v = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[1], D, mK.shape[0]),
                                                                 stride=(mK.stride[1], 1, mK.stride[0])))
            dk_v = None
            if cutlass.const_expr(not self.stage):
                dk_v = cute.make_tensor(mdK.iterator, cute.make_layout((mdK.shape[1], D, mdK.shape[0]),
                                                                       stride=(mdK.stride[1], 1, mdK.stride[0])))
            grid = (mQ.shape[1], mQ.shape[0], 1)
        if cutlass.const_expr(self.stage):
            dk_v = cute.make_tensor(mdK.iterator, cute.make_layout((mdK.shape[0], D), stride=(D, 1)))
            grid = (mKeys.shape[0] // (grid[1] * mSlots.shape[len(mSlots.shape) - 1]), grid[1], 1)
        K, MN, L = OperandMajorMode.K, OperandMajorMode.MN, LayoutEnum
        mma = lambda a, b, n: sm90_utils.make_trivial_tiled_mma(dt, dt, a, b, Float32, (1, 1, 1),  # noqa: E731
                                                                 tiler_mn=(64, n))
        mmas = (mma(K, K, H), mma(K, K, H), mma(K, MN, DC), mma(MN, MN, H))     # X, X accumulate, dk, dq^T
        layouts = (
            sm90_utils.make_smem_layout_b(L.ROW_MAJOR, (BK, H, D), dt, 1),          # Q (h, d): X^T B
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (BK, DC, H), dt, self.NC),   # Q chunks (d, h): dk B
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (BK, H, DC), dt, self.stages),    # K chunk (key, c): X^T A
            sm90_utils.make_smem_layout_a(L.COL_MAJOR, (DC, H, BK), dt, self.stages),    # K chunk (c, key): dq^T A
            sm90_utils.make_smem_layout_a(L.ROW_MAJOR, (BK, DC, H), dt, self.W),    # dA (key, h): dk A
            sm90_utils.make_smem_layout_b(L.COL_MAJOR, (DC, H, BK), dt, self.W))    # dA (h, key): dq^T B
        sQ_l = layouts[0]
        tma_q, tQ = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), q_v,
                                                cute.slice_(sQ_l, (None, None, 0)), (H, D))
        self.q_bytes = H * D * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sRed: cute.struct.MemRange[Float32, 4 * self.W]
            sW: cute.struct.MemRange[Float32, H]
            sDW: cute.struct.MemRange[Float32, 4 * self.W * H]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_l)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(layouts[2])], 1024]
            sdA: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(layouts[4])], 1024]
            sDQ: cute.struct.Align[cute.struct.MemRange[Float32, (self.W - 1) * D * H], 16]

        self.shared_storage = SharedStorage
        return tma_q, tQ, k_v, dk_v, grid, mmas, layouts

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, mK: cute.Tensor, mdK: cute.Tensor, mW: cute.Tensor,
               mIdx: cute.Tensor, mLen: cute.Tensor, mS: cute.Tensor, mLse: cute.Tensor, mA: cute.Tensor,
               mL1: cute.Tensor, mC: cute.Tensor, mdQ: cute.Tensor, mdW: cute.Tensor, mCuQ: cute.Tensor,
               mCuK: cute.Tensor, mKeys: cute.Tensor, row0: Int32, mmas, layouts):
        tidx, _, _ = cute.arch.thread_idx()
        rel, batch, _ = cute.arch.block_idx()
        row = rel
        if cutlass.const_expr(self.stage):
            row = row0 + rel
        g = (tma_q, tQ, mK, mdK, mW, mIdx, mLen, mS, mLse, mA, mL1, mC, mdQ, mdW, mKeys, rel)
        if cutlass.const_expr(self.varlen):
            n_seq = mCuQ.shape[0] - 1
            if row >= mCuQ[n_seq]:
                self.clear_row(mdQ, mdW, row, tidx, mKeys, rel, mIdx)
            else:
                b = find_sequence(mCuQ, n_seq, row, tidx % 32)
                k_off = mCuK[b]
                self.backward_row(g, mmas, layouts, tidx, Int32(0), row, k_off, mCuK[b + 1] - k_off,
                                  self.slots_of_row(mIdx, mLen, Int32(0), row))
        else:
            self.backward_row(g, mmas, layouts, tidx, batch, row, Int32(0), mK.shape[0],
                              self.slots_of_row(mIdx, mLen, batch, row))

    @cute.jit
    def slots_of_row(self, mIdx: cute.Tensor, mLen: cute.Tensor, batch: Int32, row: Int32):
        """The row's slot count: K, or min(K, topk_length) clamped at 0."""
        n_slots = mIdx.shape[1] if cutlass.const_expr(self.varlen) else mIdx.shape[2]
        row_len = n_slots
        if cutlass.const_expr(self.has_length):
            row_len = cutlass.max(cutlass.min(n_slots, mLen[self.row_at(batch, row)]), Int32(0))
        return row_len

    def rc(self, batch, row, *rest):
        """Coordinate of (row, rest...) in a [B, Sq, ...] / THD [Tq, ...] tensor."""
        return (row,) + rest if cutlass.const_expr(self.varlen) else (batch, row) + rest

    def idx_coord(self, batch, row, j):
        return self.rc(batch, row, j)

    def row_at(self, batch, row):
        return row if cutlass.const_expr(self.varlen) else (batch, row)

    @cute.jit
    def clear_row(self, mdQ: cute.Tensor, mdW: cute.Tensor, row: Int32, tidx: Int32, mKeys: cute.Tensor, rel: Int32,
                  mSlots: cute.Tensor):
        """A THD row at or past cu_seqlens_q[-1]: dq 0, d_weights 0 (deterministic: its keys -1, no entry)."""
        if cutlass.const_expr(self.stage):
            n_slots = mSlots.shape[1]
            for i in cutlass.range(tidx, n_slots, self.threads, unroll=1):
                mKeys[rel * n_slots + i] = Int32(-1)
        for i in cutlass.range(tidx, self.H * self.D, self.threads, unroll=1):
            mdQ[row, i // self.D, i % self.D] = self.dt(0.0)
        if tidx < self.H:
            mdW[row, tidx] = Float32(0.0)

    @cute.jit
    def publish_rows(self, stage, rows, n: Int32, tidx: Int32, b: cutlass.Constexpr = 0):
        """Deterministic only (produce() gets no sRows otherwise): mKeys[ebase + slot] = the global key row of each
        slot of block n the producer gathers (-1: invalid; the consumers' validity test is the same), slots < the
        row's slot count, by the first of the 8 threads of each key row. stage = (mKeys, ebase, n_slots, key_off)."""
        mKeys, ebase, n_slots, key_off = stage
        per_row = DC // PIECE
        if tidx % per_row == 0:
            for p in cutlass.range_constexpr(self.pieces):
                slot = n * BK + (tidx + 128 * p) // per_row
                if slot < n_slots:
                    mKeys[ebase + slot] = Int32(cutlass.select_(rows[p, b] >= 0, rows[p, b] + key_off, Int32(-1)))

    @cute.jit
    def slot_raw(self, mIdx: cute.Tensor, batch: Int32, row: Int32, j: Int32):
        """The key index slot j (< the row's slot count) names: valid when 0 <= it < the sequence's keys."""
        return mIdx[self.rc(batch, row, j)]

    @cute.jit
    def slot_loads(self, praw, ps, pa, mIdx, mS, mA, batch: Int32, row: Int32, j: Int32, row_len: Int32,
                   r: cutlass.Constexpr):
        """praw / ps / pa[r] = slot j's key index, index score, attention score, loaded at min(j, row_len - 1)
        (row_len >= 1) without a condition, so the three loads are in flight together and nothing waits on them
        until they are used (the caller tests j < row_len there)."""
        jc = cutlass.min(j, row_len - 1)
        praw[r] = self.slot_raw(mIdx, batch, row, jc)
        ps[r] = mS[self.rc(batch, row, jc)]
        pa[r] = mA[self.rc(batch, row, jc)]

    @cute.jit
    def g_and_p(self, valid, s: Float32, a: Float32, lse: Float32, l1c: Float32, c: Float32):
        """(g, p) of one slot (module docstring); 0, 0 at an invalid one."""
        x = Float32(cutlass.select_(valid, s - lse, Float32(0.0)))
        xm = Float32(cutlass.select_(x > Float32(0.0), Float32(0.0), x))                 # min(x, 0), NaN kept
        p = cute.math.exp(xm, fastmath=False)
        p = Float32(cutlass.select_(valid and not (x < Float32(EXP_ARG_MIN)), p, Float32(0.0)))
        t = a / l1c
        t = Float32(cutlass.select_(t < Float32(PROB_MIN), Float32(PROB_MIN), t))         # max(t, e^-100), NaN kept
        g = Float32(cutlass.select_(valid and not (x < Float32(LOG_MIN)), -c * t, Float32(0.0)))
        return g, p

    @cute.jit
    def backward_row(self, g, mmas, layouts, tidx: Int32, batch: Int32, row: Int32, k_off: Int32, seqlen_k: Int32,
                     row_len: Int32):
        """One query row's gradients over its first row_len slots (keys k_off + slot_raw(j))."""
        tma_q, tQ, mK, mdK, mW, mIdx, mLen, mS, mLse, mA, mL1, mC, mdQ, mdW, mKeys, rel = g
        sQ_l, sQt_l, sK_l, sKt_l, sdA_l, sdAt_l = layouts
        n_blk = (row_len + BK - 1) // BK
        n_slots = mIdx.shape[len(mIdx.shape) - 1]
        # deterministic: entry (rel, batch, slot) of the chunk is ebase + slot; its key the global key row
        ebase = (rel * (1 if cutlass.const_expr(self.varlen) else mIdx.shape[0]) + batch) * n_slots

        smem = SmemAllocator()
        st = smem.allocate(self.shared_storage)
        sQ = st.sQ.get_tensor(sQ_l.outer, swizzle=sQ_l.inner)
        sQt = st.sQ.get_tensor(sQt_l.outer, swizzle=sQt_l.inner)
        sK = st.sK.get_tensor(sK_l.outer, swizzle=sK_l.inner)
        sKt = st.sK.get_tensor(sKt_l.outer, swizzle=sKt_l.inner)
        sdA = st.sdA.get_tensor(sdA_l.outer, swizzle=sdA_l.inner)
        sdAt = st.sdA.get_tensor(sdAt_l.outer, swizzle=sdAt_l.inner)
        sRed = st.sRed.get_tensor(cute.make_layout(4 * self.W))
        sW = st.sW.get_tensor(cute.make_layout(self.H))
        sDW = st.sDW.get_tensor(cute.make_layout((4 * self.W, self.H), stride=(self.H, 1)))
        sDQ = st.sDQ.get_tensor(cute.make_layout((self.W - 1) * self.D * self.H))
        q_bar = st.mbar_q.data_ptr()
        gQ = cute.local_tile(tQ[None, None, batch], (self.H, self.D), (row, 0))
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ[None, None, 0], 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        pipe = self.gather_pipeline(st.mbar.data_ptr(), 128, q_bar, tidx)

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            cute.arch.setmaxregister_decrease(self.REGS[self.W][0])
            if warp == 0:
                load_resident_tiles(q_bar, self.q_bytes, ((tma_q, tQg, tQs),))
            if cutlass.const_expr(self.stage):
                key_off = Int32(0) if cutlass.const_expr(self.varlen) else batch * seqlen_k
                self.produce(pipe, sK, mK, mIdx, batch, row, row_len, n_blk, k_off, seqlen_k, tidx,
                             (mKeys, ebase, n_slots, key_off))
                for i in cutlass.range(n_blk * BK + tidx, n_slots, 128, unroll=1):    # past the last block
                    mKeys[ebase + i] = Int32(-1)
            else:
                self.produce(pipe, sK, mK, mIdx, batch, row, row_len, n_blk, k_off, seqlen_k, tidx)
        else:
            cute.arch.setmaxregister_increase(self.REGS[self.W][1])
            ctid = tidx - 128
            lse, l1 = mLse[self.row_at(batch, row)], mL1[self.row_at(batch, row)]
            l1c = Float32(cutlass.select_(l1 < Float32(L1_EPS), Float32(L1_EPS), l1))         # NaN kept
            c = mC[0]
            self.row_sums(sRed, sW, mW, mIdx, mS, mA, batch, row, row_len, seqlen_k, lse, l1c, c, ctid)
            pipeline.NamedBarrier(barrier_id=PRE_BAR, num_threads=128 * self.W).arrive_and_wait()  # sRed, sW
            gsum = Float32(0.0)
            for i in cutlass.range_constexpr(4 * self.W):
                gsum = gsum + sRed[i]
            rowc = (lse, l1c, c, gsum)
            x_mma, x_mma_acc, dk_mma, dq_mma = mmas
            x_mma.set(warpgroup.Field.ACCUMULATE, False)
            x_mma_acc.set(warpgroup.Field.ACCUMULATE, True)
            dk_mma.set(warpgroup.Field.ACCUMULATE, True)
            dq_mma.set(warpgroup.Field.ACCUMULATE, True)
            sv = (sQ[None, None, 0], sQt, sK, sKt, sdA, sdAt, sW, sDW, sDQ)
            self.consume(pipe, q_bar, sv, mmas, mIdx, mS, mA, mdK, mdQ, mdW, rowc, ctid, batch, row, row_len, n_blk,
                         k_off, seqlen_k, ebase)

    @cute.jit
    def row_sums(self, sRed, sW, mW, mIdx, mS, mA, batch: Int32, row: Int32, row_len: Int32, seqlen_k: Int32,
                 lse: Float32, l1c: Float32, c: Float32, ctid: Int32):
        """sRed[warp] = the consumer warp's part of sum_s g (fixed order), sW = w[t, :] in fp32."""
        part = Float32(0.0)
        step = 128 * self.W
        praw = cute.make_rmem_tensor((4,), Int32)
        ps = cute.make_rmem_tensor((4,), Float32)
        pa = cute.make_rmem_tensor((4,), Float32)
        for j0 in cutlass.range(ctid, row_len, 4 * step, unroll=1):      # four slots' loads in flight
            for i in cutlass.range_constexpr(4):
                self.slot_loads(praw, ps, pa, mIdx, mS, mA, batch, row, j0 + i * step, row_len, i)
            for i in cutlass.range_constexpr(4):
                valid = j0 + i * step < row_len and praw[i] >= 0 and praw[i] < seqlen_k
                gj, _ = self.g_and_p(valid, ps[i], pa[i], lse, l1c, c)
                part = part + gj
        for off in cutlass.range_constexpr(5):
            part = part + cute.arch.shuffle_sync_bfly(part, offset=1 << off)
        if ctid % 32 == 0:
            sRed[ctid // 32] = part
        if ctid < self.H:
            sW[ctid] = Float32(mW[self.rc(batch, row, ctid)])

    GATHER_BK = BK

    def gather_lag(self):
        return min(self.LAG, self.NC)

    def gather_dst(self, sK, r, col, index):
        return cute.local_tile(sK[r, None, index], (PIECE,), (col,))

    def state(self, n, ch, producer):
        return self.chunk_state(n, ch, producer)

    def chunk_state(self, n, ch, producer):
        """Chunk ch of block n in consumer n % W's part of the ring (its (n // W) * NC + ch-th chunk)."""
        return ring_state(self.stages, n % self.W, (n // self.W) * self.NC + ch, producer, self.W)

    @cute.jit
    def issue_x(self, pipe, x_mma, x_mma_acc, acc_x, tXrK, tXrQ, n: Int32):
        """X^T(n) = K_n Q^T into acc_x: wait each of block n's chunks, its k-blocks; one committed group."""
        kpc = DC // 16
        gemm_chunks(pipe, lambda ch: self.chunk_state(n, ch, False), tuple(range(self.NC)), x_mma, x_mma_acc, acc_x,
                    lambda ch, kb, stage: (tXrK[None, None, kb, stage], tXrQ[None, None, ch * kpc + kb]), kpc)

    @cute.jit
    def row_block(self, ctx, frag, regs, n: Int32):
        """Consumer w's block n (module docstring): X^T, G, d_weights partials, dA to sdA[w], dq^T and the dk tiles
        with their reductions, the chunks released."""
        pipe, sdA, sW, mmas, mIdx, mS, mA, mdK, rowc, w, lane, batch, row, row_len, n_blk, k_off, seqlen_k, ebase = ctx
        tXrK, tXrQ, tKrA, tKrQ, tQrK, tQrA, x_id, thr_k, r2s, thr_r2s = frag
        acc_x, acc_dq, dwp, gr, krow, kval, krow_b, praw, ps, pa = regs
        x_mma, x_mma_acc, dk_mma, dq_mma = mmas
        lse, l1c, c, gsum = rowc
        H, NC = self.H, self.NC
        n_cols = cute.size(x_id, mode=[1])
        # ---- X^T = K Q^T
        self.issue_x(pipe, x_mma, x_mma_acc, acc_x, tXrK, tXrQ, n)
        for r in cutlass.range_constexpr(2):           # this thread's two slots (rows of X^T)
            kidx = praw[r]
            valid = n * BK + x_id[r, 0][0] < row_len and kidx >= 0 and kidx < seqlen_k
            gj, pj = self.g_and_p(valid, ps[r], pa[r], lse, l1c, c)
            gr[r] = Float32(cutlass.select_(valid, gj - pj * gsum, Float32(0.0)))
            krow[r] = k_off + kidx
            kval[r] = valid
        if n + self.W < n_blk:                          # the next block's slots, used one block from now
            for r in cutlass.range_constexpr(2):
                self.slot_loads(praw, ps, pa, mIdx, mS, mA, batch, row, (n + self.W) * BK + x_id[r, 0][0],
                                row_len, r)
        warpgroup.wait_group(0)
        if cutlass.const_expr(self.stage):      # the slots' staging rows (entry ebase + slot), this lane's own
            for r in cutlass.range_constexpr(2):
                krow_b[0, r] = Int32(cutlass.select_(kval[r], ebase + n * BK + x_id[r, 0][0], Int32(-1)))
        else:
            partner_rows(krow_b, Int32(cutlass.select_(kval[0], krow[0], Int32(-1))),     # -1: invalid slot
                         Int32(cutlass.select_(kval[1], krow[1], Int32(-1))), lane)
        # ---- d_weights partials, dA = G w relu'(X) (bf16) to sdA[w]
        x_mn = acc_mn_view(acc_x)
        for ci in cutlass.range_constexpr(n_cols):
            wc = sW[x_id[0, ci][1]]
            for r in cutlass.range_constexpr(2):
                x = x_mn[r, ci]
                relu = cute.arch.fmax(x, Float32(0.0), nan=True)                         # FMNMX.NaN: NaN kept
                slope = Float32(cutlass.select_(x > Float32(0.0), Float32(1.0), relu))    # 1, 0 or NaN
                dwp[ci] = dwp[ci] + gr[r] * relu
                x_mn[r, ci] = gr[r] * wc * slope
        rdA = cute.make_rmem_tensor(acc_x.layout, self.dt)      # the tile in bf16 pairs, stmatrix 8 x 8 x 4 a warp
        rdA.store(acc_x.load().to(self.dt))
        cute.copy(r2s, thr_r2s.retile(rdA), thr_r2s.partition_D(sdA[None, None, w]))
        cute.arch.fence_proxy("async.shared", space="cta")
        for i in cutlass.range_constexpr(self.W):       # sdA[w] written by this warpgroup's 128 threads
            if w == i:
                pipeline.NamedBarrier(barrier_id=DA_BAR + i, num_threads=128).arrive_and_wait()
        # ---- dq^T += K^T dA (registers), then the dk tiles (atomics)
        warpgroup.fence()
        for ch in cutlass.range_constexpr(NC):
            s = self.chunk_state(n, ch, False)
            for kb in cutlass.range_constexpr(BK // 16):
                cute.gemm(dq_mma, acc_dq[ch], tQrK[None, None, kb, s.index], tQrA[None, None, kb, w], acc_dq[ch])
        warpgroup.commit_group()
        for ch in cutlass.range_constexpr(NC):
            acc_k = thr_k.make_fragment_C(thr_k.partition_shape_C((BK, DC)))
            acc_k.fill(0.0)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(H // 16):
                cute.gemm(dk_mma, acc_k, tKrA[None, None, kb, w], tKrQ[None, None, kb, ch], acc_k)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.stage):
                st_tile_pairs(acc_mn_view(acc_k), krow_b[0, 0], krow_b[0, 1], lane, mdK, ch * DC)
            else:
                red_tile_lines(acc_mn_view(acc_k), krow_b, lane, mdK, batch, ch * DC, DC // 32)   # 4 rows x 128 B
        warpgroup.wait_group(0)
        for ch in cutlass.range_constexpr(NC):
            pipe.consumer_release(self.chunk_state(n, ch, False))

    @cute.jit
    def consume(self, pipe, q_bar, sv, mmas, mIdx, mS, mA, mdK, mdQ, mdW, rowc, ctid: Int32, batch: Int32,
                row: Int32, row_len: Int32, n_blk: Int32, k_off: Int32, seqlen_k: Int32, ebase: Int32):
        sQ2, sQt, sK, sKt, sdA, sdAt, sW, sDW, sDQ = sv
        x_mma, x_mma_acc, dk_mma, dq_mma = mmas
        lse, l1c, c, gsum = rowc
        H, NC = self.H, self.NC
        w = ctid // 128
        t = ctid % 128
        lane = t % 32
        thr_x = x_mma.get_slice(t)
        thr_k = dk_mma.get_slice(t)
        thr_q = dq_mma.get_slice(t)
        tXrK = thr_x.make_fragment_A(thr_x.partition_A(sK))
        tXrQ = thr_x.make_fragment_B(thr_x.partition_B(sQ2))
        tKrA = thr_k.make_fragment_A(thr_k.partition_A(sdA))
        tKrQ = thr_k.make_fragment_B(thr_k.partition_B(sQt))
        tQrK = thr_q.make_fragment_A(thr_q.partition_A(sKt))
        tQrA = thr_q.make_fragment_B(thr_q.partition_B(sdAt))
        x_id = acc_mn_view(thr_x.partition_C(cute.make_identity_tensor((BK, H))))
        acc_dq = [thr_q.make_fragment_C(thr_q.partition_shape_C((DC, H))) for _ in range(NC)]
        for i in cutlass.range_constexpr(NC):
            acc_dq[i].fill(0.0)
        n_cols = cute.size(x_id, mode=[1])
        dwp = cute.make_rmem_tensor((n_cols,), Float32)
        dwp.fill(0.0)
        gr = cute.make_rmem_tensor((2,), Float32)
        krow = cute.make_rmem_tensor((2,), Int32)
        kval = cute.make_rmem_tensor((2,), cutlass.Boolean)
        krow_b = cute.make_rmem_tensor((2, 2), Int32)   # [b, r]: the dk row of row (lane >> 2 with bit 0 = b) + 8 r
        praw = cute.make_rmem_tensor((2,), Int32)       # the thread's two slots of its next block, loaded a block ahead
        ps = cute.make_rmem_tensor((2,), Float32)
        pa = cute.make_rmem_tensor((2,), Float32)
        if w < n_blk:
            for r in cutlass.range_constexpr(2):
                self.slot_loads(praw, ps, pa, mIdx, mS, mA, batch, row, w * BK + x_id[r, 0][0], row_len, r)
        acc_x = thr_x.make_fragment_C(thr_x.partition_shape_C((BK, H)))
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dt), x_mma)
        thr_r2s = r2s.get_slice(t)
        frag = (tXrK, tXrQ, tKrA, tKrQ, tQrK, tQrA, x_id, thr_k, r2s, thr_r2s)
        regs = (acc_x, acc_dq, dwp, gr, krow, kval, krow_b, praw, ps, pa)
        ctx = (pipe, sdA, sW, mmas, mIdx, mS, mA, mdK, rowc, w, lane, batch, row, row_len, n_blk, k_off, seqlen_k,
               ebase)
        cute.arch.mbarrier_wait(q_bar, 0)
        for n in cutlass.range(w, n_blk, self.W, unroll=1):
            self.row_block(ctx, frag, regs, n)

        # ---- d_weights: lanes xor 4, 8, 16 (the warp's 16 slots), then the 4 W consumer warps in order
        for ci in cutlass.range_constexpr(n_cols):
            v = dwp[ci]
            for off in cutlass.range_constexpr(3):
                v = v + cute.arch.shuffle_sync_bfly(v, offset=4 << off)
            dwp[ci] = v
        if lane < 4:
            for ci in cutlass.range_constexpr(n_cols):
                sDW[ctid // 32, x_id[0, ci][1]] = dwp[ci]
        n_dq = NC * cute.size(acc_dq[0])              # one partial's fp32 values a thread
        if w > 0:                                       # partial w - 1 of sDQ
            for ch in cutlass.range_constexpr(NC):
                for e in cutlass.range_constexpr(cute.size(acc_dq[ch])):
                    sDQ[((w - 1) * n_dq + ch * cute.size(acc_dq[ch]) + e) * 128 + t] = acc_dq[ch][e]
        pipeline.NamedBarrier(barrier_id=END_BAR, num_threads=128 * self.W).arrive_and_wait()  # sDW, sDQ written
        if ctid < H:
            dw = Float32(0.0)
            for i in cutlass.range_constexpr(4 * self.W):
                dw = dw + sDW[i, ctid]
            mdW[self.rc(batch, row, ctid)] = dw
        if w == 0:
            for ch in cutlass.range_constexpr(NC):
                q_mn = acc_mn_view(acc_dq[ch])
                o_mn = acc_mn_view(thr_q.partition_C(cute.make_identity_tensor((DC, H))))
                for e in cutlass.range_constexpr(cute.size(acc_dq[ch])):
                    for pv in cutlass.range_constexpr(self.W - 1):     # partials of consumers 1, 2, .. in order
                        acc_dq[ch][e] = acc_dq[ch][e] + sDQ[(pv * n_dq + ch * cute.size(acc_dq[ch]) + e) * 128 + t]
                for r in cutlass.range_constexpr(2):
                    for ci in cutlass.range_constexpr(cute.size(q_mn, mode=[1])):
                        d = ch * DC + o_mn[r, ci][0]
                        mdQ[self.rc(batch, row, o_mn[r, ci][1], d)] = self.dt(q_mn[r, ci])
