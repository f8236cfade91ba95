"""Flash-attention forward for Hopper (sm_90a), CuTe DSL: TMA loads, warpgroup MMA, online softmax in base 2.

Math (per query row i of one (batch, head) segment, keys j, scale c = softmax_scale * log2(e)):

    S_ij = q_i . k_j                         fp32 wgmma accumulator (bf16/fp16 inputs, never pre-scaled)
    masked to -inf where key j is invisible (ops.common.mask)
    m_i  = rn(c max_j S_ij) (running, monotonic)
    P_ij = 2^(fma(S_ij, c, -m_i))            (rounded to the input dtype for P V)
    l_i  = sum_j P_ij (fp32, unrounded),     O_i = sum_j P_ij v_j / l_i
    lse_i = ln(2) * (m_i + log2(l_i))        natural log; a row that sees no key: O_i = 0, lse_i = -inf
(online form, the -inf guards, and why the scale folds into the exponent's fma only for c > 0 and |m_i| < 2^28,
the scores being scaled first otherwise: ops.common.softmax; the rescale skip, a knob off by default since it costs
accuracy on peaked rows: RESCALE_SKIP below).

Head dims: query/key D and value Dv as one of TILES' pairs ((64, 64), (96, 96), (128, 128), (192, 128) for MLA in
MHA form, (192, 192), (256, 256)); out has Dv columns.

Tiling. One CTA = BM query rows of one (batch, head) (supported.fwd_block_m: 192 for (64, 64) without a bounded
mask, else 128) = one producer and BM / 64 consumer warpgroups (384 or 512 threads; setmaxnreg 24 / 240 or 24 / 160):
  - warpgroup 0 (producer, registers lowered): its warp 0 issues TMA bulk tensor loads: the Q tile (BM x D) once,
    then for each visible key block n: K_n (BN x D, K-major) and V_n (read as Dv x BN, MN-major) into a
    ``stages``-deep ring guarded by two PipelineTmaAsync pipelines (full = TMA transaction bytes, empty = 4 x BM / 64
    consumer warps).
  - warpgroups 1.. (consumers): each owns 64 of the BM rows (the tiled MMA has BM / 64 atoms along M).
    Per key block: S = Q K_n^T (wgmma SS, 64 x BN x 16 atoms) -> mask (only on blocks that need it),
    online softmax (scale folded) -> P in registers converted to the input dtype -> O += P V_n (wgmma RS,
    64 x Dv x 16 atoms).
    Epilogue: O / l written straight from registers to global memory with a row predicate (so varlen
    segments never write past their end), lse by one lane per quad.
  BN and the ring's stages per (D, Dv): TILES below (BN 128 up to (192, 128), 64 for (192, 192) and (256, 256)).
  The shared-memory swizzle of each tile follows its row width (hopper_helpers.make_smem_layout_a / _b).
Key blocks visited: [n_lo, n_hi) from ops.common.mask.key_block_range (an empty range still writes O = 0 and
lse = -inf). Query blocks are launched longest-first: unmasked variants by reversed blockIdx.x per head; masked ones
(LPT_MB, default 24) walk the longest blocks of all heads of an L2 section first (ops.common.launch_order).

Layouts. Dense: q [B,Sq,H,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv], out [B,Sq,H,Dv], lse [B,H,Sq]. Varlen: q [Tq,H,D],
k [Tk,Hkv,D], v [Tk,Hkv,Dv], out [Tq,H,Dv], lse [H,Tq], cu_seqlens_q/k int32 [batch+1]; the grid gets one extra
z-slice (batch index == batch) that writes O = 0, lse = -inf to the rows at or past cu_seqlens_q[-1]. Query head h reads kv head h // (H // Hkv).
TMA tiles may run past a segment end into the next segment's rows (loads only, masked out) or past the tensor
(zero-filled); stores are always row-predicated.

Status (H200, 2026-12-03): tests/gpu/test_flash_fwd.py 152/152 pass for every TILES pair, compute-sanitizer
racecheck and memcheck clean (tests/gpu/sanitize_fwd.py, pairs (64, 64), (128, 128), (96, 96), (192, 128), (256, 256)).
New pairs, B2 H16 S8k (docs/performance.md): (192, 128) 720 / 668 TFLOP/s non-causal / causal (1.04x / 1.08x cuDNN,
0.91x / 0.86x FA4), (96, 96) 563 / 481, (192, 192) 663 / 624, (256, 256) 707 / 643. Speed against SDPA, cuDNN and FA4 in one run: docs/performance.md (D=128 S=8k about
1.8x SDPA-FA2, 0.9x-1.0x cuDNN, 0.85x-0.9x FA4). Launched through TVM-FFI: ~60 us of host time per call.
The ping-pong option passed the same tests but measured mixed (+/- ~15 %, noisy), so it stays off.
The 192-row D 64 tile (2026-12-05, H100): tests/gpu/test_flash_fwd.py 171/171 pass with it at D 64 masked and
unmasked (PADDLE_DSA_FWD_BM64=192/192), racecheck and memcheck clean; same-run A/B against the 128-row tile:
non-causal 428-469 vs 401-442 TFLOP/s at S >= 4096 (+4..8 %), causal 190-426 vs 225-432 (slower; the masked variants
spill 100-132 B at 160 registers a consumer thread), so at first only the unmasked D 64 variants took it. With the
mask's bounds relative to a thread's first column (ops.common.mask.apply_mask, 2026-12-07, H100) the masked tile spills
nothing and every D 64 variant takes 192 rows: test_flash_fwd 183/183, racecheck / memcheck clean, same-run A/B
against the 128-row masked tile with absolute bounds: D 64 causal 418.5 -> 441.8 TFLOP/s (1.056x), D 64 non-causal
1.015x, D 128 0.999x / 1.011x, outputs bit for bit equal (perf/device_2026-12-07T1903_h100.txt).
The folded scale (2026-12-07, H100 only, no H200 since): tests/gpu/test_flash_fwd.py 183/183 pass, sanitize_fwd
racecheck and memcheck clean, 1.01-1.09x against FOLD=0 in the same run (D 64 1.09x / 1.05x, D 96 1.04x / 1.06x,
D 128 1.01x / 1.00x).
"""
import math

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.nvgpu import OperandMajorMode
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..common import launch_order
from ..common import mask as mask_lib
from ..common.softmax import (acc_mn_view, fold_factors, online_softmax_finalize, online_softmax_step,
                              online_softmax_update, p_operand_view, prescale_scores, rescale_rows,
                              rescale_rows_where_needed, softmax_state)
