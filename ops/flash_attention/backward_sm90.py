"""Flash-attention backward for sm90 (Hopper), CuTe DSL.

First, deliberately simple structure (correctness first):

- ``_preprocess`` (a warp per query row, shared with backward_fast_sm90.py): Delta = rowsum(O * dO) (fp32, from
  the stored O) - dlse, the LSE in log2 form (+inf for a row whose stored LSE is -inf, so P = 0 there with no
  special case later), and the fp32 dQ accumulator zeroed (every row, also rows no tile visits).
- ``_main``: one CTA (one warpgroup, 128 threads) per (key block of 64, kv head, batch/segment).
  K, V of the block stay in shared memory; the CTA loops over the query heads of its kv head (GQA)
  and over the query blocks that can see the key block. Per query block:
  S = Q K^T and dP = dO V^T (wgmma, fp32), P = exp2(min(S*scale*log2e - lse2, 0)) (masked -> 0),
  dS = P (dP - Delta); P and dS are rounded to the input dtype into shared memory, then
  dV += P^T dO, dK += dS^T Q (fp32 registers) and, unless deterministic, dQ_partial = dS K goes to
  the fp32 accumulator with ``red.global.add.f32``.
- ``_dq``: deterministic mode only: one CTA per (query block, query head, batch) recomputes S, dP,
  dS over the visible key blocks in a fixed order and stores dQ (fp32) into the accumulator.
- ``_postprocess`` (a warp per row, shared too): dQ = scale * accumulator -> input dtype for every row; varlen
  (``_zero_tail``): zero dK/dV rows past cu_seqlens_k[-1].

Split form, for the wide (D, Dv) pairs WIDE = (192, 128), (192, 192), (256, 256) (supported.BWD_WIDE_HEAD_DIMS):
one CTA of 128 threads cannot hold dK and dV (64 x 256 fp32 each: 128 registers a thread apiece) plus S and dP, so
``_main_part`` runs twice, PART_DV (S -> P -> dV += P^T dO; V is not loaded, dP not computed) and PART_DK (S, dP ->
dS -> dK += dS^T Q), and dQ comes from ``_dq`` (the deterministic mode's kernel): three launches, 8 / 5 of the fused
matmul work, no atomics, so every rerun is bitwise identical. dO and V have Dv columns (their own TMA atoms and, for
Dv != D, the dV MMA ``mma_dv``); Delta sums Dv columns. ptxas (CPU, 2026-12-03): no spills, dK pass 224 / 224 / 255
registers for (192, 128) / (192, 192) / (256, 256). The D <= 128 variants are unchanged (``_main`` = PART_BOTH;
their PTX equals the tree before the split form but for kernel names). Status (H200, 2026-12-04): test_flash_bwd.py
209 passed (test_wide_* included), sanitize_bwd racecheck / memcheck clean; routed by paddle_dsa. B2 H16 S8k TFLOP/s
non-causal / causal: (192, 128) 211 / 171, (192, 192) 233 / 193, (256, 256) 165 / 158 (0.36-0.72x cuDNN).

Status (H200, 2026-12-02): tests/gpu/test_flash_bwd.py 45/45 pass (every gate ratio ~1.00 x floor); bf16
B2 S4096 H16: D128 non-causal 125, causal 109 (deterministic 160), D64 causal 104 TFLOP/s. The fp32 dQ atomics are
the bottleneck of the non-deterministic path; next steps: smem dQ tile + bulk reduce-add, 2 MMA warpgroups with
tile_n = 128, a producer warp with double-buffered Q/dO, vectorised pre/postprocess (done since in
backward_fast_sm90.py; since 2026-12-04 both launchers run that warp-per-row pre/postprocess, the thread-per-row one
of this file is gone; H200 2026-12-04 12:52: test_flash_bwd 209 passed, 76 skipped, sanitize_bwd clean). D 96
(2026-12-03): 64-byte swizzled D tiles (_atom_d); test_flash_bwd.py (simple and deterministic modes included) and
sanitize_bwd pass on the H200.

Tensors are 4-D BSHD inside (a varlen THD tensor is viewed as B=1); lse-like tensors are [B, H, S].
Masks: key j visible for query i iff j < seqlen_k and i + off - left <= j <= i + off + right with
off = seqlen_k - seqlen_q (bottom-right aligned); unbounded sides use a large sentinel.
"""
import math

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup as wg, OperandMajorMode as Major
from cutlass.cute.nvgpu.warp import StMatrix8x8x16bOp
from cutlass.memory import SmemAllocator

LOG2E = math.log2(math.e)
# (D, Dv) pairs the split ("wide") form of this file's kernels serves: compiled and GPU-tested, not yet in
# supported.BWD_HEAD_DIMS (see the module docstring)
WIDE = ((192, 128), (192, 192), (256, 256))
PART_BOTH, PART_DV, PART_DK = 0, 1, 2   # what one _main launch accumulates (Constexpr)
BLOCK_M = 64  # query rows per tile
BLOCK_N = 64  # key rows per tile
NTHREADS = 128  # one warpgroup


def _tma_part(atom, s, g):
    return cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                 cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2))


def _transpose(t):
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0]))


def _atom_d(head_dim, dt):
    """Shared-memory atom of a (rows, head_dim) K-major tile: 128-byte swizzle when a row holds whole 64-element
    spans (D 64 / 128), else 64-byte (D 96: three 32-element spans)."""
    kind = wg.SmemLayoutAtomKind.K_SW128 if head_dim % 64 == 0 else wg.SmemLayoutAtomKind.K_SW64
    return wg.make_smem_layout_atom(kind, dt)


