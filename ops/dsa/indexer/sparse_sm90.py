"""Sparse indexer score recompute for Hopper (sm_90a), CuTe DSL: the indexer's relu * w head sum over each
query's own top-k slots (ops/common/sparse_head_sum_sm90.py with IndexerEpilogue from score_sm90.py).

    index_score[t, s] = sum_h w[t, h] * relu(q[t, h] . k[idx[t, s]])   valid slots; -inf at invalid ones
    index_lse[t]      = ln sum_{valid s} exp(index_score[t, s])        0 for a row with no valid slot
Key rows gathered with cp.async (D = 64 or 128 in one chunk), ring of 4 chunk buffers; one query row per CTA, two
CTAs an SM.

Status (H200, 2026-12-04): tests/gpu/test_dsa_sparse_scores.py 32 passed (both kinds), racecheck/memcheck clean;
Sq 4K, top-k 2048, 64 heads, Di 128: 0.62 ms = 221 TFLOP/s with two CTAs an SM (0.96 ms with one, 2.17 ms before
the producer kept 3 chunks in flight); cuDNN frontend 0.38 ms in the same run (0.62x). Still one query row per CTA:
several rows per CTA and a persistent grid are the next levers (docs/performance.md). Gathers with the L2 hints of
gather_sm90.GatherHints form 3 since 2026-12-05 (H200 same run: 0.614 -> 0.579 ms, bitwise equal).
Since 2026-12-06 the producer forms its copies' addresses once (LEAN_GATHER; ncu had shown it, at ~38 instructions
a 16-byte copy, the kernel's bound) and its producer has 48 registers: H100 06:43-07:13, 0.554 -> 0.425 -> 0.410 ms
(cuDNN 0.389, 0.95x), bitwise equal; tests and sanitizers pass on the H100 and on the H200 (2026-12-06 10:17-10:23,
the whole suite; 0.41 ms against cuDNN frontend's 0.38 there, 0.93x).
"""
from ...common.sparse_head_sum_sm90 import SparseHeadSumSm90
from .score_sm90 import IndexerEpilogue


class SparseIndexerScoreSm90(IndexerEpilogue, SparseHeadSumSm90):
    """One compiled variant: (head_dim, heads, varlen, has_length); the weight dtype comes with mC."""

    STAGES = 4          # two CTAs an SM (bench/sparse_score_shapes.py, H200 2026-12-04: 0.958 -> 0.622 ms, same bits)
    GATHER_PREFETCH = 3   # L2 hints (gather_sm90.GatherHints): H200 2026-12-05, 0.614 -> 0.579 ms (2: 0.577), same bits
    MIN_BLOCKS = 2      # registers capped at 80 (ptxas 12-06 09:50, producer 48: one 8 B spill, in the producer's
    #                     setup, none in its loop); 2 x (16 + 64) KiB smem
    REGS = (48, 96)     # producer 48 (its pinned addresses): H100 2026-12-06 07:00, 0.424 -> 0.407 ms, same bits
    IDX_AHEAD = 1       # with LEAN_GATHER (2: 0.715 ms, spills); without it 2 was best (H200 04:20: 0.578 -> 0.562 ms)
    LEAN_GATHER = True  # addresses formed once: H100 2026-12-06 06:43, 0.554 (IDX_AHEAD 2) -> 0.425 ms, same bits

    def __init__(self, head_dim: int, heads: int, varlen: bool, has_length: bool):
        assert head_dim in (64, 128) and heads in (16, 32, 64), (head_dim, heads)
        super().__init__(head_dim, heads, head_dim, self.STAGES, varlen, has_length)
