"""Dense indexer backward for Hopper (sm_90a), CuTe DSL: gradients of the dense warm-up indexer KL loss
(docs/dsa.md dense_indexer_backward, paddle_dsa/reference/dsa/indexer_loss.py dense_backward).

Math: sparse_bwd_sm90.py's, with the row's entries the keys it sees instead of top-k slots:

    entries of query row t: keys j < lim(t),  lim(t) = clamp((q_offset + t + 1) // ratio, 0, Sk)  (causal)  or  Sk
    (the indexer forward's mask, ops/common/head_sum_sm90.py), slot j = key j, index_score / attn_score [.., Sk] read
    at column j. x, p, T, g, G, X, dA, d_weights, d_index_q, d_index_k exactly as there.

Tiling: SparseIndexerBwdSm90's (one query row x all Hi heads per CTA, keys in blocks of 64 gathered by cp.async
into the consumers' half rings, dq and d_weights reduced in a fixed order, d_index_k by red.global.add.v4.f32 into
a zeroed fp32 buffer, not bitwise deterministic); only the slot source differs: slot j of the row is key j, valid
below lim(t) (no index tensor is read), and the row's slot count is lim(t) (clamped to the scores' width W, so a
THD width below the longest key sequence can never make the kernel read past a row; the seam's caller guarantees
W >= every sequence's keys). Causal grids run the longest rows first (row = Sq - 1 - blockIdx.x; deterministic: of
the chunk's rows). The shared-memory handoffs and the deterministic variant (entries (row, slot = key j), W a row)
are the sparse kernel's (its docstring).

Layouts. Dense: index_q [B,Sq,Hi,Di], index_k [B,Sk,Di], weights [B,Sq,Hi] (bf16 or fp32), index_score /
attn_score fp32 [B,Sq,Sk], index_lse / attn_l1norm fp32 [B,Sq], q_offsets int32 [B], grad_scale fp32 [1],
d_index_q bf16 like index_q, d_index_k fp32 like index_k (zeroed by the seam), d_weights fp32 [B,Sq,Hi].
THD: the same without B, scores [Tq, W] with columns local to the row's sequence, q_offsets int32 [batch],
cu_seqlens_q/k int32 [batch+1]; rows at or past cu_seqlens_q[-1]: dq 0, d_weights 0.

Status (H200, 2026-12-03 16:51 UTC): tests/gpu/test_dsa_indexer_dense_bwd.py 25 passed (float64 gates, bitwise equal
to the sparse kernel on the same slots, THD, q_offsets, degenerate lse, reruns, graph capture, seed 003's race test);
racecheck 0 hazards, memcheck 0 errors (sanitize_dsa_indexer_dense_bwd.py). Routed in paddle_dsa since that run.
2026-12-04 09:38 UTC (the sparse kernel's slot loads a block ahead): the same tests and sanitizers pass; Sq = Sk = 8K
causal, Hi 64, Di 128: 8.66 ms (9.72 before; the issue's cuDNN figure 8.18 ms, its kernel does not launch at 8K here).
2026-12-04 19:30 UTC (d_index_k by whole 128-byte lines): the same tests and sanitizers pass; 8K: 6.93 ms; Sq = Sk =
4K: 1.85 ms against cuDNN frontend's 3.00 in the same run.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32

from ...common.gather_sm90 import PIECE, find_sequence
from ...common.head_sum_sm90 import visible_limit
from .sparse_bwd_sm90 import SparseIndexerBwdSm90


class DenseIndexerBwdSm90(SparseIndexerBwdSm90):
    """One compiled variant: (Di, Hi, weights dtype name, varlen, with q_offsets). Launch shape: the sparse kernel's,
    at three consumer warpgroups (CONSUMERS 3, the sparse kernel's two before 2026-12-06 13:17). Three are faster:
    H200 2026-12-06 10:15 (bench/indexer_bwd_shapes.py, same run) dense causal 8K Hi 64 5.619 ms against 5.945; H100
    10:30-10:42 5.974-5.989 against 6.069-6.073. With CONSUMERS = 3 tests/gpu/test_dsa_indexer_dense_bwd.py (39) and
    its sanitizers passed on H100s (10:35, 10:37, 10:42; 13:17 in the whole suite, 13:28), not yet on an H200 (every
    call asking for one since 10:30 was placed on an H100). ptxas at three: 16-byte spill, one 4-byte reload a block
    (128, 64, fp32); the deterministic variants spill 44-68 bytes."""

    CONSUMERS = 3

    def __init__(self, head_dim: int, heads: int, w_dtype: str, varlen: bool, has_offsets: bool,
                 deterministic: bool = False):
        super().__init__(head_dim, heads, w_dtype, varlen, False, deterministic)
        self.has_offsets = has_offsets

    # ------------------------------------------------------------------------------------------ host (jit)
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mW: cute.Tensor, mOff: cute.Tensor, mS: cute.Tensor,
                 mLse: cute.Tensor, mA: cute.Tensor, mL1: cute.Tensor, mC: cute.Tensor, mdQ: cute.Tensor,
                 mdK: cute.Tensor, mdW: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor, causal: Int32,
                 ratio: Int32, mKeys: cute.Tensor, row0: Int32, stream):
        """Deterministic variant: as SparseIndexerBwdSm90's, the entries (row, slot = key) of the rows
        [row0, row0 + E / (B W))."""
        tma_q, tQ, k_v, dk_v, grid, mmas, layouts = self.setup(mQ, mK, mdK, mKeys, mS)
        self.dense_kernel(tma_q, tQ, k_v, dk_v, mW, mOff, mS, mLse, mA, mL1, mC, mdQ, mdW, mCuQ, mCuK, causal,
                          ratio, mKeys, row0, mmas, layouts).launch(grid=grid, block=(self.threads, 1, 1), stream=stream,
                                                       min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ device
    @cute.kernel
    def dense_kernel(self, tma_q: cute.CopyAtom, tQ: cute.Tensor, mK: cute.Tensor, mdK: cute.Tensor, mW: cute.Tensor,
                     mOff: cute.Tensor, mS: cute.Tensor, mLse: cute.Tensor, mA: cute.Tensor, mL1: cute.Tensor,
                     mC: cute.Tensor, mdQ: cute.Tensor, mdW: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
                     causal: Int32, ratio: Int32, mKeys: cute.Tensor, row0: Int32, mmas, layouts):
        tidx, _, _ = cute.arch.thread_idx()
        bx, batch, _ = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        rel = bx
        if causal != 0:
            rel = gx - 1 - bx                     # longest rows first
        row = rel
        if cutlass.const_expr(self.stage):
            row = row0 + rel
        width = mS.shape[1] if cutlass.const_expr(self.varlen) else mS.shape[2]
        # the slot source is the scores tensor itself (never read as indices: slot_raw / load_slots below)
        g = (tma_q, tQ, mK, mdK, mW, mS, None, mS, mLse, mA, mL1, mC, mdQ, mdW, mKeys, rel)
        if cutlass.const_expr(self.varlen):
            n_seq = mCuQ.shape[0] - 1
            if row >= mCuQ[n_seq]:
                self.clear_row(mdQ, mdW, row, tidx, mKeys, rel, mS)
            else:
                b = find_sequence(mCuQ, n_seq, row, tidx % 32)
                k_off = mCuK[b]
                seqlen_k = mCuK[b + 1] - k_off
                lim = visible_limit(row - mCuQ[b], self.q_offset(mOff, b), causal, ratio, seqlen_k)
                self.backward_row(g, mmas, layouts, tidx, Int32(0), row, k_off, seqlen_k, cutlass.min(lim, width))
        else:
            lim = visible_limit(row, self.q_offset(mOff, batch), causal, ratio, mK.shape[0])
            self.backward_row(g, mmas, layouts, tidx, batch, row, Int32(0), mK.shape[0], cutlass.min(lim, width))

    @cute.jit
    def q_offset(self, mOff: cute.Tensor, b: Int32):
        pos0 = Int32(0)
        if cutlass.const_expr(self.has_offsets):
            pos0 = mOff[b]
        return pos0

    # ------------------------------------------------------------------------------------------ the slot source
    @cute.jit
    def slot_raw(self, mIdx: cute.Tensor, batch: Int32, row: Int32, j: Int32):
        """Slot j is key j (valid: j is below the row's limit, which is at most the sequence's keys)."""
        return j

    @cute.jit
    def load_slots(self, raw, mIdx: cute.Tensor, batch: Int32, row: Int32, n: Int32, row_len: Int32, tidx: Int32,
                   b: cutlass.Constexpr = 0):
        """raw[p, b] = the key piece p of block n gathers (its slot), -1 past the row's limit."""
        for p in cutlass.range_constexpr(self.pieces):
            j = n * self.GATHER_BK + (tidx + 128 * p) // (64 // PIECE)
            raw[p, b] = Int32(cutlass.select_(j < row_len, j, Int32(-1)))