from ..common.switches import dims_knob

from .supported import FWD_BLOCK_M_DEFAULT as BLOCK_M, fwd_block_m
SMEM_BYTES = 232448  # sm90 dynamic shared memory a CTA can have (227 KiB)

# (Dqk, Dv) -> (BN key rows a block, stages of the K / V ring). Shared memory (16-bit elements, 1 KiB alignment):
# Q BM x Dqk + stages x BN x (Dqk + Dv). Live fp32 accumulators a consumer thread: O 64 x Dv / 128 + S 64 x BN / 128.
# Picked on CPU (2026-12-03, ptxas sm_90a): no spills, and no warpgroup.arrive injected by ptxas between the P V
# wgmmas (it does inject them for (192, 192) at BN 80 / 96 / 112 and (256, 256) at BN 80, when P's registers are
# repacked between the wgmmas of one group; (192, 192) at BN 128 needs a single stage and spills).
TILES = {
    (64, 64): (128, 3),      # 24 (BM 192) + 3 x 32 = 120 KiB;  O 32 + S 64 registers
    (96, 96): (128, 3),      # 24 + 3 x 48 = 168 KiB;  O 48 + S 64
    (128, 128): (128, 2),    # 32 + 2 x 64 = 160 KiB;  O 64 + S 64
    (192, 128): (128, 2),    # 48 + 2 x 80 = 208 KiB;  O 64 + S 64
    (192, 192): (64, 3),     # 48 + 3 x 48 = 192 KiB;  O 96 + S 32
    (256, 256): (64, 2),     # 64 + 2 x 64 = 192 KiB;  O 128 + S 32
}