def _sdhb(t):
    """(B, S, H, D) -> the (S, D, H, B) view the TMA atoms tile."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))


class FlashBwdSm90:
    """Backward launcher for one static configuration (dtype, head_dim, varlen, deterministic)."""

    def __init__(self, dtype, head_dim: int, varlen: bool, deterministic: bool, v_head_dim=None):
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        assert (head_dim, v_head_dim) in ((64, 64), (96, 96), (128, 128)) + WIDE, (head_dim, v_head_dim)
        self.dtype = dtype
        self.D = head_dim
        self.Dv = v_head_dim
        self.varlen = varlen
        # wide head dims: dK and dV in two launches of _main (PART_DK, PART_DV) and dQ by _dq, so no launch holds
        # more than one 64 x 256 fp32 accumulator; no atomics at all (deterministic by construction)
        self.wide = (head_dim, v_head_dim) in WIDE
        self.deterministic = deterministic or self.wide
        self.bm = BLOCK_M
        self.bn = BLOCK_N

    # ------------------------------------------------------------------ host
    def _to4(self, t):
        """THD -> (1, T, H, D) view (varlen); BSHD unchanged."""
        if cutlass.const_expr(self.varlen):
            T = t.shape[0]
            lay = cute.make_layout((1, T, t.shape[1], t.shape[2]),
                                   stride=(T * t.stride[0], t.stride[0], t.stride[1], 1))
            return cute.make_tensor(t.iterator, lay)
        return t

    def _to3(self, t):
        """[H, T] -> (1, H, T) view (varlen); [B, H, S] unchanged."""
        if cutlass.const_expr(self.varlen):
            lay = cute.make_layout((1, t.shape[0], t.shape[1]), stride=(0, t.stride[0], t.stride[1]))
            return cute.make_tensor(t.iterator, lay)
        return t

    def _views(self, mQ, mK, mV, mO, mdO, mLSE, mdLSE, mdQ, mdK, mdV, mLSE2, mDelta, mdQacc):
        """The launch's 4-d / 3-d views (_to4, _to3) of every tensor argument, in argument order, then (B, Sq, Sk,
        H, Hkv, query heads per kv head): shared by both backward launchers."""
        q4, k4, v4, o4, do4 = [self._to4(t) for t in (mQ, mK, mV, mO, mdO)]
        dq4, dk4, dv4, dqacc4 = [self._to4(t) for t in (mdQ, mdK, mdV, mdQacc)]
        lse3, dlse3, lse23, delta3 = [self._to3(t) for t in (mLSE, mdLSE, mLSE2, mDelta)]
        H, Hkv = q4.shape[2], k4.shape[2]
        return ((q4, k4, v4, o4, do4), (dq4, dk4, dv4, dqacc4), (lse3, dlse3, lse23, delta3),
                (q4.shape[0], q4.shape[1], k4.shape[1], H, Hkv, H // Hkv))

    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
                 mdQ: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                 mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor,
                 mCuQ: cute.Tensor, mCuK: cute.Tensor, mSem: cute.Tensor,
                 scale: Float32, has_dlse: Int32, win_left: Int32, win_right: Int32,
                 nbatch: Int32, grid_m: Int32, grid_n: Int32, stream):
        dt = self.dtype
        D = self.D
        bm, bn = self.bm, self.bn
        (q4, k4, v4, o4, do4), (dq4, dk4, dv4, dqacc4), (lse3, dlse3, lse23, delta3), \
            (B4, Sq4, Sk4, H, Hkv, qhead_per_kv) = self._views(mQ, mK, mV, mO, mdO, mLSE, mdLSE, mdQ, mdK, mdV,
                                                               mLSE2, mDelta, mdQacc)

        # shared-memory layouts (swizzle separated later onto the pointer); dO and V have Dv columns
        Dv = self.Dv
        atom_d = _atom_d(D, dt)
        l_q = cute.tile_to_shape(atom_d, (bm, D), order=(0, 1))
        l_k = cute.tile_to_shape(atom_d, (bn, D), order=(0, 1))
        l_do = cute.tile_to_shape(_atom_d(Dv, dt), (bm, Dv), order=(0, 1))
        l_v = cute.tile_to_shape(_atom_d(Dv, dt), (bn, Dv), order=(0, 1))
        l_p = cute.tile_to_shape(wg.make_smem_layout_atom(wg.SmemLayoutAtomKind.K_SW128, dt), (bm, bn), order=(0, 1))

        mma_sdp = sm90.make_trivial_tiled_mma(dt, dt, Major.K, Major.K, Float32, (1, 1, 1),
                                              tiler_mn=(64, bn))
        mma_dkv = sm90.make_trivial_tiled_mma(dt, dt, Major.MN, Major.MN, Float32, (1, 1, 1),
                                              tiler_mn=(64, D))
        mma_dq = sm90.make_trivial_tiled_mma(dt, dt, Major.K, Major.MN, Float32, (1, 1, 1),
                                             tiler_mn=(64, D))
        mma_dv = mma_dkv
        if cutlass.const_expr(Dv != D):
            mma_dv = sm90.make_trivial_tiled_mma(dt, dt, Major.MN, Major.MN, Float32, (1, 1, 1),
                                                 tiler_mn=(64, Dv))

        # TMA over (S, D, H, B) views
        G2S = cpasync.CopyBulkTensorTileG2SOp
        tma_q, gq = cpasync.make_tiled_tma_atom(G2S(), _sdhb(q4), l_q, (bm, D))
        tma_do, gdo = cpasync.make_tiled_tma_atom(G2S(), _sdhb(do4), l_do, (bm, Dv))
        tma_k, gk = cpasync.make_tiled_tma_atom(G2S(), _sdhb(k4), l_k, (bn, D))
        tma_v, gv = cpasync.make_tiled_tma_atom(G2S(), _sdhb(v4), l_v, (bn, Dv))

        scale_log2 = scale * Float32(LOG2E)

        nrow_blk_q = (Sq4 + 127) // 128
        self._preprocess(o4, do4, lse3, dlse3, lse23, delta3, dqacc4, has_dlse).launch(
            grid=(nrow_blk_q, H, B4), block=(128, 1, 1), stream=stream)

        main_args = (tma_q, gq, tma_do, gdo, tma_k, gk, tma_v, gv, lse23, delta3, dqacc4, dk4, dv4,
                     mCuQ, mCuK, Sq4, Sk4, qhead_per_kv, scale, scale_log2, win_left, win_right,
                     mma_sdp, mma_dkv, mma_dq, l_q, l_k, l_p)
        if cutlass.const_expr(self.wide):
            for part in (PART_DV, PART_DK):
                self._main_part(*main_args, mma_dv, l_do, l_v, part).launch(
                    grid=(grid_n, Hkv, nbatch), block=(NTHREADS, 1, 1), stream=stream)
        else:
            self._main(*main_args).launch(grid=(grid_n, Hkv, nbatch), block=(NTHREADS, 1, 1), stream=stream)

        if cutlass.const_expr(self.deterministic):
            self._dq(tma_q, gq, tma_do, gdo, tma_k, gk, tma_v, gv, lse23, delta3, dqacc4,
                     mCuQ, mCuK, Sq4, Sk4, qhead_per_kv, scale_log2, win_left, win_right,
                     mma_sdp, mma_dq, l_q, l_k, l_p, l_do, l_v).launch(
                grid=(grid_m, H, nbatch), block=(NTHREADS, 1, 1), stream=stream)

        self._launch_tail(dqacc4, dq4, dk4, dv4, mCuK, scale, (nrow_blk_q, H, B4), Sk4, Hkv, stream)

    def _launch_tail(self, dqacc4, dq4, dk4, dv4, mCuK, scale, q_grid, Sk4, Hkv, stream):
        """Both launchers' last kernels: dq from the fp32 accumulator (_postprocess), and for varlen the zeroing of
        the dk / dv rows past cu_seqlens_k[-1]."""
        self._postprocess(dqacc4, dq4, scale).launch(grid=q_grid, block=(128, 1, 1), stream=stream)
        if cutlass.const_expr(self.varlen):
            nrow_blk_k = (Sk4 + 127) // 128
            self._zero_tail(dk4, dv4, mCuK).launch(
                grid=(nrow_blk_k, Hkv, 1), block=(128, 1, 1), stream=stream)

    # ------------------------------------------------------------ helpers
    @cute.jit
    def _seg(self, mCu: cute.Tensor, b, S_dense):
        """(batch index into the 4-D view, row offset, segment length)."""
        bb = b
        off = Int32(0)
        slen = S_dense
        if cutlass.const_expr(self.varlen):
            bb = Int32(0)
            off = mCu[b]
            slen = mCu[b + 1] - off
        return bb, off, slen

    # ------------------------------------------------ pre/postprocess, a warp per row
    # Both launchers' first and last kernels: 128 threads = 4 warps, 32 rows each; a warp walks one row at a time
    # with lane l on columns l, l + 32, ... (coalesced; every head dim is a multiple of 32), Delta's row sum finished
    # by a butterfly over the warp (a fixed order: deterministic).
    @cute.kernel
    def _preprocess(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
                    mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor, has_dlse: Int32):
        """Delta = rowsum(O * dO) (Dv columns) - dlse, lse2 = lse log2 e (+inf where lse = -inf), dQacc rows = 0."""
        tid, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        lane = tid % 32
        w = tid // 32
        S = mO.shape[1]
        for k in cutlass.range(32, unroll=4):
            row = bx * 128 + k * 4 + w
            if row < S:
                acc = Float32(0.0)
                for d in cutlass.range_constexpr(self.Dv // 32):
                    c = lane + 32 * d
                    acc += Float32(mO[b, row, h, c]) * Float32(mdO[b, row, h, c])
                    if cutlass.const_expr(self.D == self.Dv):
                        mdQacc[b, row, h, c] = Float32(0.0)
                if cutlass.const_expr(self.D != self.Dv):
                    for d in cutlass.range_constexpr(self.D // 32):
                        mdQacc[b, row, h, lane + 32 * d] = Float32(0.0)
                for sh in cutlass.range_constexpr(5):
                    acc = acc + cute.arch.shuffle_sync_bfly(acc, offset=16 >> sh)
                if lane == 0:
                    if has_dlse != 0:
                        acc = acc - mdLSE[b, h, row]
                    lse = mLSE[b, h, row]
                    lse2 = lse * Float32(LOG2E)
                    if lse == -Float32.inf:
                        lse2 = Float32.inf
                    mLSE2[b, h, row] = lse2
                    mDelta[b, h, row] = acc

    @cute.kernel
    def _postprocess(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, scale: Float32):
        """dQ = scale * dQacc in the input dtype."""
        tid, _, _ = cute.arch.thread_idx()
        bx, h, b = cute.arch.block_idx()
        lane = tid % 32
        w = tid // 32
        S = mdQ.shape[1]
        for k in cutlass.range(32, unroll=4):
            row = bx * 128 + k * 4 + w
            if row < S:
                for d in cutlass.range_constexpr(self.D // 32):
                    c = lane + 32 * d
                    mdQ[b, row, h, c] = (mdQacc[b, row, h, c] * scale).to(self.dtype)

    @cute.kernel
    def _zero_tail(self, mdK: cute.Tensor, mdV: cute.Tensor, mCuK: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bx, h, _ = cute.arch.block_idx()
        row = bx * 128 + tid
        total = mCuK[mCuK.shape[0] - 1]
        if row < mdK.shape[1]:
            if row >= total:
                if cutlass.const_expr(self.Dv == self.D):
                    for d in cutlass.range_constexpr(self.D):
                        mdK[0, row, h, d] = Float32(0.0).to(self.dtype)
                        mdV[0, row, h, d] = Float32(0.0).to(self.dtype)
                else:
                    for d in cutlass.range_constexpr(self.D):
                        mdK[0, row, h, d] = Float32(0.0).to(self.dtype)
                    for d in cutlass.range_constexpr(self.Dv):
                        mdV[0, row, h, d] = Float32(0.0).to(self.dtype)

    # ------------------------------------------------------- shared parts
    @cute.jit
    def _store_dkv(self, acc_dK: cute.Tensor, acc_dV: cute.Tensor, tKVc: cute.Tensor, j0, slen_k, mdK: cute.Tensor,
                   mdV: cute.Tensor, bb, off_k, hkv, scale: Float32):
        """Both launchers' epilogue (D = Dv): dK = scale * acc, dV = acc in the input dtype, for the key rows
        j0 + r inside the segment only."""
        for e in cutlass.range_constexpr(cute.size(acc_dK)):
            r, c = tKVc[e]
            j = j0 + r
            if j < slen_k:
                mdK[bb, off_k + j, hkv, c] = (acc_dK[e] * scale).to(self.dtype)
                mdV[bb, off_k + j, hkv, c] = acc_dV[e].to(self.dtype)

    def _tile_store(self, mma_sdp: cute.TiledMma, tid, s_tiles, stmatrix: bool):
        """How this thread writes S-shaped input-dtype tiles (P, dS) to shared memory: (copy, its thread slice, the
        destination partition of each tile). stmatrix: four 8 x 8 b16 matrices an instruction (one row address a
        thread per 8 elements, so fewer live swizzled addresses: the pipelined kernel's spills went from 116 to 20 B
        at D 128); else element pairs through the accumulator's own partition (copy None; the simple kernels here,
        whose registers stmatrix only moves around: 8 B of spills at D 256 with it)."""
        if stmatrix:
            r2s = cute.make_tiled_copy_C(cute.make_copy_atom(StMatrix8x8x16bOp(False, 4), self.dtype), mma_sdp)
            thr = r2s.get_slice(tid)
            return r2s, thr, [thr.partition_D(t) for t in s_tiles]
        thr = mma_sdp.get_slice(tid)
        return None, thr, [thr.partition_C(t) for t in s_tiles]

    def _store_tile(self, r2s, thr, r, dst):
        """r (registers, the accumulator's layout, input dtype) -> dst, by _tile_store's copy."""
        if r2s is None:
            cute.autovec_copy(r, dst)
        else:
            cute.copy(r2s, thr.retile(r), dst)

    @cute.jit
    def _p_ds(self, acc_S: cute.Tensor, acc_dP: cute.Tensor, tScS: cute.Tensor, sLSE: cute.Tensor,
              sDelta: cute.Tensor, i0, j0, slen_q, slen_k, off, win_left, win_right, scale_log2):
        """acc_S <- P, acc_dP <- dS (fp32), with masks; rows/cols are tile coordinates."""
        for e in cutlass.range_constexpr(cute.size(acc_S)):
            r, c = tScS[e]
            i = i0 + r
            j = j0 + c
            lse2 = sLSE[r]
            dl = sDelta[r]
            arg = cutlass.min(acc_S[e] * scale_log2 - lse2, Float32(0.0))
            p = cute.math.exp2(arg, fastmath=True)
            ok = (i < slen_q) & (j < slen_k) & (j >= i + off - win_left) & (j <= i + off + win_right)
            p = cutlass.select_(ok, p, Float32(0.0))
            acc_S[e] = p
            acc_dP[e] = p * (acc_dP[e] - dl)

    @cute.jit
    def _tiles(self, l_q, l_do, l_k, l_v, l_p, with_p: cutlass.Constexpr):
        """_main_body's and _dq's shared memory, in this order: Q, dO, K, V, P (with_p; else None), dS tiles (1024-byte
        aligned), the block's lse2 and Delta rows, two mbarriers."""
        dt = self.dtype
        smem = SmemAllocator()
        sQ = smem.allocate_tensor(dt, l_q.outer, 1024, l_q.inner)
        sdO = smem.allocate_tensor(dt, l_do.outer, 1024, l_do.inner)
        sK = smem.allocate_tensor(dt, l_k.outer, 1024, l_k.inner)
        sV = smem.allocate_tensor(dt, l_v.outer, 1024, l_v.inner)
        sP = None
        if cutlass.const_expr(with_p):
            sP = smem.allocate_tensor(dt, l_p.outer, 1024, l_p.inner)
        sdS = smem.allocate_tensor(dt, l_p.outer, 1024, l_p.inner)
        sLSE = smem.allocate_tensor(Float32, cute.make_layout(self.bm), 16)
        sDelta = smem.allocate_tensor(Float32, cute.make_layout(self.bm), 16)
        bars = smem.allocate_array(Int64, 2, byte_alignment=8)
        return sQ, sdO, sK, sV, sP, sdS, sLSE, sDelta, bars

    @cute.jit
    def _init_bars(self, tid: Int32, bar_kv, bar_q):
        """The K/V and Q/dO mbarriers (one arrival each) initialised by thread 0 and made visible to the CTA."""
        if tid == 0:
            cute.arch.mbarrier_init(bar_kv, 1)
            cute.arch.mbarrier_init(bar_q, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

    @cute.jit
    def _load_q_tile(self, tma_q, gq, tma_do, gdo, sQ, sdO, sLSE, sDelta, mLSE2, mDelta, bar_q, hq, bb, off_q,
                     m: Int32, slen_q, tid: Int32, warp_idx):
        """Query tile m of head hq: Q and dO by TMA on bar_q (warp 0 issues), lse2 / Delta of its rows into sLSE /
        sDelta (+inf / 0 past the segment: P = 0 there). The caller orders the smem rows (sync_threads) and waits on
        bar_q."""
        bm = self.bm
        gQ_t = cute.local_tile(cute.domain_offset((off_q, 0), gq[None, None, hq, bb]), (bm, self.D), (m, 0))
        gdO_t = cute.local_tile(cute.domain_offset((off_q, 0), gdo[None, None, hq, bb]), (bm, self.Dv), (m, 0))
        tsQ, tgQ = _tma_part(tma_q, sQ, gQ_t)
        tsdO, tgdO = _tma_part(tma_do, sdO, gdO_t)
        if warp_idx == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(bar_q, bm * (self.D + self.Dv) * (self.dtype.width // 8))
            cute.copy(tma_q, tgQ, tsQ, tma_bar_ptr=bar_q)
            cute.copy(tma_do, tgdO, tsdO, tma_bar_ptr=bar_q)
        if tid < bm:
            l2, dl = self._row_stats(mLSE2, mDelta, bb, hq, off_q, m * bm + tid, slen_q)
            sLSE[tid] = l2
            sDelta[tid] = dl

    @cute.jit
    def _row_stats(self, mLSE2: cute.Tensor, mDelta: cute.Tensor, bb, hq, off_q, row, slen_q):
        """(lse2, Delta) of query row `row` of the segment; (+inf, 0) past its end, so P = 0 and dS = 0 there."""
        l2 = Float32.inf
        dl = Float32(0.0)
        if row < slen_q:
            l2 = mLSE2[bb, hq, off_q + row]
            dl = mDelta[bb, hq, off_q + row]
        return l2, dl

    # --------------------------------------------------------------- main
    @cute.kernel
    def _main(self, tma_q, gq, tma_do, gdo, tma_k, gk, tma_v, gv, mLSE2, mDelta, mdQacc, mdK, mdV, mCuQ, mCuK, Sq,
              Sk, qhead_per_kv, scale, scale_log2, win_left, win_right, mma_sdp, mma_dkv, mma_dq, l_q, l_k, l_p):
        """dK and dV (and dQ unless deterministic) of one key block, D = Dv: _main_body's PART_BOTH."""
        self._main_body(tma_q, gq, tma_do, gdo, tma_k, gk, tma_v, gv, mLSE2, mDelta, mdQacc, mdK, mdV, mCuQ, mCuK,
                        Sq, Sk, qhead_per_kv, scale, scale_log2, win_left, win_right, mma_sdp, mma_dkv, mma_dq,
                        l_q, l_k, l_p, mma_dkv, l_q, l_k, PART_BOTH)

    @cute.kernel
    def _main_part(self, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19,
                   a20, a21, a22, a23, a24, a25, a26, a27, mma_dv, l_do, l_v, part: cutlass.Constexpr):
        """One part (PART_DV or PART_DK) of the wide pairs' split form; a0..a27 are _main's arguments."""
        self._main_body(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19,
                        a20, a21, a22, a23, a24, a25, a26, a27, mma_dv, l_do, l_v, part)

    @cute.jit
    def _main_body(self, tma_q: cute.CopyAtom, gq: cute.Tensor, tma_do: cute.CopyAtom, gdo: cute.Tensor,
                   tma_k: cute.CopyAtom, gk: cute.Tensor, tma_v: cute.CopyAtom, gv: cute.Tensor,
                   mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor,
                   mdK: cute.Tensor, mdV: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
                   Sq, Sk, qhead_per_kv, scale: Float32, scale_log2: Float32,
                   win_left: Int32, win_right: Int32,
                   mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma,
                   l_q: cute.ComposedLayout, l_k: cute.ComposedLayout, l_p: cute.ComposedLayout,
                   mma_dv: cute.TiledMma, l_do: cute.ComposedLayout, l_v: cute.ComposedLayout,
                   part: cutlass.Constexpr):
        """part: PART_BOTH (dK and dV, and dQ unless deterministic), PART_DV (S -> P -> dV only; V is not loaded),
        PART_DK (S, dP -> dS -> dK only; dQ comes from _dq)."""
        dt = self.dtype
        D, Dv = self.D, self.Dv
        bm, bn = self.bm, self.bn
        want_dv = part != PART_DK
        want_dk = part != PART_DV
        tid, _, _ = cute.arch.thread_idx()
        nb, hkv, b = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        sQ, sdO, sK, sV, sP, sdS, sLSE, sDelta, bars = self._tiles(l_q, l_do, l_k, l_v, l_p, True)
        bar_kv = bars
        bar_q = bars + 1

        bb, off_q, slen_q = self._seg(mCuQ, b, Sq)
        _, off_k, slen_k = self._seg(mCuK, b, Sk)
        n0 = nb * bn
        self._init_bars(tid, bar_kv, bar_q)

        if n0 < slen_k:
            off = slen_k - slen_q
            # query rows that can see some key of [n0, n0 + bn)
            i_lo = cutlass.max(n0 - off - win_right, Int32(0))
            i_hi = cutlass.min(n0 + bn - 1 - off + win_left, slen_q - 1)
            m_min = i_lo // bm
            m_max = (cutlass.max(i_hi + 1, Int32(0)) + bm - 1) // bm
            nm = cutlass.max(m_max - m_min, Int32(0))
            n_iter = nm * qhead_per_kv

            # K, V tiles once
            gK_t = cute.local_tile(cute.domain_offset((off_k, 0), gk[None, None, hkv, bb]), (bn, D), (nb, 0))
            gV_t = cute.local_tile(cute.domain_offset((off_k, 0), gv[None, None, hkv, bb]), (bn, Dv), (nb, 0))
            tsK, tgK = _tma_part(tma_k, sK, gK_t)
            tsV, tgV = _tma_part(tma_v, sV, gV_t)
            # TMA copies elect a leader lane themselves (elect.sync): issue them from a whole, converged warp
            kv_bytes = bn * (D + (Dv if want_dk else 0)) * (dt.width // 8)
            if warp_idx == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(bar_kv, kv_bytes)
                cute.copy(tma_k, tgK, tsK, tma_bar_ptr=bar_kv)
                if cutlass.const_expr(want_dk):
                    cute.copy(tma_v, tgV, tsV, tma_bar_ptr=bar_kv)

            thr_sdp = mma_sdp.get_slice(tid)
            thr_dkv = mma_dkv.get_slice(tid)
            thr_dq = mma_dq.get_slice(tid)
            tSrQ = mma_sdp.make_fragment_A(thr_sdp.partition_A(sQ))
            tSrK = mma_sdp.make_fragment_B(thr_sdp.partition_B(sK))
            tPrdO = mma_sdp.make_fragment_A(thr_sdp.partition_A(sdO))
            tPrV = mma_sdp.make_fragment_B(thr_sdp.partition_B(sV))
            # PART_BOTH (D = Dv) keeps one MMA for dK and dV (mma_dkv), as before the split form existed
            if cutlass.const_expr(part == PART_BOTH):
                tVrPt = mma_dkv.make_fragment_A(thr_dkv.partition_A(_transpose(sP)))
                tVrdOt = mma_dkv.make_fragment_B(thr_dkv.partition_B(_transpose(sdO)))
            else:
                thr_dv = mma_dv.get_slice(tid)
                tVrPt = mma_dv.make_fragment_A(thr_dv.partition_A(_transpose(sP)))
                tVrdOt = mma_dv.make_fragment_B(thr_dv.partition_B(_transpose(sdO)))
                tVc = thr_dv.partition_C(cute.make_identity_tensor((bn, Dv)))
            tKrdSt = mma_dkv.make_fragment_A(thr_dkv.partition_A(_transpose(sdS)))
            tKrQt = mma_dkv.make_fragment_B(thr_dkv.partition_B(_transpose(sQ)))
            tQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(sdS))
            tQrKt = mma_dq.make_fragment_B(thr_dq.partition_B(_transpose(sK)))

            tScS = thr_sdp.partition_C(cute.make_identity_tensor((bm, bn)))
            tKVc = thr_dkv.partition_C(cute.make_identity_tensor((bn, D)))
            tQc = thr_dq.partition_C(cute.make_identity_tensor((bm, D)))
            r2s, thr_r2s, (tPsP, tPsdS) = self._tile_store(mma_sdp, tid, (sP, sdS), False)

            acc_S = cute.make_rmem_tensor(tScS.shape, Float32)
            acc_dP = cute.make_rmem_tensor(tScS.shape, Float32)
            acc_dK = cute.make_rmem_tensor(tKVc.shape, Float32)
            acc_dV = cute.make_rmem_tensor(tKVc.shape if cutlass.const_expr(part == PART_BOTH) else tVc.shape,
                                           Float32)
            acc_dQ = cute.make_rmem_tensor(tQc.shape, Float32)
            rP = cute.make_rmem_tensor(tScS.shape, dt)
            rdS = cute.make_rmem_tensor(tScS.shape, dt)
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)
            mma_sdp.set(wg.Field.ACCUMULATE, True)
            mma_dkv.set(wg.Field.ACCUMULATE, True)
            mma_dq.set(wg.Field.ACCUMULATE, True)
            if cutlass.const_expr(part != PART_BOTH):
                mma_dv.set(wg.Field.ACCUMULATE, True)   # its own MMA (N = Dv): accumulate over the query tiles too

            cute.arch.mbarrier_wait(bar_kv, 0)

            for it in cutlass.range(n_iter, unroll=1):
                hq = hkv * qhead_per_kv + it // nm
                m = m_min + it % nm
                i0 = m * bm
                cute.arch.sync_threads()  # previous tile fully consumed
                self._load_q_tile(tma_q, gq, tma_do, gdo, sQ, sdO, sLSE, sDelta, mLSE2, mDelta, bar_q, hq, bb, off_q,
                                  m, slen_q, tid, warp_idx)
                cute.arch.sync_threads()
                cute.arch.mbarrier_wait(bar_q, it % 2)

                acc_S.fill(0.0)
                acc_dP.fill(0.0)
                wg.fence()
                for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                    cute.gemm(mma_sdp, acc_S, tSrQ[None, None, kb], tSrK[None, None, kb], acc_S)
                if cutlass.const_expr(want_dk):
                    for kb in cutlass.range_constexpr(cute.size(tPrdO, mode=[2])):
                        cute.gemm(mma_sdp, acc_dP, tPrdO[None, None, kb], tPrV[None, None, kb], acc_dP)
                wg.commit_group()
                wg.wait_group(0)

                # (PART_DV: dP stays 0, so the dS computed here is unused)
                self._p_ds(acc_S, acc_dP, tScS, sLSE, sDelta, i0, n0, slen_q, slen_k, off,
                           win_left, win_right, scale_log2)
                if cutlass.const_expr(want_dv):
                    rP.store(acc_S.load().to(dt))
                if cutlass.const_expr(want_dk):
                    rdS.store(acc_dP.load().to(dt))
                if cutlass.const_expr(want_dv):
                    self._store_tile(r2s, thr_r2s, rP, tPsP)
                if cutlass.const_expr(want_dk):
                    self._store_tile(r2s, thr_r2s, rdS, tPsdS)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_threads()

                if cutlass.const_expr(not self.deterministic):
                    acc_dQ.fill(0.0)
                wg.fence()
                if cutlass.const_expr(want_dv):
                    mma_v = mma_dkv if cutlass.const_expr(part == PART_BOTH) else mma_dv
                    for kb in cutlass.range_constexpr(cute.size(tVrPt, mode=[2])):
                        cute.gemm(mma_v, acc_dV, tVrPt[None, None, kb], tVrdOt[None, None, kb], acc_dV)
                if cutlass.const_expr(want_dk):
                    for kb in cutlass.range_constexpr(cute.size(tKrdSt, mode=[2])):
                        cute.gemm(mma_dkv, acc_dK, tKrdSt[None, None, kb], tKrQt[None, None, kb], acc_dK)
                if cutlass.const_expr(not self.deterministic):
                    for kb in cutlass.range_constexpr(cute.size(tQrdS, mode=[2])):
                        cute.gemm(mma_dq, acc_dQ, tQrdS[None, None, kb], tQrKt[None, None, kb], acc_dQ)
                wg.commit_group()
                wg.wait_group(0)

                if cutlass.const_expr(not self.deterministic):
                    for e in cutlass.range_constexpr(cute.size(acc_dQ)):
                        r, c = tQc[e]
                        i = i0 + r
                        if i < slen_q:
                            ptr = mdQacc.iterator + cute.crd2idx((bb, off_q + i, hq, c), mdQacc.layout)
                            cute.arch.red(ptr, acc_dQ[e], op="add", dtype=Float32, sem="relaxed",
                                          scope="gpu")

            # epilogue: dK = scale * acc, dV = acc, rows inside the segment only
            if cutlass.const_expr(part == PART_BOTH and Dv == D):
                self._store_dkv(acc_dK, acc_dV, tKVc, n0, slen_k, mdK, mdV, bb, off_k, hkv, scale)
            else:
                if cutlass.const_expr(want_dk):
                    for e in cutlass.range_constexpr(cute.size(acc_dK)):
                        r, c = tKVc[e]
                        if n0 + r < slen_k:
                            mdK[bb, off_k + n0 + r, hkv, c] = (acc_dK[e] * scale).to(dt)
                if cutlass.const_expr(want_dv):
                    for e in cutlass.range_constexpr(cute.size(acc_dV)):
                        r, c = tVc[e]
                        if n0 + r < slen_k:
                            mdV[bb, off_k + n0 + r, hkv, c] = acc_dV[e].to(dt)

    # ----------------------------------------------------- deterministic dQ
    @cute.kernel
    def _dq(self, tma_q: cute.CopyAtom, gq: cute.Tensor, tma_do: cute.CopyAtom, gdo: cute.Tensor,
            tma_k: cute.CopyAtom, gk: cute.Tensor, tma_v: cute.CopyAtom, gv: cute.Tensor,
            mLSE2: cute.Tensor, mDelta: cute.Tensor, mdQacc: cute.Tensor,
            mCuQ: cute.Tensor, mCuK: cute.Tensor, Sq, Sk, qhead_per_kv, scale_log2: Float32,
            win_left: Int32, win_right: Int32,
            mma_sdp: cute.TiledMma, mma_dq: cute.TiledMma,
            l_q: cute.ComposedLayout, l_k: cute.ComposedLayout, l_p: cute.ComposedLayout,
            l_do: cute.ComposedLayout, l_v: cute.ComposedLayout):
        dt = self.dtype
        D, Dv = self.D, self.Dv
        bm, bn = self.bm, self.bn
        tid, _, _ = cute.arch.thread_idx()
        mb, hq, b = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        hkv = hq // qhead_per_kv

        sQ, sdO, sK, sV, _, sdS, sLSE, sDelta, bars = self._tiles(l_q, l_do, l_k, l_v, l_p, False)
        bar_q = bars
        bar_kv = bars + 1

        bb, off_q, slen_q = self._seg(mCuQ, b, Sq)
        _, off_k, slen_k = self._seg(mCuK, b, Sk)
        i0 = mb * bm
        self._init_bars(tid, bar_kv, bar_q)

        if i0 < slen_q:
            off = slen_k - slen_q
            j_lo = cutlass.max(i0 + off - win_left, Int32(0))
            j_hi = cutlass.min(i0 + bm - 1 + off + win_right, slen_k - 1)
            n_min = j_lo // bn
            n_max = (cutlass.max(j_hi + 1, Int32(0)) + bn - 1) // bn
            nn = cutlass.max(n_max - n_min, Int32(0))

            self._load_q_tile(tma_q, gq, tma_do, gdo, sQ, sdO, sLSE, sDelta, mLSE2, mDelta, bar_q, hq, bb, off_q, mb,
                              slen_q, tid, warp_idx)

            thr_sdp = mma_sdp.get_slice(tid)
            thr_dq = mma_dq.get_slice(tid)
            tSrQ = mma_sdp.make_fragment_A(thr_sdp.partition_A(sQ))
            tSrK = mma_sdp.make_fragment_B(thr_sdp.partition_B(sK))
            tPrdO = mma_sdp.make_fragment_A(thr_sdp.partition_A(sdO))
            tPrV = mma_sdp.make_fragment_B(thr_sdp.partition_B(sV))
            tQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(sdS))
            tQrKt = mma_dq.make_fragment_B(thr_dq.partition_B(_transpose(sK)))
            tScS = thr_sdp.partition_C(cute.make_identity_tensor((bm, bn)))
            tQc = thr_dq.partition_C(cute.make_identity_tensor((bm, D)))
            r2s, thr_r2s, (tPsdS,) = self._tile_store(mma_sdp, tid, (sdS,), False)
            acc_S = cute.make_rmem_tensor(tScS.shape, Float32)
            acc_dP = cute.make_rmem_tensor(tScS.shape, Float32)
            acc_dQ = cute.make_rmem_tensor(tQc.shape, Float32)
            rdS = cute.make_rmem_tensor(tScS.shape, dt)
            acc_dQ.fill(0.0)
            mma_sdp.set(wg.Field.ACCUMULATE, True)
            mma_dq.set(wg.Field.ACCUMULATE, True)
            cute.arch.mbarrier_wait(bar_q, 0)

            for it in cutlass.range(nn, unroll=1):
                nb = n_min + it
                j0 = nb * bn
                cute.arch.sync_threads()  # previous K/V/dS consumed; sLSE visible on first pass
                gK_t = cute.local_tile(cute.domain_offset((off_k, 0), gk[None, None, hkv, bb]), (bn, D), (nb, 0))
                gV_t = cute.local_tile(cute.domain_offset((off_k, 0), gv[None, None, hkv, bb]), (bn, Dv), (nb, 0))
                tsK, tgK = _tma_part(tma_k, sK, gK_t)
                tsV, tgV = _tma_part(tma_v, sV, gV_t)
                if warp_idx == 0:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(bar_kv, bn * (D + Dv) * (dt.width // 8))
                    cute.copy(tma_k, tgK, tsK, tma_bar_ptr=bar_kv)
                    cute.copy(tma_v, tgV, tsV, tma_bar_ptr=bar_kv)
                cute.arch.mbarrier_wait(bar_kv, it % 2)

                acc_S.fill(0.0)
                acc_dP.fill(0.0)
                wg.fence()
                for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                    cute.gemm(mma_sdp, acc_S, tSrQ[None, None, kb], tSrK[None, None, kb], acc_S)
                for kb in cutlass.range_constexpr(cute.size(tPrdO, mode=[2])):
                    cute.gemm(mma_sdp, acc_dP, tPrdO[None, None, kb], tPrV[None, None, kb], acc_dP)
                wg.commit_group()
                wg.wait_group(0)

                self._p_ds(acc_S, acc_dP, tScS, sLSE, sDelta, i0, j0, slen_q, slen_k, off,
                           win_left, win_right, scale_log2)
                rdS.store(acc_dP.load().to(dt))
                self._store_tile(r2s, thr_r2s, rdS, tPsdS)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.sync_threads()

                wg.fence()
                for kb in cutlass.range_constexpr(cute.size(tQrdS, mode=[2])):
                    cute.gemm(mma_dq, acc_dQ, tQrdS[None, None, kb], tQrKt[None, None, kb], acc_dQ)
                wg.commit_group()
                wg.wait_group(0)

            for e in cutlass.range_constexpr(cute.size(acc_dQ)):
                r, c = tQc[e]
                i = i0 + r
                if i < slen_q:
                    mdQacc[bb, off_q + i, hq, c] = acc_dQ[e]
