"""Flash-attention backward for sm90, pipelined variant (PADDLE_DSA_BWD_FAST=1 or 2, see bwd.py).

Same math, masks and numerics as backward_sm90.py: fp32 Delta = rowsum(O * dO) - dlse from the stored O,
P = exp2(min(S * scale * log2e - lse2, 0)) with lse2 = +inf for rows whose LSE is -inf (P = 0 there), masked
entries set to 0 (ops/common/mask.py semantics), P and dS rounded to the input dtype before the matmuls that
consume them, dK/dV summed over the query heads of a kv head (GQA), varlen segments, every output written.
The pre/postprocess kernels (a warp per row) and _zero_tail are backward_sm90.py's.

Schedule of ``_main_fast``:

- One CTA per (key block of 128, kv head, batch/segment), 3 warpgroups (384 threads):
  warpgroup 0 is the producer (registers lowered to 24); its warp 0 loads K and V of the block once (TMA) and
  then streams the (Q, dO) tiles (64 x D each) of every (query head, query block) the key block can see through
  a ``STAGES``-deep ring (PipelineTmaAsync: full = TMA transaction bytes, empty = 8 consumer warps).
- Warpgroups 1 and 2 (consumers, 240 registers) each own 64 of the 128 keys (their own dK, dV accumulators).
  Per stage, keys as the MMA rows (FA3 / FA4 call this SdP_swapAB): the groups [S^T = K_w Q^T], [dP^T = V_w dO^T];
  once S^T is done (dP^T still running) P^T is formed and, rounded, is the register A operand of [dV += P^T dO],
  issued at once; once dP^T is done dS^T = P^T (dP^T - Delta) is rounded, stored to shared memory (keys x queries,
  stmatrix; before the dK wgmma reading the same registers is issued: a pending wgmma's A registers are not
  touched) and [dK += dS^T Q] is issued from registers. After the tile's barrier, [dQ chunk 0] reads dS as an
  MN-major A; the stage is released once every group is retired.
- log2-LSE / Delta per query column: each consumer thread loads one value of the next tile (threads 0-63 log2-LSE,
  64-127 Delta) at the top of a tile and stores it to sStat[query, kind, tile parity, warpgroup] before the tile's
  last barrier; the tile after reads it there.
- dQ without per-element atomics: the fp32 dQ tile is staged in shared memory (SW128 swizzle) and added to the
  fp32 accumulator by a bulk tensor reduce (cp.reduce.async.bulk.tensor add.f32; one per 32-column box):
    mode 1 (dq_cols=False): each warpgroup computes its partial dQ_w = dS_w K_w (64 x D, in 64-column chunks
      to cap live registers) and reduces its own 64 x D tile;
    mode 2 (dq_cols=True, D = 128; D = 64 too in the ordered form): dQ = dS (64 x 128 keys) K, warpgroup w
      computes columns [w D / 2, (w + 1) D / 2) over all 128 keys and reduces that half: half the reduce traffic,
      two 256-thread named barriers per tile (both dS halves written before the dQ MMA; both dQ MMAs retired before
      dS is rewritten; DS_STAGES = 2 drops the second).
  Protocol per warpgroup: every writer fence_proxy(async.shared, cta) -> named barrier -> warp 0 issues the TMA
  reduce (from the whole converged warp: the atom elects its lane) and commits the bulk group; before the buffer
  is written again that warp waits (bulk_wait_group 0, read) ahead of a named barrier; it waits for full
  completion before the CTA exits. Rows of a tile past the segment end carry dS = 0 exactly (P = 0 there), so a
  tile overlapping the next varlen segment adds exact zeros to it; rows past the tensor end are clipped by TMA.
- Per-element masking only on tiles that need it (mask.block_needs_mask, plus rows past the segment end).

Ordered form (``ordered=True``; the deterministic mode when PADDLE_DSA_BWD_DET=ordered, bwd.py): the same kernel,
with every dQ tile's bulk reduces taken in a fixed order, so dQ is bitwise the same on every run (dK and dV are
per-CTA register sums, deterministic already, and bitwise equal to the non-deterministic kernel's):
  - key blocks run highest first (nb = grid_n - 1 - blockIdx.x), and the writers of dQ tile (segment, query head,
    query block m) go in descending key-block order, warpgroup 0 before warpgroup 1 in mode 1 (both add to the same
    columns), both together in mode 2 (disjoint column halves). A writer's turn is the number of writers before it
    (``_turns``: 2 (nb_last(m) - nb) + cwg in mode 1), counted on an int32 counter per dQ tile (the ``turn
    workspace`` [query head, slot], slot = segment + the block's first row // 64 counting rows over all segments
    (``_turn_slot0``: injective, and in bounds whatever max_seqlen_q says), zeroed by tile_order.clear_counters on
    the stream before the main kernel);
  - protocol (ops/common/tile_order.py): warp 0 of the warpgroup waits (lane 0 spins with ld.acquire.gpu, then
    syncwarp and fence.proxy.async.global) until the counter reaches its turn, then issues the reduce; at its next
    tile (TURN_PASS = 1: under that tile's dQ wgmmas; 0: at its reduce), or after its last tile, it waits for the
    full completion of that bulk group (wait_group 0, not .read), fences the async proxy and adds 1 with
    red.release.gpu. So a turn passes about one tile late: in a chain of
    key blocks that all start at query block 0 (no causal mask) at the same time, key block nb starts about
    (grid_n - 1 - nb) tiles late (twice that in mode 1, where warpgroup 1 trails warpgroup 0), once; CTAs of later
    waves start staggered anyway. Varlen caveat: the rows a segment's last dQ tile covers past its end get exact
    zeros added out of turn; x + 0 = x, but if the bulk add flushes a negative subnormal sum to -0 (as atom.add.f32
    does) such an add can turn it into +0: reruns could differ in the sign of a zero, never in a value;
  - deadlock freedom: a CTA waits only for CTAs of higher key blocks of its (kv head, segment), which have lower
    linear block indices and were dispatched before it (the hardware dispatches CTAs in that order; FlashAttention-3's
    deterministic backward relies on the same), and those never wait on it. The order also suits causal masks: key
    block nb + 1 reaches a shared query block two tiles before nb does, so the diagonal CTAs rarely wait at all.
    tests/compile/test_flash_bwd_ordered.py checks the turn rule and deadlock freedom on a model of the schedule
    (one resident CTA at a time included).
  Speed (H100 2026-12-07 10:24, B2 H16 S8K bf16, TFLOP/s non-causal / causal, with its tiles' dQ epilogue and turn
  wait under the next tile's S^T / dP^T, ORDERED_EARLY_SDP_DIMS): D 128 403 / 370 (the recompute kernel 302 / 277; the
  default form 507 / 458: 0.796x / 0.809x), D 64 253 / 241 (236 / 217; 0.76x / 0.71x), D 96 (mode 1) 251 / 279
  (recompute 279 / 263 at 07:40): bwd.py's "auto" takes this form at D 64 and 128.

Knobs (class attributes; timed by bench/ab_flash_bwd.py --knobs, tested with FLASH_BWD_KNOBS in
tests/gpu/test_flash_bwd.py and sanitize_bwd.py):
  - DQ_COLS_DIMS / ORDERED_DQ_COLS_DIMS: the head dims whose mode 2 is the column-split dQ, (128,) / (64, 128) (at
    D 64: 32 columns a warpgroup over all 128 keys, half the dQ reduce traffic; in the ordered form both
    warpgroups take one turn, halving the chain).
  - DS_STAGES = 2 (mode 2): dS double-buffered (+16 KiB), the tile's second 256-thread barrier dropped; None (the
    default): 2 in the ordered form, 1 otherwise.
  - TURN_PASS = 1 (ordered form, the default): a warpgroup waits for its previous reduce and passes that turn
    under the current tile's dQ wgmmas instead of at the current tile's reduce, so the next writer waits less.
  - STAGES: the (Q, dO) ring's depth (2; 3 fits too).
  - STAT_AHEAD_DIMS = (128,): a tile's column log2-LSE / Delta go from shared memory to registers before the wgmma
    waits that precede their use, not right before it. H100 2026-12-07 09:30: D 128 1.03x, ordered 1.01x; D 64
    causal 0.97x, so D 64 / 96 read them where used.
  - EARLY_SDP_DIMS / ORDERED_EARLY_SDP_DIMS = () / (64, 96, 128): at these head dims (one dQ chunk) a tile issues its
    [S^T], [dP^T] first and runs the previous tile's dQ epilogue under them (release of its stage, its column stat,
    the warpgroup barrier, the bulk reduce and, ordered, the wait for its turn); the last tile's after the loop. The
    previous tile's dQ registers go to shared memory just before the issue (read after it, ptxas puts a wgmma wait
    there, C7517), and no wgmma is in flight across the loop's back edge (issuing the next tile's S^T / dP^T at the
    end of a tile made ptxas serialize every wgmma, C7514). H100 2026-12-07 10:10: the ordered form 1.03-1.12x (its
    turn waits now under the wgmmas); the default form 0.75-1.05x (its stage is released a tile's S^T / dP^T later,
    and the 2-deep ring runs dry at D 96), so there it is off.
  - EARLY_RELEASE = 0 (trial): with early_sdp, 1 releases a tile's stage at its end instead. H100 10:30: the default
    form no longer runs dry at D 96 but gains nothing (D 128 0.93x); ordered D 96 1.06x, the rest within 2 %.
  - BM128_DIMS = (64,) (default since 2026-12-07; 0: the 64-row form): at D 64 the query tiles are 128 rows
    (``mode 3``). Why: a 64 x 64 x 16 SS wgmma (S^T, dP^T, dQ at bm 64) reads 4 KiB of shared memory in its 32
    tensor-core cycles, the 128 B/clk an SM's shared memory gives; at N = 128 S^T and dP^T read 6 KiB in 64 cycles, and
    a tile's fixed costs (barriers, the stage handoff, the dQ reduce's issue) are paid once for twice the work. What
    changes: S^T / dP^T are (64 keys x 128 queries) a warpgroup (64 accumulator registers each), always issued early
    (EARLY_SDP: without it ptxas spills 48-172 B); P^T and dS^T are both formed after both wgmmas are done and then
    [dV], [dK] issued (dV in flight while dS^T is formed spilled and serialized the wgmmas); dS is one (128 keys x 128
    queries) tile, keys first, so warpgroup w's dQ operand, query rows [64 w, 64 w + 64) over all 128 keys, is one
    contiguous block; each warpgroup computes and bulk-reduces that (64 x D) row half (mode 2's reduce traffic, N = D
    wgmmas; in the ordered form one turn for both warpgroups); each thread stages both column stats of one query.
    ptxas: no spills (both forms, dense and varlen), no wgmma serialization. H100 2026-12-07 14:32
    (perf/device_2026-12-07T1432_h100.txt; as the knob set BM128_DIMS=64,EARLY_SDP_DIMS=64, whose PTX the default now
    is byte for byte), B2 H16 S8K bf16 TFLOP/s non-causal / causal: 412.6 / 376.5 against 333.2 / 333.8 (1.24x /
    1.13x), ordered 302.8 / 321.3 against 254.2 / 240.0 (1.19x / 1.34x); dK, dV bitwise equal to the 64-row form's;
    test_flash_bwd -k "fast2 or ordered" 86 passed, sanitize_bwd memcheck 0 errors, racecheck no hazard in its D 64
    configurations (the run was cut by the call's limit before its summary, in a configuration of another kernel).
  - LPT_MB = 0 (trial, default form only): > 0 walks the grid by key block across the (segment, kv head) pairs of an L2
    section (ops.common.launch_order.lpt_tile), so a causal launch's longest CTAs start first. H100 2026-12-08 00:59
    (bench/ab_flash_bwd.py, B2 H16 S8K, dK / dV bitwise equal): LPT_MB 24 causal D 128 1.018x, D 64 1.044x, but D 64
    full 0.982x; LPT_MB 8 (one pair a section at D 128: the current order) 1.007-1.016x, within the run's noise (the
    ordered rows, which it does not touch, moved 0.985-1.007x). Not adopted; 24 is owed a rerun.
  The tables of these trials: docs/performance.md, 2026-12-07.

Status (2026-12-07, H100; no H200 has run this kernel since 2026-12-06): the swapped S / dP is the one form since the
trial of 07:20 (the earlier form, S = Q K_w^T with P stored for an SS dV, was deleted: 1.06-1.17x slower; PTX of the
kept kernels byte-identical before and after). The final defaults (e2b6916: the column stats ahead at D 128, the
ordered form's early S^T / dP^T) at 10:24 (perf/flash_early_2026-12-07T1022_h100.txt): test_flash_bwd 238 passed,
sanitize_bwd racecheck 0 hazards, memcheck 0 errors; B2 H16 S8K bf16 TFLOP/s non-causal / causal: D 128 507 / 458
(ordered 403 / 370), D 64 333 / 338 (ordered 253 / 241); since 14:32 D 64 runs 128-row query tiles (BM128_DIMS below:
413 / 377, ordered 303 / 321). ptxas: 168 registers at launch, consumers raised to 240 by
setmaxnreg; spills D 128 mode 2 60 B, ordered none, D 64 / 96 none; no wgmma serialization
(tests/compile/test_wgmma_serialization.py).
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync, warpgroup as wg, OperandMajorMode as Major
from cutlass.memory import SmemAllocator

from ..common import mask as mask_lib
from ..common import launch_order
from ..common import tile_order
from ..common.softmax import acc_mn_view, p_operand_view
from ..common.switches import dims_knob
from .backward_sm90 import FlashBwdSm90, LOG2E, _atom_d, _sdhb, _tma_part, _transpose

BLOCK_M_FAST = 64    # query rows per tile
BLOCK_N_FAST = 128   # key rows per CTA (64 per consumer warpgroup)
NTHREADS_FAST = 384  # producer warpgroup + 2 consumer warpgroups
STAGES = 2


def _t3(t):
    """(rows, cols, stages) -> (cols, rows, stages) view."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0, 2]))