def smem_bytes(head_dim, v_head_dim):
    """Shared memory of one CTA: barriers, then Q, K, V each at a 1 KiB boundary (SharedStorage below)."""
    bn, stages = TILES[(head_dim, v_head_dim)]
    up = lambda x: -(-x // 1024) * 1024  # noqa: E731
    bm = max(fwd_block_m(head_dim, v_head_dim, b) for b in (False, True))
    return up(up(up(8 * (4 * stages + 1)) + bm * head_dim * 2) + stages * bn * head_dim * 2) + \
        stages * bn * v_head_dim * 2


class FlashFwdSm90:
    """One compiled forward variant: (dtype, (head_dim, v_head_dim), bounded mask?, varlen?)."""

    # Knob (class attribute, read while tracing; timed by bench/ab_flash_fwd.py --knobs): FOLD folds a positive
    # scale into the exponent's fma (ops.common.softmax.fold_factors); False scales every score first, the form
    # before 2026-12-07.
    FOLD = True
    # RESCALE_SKIP at the head dims RESCALE_SKIP_DIMS (trial knob, off: no head dim): a key block whose max exceeds a
    # row's running max by at most RESCALE_SKIP (log2 units, <= 7) keeps the running max, and O is rescaled only where
    # a row of the warp moved its max (ops.common.softmax, rescale skip). H100 2026-12-07 19:52, same run, threshold 7
    # (4 the same): D 128 1.019x / 1.029x (non-causal / causal), D 96 0.993x / 1.002x, D 64 (192-row tile) 0.939x /
    # 0.963x; it was on at D 128 from then until 2026-12-08, when test_seed001 failed with it on the H100 (00:59:
    # 12 of 14 cases, K*8 rel L2 1.972e-3 against the floor's 1.708e-3, 1.154x; 1.679e-3, 0.983x without it): a
    # kept max leaves the row's largest P = 2^(positive fraction), rounded to bf16, where the exact max gives P = 1
    # exactly, and on peaked rows that term carries most of the output. Accuracy first: off at every head dim
    # (tests/test_softmax_fold_model.py pins it on a model of the kernel's arithmetic).
    RESCALE_SKIP = 7
    RESCALE_SKIP_DIMS = ()
    # RESCALE_VOTE_DIMS (trial knob, off): at these head dims O is rescaled only where a row of the warp moved its max
    # (rescale_rows_where_needed) without keeping any max: corr is then exactly 1 where skipped, so out / lse are bit
    # for bit the plain form's; only the time can differ (not yet timed on a GPU)
    RESCALE_VOTE_DIMS = ()
    # LPT_MB > 0 (masked variants only): the grid is walked longest query block first across all (batch, head) pairs
    # of an L2 section, not per head: the launch's linear CTA order is remapped so that consecutive CTAs take the same
    # query block of the section's heads, a section holding about LPT_MB MiB of K / V (lpt_tile). Why: with one head's
    # blocks longest-to-shortest, the last heads' longest causal blocks start late and run alone at the end (a CPU model
    # of greedy dispatch on 132 SMs, B 2 H 16 S 8K: 0.91 / 0.95 of the ideal at D 64 / 128, 0.99 / 1.00 in LPT order).
    # H100 2026-12-08 00:59 (bench/ab_flash_fwd.py, same run, out and lse bit for bit equal): causal D 128 626.6 ->
    # 657.9 TFLOP/s (1.050x), D 64 441.6 -> 472.0 (1.069x); LPT_MB = 8 1.055x / 1.058x; the default since then.
    LPT_MB = 24

    def __init__(self, dtype, head_dim: int, bounded: bool, varlen: bool, overlap: bool = True,
                 pingpong: bool = False, v_head_dim=None):
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        assert (head_dim, v_head_dim) in TILES, (head_dim, v_head_dim)
        self.skip = int(self.RESCALE_SKIP) if head_dim in dims_knob(self.RESCALE_SKIP_DIMS) else 0
        assert 0 <= self.skip <= 7, self.skip             # P <= 2^(skip + 8) stays a finite float16
        self.vote = self.skip > 0 or head_dim in dims_knob(self.RESCALE_VOTE_DIMS)
        self.dtype = dtype
        self.D = head_dim
        self.Dv = v_head_dim
        self.BM = fwd_block_m(head_dim, v_head_dim, bounded)
        self.wgs = self.BM // 64                  # consumer warpgroups, 64 rows each
        self.threads = 128 * (1 + self.wgs)
        # setmaxnreg: producer 24, consumers 240 (2) or 160 (3): 24 + wgs x regs <= 512 (64 K registers / 128)
        self.consumer_regs = 240 if self.wgs == 2 else 160
        self.BN, self.stages = TILES[(head_dim, v_head_dim)]
        assert smem_bytes(head_dim, v_head_dim) <= SMEM_BYTES
        self.bounded = bounded
        self.varlen = varlen
        # overlap: issue Q K_{n+1}^T and P_n V_n back to back and run softmax(n+1) while P_n V_n is in flight
        self.overlap = overlap
        # pingpong (with overlap): the two consumer warpgroups take turns issuing their wgmmas (named barriers),
        # so one warpgroup's softmax runs under the other's tensor-core work (passed the GPU tests; off by default)
        # (turns between exactly two consumer warpgroups: off for the 192-row tile, whatever PADDLE_DSA_FWD_PINGPONG)
        self.pingpong = pingpong and overlap and self.wgs == 2
        self.lpt_mb = int(self.LPT_MB) if bounded else 0

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mCuQ: cute.Tensor, mCuK: cute.Tensor, scale_log2: Float32, win_left: Int32, win_right: Int32,
                 grid_m: Int32, stream):
        D, Dv, BM, BN, dt = self.D, self.Dv, self.BM, self.BN, self.dtype
        if cutlass.const_expr(self.varlen):
            # THD -> (S, D, H): rows, head_dim (contiguous), heads
            q3 = cute.make_tensor(mQ.iterator, cute.make_layout((mQ.shape[0], D, mQ.shape[1]),
                                                                stride=(mQ.stride[0], 1, mQ.stride[1])))
            k3 = cute.make_tensor(mK.iterator, cute.make_layout((mK.shape[0], D, mK.shape[1]),
                                                                stride=(mK.stride[0], 1, mK.stride[1])))
            vt = cute.make_tensor(mV.iterator, cute.make_layout((Dv, mV.shape[0], mV.shape[1]),
                                                                stride=(1, mV.stride[0], mV.stride[1])))
            o_v = cute.make_tensor(mO.iterator, cute.make_layout((mO.shape[0], Dv, mO.shape[1]),
                                                                 stride=(mO.stride[0], 1, mO.stride[1])))
            lse_v = cute.make_tensor(mLSE.iterator, cute.make_layout((mLSE.shape[1], mLSE.shape[0]),
                                                                     stride=(mLSE.stride[1], mLSE.stride[0])))
            num_heads = mQ.shape[1]
            num_kv_heads = mK.shape[1]
            grid_z = mCuQ.shape[0]  # batch + 1: the last slice clears rows past cu_seqlens_q[-1]
        else:
            # BSHD -> (S, D, H, B)
            q3 = cute.make_tensor(mQ.iterator, cute.make_layout(
                (mQ.shape[1], D, mQ.shape[2], mQ.shape[0]), stride=(mQ.stride[1], 1, mQ.stride[2], mQ.stride[0])))
            k3 = cute.make_tensor(mK.iterator, cute.make_layout(
                (mK.shape[1], D, mK.shape[2], mK.shape[0]), stride=(mK.stride[1], 1, mK.stride[2], mK.stride[0])))
            vt = cute.make_tensor(mV.iterator, cute.make_layout(
                (Dv, mV.shape[1], mV.shape[2], mV.shape[0]), stride=(1, mV.stride[1], mV.stride[2], mV.stride[0])))
            o_v = cute.make_tensor(mO.iterator, cute.make_layout(
                (mO.shape[1], Dv, mO.shape[2], mO.shape[0]), stride=(mO.stride[1], 1, mO.stride[2], mO.stride[0])))
            # lse [B,H,Sq] -> (Sq, H, B)
            lse_v = cute.make_tensor(mLSE.iterator, cute.make_layout(
                (mLSE.shape[2], mLSE.shape[1], mLSE.shape[0]),
                stride=(mLSE.stride[2], mLSE.stride[1], mLSE.stride[0])))
            num_heads = mQ.shape[2]
            num_kv_heads = mK.shape[2]
            grid_z = mQ.shape[0]

        qk_mma = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                   (self.wgs, 1, 1), tiler_mn=(64, BN))
        # same QK MMA twice: one fixed to overwrite (first k-block), one to accumulate; fixing the ACCUMULATE field
        # once, outside all staged control flow, keeps the tracer from carrying MMA state across regions
        qk_mma_acc = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                       (self.wgs, 1, 1), tiler_mn=(64, BN))
        pv_mma = sm90_utils.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32,
                                                   (self.wgs, 1, 1), tiler_mn=(64, Dv),
                                                   a_source=warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (BM, BN, D), dt, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (BM, BN, D), dt, self.stages)
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, (BM, Dv, BN), dt, self.stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, q3, cute.slice_(sQ_layout, (None, None, 0)), (BM, D))
        tma_k, tK = cpasync.make_tiled_tma_atom(g2s, k3, cute.slice_(sK_layout, (None, None, 0)), (BN, D))
        tma_v, tV = cpasync.make_tiled_tma_atom(g2s, vt, cute.slice_(sV_layout, (None, None, 0)), (Dv, BN))

        self.q_bytes = BM * D * dt.width // 8
        self.k_bytes = BN * D * dt.width // 8
        self.v_bytes = BN * Dv * dt.width // 8

        @cute.struct
        class SharedStorage:
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]

        self.shared_storage = SharedStorage

        self.kernel(tma_q, tQ, tma_k, tK, tma_v, tV, o_v, lse_v, mCuQ, mCuK, scale_log2, win_left, win_right,
                    num_heads, num_kv_heads, grid_m, qk_mma, qk_mma_acc, pv_mma, sQ_layout, sK_layout, sV_layout).launch(
            grid=(grid_m, num_heads, grid_z), block=(self.threads, 1, 1), stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, tma_k: cute.CopyAtom, tK: cute.Tensor,
               tma_v: cute.CopyAtom, tV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mCuQ: cute.Tensor, mCuK: cute.Tensor, scale_log2: Float32, win_left: Int32, win_right: Int32,
               num_heads: Int32, num_kv_heads: Int32, grid_m: Int32,
               qk_mma: cute.TiledMma, qk_mma_acc: cute.TiledMma, pv_mma: cute.TiledMma,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout):
        D, BM, BN = self.D, self.BM, self.BN
        tidx, _, _ = cute.arch.thread_idx()
        bx, head, batch = cute.arch.block_idx()
        m_block = grid_m - 1 - bx  # longest (causal) query blocks first
        if cutlass.const_expr(self.lpt_mb > 0):
            m_block, head, batch = self.lpt_tile(bx, head, batch, grid_m, num_heads, num_kv_heads, tK.shape[0])

        if cutlass.const_expr(self.varlen):
            n_batch = mCuQ.shape[0] - 1
            if batch == n_batch:
                self.clear_tail(mO, mLSE, mCuQ, head, m_block, grid_m, tidx)
            else:
                q_off = mCuQ[batch]
                seqlen_q = mCuQ[batch + 1] - q_off
                k_off = mCuK[batch]
                seqlen_k = mCuK[batch + 1] - k_off
                if m_block * BM < seqlen_q:
                    self.attend(tma_q, tQ, tma_k, tK, tma_v, tV, mO, mLSE, scale_log2, win_left, win_right,
                                num_heads, num_kv_heads, qk_mma, qk_mma_acc, pv_mma, sQ_layout, sK_layout, sV_layout,
                                tidx, head, batch, m_block, q_off, seqlen_q, k_off, seqlen_k)
        else:
            self.attend(tma_q, tQ, tma_k, tK, tma_v, tV, mO, mLSE, scale_log2, win_left, win_right,
                        num_heads, num_kv_heads, qk_mma, qk_mma_acc, pv_mma, sQ_layout, sK_layout, sV_layout,
                        tidx, head, batch, m_block, Int32(0), tQ.shape[0], Int32(0), tK.shape[0])

    @cute.jit
    def lpt_tile(self, bx: Int32, by: Int32, bz: Int32, grid_m: Int32, num_heads: Int32, num_kv_heads: Int32,
                 keys: Int32):
        """(m_block, head, batch) of the CTA at linear launch position bx + grid_m (by + num_heads bz), in LPT order
        (ops.common.launch_order): pairs hb = head + num_heads batch (varlen: batch = segment, the clearing slice
        last), sections of the query heads of max(1, LPT_MB MiB / (K + V bytes of one kv head)) kv heads (a segment's
        keys: all keys / segments for varlen); rank 0 = the last query block, the longest under a causal mask."""
        _, _, gz = cute.arch.grid_dim()
        seq_k = keys
        if cutlass.const_expr(self.varlen):
            seq_k = keys // cutlass.max(gz - 1, 1)
        budget_keys = (self.lpt_mb << 20) // ((self.D + self.Dv) * self.dtype.width // 8)   # compile time
        sec = cutlass.max(Int32(budget_keys) // cutlass.max(seq_k, 1), 1) * (num_heads // num_kv_heads)
        rank, hb = launch_order.lpt_tile(bx + grid_m * (by + num_heads * bz), grid_m, num_heads * gz, sec)
        return grid_m - 1 - rank, hb % num_heads, hb // num_heads

    @cute.jit
    def clear_tail(self, mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: cute.Tensor, head: Int32, m_block: Int32,
                   grid_m: Int32, tidx: Int32):
        """Varlen rows at or past cu_seqlens_q[-1]: out 0, lse -inf (grid-stride over BM-row chunks)."""
        D, BM = self.Dv, self.BM  # out rows are Dv wide
        total = mO.shape[0]
        start = mCuQ[mCuQ.shape[0] - 1] + m_block * BM
        zero = self.dtype(0.0)
        for row0 in cutlass.range(start, total, grid_m * BM, unroll=1):
            for i in cutlass.range(tidx, BM * D, self.threads, unroll=1):
                row = row0 + i // D
                if row < total:
                    mO[row, i % D, head] = zero
            if tidx < BM:
                if row0 + tidx < total:
                    mLSE[row0 + tidx, head] = -Float32.inf

    @cute.jit
    def attend(self, tma_q, tQ, tma_k, tK, tma_v, tV, mO, mLSE, scale_log2: Float32, win_left: Int32,
               win_right: Int32, num_heads: Int32, num_kv_heads: Int32, qk_mma: cute.TiledMma,
               qk_mma_acc: cute.TiledMma, pv_mma: cute.TiledMma, sQ_layout, sK_layout, sV_layout, tidx: Int32, head: Int32, batch: Int32,
               m_block: Int32, q_off: Int32, seqlen_q: Int32, k_off: Int32, seqlen_k: Int32):
        D, Dv, BM, BN, dt = self.D, self.Dv, self.BM, self.BN, self.dtype
        kv_head = head // (num_heads // num_kv_heads)
        m_start = m_block * BM

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sQ2 = sQ[None, None, 0]
        q_bar = storage.mbar_q.data_ptr()

        # global tiles (TMA coordinate tensors)
        if cutlass.const_expr(self.varlen):
            gQh = cute.domain_offset((q_off, 0), tQ[None, None, head])
            gKh = cute.domain_offset((k_off, 0), tK[None, None, kv_head])
            gVh = cute.domain_offset((0, k_off), tV[None, None, kv_head])
            gOh = mO[None, None, head]
            gLh = mLSE[None, head]
        else:
            gQh = tQ[None, None, head, batch]
            gKh = tK[None, None, kv_head, batch]
            gVh = tV[None, None, kv_head, batch]
            gOh = mO[None, None, head, batch]
            gLh = mLSE[None, head, batch]
        gQ = cute.local_tile(gQh, (BM, D), (m_block, 0))
        gK = cute.local_tile(gKh, (BN, D), (None, 0))   # (BN, D, n)
        gV = cute.local_tile(gVh, (Dv, BN), (0, None))   # (Dv, BN, n)
        tQs, tQg = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ2, 0, 2),
                                         cute.group_modes(gQ, 0, 2))
        tKs, tKg = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                         cute.group_modes(gK, 0, 2))
        tVs, tVg = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2),
                                         cute.group_modes(gV, 0, 2))

        n_lo, n_hi = mask_lib.key_block_range(m_start, BM, seqlen_q, seqlen_k, win_left, win_right, BN,
                                              self.bounded)

        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.wgs)  # one arrive per consumer warp
        pipe_k = pipeline.PipelineTmaAsync.create(barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.stages,
                                                  producer_group=producer, consumer_group=consumers,
                                                  tx_count=self.k_bytes, defer_sync=True)
        pipe_v = pipeline.PipelineTmaAsync.create(barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.stages,
                                                  producer_group=producer, consumer_group=consumers,
                                                  tx_count=self.v_bytes, defer_sync=True)
        if tidx == 0:
            cute.arch.mbarrier_init(q_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4
        if wg == 0:
            # ---------------- producer
            cute.arch.setmaxregister_decrease(24)
            if warp == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(q_bar, self.q_bytes)
                cute.copy(tma_q, tQg, tQs, tma_bar_ptr=q_bar)
                st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
                for n in cutlass.range(n_lo, n_hi, unroll=1):
                    pipe_k.producer_acquire(st)
                    cute.copy(tma_k, tKg[None, n], tKs[None, st.index], tma_bar_ptr=pipe_k.producer_get_barrier(st))
                    pipe_v.producer_acquire(st)
                    cute.copy(tma_v, tVg[None, n], tVs[None, st.index], tma_bar_ptr=pipe_v.producer_get_barrier(st))
                    st.advance()
        else:
            # ---------------- consumers (BM / 64 warpgroups x 64 rows)
            cute.arch.setmaxregister_increase(self.consumer_regs)
            ctid = tidx - 128
            thr_qk = qk_mma.get_slice(ctid)
            thr_pv = pv_mma.get_slice(ctid)
            tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ2))
            tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
            tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))
            acc_o = thr_pv.make_fragment_C(thr_pv.partition_shape_C((BM, Dv)))
            acc_o.fill(0.0)
            o_mn = acc_mn_view(acc_o)
            c_mn = acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor((BM, BN))))
            n_kblk_pv = BN // 16

            oc_mn = acc_mn_view(thr_pv.partition_C(cute.make_identity_tensor((BM, Dv))))
            pv_mma.set(warpgroup.Field.ACCUMULATE, True)
            qk_mma.set(warpgroup.Field.ACCUMULATE, False)
            qk_mma_acc.set(warpgroup.Field.ACCUMULATE, True)
            row_max, row_sum = softmax_state(2)
            prescale, mult = scale_log2, Float32(1.0)
            if cutlass.const_expr(self.FOLD):
                prescale, mult = fold_factors(scale_log2)
            cute.arch.mbarrier_wait(q_bar, 0)
            if cutlass.const_expr(not self.overlap):
                st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                for n in cutlass.range(n_lo, n_hi, unroll=1):
                    acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((BM, BN)))
                    pipe_k.consumer_wait(st)
                    warpgroup.fence()
                    self.issue_qk(qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, st.index)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe_k.consumer_release(st)
                    s_mn = acc_mn_view(acc_s)
                    self.prep_scores(s_mn, c_mn, prescale, m_start, n * BN, seqlen_q, seqlen_k, win_left,
                                     win_right)
                    online_softmax_update(s_mn, o_mn, row_max, row_sum, mult)
                    tOrP = self.p_to_operand(acc_s)
                    pipe_v.consumer_wait(st)
                    warpgroup.fence()
                    self.issue_pv(pv_mma, acc_o, tOrP, tOrV, st.index)
                    warpgroup.commit_group()
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(st)
                    st.advance()
            else:
                st_k = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                st_v = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
                cwg = wg - 1
                if n_lo < n_hi:
                    acc_s = thr_qk.make_fragment_C(thr_qk.partition_shape_C((BM, BN)))
                    if cutlass.const_expr(self.pingpong):
                        if cwg == 1:
                            self.turn_bar(0).arrive()   # warpgroup 0 issues first
                    pipe_k.consumer_wait(st_k)
                    self.turn_wait(cwg)
                    warpgroup.fence()
                    self.issue_qk(qk_mma, qk_mma_acc, acc_s, tSrQ, tSrK, st_k.index)
                    warpgroup.commit_group()
                    self.turn_pass(cwg)
                    warpgroup.wait_group(0)
                    pipe_k.consumer_release(st_k)
                    st_k.advance()
                    s_mn = acc_mn_view(acc_s)
                    self.prep_scores(s_mn, c_mn, prescale, m_start, n_lo * BN, seqlen_q, seqlen_k, win_left,
                                     win_right)
                    online_softmax_update(s_mn, o_mn, row_max, row_sum, mult)
                    rP = cute.make_rmem_tensor(acc_s.layout, dt)
                    rP.store(acc_s.load().to(dt))
                    tOrP = self.p_view(rP)
                    corr = cute.make_rmem_tensor((2,), Float32)
                    for n in cutlass.range(n_lo + 1, n_hi, unroll=1):
                        acc_s2 = thr_qk.make_fragment_C(thr_qk.partition_shape_C((BM, BN)))
                        pipe_k.consumer_wait(st_k)
                        pipe_v.consumer_wait(st_v)
                        self.turn_wait(cwg)
                        warpgroup.fence()
                        self.issue_qk(qk_mma, qk_mma_acc, acc_s2, tSrQ, tSrK, st_k.index)
                        warpgroup.commit_group()
                        self.issue_pv(pv_mma, acc_o, tOrP, tOrV, st_v.index)
                        warpgroup.commit_group()
                        self.turn_pass(cwg)
                        warpgroup.wait_group(1)          # Q K_n^T done (groups retire in order)
                        pipe_k.consumer_release(st_k)
                        st_k.advance()
                        s2_mn = acc_mn_view(acc_s2)
                        self.prep_scores(s2_mn, c_mn, prescale, m_start, n * BN, seqlen_q, seqlen_k, win_left,
                                         win_right)
                        online_softmax_step(s2_mn, row_max, row_sum, corr, mult, self.skip)
                        warpgroup.wait_group(0)          # P_{n-1} V_{n-1} done: O and P registers free
                        pipe_v.consumer_release(st_v)
                        st_v.advance()
                        if cutlass.const_expr(self.vote):
                            rescale_rows_where_needed(o_mn, corr)
                        else:
                            rescale_rows(o_mn, corr)
                        rP.store(acc_s2.load().to(dt))
                    pipe_v.consumer_wait(st_v)
                    self.turn_wait(cwg)
                    warpgroup.fence()
                    self.issue_pv(pv_mma, acc_o, tOrP, tOrV, st_v.index)
                    warpgroup.commit_group()
                    if cutlass.const_expr(self.pingpong):
                        if cwg == 0:                    # warpgroup 1 waits for this last turn; its own is dropped
                            self.turn_bar(1).arrive()
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(st_v)
                    st_v.advance()

            # ---------------- epilogue: O / l and lse, row-predicated direct stores
            lse_r = cute.make_rmem_tensor((2,), Float32)
            online_softmax_finalize(o_mn, row_max, row_sum, lse_r)
            for r in cutlass.range_constexpr(2):
                row = m_start + oc_mn[r, 0][0]
                if row < seqlen_q:
                    for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                        gOh[q_off + row, oc_mn[r, c][1]] = dt(o_mn[r, c])
                    if ctid % 4 == 0:
                        gLh[q_off + row] = lse_r[r]

    # ------------------------------------------------------------------------------------------ pieces
    def turn_bar(self, c):
        """Named barrier on which consumer warpgroup c waits for its turn (c's 128 + the other's 128 threads)."""
        return pipeline.NamedBarrier(barrier_id=5 + c, num_threads=256)

    @cute.jit
    def turn_wait(self, cwg: Int32):
        if cutlass.const_expr(self.pingpong):
            if cwg == 0:
                self.turn_bar(0).arrive_and_wait()
            else:
                self.turn_bar(1).arrive_and_wait()

    @cute.jit
    def turn_pass(self, cwg: Int32):
        if cutlass.const_expr(self.pingpong):
            if cwg == 0:
                self.turn_bar(1).arrive()
            else:
                self.turn_bar(0).arrive()

    def issue_qk(self, qk_mma: cute.TiledMma, qk_mma_acc: cute.TiledMma, acc_s: cute.Tensor, tSrQ: cute.Tensor, tSrK: cute.Tensor, stage):
        for kb in range(cute.size(tSrQ, mode=[2])):
            cute.gemm(qk_mma if kb == 0 else qk_mma_acc, acc_s, tSrQ[None, None, kb], tSrK[None, None, kb, stage], acc_s)

    def issue_pv(self, pv_mma: cute.TiledMma, acc_o: cute.Tensor, tOrP: cute.Tensor, tOrV: cute.Tensor, stage):
        # (ACCUMULATE is set once before the mainloop: O starts at 0)
        for kb in range(cute.size(tOrP, mode=[2])):
            cute.gemm(pv_mma, acc_o, tOrP[None, None, kb], tOrV[None, None, kb, stage], acc_o)

    @cute.jit
    def prep_scores(self, s_mn, c_mn, prescale: Float32, m_start: Int32, n_start: Int32, seqlen_q: Int32,
                    seqlen_k: Int32, win_left: Int32, win_right: Int32):
        """S scaled first only when the scale is not folded (prescale != 1: ops.common.softmax.fold_factors), then
        -inf where invisible (only on blocks that can hold an invisible entry)."""
        prescale_scores(s_mn, prescale)
        if mask_lib.block_needs_mask(m_start, self.BM, n_start, self.BN, seqlen_q, seqlen_k, win_left, win_right,
                                     self.bounded):
            mask_lib.apply_mask(s_mn, c_mn, m_start, n_start, seqlen_q, seqlen_k, win_left, win_right,
                                self.bounded)

    def p_view(self, rP: cute.Tensor) -> cute.Tensor:
        return p_operand_view(rP, self.BN)

    def p_to_operand(self, acc_s: cute.Tensor):
        rP = cute.make_rmem_tensor(acc_s.layout, self.dtype)
        rP.store(acc_s.load().to(self.dtype))
        return self.p_view(rP)