class FlashBwdSm90Fast(FlashBwdSm90):
    """Pipelined backward for one static configuration (dtype, head_dim, varlen, dq_cols, ordered)."""

    # ordered form: where a warpgroup passes its turn on the previous tile's dQ counter. 0: at this tile's reduce
    # (the form of 2026-12-05); 1 (default since 2026-12-07): under this tile's dQ wgmmas, a tile's elementwise
    # part sooner
    TURN_PASS = 1
    # 2 (mode 2 only): dS double-buffered in shared memory (+16 KiB at D 128), so the second 256-thread barrier of a
    # tile (both warpgroups' dQ wgmmas done with dS before it is rewritten) goes: tile t + 2 rewrites buffer t % 2
    # only after the first barrier of tile t + 1, which both warpgroups reach with tile t's wgmmas retired.
    # None (default): 2 in the ordered form, 1 otherwise (the H100 trial of 2026-12-07; 1 or 2 forces both forms)
    DS_STAGES = None
    DQ_COLS_DIMS = (128,)            # head dims that take the column-split dQ (mode 2) when asked
    ORDERED_DQ_COLS_DIMS = (64, 128)  # the same for the ordered form (one turn for both warpgroups halves its chain)
    # the schedule knobs below: what each does and its H100 figures are in the module docstring ("Knobs")
    STAT_AHEAD_DIMS = (128,)                # column log2-LSE / Delta into registers before the wgmma waits
    EARLY_SDP_DIMS = ()                     # a tile's S^T / dP^T under the previous tile's dQ epilogue: default form
    ORDERED_EARLY_SDP_DIMS = (64, 96, 128)  # the same, ordered form (its turn waits under the wgmmas)
    EARLY_RELEASE = 0                       # with those: 1 releases a tile's stage at its end (trial knob)
    # head dims (64 only) whose query tiles are 128 rows: S^T / dP^T are 64 keys x 128 queries a warpgroup (N = 128
    # wgmmas, 96 B of shared memory a tensor-core cycle instead of 128), dQ split by rows (mode 3), the early S^T / dP^T
    # always (without it ptxas spills); default since 2026-12-07 (H100 14:32: 1.13-1.34x; "0" gives the 64-row form)
    BM128_DIMS = (64,)
    # depth of the (Q, dO) ring (knob: 3 fits in shared memory too; +2 % at D 128, -1.5 % causal, H100 2026-12-07)
    STAGES = STAGES
    # LPT_MB > 0 (trial; default form only, the ordered form keeps its order, which its deadlock freedom rests on):
    # the grid is walked by key block across the (segment, kv head) pairs of an L2 section, not per kv head, so a
    # causal launch's longest CTAs (key block 0 sees every query) all start first and its last ones are short; a
    # section holds about LPT_MB MiB of what its CTAs stream (Q, dO, the dQ accumulator, the column stats). CPU model of
    # greedy dispatch on 132 SMs, B 2 H 16 S 8K causal: 0.95 of the ideal per kv head, 1.00 in this order.
    # H100 2026-12-08: noise-level at 8, mixed at 24 (the docstring's Knobs), so off
    LPT_MB = 0
    SMEM_LIMIT = 232448  # bytes of shared memory a CTA may use on sm90

    def smem_bytes(self) -> int:
        """Shared memory _main_fast allocates (1024-byte aligned tiles, then the mbarriers), for the knob check."""
        D, bm, bn, bnw, dtb = self.D, self.bm, self.bn, self.bnw, self.dtype.width // 8
        ds2 = self.ds_stages == 2 and self.dq_shared
        tiles = [bm * D * 4 * (1 if self.dq_shared else 2), bn * D * dtb, bn * D * dtb, bm * D * dtb * self.stages,
                 bm * D * dtb * self.stages, bm * bnw * dtb * 2 * (2 if ds2 else 1)]
        total = sum(-(-t // 1024) * 1024 for t in tiles)
        return total + bm * 2 * 2 * 2 * 4 + 8 * (2 * self.stages + 1)   # + sStat, the mbarriers

    @classmethod
    def dq_cols_dims(cls, ordered: bool):
        """Head dims whose mode 2 is the column-split dQ (others fall back to mode 1), per form."""
        return dims_knob(cls.ORDERED_DQ_COLS_DIMS if ordered else cls.DQ_COLS_DIMS)

    def __init__(self, dtype, head_dim: int, varlen: bool, dq_cols: bool = False, ordered: bool = False):
        super().__init__(dtype, head_dim, varlen, bool(ordered))
        # ordered: the deterministic form (dQ tiles reduced in a fixed order of the key blocks, see the docstring)
        self.ordered = bool(ordered)
        # dq_cols (D in dq_cols_dims(ordered)): dQ = dS(64 x 128 keys) K, each consumer warpgroup computes D / 2 of
        # the D columns over all 128 keys and bulk-reduces its column half (half the reduce traffic of the
        # per-warpgroup partials), at the price of two 256-thread barriers per tile (both dS halves in smem; dS reuse).
        self.dq_cols = bool(dq_cols) and head_dim in self.dq_cols_dims(self.ordered)
        self.ds_stages = self.DS_STAGES if self.DS_STAGES is not None else (2 if self.ordered else 1)
        self.stat_ahead = head_dim in dims_knob(self.STAT_AHEAD_DIMS)
        self.bm = BLOCK_M_FAST
        if head_dim in dims_knob(self.BM128_DIMS):
            if head_dim != 64:
                raise ValueError(f"FlashBwdSm90Fast knob BM128_DIMS: 128-row query tiles only at head_dim 64 "
                                 f"(the S^T, dP^T, dK, dV accumulators of D {head_dim} do not fit in 240 registers)")
            self.bm = 128
        # mode 3 (bm = 128): dQ = dS (128 queries x 128 keys) K, warpgroup w computes query rows [64 w, 64 w + 64) over
        # all 128 keys and reduces its row half (the reduce traffic of mode 2, N = D wgmmas)
        self.dq_rows = self.bm == 128
        if self.dq_rows:
            self.dq_cols = False
        # both warpgroups read the whole dS tile and reduce disjoint parts of one dQ tile (modes 2 and 3)
        self.dq_shared = self.dq_cols or self.dq_rows
        self.bn = BLOCK_N_FAST
        self.bnw = BLOCK_N_FAST // 2
        self.stages = self.STAGES
        self.lpt_mb = 0 if self.ordered else int(self.LPT_MB)
        # dQ_w = dS_w K_w is computed in column chunks of 64 (2 for D = 128) to cap live accumulators; D = 96 in one
        # chunk of 96 (48 registers a thread, fewer than D = 128's dK + dV leave free)
        self.dqn = head_dim // 2 if self.dq_cols else (head_dim if head_dim <= 96 else 64)
        self.nsplit = 1 if self.dq_cols else head_dim // self.dqn
        early_dims = dims_knob(self.ORDERED_EARLY_SDP_DIMS if self.ordered else self.EARLY_SDP_DIMS)
        # bm 128: P^T and dS^T are both formed once S^T and dP^T are done, then [dV], [dK] issued (with dV in flight
        # while dS^T is formed, the fp32 P^T that dS^T reads, the rounded P^T, dP^T, dK and dV leave too few registers:
        # ptxas spilled and serialized the wgmmas)
        self.sdp_joint = self.bm == 128
        self.early_sdp = (head_dim in early_dims or self.bm == 128) and self.nsplit == 1
        # S^T tiles are (bnw keys, bm queries); the staged column stats: 2 bm values a tile, bm / 64 a thread
        assert self.bnw == 64 and self.bm in (64, 128)
        if self.smem_bytes() > self.SMEM_LIMIT:
            raise ValueError(f"FlashBwdSm90Fast knobs STAGES={self.STAGES}, DS_STAGES={self.ds_stages} need "
                             f"{self.smem_bytes()} bytes of shared memory at head_dim {head_dim} "
                             f"(dq_cols={self.dq_cols}); sm90 allows {self.SMEM_LIMIT}")

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
        bm, bn, bnw = self.bm, self.bn, self.bnw
        (q4, k4, v4, o4, do4), (dq4, dk4, dv4, dqacc4), (lse3, dlse3, lse23, delta3), \
            (B4, Sq4, Sk4, H, Hkv, qhead_per_kv) = self._views(mQ, mK, mV, mO, mdO, mLSE, mdLSE, mdQ, mdK, mdV,
                                                               mLSE2, mDelta, mdQacc)

        atom_d = _atom_d(D, dt)
        l_q = cute.tile_to_shape(atom_d, (bm, D, self.stages), order=(0, 1, 2))
        l_k = cute.tile_to_shape(atom_d, (bn, D), order=(0, 1))
        # dS^T tiles: keys x queries (queries contiguous), one (bnw, bm) tile a warpgroup
        l_p = cute.tile_to_shape(wg.make_smem_layout_atom(wg.SmemLayoutAtomKind.K_SW128, dt), (bnw, bm, 2),
                                 order=(0, 1, 2))
        atom_f = wg.make_smem_layout_atom(wg.SmemLayoutAtomKind.K_SW128, Float32)
        if cutlass.const_expr(self.dq_cols):
            l_dq = cute.tile_to_shape(atom_f, (bm, D), order=(0, 1))           # one tile, column halves per WG
            l_dq_tma = cute.tile_to_shape(atom_f, (bm, D // 2), order=(0, 1))
            dq_box = (bm, D // 2)
        elif cutlass.const_expr(self.dq_rows):
            l_dq = cute.tile_to_shape(atom_f, (64, D, 2), order=(0, 1, 2))     # the tile's row halves, one per WG
            l_dq_tma = cute.slice_(l_dq, (None, None, 0))
            dq_box = (64, D)
        else:
            l_dq = cute.tile_to_shape(atom_f, (bm, D, 2), order=(0, 1, 2))     # one tile per WG
            l_dq_tma = cute.slice_(l_dq, (None, None, 0))
            dq_box = (bm, D)

        # S^T = K_w Q^T: M = the warpgroup's bnw = 64 keys, N = the tile's bm queries
        mma_sdp = sm90.make_trivial_tiled_mma(dt, dt, Major.K, Major.K, Float32, (1, 1, 1),
                                              tiler_mn=(bnw, bm))
        # dS is stored keys x queries (queries contiguous), so dQ = dS K reads it as an MN-major A
        a_dq = Major.MN
        mma_dq = sm90.make_trivial_tiled_mma(dt, dt, a_dq, Major.MN, Float32, (1, 1, 1),
                                             tiler_mn=(64, self.dqn))
        # same MMAs fixed to overwrite (first k-block of S, dP, dQ): no register zeroing between wgmma groups
        mma_sdp_z = sm90.make_trivial_tiled_mma(dt, dt, Major.K, Major.K, Float32, (1, 1, 1),
                                                tiler_mn=(bnw, bm))
        mma_dq_z = sm90.make_trivial_tiled_mma(dt, dt, a_dq, Major.MN, Float32, (1, 1, 1),
                                               tiler_mn=(64, self.dqn))
        # dV += P^T dO, dK += dS^T Q with P^T, dS^T from registers (the S^T / dP^T accumulators, rounded)
        mma_dkv = sm90.make_trivial_tiled_mma(dt, dt, Major.K, Major.MN, Float32, (1, 1, 1), tiler_mn=(64, D),
                                              a_source=wg.OperandSource.RMEM)

        G2S = cpasync.CopyBulkTensorTileG2SOp
        l_q1 = cute.slice_(l_q, (None, None, 0))
        tma_q, gq = cpasync.make_tiled_tma_atom(G2S(), _sdhb(q4), l_q1, (bm, D))
        tma_do, gdo = cpasync.make_tiled_tma_atom(G2S(), _sdhb(do4), l_q1, (bm, D))
        tma_k, gk = cpasync.make_tiled_tma_atom(G2S(), _sdhb(k4), l_k, (bn, D))
        tma_v, gv = cpasync.make_tiled_tma_atom(G2S(), _sdhb(v4), l_k, (bn, D))
        tma_dq, gdq = cpasync.make_tiled_tma_atom(
            cpasync.CopyReduceBulkTensorTileS2GOp(cute.ReductionKind.ADD), _sdhb(dqacc4),
            l_dq_tma, dq_box)

        scale_log2 = scale * Float32(LOG2E)

        nrow_blk_q = (Sq4 + 127) // 128
        self._preprocess(o4, do4, lse3, dlse3, lse23, delta3, dqacc4, has_dlse).launch(
            grid=(nrow_blk_q, H, B4), block=(128, 1, 1), stream=stream)
        sem2 = None
        if cutlass.const_expr(self.ordered):
            # the flat counter buffer as [query head, slot] (slots: _turn_slot0)
            n_slots = mSem.shape[0] // H
            sem2 = cute.make_tensor(mSem.iterator, cute.make_layout((H, n_slots), stride=(n_slots, 1)))
            tile_order.clear_counters(mSem, mSem.shape[0], stream)

        self._main_fast(tma_q, gq, tma_do, gdo, tma_k, gk, tma_v, gv, tma_dq, gdq, lse23, delta3, dk4, dv4,
                        mCuQ, mCuK, sem2, Sq4, Sk4, qhead_per_kv, scale, scale_log2, win_left, win_right,
                        mma_sdp, mma_dkv, mma_dq, mma_sdp_z, mma_dq_z, l_q, l_k, l_p, l_dq).launch(
            grid=(grid_n, Hkv, nbatch), block=(NTHREADS_FAST, 1, 1), stream=stream, min_blocks_per_mp=1)

        self._launch_tail(dqacc4, dq4, dk4, dv4, mCuK, scale, (nrow_blk_q, H, B4), Sk4, Hkv, stream)

    # ------------------------------------------------------------ helpers
    @cute.jit
    def _wg_sync(self, cwg: Int32):
        """Named barrier of one consumer warpgroup (ids 1, 2; id 0 is __syncthreads)."""
        if cwg == 0:
            cute.arch.barrier(barrier_id=1, number_of_threads=128)
        else:
            cute.arch.barrier(barrier_id=2, number_of_threads=128)

    @cute.jit
    def _turns(self, nb, off, slen_q, slen_k, win_right):
        """Ordered mode, once per CTA: (a, c) such that the turn of this CTA's warpgroup on dQ tile (hq, m) is
        2 min(a, (m bm + c) // bn) (+ cwg, see _main_fast).
        Why: the writers of dQ tile m are the key blocks nb_last(m), nb_last(m) - 1, ... that see query block m (a
        contiguous range, since both ends of a key block's query-block range grow with it), two per key block (the
        warpgroups). nb_last(m) = the largest nb with nb bn < slen_k whose first query block
        max(nb bn - off - right, 0) // bm is <= m, i.e. min((slen_k - 1) // bn, ((m + 1) bm + off + right - 1) // bn);
        this CTA's turn counts the writers before it: 2 (nb_last(m) - nb). So a = (slen_k - 1) // bn - nb and
        c = bm + off + right - 1 - nb bn (m bm + c >= 0 on every tile this CTA writes). ``right`` is capped at
        slen_q + slen_k: that changes no nb_last and keeps the sums in int32. The key blocks also stop at the grid
        (grid_n - 1): a max_seqlen_k below a segment's keys then gives wrong gradients as in the other modes (the
        caller's contract), never a wait for a CTA that was not launched."""
        bm, bn = self.bm, self.bn
        grid_n, _, _ = cute.arch.grid_dim()
        right = cutlass.min(win_right, slen_q + slen_k)
        a = cutlass.min((slen_k - 1) // bn, grid_n - 1) - nb
        c = bm + off + right - 1 - nb * bn
        return a, c

    @cute.jit
    def _turn_slot0(self, b, off_q, Sq):
        """Ordered mode: the counter slot of query block 0 of segment / batch b; block m's is slot0 + m. Slots are
        b + (first row of the block) // 64 with rows counted over all segments end to end (varlen: off_q; dense:
        b Sq): strictly increasing in (b, m), since a segment's first block starts at or after the previous
        segment's last one, so every dQ tile has its own counter, and the buffer needs batch + ceil(rows / 64)
        slots a head whatever max_seqlen_q says (bwd.py allocates it). A slot past the buffer (only if cu_seqlens_q
        runs past the query rows, a broken input) is never touched: its tile's writers skip their turns."""
        row0 = off_q
        if cutlass.const_expr(not self.varlen):
            row0 = b * Sq
        return b + row0 // self.bm

    @cute.jit
    def _turn_ptr(self, mSem: cute.Tensor, hq, slot):
        """Ordered mode: the counter of query head hq, slot slot."""
        return mSem.iterator + cute.crd2idx((hq, slot), mSem.layout)

    def _pair_sync(self):
        """Named barrier of both consumer warpgroups (256 threads, id 3)."""
        cute.arch.barrier(barrier_id=3, number_of_threads=256)

    @staticmethod
    def _query_bounds(i, off, win_left, win_right, slen_q, slen_k):
        """Query i's visible keys [lo, hi] (window and segment end) and whether i is a row of the segment."""
        return i + off - win_left, cutlass.min(i + off + win_right, slen_k - 1), i < slen_q

    @staticmethod
    def _p_of(s, lse2, scale_log2, mask=None):
        """P = exp2(min(S scale log2e - lse2, 0)); mask (query ok, key j, lo, hi): 0 unless ok and lo <= j <= hi."""
        p = cute.math.exp2(cutlass.min(s * scale_log2 - lse2, Float32(0.0)), fastmath=True)
        if mask is None:
            return p
        q_ok, j, lo, hi = mask
        return cutlass.select_(q_ok & (j >= lo) & (j <= hi), p, Float32(0.0))

    @cute.jit
    def _col_stat(self, mLSE2: cute.Tensor, mDelta: cute.Tensor, bb, hq, off_q, row, slen_q, kind):
        """Query row `row`'s log2-LSE (kind 0) or Delta (kind 1); +inf / 0 past the segment's end (P = 0,
        dS = 0 there), as _row_stats."""
        v = Float32(0.0)
        if kind == 0:
            v = Float32.inf
        if row < slen_q:
            if kind == 0:
                v = mLSE2[bb, hq, off_q + row]
            else:
                v = mDelta[bb, hq, off_q + row]
        return v

    @cute.jit
    def _p_swap(self, s_mn: cute.Tensor, c_mn: cute.Tensor, sL: cute.Tensor, i0, j0, slen_q, slen_k, off,
                win_left, win_right, scale_log2, need_mask, rL=None):
        """s_mn (a thread's rows = keys x cols = queries view of S^T) <- P^T, with the column's log2-LSE from shared
        memory (or from rL, _col_regs' copy); masks only when need_mask (mask.py's semantics; queries past the
        segment's end give P = 0)."""
        if need_mask:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                qi = c_mn[0, c][1]
                lse2 = rL[c] if cutlass.const_expr(rL is not None) else sL[qi]
                lo, hi, col_ok = self._query_bounds(i0 + qi, off, win_left, win_right, slen_q, slen_k)
                for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                    j = j0 + c_mn[r, c][0]
                    s_mn[r, c] = self._p_of(s_mn[r, c], lse2, scale_log2, (col_ok, j, lo, hi))
        else:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                lse2 = rL[c] if cutlass.const_expr(rL is not None) else sL[c_mn[0, c][1]]
                for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                    s_mn[r, c] = self._p_of(s_mn[r, c], lse2, scale_log2)

    @cute.jit
    def _col_regs(self, c_mn: cute.Tensor, sX: cute.Tensor):
        """STAT_AHEAD_DIMS: this thread's columns' values of sX (log2-LSE or Delta) copied to registers."""
        r = cute.make_rmem_tensor((cute.size(c_mn, mode=[1]),), Float32)
        for c in cutlass.range_constexpr(cute.size(c_mn, mode=[1])):
            r[c] = sX[c_mn[0, c][1]]
        return r

    @cute.jit
    def _ds_swap(self, p_mn: cute.Tensor, dp_mn: cute.Tensor, c_mn: cute.Tensor, sD: cute.Tensor, rD=None):
        """dp_mn <- dS^T = P^T (dP^T - Delta) with the column's Delta from shared memory (or rD, _col_regs')."""
        for c in cutlass.range_constexpr(cute.size(p_mn, mode=[1])):
            dl = rD[c] if cutlass.const_expr(rD is not None) else sD[c_mn[0, c][1]]
            for r in cutlass.range_constexpr(cute.size(p_mn, mode=[0])):
                dp_mn[r, c] = p_mn[r, c] * (dp_mn[r, c] - dl)

    @cute.jit
    def _sdp_issue(self, mma_sdp: cute.TiledMma, mma_sdp_z: cute.TiledMma, acc_S: cute.Tensor, acc_dP: cute.Tensor,
                   tSrK: cute.Tensor, tSrQ: cute.Tensor, tPrV: cute.Tensor, tPrdO: cute.Tensor, stage):
        """Groups [S^T = K_w Q^T], [dP^T = V_w dO^T] of the (Q, dO) tile in ring stage `stage` (full)."""
        wg.fence()
        for kb in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
            cute.gemm(mma_sdp_z if kb == 0 else mma_sdp, acc_S, tSrK[None, None, kb], tSrQ[None, None, kb, stage],
                      acc_S)
        wg.commit_group()
        for kb in cutlass.range_constexpr(cute.size(tPrV, mode=[2])):
            cute.gemm(mma_sdp_z if kb == 0 else mma_sdp, acc_dP, tPrV[None, None, kb],
                      tPrdO[None, None, kb, stage], acc_dP)
        wg.commit_group()

    @cute.jit
    def _dkv_issue(self, mma_dkv: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, stage):
        """Group [acc += A B]: dV += P^T dO or dK += dS^T Q, A the rounded accumulator in registers."""
        for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            cute.gemm(mma_dkv, acc, tA[None, None, kb], tB[None, None, kb, stage], acc)
        wg.commit_group()

    @cute.jit
    def _sdp_swap(self, mma_sdp: cute.TiledMma, mma_sdp_z: cute.TiledMma, mma_dkv: cute.TiledMma,
                  acc_S: cute.Tensor, acc_dP: cute.Tensor, acc_dV: cute.Tensor, acc_dK: cute.Tensor,
                  rP: cute.Tensor, rdS: cute.Tensor, tSrK: cute.Tensor, tSrQ: cute.Tensor, tPrV: cute.Tensor,
                  tPrdO: cute.Tensor, tVrPt: cute.Tensor, tVrdOt: cute.Tensor, tKrdSt: cute.Tensor,
                  tKrQt: cute.Tensor, stage, c_mn: cute.Tensor, sL: cute.Tensor, sD: cute.Tensor, i0, j0, slen_q,
                  slen_k, off, win_left, win_right, scale_log2, need_mask, r2s, thr_r2s, tPsdS: cute.Tensor,
                  issued: cutlass.Constexpr = False):
        """One tile of a consumer warpgroup up to the dS store (the stage is full): groups [S^T], [dP^T],
        then [dV += P^T dO] once P^T is formed (dP^T still running), then the rounded dS^T is stored to shared memory
        (tPsdS, for dQ; before the dK wgmma that reads the same registers is issued: a pending wgmma's A registers
        are not touched, not even read) and [dK += dS^T Q] issued. dV and dK stay in flight (rP / rdS are not
        written again before the tile's wait_group(0)). issued: [S^T], [dP^T] were issued already (EARLY_SDP) and
        are the only groups in flight."""
        dt = self.dtype
        if cutlass.const_expr(not issued):
            self._sdp_issue(mma_sdp, mma_sdp_z, acc_S, acc_dP, tSrK, tSrQ, tPrV, tPrdO, stage)
        rL = None
        if cutlass.const_expr(self.stat_ahead):
            rL = self._col_regs(c_mn, sL)   # the shared-memory reads under the S^T / dP^T wgmmas, not after them
        if cutlass.const_expr(self.sdp_joint):
            wg.wait_group(0)
            self._p_swap(acc_mn_view(acc_S), c_mn, sL, i0, j0, slen_q, slen_k, off, win_left, win_right, scale_log2,
                         need_mask, rL)
            self._ds_swap(acc_mn_view(acc_S), acc_mn_view(acc_dP), c_mn, sD, None)
            rP.store(acc_S.load().to(dt))
            rdS.store(acc_dP.load().to(dt))
            wg.fence()
            self._dkv_issue(mma_dkv, acc_dV, tVrPt, tVrdOt, stage)
            self._store_tile(r2s, thr_r2s, rdS, tPsdS)
            wg.fence()
            self._dkv_issue(mma_dkv, acc_dK, tKrdSt, tKrQt, stage)
        else:
            wg.wait_group(1)
            self._p_swap(acc_mn_view(acc_S), c_mn, sL, i0, j0, slen_q, slen_k, off, win_left, win_right, scale_log2,
                         need_mask, rL)
            rP.store(acc_S.load().to(dt))
            wg.fence()
            self._dkv_issue(mma_dkv, acc_dV, tVrPt, tVrdOt, stage)
            rD = None
            if cutlass.const_expr(self.stat_ahead):
                rD = self._col_regs(c_mn, sD)
            wg.wait_group(1)
            self._ds_swap(acc_mn_view(acc_S), acc_mn_view(acc_dP), c_mn, sD, rD)
            rdS.store(acc_dP.load().to(dt))
            self._store_tile(r2s, thr_r2s, rdS, tPsdS)
            wg.fence()
            self._dkv_issue(mma_dkv, acc_dK, tKrdSt, tKrQt, stage)

    @cute.jit
    def _dq_out(self, t, hq_t, m_t, stat_n, stat_n2, sStat: cute.Tensor, srow, skind, cwg, wwarp, off_q,
                gdq: cute.Tensor, bb,
                tma_dq: cute.CopyAtom, sdQw: cute.Tensor, mSem, slot0, m_min, nm, hq0, turn_a, turn_c):
        """After tile t's dQ is in sdQw and its stage released: the next tile's column value staged (sStat, parity
        t + 1), the warpgroup's barrier, then warp 0 bulk-reduces the tile into dQ (hq_t, m_t) (the ordered form: in
        its turn, after passing tile t - 1's turn when TURN_PASS = 0)."""
        bm, bn, D = self.bm, self.bn, self.D
        sStat[srow, skind, (t + 1) % 2, cwg] = stat_n   # read after the barrier below
        if cutlass.const_expr(self.bm == 128):
            sStat[srow, 1, (t + 1) % 2, cwg] = stat_n2
        cute.arch.fence_proxy("async.shared", space="cta")
        self._wg_sync(cwg)
        if wwarp == 0:
            if cutlass.const_expr(self.dq_cols):
                gdQ_t = cute.local_tile(cute.domain_offset((off_q, 0), gdq[None, None, hq_t, bb]), (bm, D // 2),
                                        (m_t, cwg))
            elif cutlass.const_expr(self.dq_rows):
                gdQ_t = cute.local_tile(cute.domain_offset((off_q, 0), gdq[None, None, hq_t, bb]), (64, D),
                                        (m_t * (bm // 64) + cwg, 0))
            else:
                gdQ_t = cute.local_tile(cute.domain_offset((off_q, 0), gdq[None, None, hq_t, bb]), (bm, D), (m_t, 0))
            tsdQ, tgdQ = _tma_part(tma_dq, sdQw, gdQ_t)
            if cutlass.const_expr(self.ordered):
                if cutlass.const_expr(self.TURN_PASS == 0):
                    if t > 0:
                        # the previous tile's reduce has fully completed (not only read its source): its turn passes
                        # to the next writer of that dQ tile
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                        prev = slot0 + m_min + (t - 1) % nm
                        if prev < mSem.shape[1]:
                            tile_order.pass_turn(self._turn_ptr(mSem, hq0 + (t - 1) // nm, prev))
                turn = 2 * cutlass.min(turn_a, (m_t * bm + turn_c) // bn)
                if cutlass.const_expr(not self.dq_shared):
                    turn = turn + cwg   # both warpgroups add to the same columns: warpgroup 0 first
                if slot0 + m_t < mSem.shape[1]:
                    tile_order.wait_turn(self._turn_ptr(mSem, hq_t, slot0 + m_t), turn)
            cute.copy(tma_dq, tsdQ, tgdQ)
            cute.arch.cp_async_bulk_commit_group()

    # --------------------------------------------------------------- main
    @cute.jit
    def lpt_tile(self, bx: Int32, by: Int32, bz: Int32, rows_q: Int32, qhead_per_kv: Int32):
        """(key block, kv head, segment) of the CTA at linear launch position bx + grid_n (by + Hkv bz), in LPT order
        (ops.common.launch_order): pairs p = by + Hkv bz, sections of max(1, LPT_MB MiB / the bytes one pair streams:
        its query heads' Q, dO (16-bit), dQ accumulator (fp32) and two column stats over the segment's rows, rows_q /
        segments for varlen); rank 0 = key block 0, the longest under a causal mask."""
        grid_n, n_kv, gz = cute.arch.grid_dim()
        rows = rows_q
        if cutlass.const_expr(self.varlen):
            rows = rows_q // cutlass.max(gz, 1)
        budget_rows = (self.lpt_mb << 20) // (self.D * (2 * self.dtype.width // 8 + 4) + 8)   # compile time
        sec = cutlass.max(Int32(budget_rows) // cutlass.max(rows * qhead_per_kv, 1), 1)
        rank, p = launch_order.lpt_tile(bx + grid_n * (by + n_kv * bz), grid_n, n_kv * gz, sec)
        return rank, p % n_kv, p // n_kv

    @cute.kernel
    def _main_fast(self, tma_q: cute.CopyAtom, gq: cute.Tensor, tma_do: cute.CopyAtom, gdo: cute.Tensor,
                   tma_k: cute.CopyAtom, gk: cute.Tensor, tma_v: cute.CopyAtom, gv: cute.Tensor,
                   tma_dq: cute.CopyAtom, gdq: cute.Tensor,
                   mLSE2: cute.Tensor, mDelta: cute.Tensor,
                   mdK: cute.Tensor, mdV: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, mSem: cute.Tensor,
                   Sq, Sk, qhead_per_kv, scale: Float32, scale_log2: Float32,
                   win_left: Int32, win_right: Int32,
                   mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma,
                   mma_sdp_z: cute.TiledMma, mma_dq_z: cute.TiledMma,
                   l_q: cute.ComposedLayout, l_k: cute.ComposedLayout, l_p: cute.ComposedLayout,
                   l_dq: cute.ComposedLayout):
        dt = self.dtype
        D = self.D
        bm, bn, bnw = self.bm, self.bn, self.bnw
        dqn, nsplit = self.dqn, self.nsplit
        stages = self.stages
        tid, _, _ = cute.arch.thread_idx()
        nb, hkv, b = cute.arch.block_idx()
        if cutlass.const_expr(self.lpt_mb > 0):
            nb, hkv, b = self.lpt_tile(nb, hkv, b, Sq, qhead_per_kv)
        if cutlass.const_expr(self.ordered):
            # the highest key block first: a CTA only waits for CTAs of higher key blocks, dispatched before it
            grid_n, _, _ = cute.arch.grid_dim()
            nb = grid_n - 1 - nb
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wgi = warp // 4

        smem = SmemAllocator()
        sdQ = smem.allocate_tensor(Float32, l_dq.outer, 1024, l_dq.inner)
        sK = smem.allocate_tensor(dt, l_k.outer, 1024, l_k.inner)
        sV = smem.allocate_tensor(dt, l_k.outer, 1024, l_k.inner)
        sQ = smem.allocate_tensor(dt, l_q.outer, 1024, l_q.inner)
        sdO = smem.allocate_tensor(dt, l_q.outer, 1024, l_q.inner)
        # per consumer warpgroup, two tiles' columns: [query of the tile, log2-LSE / Delta, tile parity, warpgroup]
        sStat = smem.allocate_tensor(Float32, cute.make_layout((bm, 2, 2, 2)), 16)
        ds2 = self.ds_stages == 2 and self.dq_shared   # dS double-buffered: a trailing stage mode on every dS view
        atom_ds = wg.make_smem_layout_atom(wg.SmemLayoutAtomKind.K_SW128, dt)
        if cutlass.const_expr(self.dq_rows):
            # mode 3: the whole (bn keys, bm queries) dS^T tile, keys first: query columns [64 w, 64 w + 64) of all
            # bn keys (warpgroup w's dQ A operand) are one contiguous 64-query block; a warpgroup's keys are a slab
            l_dsr = cute.tile_to_shape(atom_ds, (bn, bm, 2) if ds2 else (bn, bm), order=(0, 1, 2) if ds2 else (0, 1))
            sdS = smem.allocate_tensor(dt, l_dsr.outer, 1024, l_dsr.inner)
        elif cutlass.const_expr(ds2):
            l_ds4 = cute.tile_to_shape(atom_ds, (bnw, bm, 2, 2), order=(0, 1, 2, 3))
            sdS = smem.allocate_tensor(dt, l_ds4.outer, 1024, l_ds4.inner)
        else:
            sdS = smem.allocate_tensor(dt, l_p.outer, 1024, l_p.inner)
        bars = smem.allocate_array(Int64, 2 * stages + 1, byte_alignment=8)
        bar_kv = bars + 2 * stages

        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=bars, num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 8),
            tx_count=2 * bm * D * (dt.width // 8), defer_sync=True)
        if tid == 0:
            cute.arch.mbarrier_init(bar_kv, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        bb, off_q, slen_q = self._seg(mCuQ, b, Sq)
        _, off_k, slen_k = self._seg(mCuK, b, Sk)
        n0 = nb * bn

        if n0 < slen_k:
            off = slen_k - slen_q
            # query rows that can see some key of [n0, n0 + bn)
            i_lo = cutlass.max(n0 - off - win_right, Int32(0))
            i_hi = cutlass.min(n0 + bn - 1 - off + win_left, slen_q - 1)
            m_min = i_lo // bm
            m_max = (cutlass.max(i_hi + 1, Int32(0)) + bm - 1) // bm
            nm = cutlass.max(m_max - m_min, Int32(0))
            n_iter = nm * qhead_per_kv

            if wgi == 0:
                # ------------------------------------------------ producer
                cute.arch.setmaxregister_decrease(24)
                if warp == 0:
                    cpasync.prefetch_descriptor(tma_q)
                    cpasync.prefetch_descriptor(tma_do)
                    gK_t = cute.local_tile(cute.domain_offset((off_k, 0), gk[None, None, hkv, bb]), (bn, D), (nb, 0))
                    gV_t = cute.local_tile(cute.domain_offset((off_k, 0), gv[None, None, hkv, bb]), (bn, D), (nb, 0))
                    tsK, tgK = _tma_part(tma_k, sK, gK_t)
                    tsV, tgV = _tma_part(tma_v, sV, gV_t)
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(bar_kv, 2 * bn * D * (dt.width // 8))
                    cute.copy(tma_k, tgK, tsK, tma_bar_ptr=bar_kv)
                    cute.copy(tma_v, tgV, tsV, tma_bar_ptr=bar_kv)
                    st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, stages)
                    for it in cutlass.range(n_iter, unroll=1):
                        hq = hkv * qhead_per_kv + it // nm
                        m = m_min + it % nm
                        gQ_t = cute.local_tile(cute.domain_offset((off_q, 0), gq[None, None, hq, bb]), (bm, D), (m, 0))
                        gdO_t = cute.local_tile(cute.domain_offset((off_q, 0), gdo[None, None, hq, bb]), (bm, D),
                                                (m, 0))
                        tsQ, tgQ = _tma_part(tma_q, sQ, gQ_t)
                        tsdO, tgdO = _tma_part(tma_do, sdO, gdO_t)
                        pipe.producer_acquire(st)
                        cute.copy(tma_q, tgQ, tsQ[None, st.index], tma_bar_ptr=pipe.producer_get_barrier(st))
                        cute.copy(tma_do, tgdO, tsdO[None, st.index], tma_bar_ptr=pipe.producer_get_barrier(st))
                        st.advance()
            else:
                # ------------------------------------------------ consumers
                cute.arch.setmaxregister_increase(240)
                cwg = wgi - 1
                ctid = tid - 128 * wgi
                wwarp = warp % 4
                jw0 = n0 + cwg * bnw  # first key of this warpgroup

                sKw = cute.local_tile(sK, (bnw, D), (cwg, 0))
                sVw = cute.local_tile(sV, (bnw, D), (cwg, 0))
                if cutlass.const_expr(self.dq_rows):
                    sdSw = cute.local_tile(sdS, (bnw, bm, 2) if ds2 else (bnw, bm), (cwg, 0, 0) if ds2 else (cwg, 0))
                    sdS_all = _t3(sdS) if ds2 else _transpose(sdS)     # (bm queries, bn keys[, stage])
                    sdQw = sdQ[None, None, cwg]
                elif cutlass.const_expr(ds2):
                    sdSw = sdS[None, None, cwg, None]
                else:
                    sdSw = sdS[None, None, cwg]
                if cutlass.const_expr(self.dq_cols):
                    sdQw = cute.local_tile(sdQ, (bm, D // 2), (0, cwg))
                    # the whole dS tile: the two (64 keys, 64 queries) halves as one (128 keys, 64 queries) tile,
                    # seen transposed
                    ds_shape = (bn, bm)
                    l_ds = cute.tile_to_shape(wg.make_smem_layout_atom(wg.SmemLayoutAtomKind.K_SW128, dt),
                                              (*ds_shape, 2) if ds2 else ds_shape, order=(0, 1, 2) if ds2 else (0, 1))
                    sdS_all = cute.make_tensor(sdS.iterator, l_ds.outer)
                    sdS_all = _t3(sdS_all) if ds2 else _transpose(sdS_all)
                elif cutlass.const_expr(not self.dq_rows):
                    sdQw = sdQ[None, None, cwg]

                thr_sdp = mma_sdp.get_slice(ctid)
                thr_dkv = mma_dkv.get_slice(ctid)
                thr_dq = mma_dq.get_slice(ctid)
                def frags_ab(a, b):   # (A, B) register fragments of the S / dP MMA over shared-memory tiles a, b
                    fa = mma_sdp.make_fragment_A(thr_sdp.partition_A(a))
                    return fa, mma_sdp.make_fragment_B(thr_sdp.partition_B(b))

                # S^T = K_w Q^T, dP^T = V_w dO^T: the key block is A, the staged (Q, dO) tile B
                tSrK, tSrQ = frags_ab(sKw, sQ)
                tPrV, tPrdO = frags_ab(sVw, sdO)
                tVrdOt = mma_dkv.make_fragment_B(thr_dkv.partition_B(_t3(sdO)))
                tKrQt = mma_dkv.make_fragment_B(thr_dkv.partition_B(_t3(sQ)))
                if cutlass.const_expr(self.dq_rows):
                    # this warpgroup's 64 query rows of dS over all bn keys, times K^T (all D columns)
                    tQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(
                        cute.local_tile(sdS_all, (64, bn, 2) if ds2 else (64, bn), (cwg, 0, 0) if ds2 else (cwg, 0))))
                    tQrKt = [mma_dq.make_fragment_B(thr_dq.partition_B(_transpose(sK)))]
                elif cutlass.const_expr(self.dq_cols):
                    tQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(sdS_all))
                    tQrKt = [mma_dq.make_fragment_B(thr_dq.partition_B(
                        cute.local_tile(_transpose(sK), (dqn, bn), (cwg, 0))))]
                else:
                    tQrdS = mma_dq.make_fragment_A(thr_dq.partition_A(_transpose(sdSw)))
                    sKwt = _transpose(sKw)
                    tQrKt = [mma_dq.make_fragment_B(thr_dq.partition_B(cute.local_tile(sKwt, (dqn, bnw), (h, 0))))
                             for h in range(nsplit)]
                qrows = 64 if self.dq_rows else bm   # dQ rows a warpgroup computes
                tQsdQ = [thr_dq.partition_C(cute.local_tile(sdQw, (qrows, dqn), (0, h))) for h in range(nsplit)]

                # S^T coordinates: (key of the warpgroup's bnw, query of the tile's bm)
                tScS = thr_sdp.partition_C(cute.make_identity_tensor((bnw, bm)))
                tKVc = thr_dkv.partition_C(cute.make_identity_tensor((bnw, D)))
                r2s, thr_r2s, (tPsdS,) = self._tile_store(mma_sdp, ctid, (sdSw,), True)
                c_mn = acc_mn_view(tScS)

                acc_S = cute.make_rmem_tensor(tScS.shape, Float32)
                acc_dP = cute.make_rmem_tensor(tScS.shape, Float32)
                acc_dK = cute.make_rmem_tensor(tKVc.shape, Float32)
                acc_dV = cute.make_rmem_tensor(tKVc.shape, Float32)
                acc_dQ = cute.make_rmem_tensor(tQsdQ[0].shape, Float32)
                rP = cute.make_rmem_tensor(tScS.shape, dt)
                rdS = cute.make_rmem_tensor(tScS.shape, dt)
                # the rounded P^T, dS^T accumulators as the A operand of dV / dK (K = the tile's bm queries)
                tVrPt = p_operand_view(rP, bm)
                tKrdSt = p_operand_view(rdS, bm)
                acc_dK.fill(0.0)
                acc_dV.fill(0.0)
                mma_sdp.set(wg.Field.ACCUMULATE, True)
                mma_dkv.set(wg.Field.ACCUMULATE, True)
                mma_dq.set(wg.Field.ACCUMULATE, True)
                mma_sdp_z.set(wg.Field.ACCUMULATE, False)
                mma_dq_z.set(wg.Field.ACCUMULATE, False)

                if cutlass.const_expr(self.ordered):
                    turn_a, turn_c = self._turns(nb, off, slen_q, slen_k, win_right)
                    slot0 = self._turn_slot0(b, off_q, Sq)
                # each thread stages bm / 64 values of a tile's bm query columns: bm 64: threads 0-63 log2-LSE,
                # 64-127 Delta; bm 128: thread t both of query t
                srow = ctid % bm
                skind = ctid // bm
                sStat[srow, skind, 0, cwg] = self._col_stat(mLSE2, mDelta, bb, hkv * qhead_per_kv, off_q,
                                                            m_min * bm + srow, slen_q, skind)
                if cutlass.const_expr(bm == 128):
                    sStat[srow, 1, 0, cwg] = self._col_stat(mLSE2, mDelta, bb, hkv * qhead_per_kv, off_q,
                                                            m_min * bm + srow, slen_q, 1)
                self._wg_sync(cwg)
                cute.arch.mbarrier_wait(bar_kv, 0)
                if cutlass.const_expr(not self.ordered):
                    slot0, turn_a, turn_c = None, None, None    # the ordered form's (_dq_out's arguments)
                st = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
                if cutlass.const_expr(self.early_sdp):
                    # the previous tile's stage, query head and block and the column value staged after it
                    sp = st.clone()
                    p_hq, p_m, p_stat, p_stat2 = Int32(0), Int32(0), Float32(0.0), Float32(0.0)
                for it in cutlass.range(n_iter, unroll=1):
                    hq = hkv * qhead_per_kv + it // nm
                    m = m_min + it % nm
                    i0 = m * bm
                    if cutlass.const_expr(ds2):
                        dsb = it % 2      # this tile's dS buffer
                        tPsdS_c = tPsdS[None, None, None, dsb]
                        tQrdS_c = tQrdS[None, None, None, dsb]
                    else:
                        tPsdS_c, tQrdS_c = tPsdS, tQrdS
                    # the next tile's column value, loaded now, staged before this tile's last barrier
                    nxt_stat = Float32(0.0)
                    nxt_stat2 = Float32(0.0)   # bm 128: the Delta of query srow
                    if it + 1 < n_iter:
                        nxt_stat = self._col_stat(mLSE2, mDelta, bb, hkv * qhead_per_kv + (it + 1) // nm, off_q,
                                                  (m_min + (it + 1) % nm) * bm + srow, slen_q, skind)
                        if cutlass.const_expr(bm == 128):
                            nxt_stat2 = self._col_stat(mLSE2, mDelta, bb, hkv * qhead_per_kv + (it + 1) // nm, off_q,
                                                       (m_min + (it + 1) % nm) * bm + srow, slen_q, 1)
                    sL = sStat[None, 0, it % 2, cwg]
                    sD = sStat[None, 1, it % 2, cwg]
                    need_mask = mask_lib.block_needs_mask(i0, bm, jw0, bnw, slen_q, slen_k, win_left, win_right,
                                                          True)
                    need_mask = need_mask or (i0 + bm > slen_q)

                    pipe.consumer_wait(st)
                    if cutlass.const_expr(self.early_sdp):
                        # the previous tile's dQ to shared memory, this tile's [S^T], [dP^T], then the rest of the
                        # previous tile's dQ epilogue under them (the dQ registers are read before the issue: ptxas
                        # puts a wgmma wait before a read of wgmma-defined registers that follows it, C7517)
                        if it > 0:
                            cute.autovec_copy(acc_dQ, tQsdQ[0])
                        self._sdp_issue(mma_sdp, mma_sdp_z, acc_S, acc_dP, tSrK, tSrQ, tPrV, tPrdO, st.index)
                        if it > 0:
                            if cutlass.const_expr(self.dq_shared and not ds2):
                                self._pair_sync()  # both warpgroups' dQ MMAs are done with the last dS tile
                            if cutlass.const_expr(self.EARLY_RELEASE == 0):
                                pipe.consumer_release(sp)
                            self._dq_out(it - 1, p_hq, p_m, p_stat, p_stat2, sStat, srow, skind, cwg, wwarp, off_q,
                                         gdq, bb, tma_dq, sdQw, mSem, slot0, m_min, nm, hkv * qhead_per_kv, turn_a,
                                         turn_c)
                    self._sdp_swap(mma_sdp, mma_sdp_z, mma_dkv, acc_S, acc_dP, acc_dV, acc_dK, rP, rdS, tSrK, tSrQ,
                                   tPrV, tPrdO, tVrPt, tVrdOt, tKrdSt, tKrQt, st.index, c_mn, sL, sD, i0, jw0,
                                   slen_q, slen_k, off, win_left, win_right, scale_log2, need_mask, r2s, thr_r2s,
                                   tPsdS_c, self.early_sdp)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    if wwarp == 0:
                        # the previous tile's bulk reduce has finished reading sdQw before anyone rewrites it
                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                    if cutlass.const_expr(self.dq_shared):
                        self._pair_sync()  # both dS halves written (dQ reads the whole dS tile)
                    else:
                        self._wg_sync(cwg)

                    # group [dQ chunk 0] (dV / dK went ahead of it); each further dQ chunk after the previous one is
                    # staged
                    wg.fence()
                    for kb in cutlass.range_constexpr(cute.size(tQrdS_c, mode=[2])):
                        cute.gemm(mma_dq_z if kb == 0 else mma_dq, acc_dQ, tQrdS_c[None, None, kb],
                                  tQrKt[0][None, None, kb], acc_dQ)
                    wg.commit_group()
                    if cutlass.const_expr(self.ordered and self.TURN_PASS == 1):
                        if wwarp == 0:
                            if it > 0:
                                # the previous tile's reduce (the only bulk group in flight) completes under the
                                # wgmmas just issued; then its turn passes, a tile's elementwise part sooner
                                cute.arch.cp_async_bulk_wait_group(0, read=False)
                                prev = slot0 + m_min + (it - 1) % nm
                                if prev < mSem.shape[1]:
                                    tile_order.pass_turn(self._turn_ptr(mSem, hkv * qhead_per_kv + (it - 1) // nm,
                                                                        prev))
                    # dQ chunk 0 done (the last group; dV / dK went ahead of it)
                    wg.wait_group(0)
                    # dQ_w chunks -> smem (fp32), then one bulk reduce-add of the whole tile (EARLY_SDP: at the top of
                    # the next tile, or after the loop)
                    if cutlass.const_expr(not self.early_sdp):
                        cute.autovec_copy(acc_dQ, tQsdQ[0])
                    for h in cutlass.range_constexpr(1, nsplit):
                        wg.fence()
                        for kb in cutlass.range_constexpr(cute.size(tQrdS_c, mode=[2])):
                            cute.gemm(mma_dq_z if kb == 0 else mma_dq, acc_dQ, tQrdS_c[None, None, kb],
                                      tQrKt[h][None, None, kb], acc_dQ)
                        wg.commit_group()
                        wg.wait_group(0)
                        cute.autovec_copy(acc_dQ, tQsdQ[h])
                    wg.wait_group(0)
                    if cutlass.const_expr(self.early_sdp):
                        if cutlass.const_expr(self.EARLY_RELEASE == 1):
                            pipe.consumer_release(st)   # its wgmmas are retired: the producer may refill it now
                        sp = st.clone()     # tile it's stage, else released at the top of the next tile
                        p_hq, p_m, p_stat, p_stat2 = hq, m, nxt_stat, nxt_stat2
                        st.advance()
                    else:
                        if cutlass.const_expr(self.dq_shared and not ds2):
                            self._pair_sync()  # both warpgroups' dQ MMAs are done with this dS tile
                        pipe.consumer_release(st)
                        st.advance()
                        self._dq_out(it, hq, m, nxt_stat, nxt_stat2, sStat, srow, skind, cwg, wwarp, off_q, gdq, bb,
                                     tma_dq, sdQw, mSem, slot0, m_min, nm, hkv * qhead_per_kv, turn_a, turn_c)

                if cutlass.const_expr(self.early_sdp):
                    if n_iter > 0:
                        cute.autovec_copy(acc_dQ, tQsdQ[0])
                        if cutlass.const_expr(self.dq_shared and not ds2):
                            self._pair_sync()
                        if cutlass.const_expr(self.EARLY_RELEASE == 0):
                            pipe.consumer_release(sp)
                        self._dq_out(n_iter - 1, p_hq, p_m, p_stat, p_stat2, sStat, srow, skind, cwg, wwarp, off_q,
                                     gdq, bb, tma_dq, sdQw, mSem, slot0, m_min, nm, hkv * qhead_per_kv, turn_a, turn_c)
                if wwarp == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                    if cutlass.const_expr(self.ordered):
                        if n_iter > 0:
                            last = slot0 + m_min + (n_iter - 1) % nm
                            if last < mSem.shape[1]:
                                tile_order.pass_turn(self._turn_ptr(mSem, hkv * qhead_per_kv + (n_iter - 1) // nm,
                                                                    last))

                # epilogue: dK = scale * acc, dV = acc, rows inside the segment only
                self._store_dkv(acc_dK, acc_dV, tKVc, jw0, slen_k, mdK, mdV, bb, off_k, hkv, scale)
