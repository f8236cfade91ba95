"""Device helpers of the sparse (top-k slot) kernels for Hopper (sm_90a), CuTe DSL: the varlen row search, the
cp.async publish step of a gathering producer (ops/common/sparse_head_sum_sm90.py, the sparse score recomputes) and
BlockGather, the whole producer of the block-gathering kernels (ops/dsa/sparse_attn/fwd_sm90.py, bwd_sm90.py,
ops/dsa/indexer/sparse_bwd_sm90.py), GatherHints, the copy of one gathered piece in both kinds of producer (the DSL's
cp.async.cg, or inline PTX with L2 hints on trial: cp_async_cg_l2_256, l2_policy; by addresses formed once:
swizzled_address, pinned, cp_async_cg_raw, for SparseHeadSumSm90.LEAN_GATHER), and gemm_chunks, their
consumers' wgmma over a block's chunks.
"""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import T


@cute.jit
def find_sequence(mCu: cute.Tensor, n_seq: Int32, row: Int32, lane: Int32):
    """The b with cu[b] <= row < cu[b + 1] (row < cu[n_seq]): a warp-wide 32-ary search (every lane of the warp
    runs it; no host data)."""
    lo = Int32(0)
    hi = n_seq
    while hi - lo > 1:
        step = (hi - lo + 31) // 32
        probe = lo + lane * step
        v = mCu[cutlass.min(probe, hi - 1)]
        ok = probe < hi and v <= row
        n_ok = cute.arch.popc(cute.arch.vote_ballot_sync(ok))
        lo = lo + (n_ok - 1) * step
        hi = cutlass.min(lo + step, hi)
    return lo


def gather_atom(dt):
    """The 16-byte cp.async atom of the gathering producers: cp.async.cg (LDGSTS.BYPASS: L2 only, no L1 line
    allocated; a gathered row is read once per CTA). Same-run A/B against cp.async.ca on an H100, 2026-12-05
    (perf/gather_trials_2026-12-05T1700.txt): sparse attention forward 1.25x, backward 1.05x, sparse attention-score
    recompute 1.08-1.09x, sparse indexer recompute 1.02x, indexer backwards 1.00-1.01x; results bitwise equal."""
    return cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt, num_bits_per_copy=128)


def l2_policy(priority: str):
    """An L2 cache policy (createpolicy.fractional, fraction 1.0): the lines an access brings in get eviction
    priority `priority` ("evict_last", "evict_normal")."""
    return Int64(llvm.inline_asm(T.i64(), [], f"createpolicy.fractional.L2::{priority}.b64 $0, 1.0;", "=l",
                                 has_side_effects=True))


def swizzled_address(dst: cute.Tensor):
    """The shared-memory byte address (Int32) of dst's first element, for a tile with the 128-byte swizzle (pointer
    type S<3,4,3>: the swizzle acts on the byte address, bits [4, 7) ^= bits [7, 10)), applied here by hand to the
    unswizzled address, as the DSL's copy does (the PTX of both gave the same addresses for six coordinates, CPU
    2026-12-05). Adding a multiple of 1024 bytes to an address commutes with the swizzle (bits [4, 10) unchanged)."""
    ptr = dst.iterator
    assert "S<3,4,3>" in str(ptr.type), f"swizzled_address: a 128-byte-swizzled tile, got {ptr.type}"
    a = cute.recast_ptr(ptr, swizzle_=None).toint()
    return a ^ (((a >> 7) & 7) << 4)


def pinned(x):
    """x (Int32 or Int64) through an opaque register move: formed once where it is defined. LLVM would otherwise
    rebuild a cheap expression of the thread index at each use (a gathering producer's addresses: ~15 integer
    instructions a copy) and ptxas does not merge the copies across the copies' branches."""
    if x.dtype.width == 64:
        return Int64(llvm.inline_asm(T.i64(), [Int64(x).ir_value()], "mov.b64 $0, $1;", "=l,l"))
    return Int32(llvm.inline_asm(T.i32(), [Int32(x).ir_value()], "mov.b32 $0, $1;", "=r,r"))


def cp_async_cg_raw(a, g, policy=None, l2_256: bool = True):
    """One 16-byte cp.async.cg from global byte address g (Int64) to shared byte address a (Int32, swizzled), with
    the L2::256B prefetch hint (l2_256) and an L2 cache policy (when given), by inline PTX."""
    hint = ".L2::cache_hint" if policy is not None else ""
    pre = ".L2::256B" if l2_256 else ""
    args = [a.ir_value(), g.ir_value()] + ([policy.ir_value()] if policy is not None else [])
    tail = ", $2" if policy is not None else ""
    llvm.inline_asm(None, args, f"cp.async.cg.shared.global{hint}{pre} [$0], [$1], 16{tail};",
                    "r,l" + (",l" if policy is not None else ""), has_side_effects=True)


def cp_async_cg_l2_256(dst: cute.Tensor, src: cute.Tensor, policy=None):
    """One 16-byte cp.async.cg with the L2::256B prefetch hint (and an L2 cache policy when given), by inline PTX:
    the DSL's cp.async atom has no prefetch qualifier. dst: 8 bf16 of a 128-byte-swizzled shared-memory tile
    (swizzled_address); src: 16 bytes of global memory."""
    assert cute.size(dst) * dst.element_type.width == 128 and cute.size(src) * src.element_type.width == 128, \
        "cp_async_cg_l2_256 copies 16 bytes"
    cp_async_cg_raw(swizzled_address(dst), src.iterator.toint(), policy)


class GatherHints:
    """Mixin of the gathering producers (BlockGather, sparse_head_sum_sm90.SparseHeadSumSm90): the 16-byte copy of a
    gathered piece, with the L2 hints on trial. GATHER_PREFETCH: 0 = the DSL's cp.async.cg atom (gather_atom);
    1 = every copy with the L2::256B prefetch hint (cp_async_cg_l2_256); 2 = and an L2 evict_last policy (FlashMLA's
    sm90 gather does both); 3 = the hint, and evict_last only while the whole kv (all batches) is at most
    EVICT_LAST_KV_BYTES, else evict_normal (chosen at run time). Same run on an H100 (docs/performance.md, "Launch order
    and the gather's L2 hints"), sparse attention forward, H 128, Skv 8K / 32K / 64K: 0 537 / 485 / 467 TFLOP/s, 1 524 /
    532 / 496, 2 569 / 513 / 476 (outputs bitwise equal); its backward 1.00x. H200 2026-12-05 (two runs, 0 -> 3): 8K
    530 -> 578 and 509 -> 542, 32K 531 -> 525 and 530 -> 486, 64K 473 -> 477 and 460 -> 504; sparse indexer recompute
    0.614 -> 0.579 ms; sparse attention-score recompute 3.20 -> 3.31 ms (slower: stays 0). Form 3 is the default of
    the sparse attention forward and the sparse indexer recompute (their classes set it); the mixin's default is 0."""

    GATHER_PREFETCH = 0
    EVICT_LAST_KV_BYTES = 16 << 20

    def gather_policy(self, mKv: cute.Tensor):
        """The L2 policy of forms 2 and 3 (None for 0 and 1); mKv is the kv view [rows, D, batches] (form 3's size
        test). Call it once, before the gather loop."""
        mode = self.GATHER_PREFETCH
        policy = None
        if cutlass.const_expr(mode == 2):
            policy = l2_policy("evict_last")
        if cutlass.const_expr(mode == 3):
            kv_rows = mKv.shape[0] * mKv.shape[2]
            small = kv_rows <= self.EVICT_LAST_KV_BYTES // (mKv.shape[1] * (self.dt.width // 8))
            policy = Int64(cutlass.select_(small, l2_policy("evict_last"), l2_policy("evict_normal")))
        return policy

    def gather_copy(self, mKv: cute.Tensor):
        """copy(src, dst) of one gathered piece (src: 8 elements of a kv row, dst: their swizzled shared-memory
        slice); mKv is the kv view [rows, D, batches]. Call it once, before the gather loop."""
        mode = self.GATHER_PREFETCH
        atom = gather_atom(self.dt)
        policy = self.gather_policy(mKv)

        def copy(src, dst):
            if cutlass.const_expr(mode):
                cp_async_cg_l2_256(dst, src, policy)
            else:
                cute.copy(atom, src, dst)
        return copy

    def gather_copy_raw(self, mKv: cute.Tensor):
        """copy(a, g) of one gathered piece by addresses (a: swizzled shared byte address, g: global byte address),
        the same cp.async as gather_copy's form (form 0: cp.async.cg without hints, the DSL atom's instruction)."""
        mode = self.GATHER_PREFETCH
        policy = self.gather_policy(mKv)

        def copy(a, g):
            cp_async_cg_raw(a, g, policy, l2_256=mode != 0)
        return copy


@cute.jit
def publish(pipe, stages: cutlass.Constexpr, index: Int32, pending: cutlass.Constexpr):
    """Ring buffer `index`'s cp.async group retired (this thread's: at most `pending` newer groups still in flight),
    this thread's shared-memory writes to it (cp.async and plain stores alike) fenced for the async proxy (wgmma
    reads them), then this thread's arrival on the buffer's full barrier. The barrier completes only when every
    writer arrived, so a consumer's wait orders all lanes' writes, not only a fence."""
    cute.arch.cp_async_wait_group(pending)
    cute.arch.fence_proxy("async.shared", space="cta")
    pipe.producer_commit(pipeline.PipelineState(stages, Int32(0), index, Int32(0)))


@cute.jit
def gemm_chunks(pipe, state_of, chunks: cutlass.Constexpr, mma, mma_acc, acc, operands, kpc: cutlass.Constexpr,
                waits: cutlass.Constexpr = None):
    """The consumer side of a chunk pipeline: acc (+)= the chunks' products, one committed wgmma group. For each
    chunk c of `chunks` (in that order): wait the full barrier of state_of(c) (only where waits[j], when given: a
    stage of several chunks is waited on once), fence, then its kpc k-blocks, operands(c, kb, stage) -> (A, B)
    fragments of chunk c's k-block kb in ring stage `stage`. The first k-block overwrites acc (mma); the rest
    accumulate."""
    for j in cutlass.range_constexpr(len(chunks)):
        c = chunks[j]
        st = state_of(c)
        if cutlass.const_expr(waits is None or waits[j]):
            pipe.consumer_wait(st)
        warpgroup.fence()
        for kb in cutlass.range_constexpr(kpc):
            a, b = operands(c, kb, st.index)
            cute.gemm(mma if j == 0 and kb == 0 else mma_acc, acc, a, b, acc)
    warpgroup.commit_group()


PIECE = 8            # bf16 elements per 16-byte cp.async


class BlockGather(GatherHints):
    """The producer warpgroup of the sparse kernels that gather whole blocks of key rows
    (ops/dsa/sparse_attn/fwd_sm90.py, bwd_sm90.py, ops/dsa/indexer/sparse_bwd_sm90.py): block n's GATHER_BK slots,
    chunk by chunk of 64 columns.

    Piece p of a chunk (p < self.pieces) is key row r = (tidx + 128 p) // 8 of the block and 16 bytes at column
    (tidx % 8) * 8 of the chunk (the row's index loaded one block ahead, so its latency hides behind a block of
    copies); a valid slot's piece is a cp.async, an invalid one's (idx < 0, >= the sequence's keys, past the row's
    slots) a zero store, so no stale or uninitialised row can reach an operand. The chunks are filled in
    gather_order() over periods of GATHER_PERIOD blocks (default: one block, column order); a chunk is published `lag`
    acquires after its own (publish(): wait_group, proxy fence, arrive of all 128 writers on its full barrier) and
    every period ends with all its chunks published. Deadlock rule for the kernel: a consumer may block on a chunk
    of period i + 1 only after every release of period i that the producer's acquires up to lag chunks past it
    need (with the default order and releases at the end of each block this always holds). With `sRows` (an Int32
    tensor [2, GATHER_BK]) the producer also leaves each block's gathered rows there (publish_rows: -1 for an
    invalid slot), so consumers take slot validity and key rows from shared memory instead of loading the indices
    again. The kernel class supplies GATHER_BK, self.dt, self.pieces, self.NC (chunks a
    block), self.stages (pipeline stages), gather_lag(), state(n, c, producer) (the chunk's pipeline state),
    gather_dst(sK, r, col, index) (the 8-element shared-memory slice of row r, column piece col, in the stage of
    pipeline index `index`) and idx_coord(batch, row, j). MOVE_DATA = False (a diagnosis knob, never set by a kernel:
    bench/ab_sparse_attn.py's nogather knockout) keeps the protocol (acquire, slot rows, commit, publish) and moves
    no data, so the consumers read stale chunks: only the time means anything.
    Tried and removed (L2_AHEAD, commit 44745cb): each period's rows prefetched into L2 a period ahead of their gather
    (one cp.async.bulk.prefetch.L2 of a whole kv row per producer thread, its idx loaded a period before): outputs
    bitwise equal, test_dsa_sparse_attn and its sanitizers clean, but slower in every row of a same-run A/B on an H100
    (2026-12-06 11:27, perf/l2_ahead_2026-12-06T1150_h100_ab_*.txt): sparse attention forward H 128 Skv 8K / 32K /
    64K 4.58 / 5.04 / 4.97 ms against 4.35 / 4.61 / 4.66 without, H 64 64K 3.31 against 2.74; backward H 64 8K 7.95
    against 7.45."""

    MOVE_DATA = True
    GATHER_PERIOD = 1    # blocks a period of the fill order (gather_order)

    def gather_order(self):
        """The fill order of one period of GATHER_PERIOD blocks: (block offset in the period, group) pairs, each
        group of each block once. Default: one block, groups in column order."""
        return tuple((0, g) for g in range(len(self.gather_groups())))

    def gather_groups(self):
        """A block's chunks in pipeline stages: a tuple of chunk tuples, one full / empty barrier pair each (published
        when all its chunks are written, freed when every consumer is done with all of them). Default: every chunk
        its own stage."""
        return tuple((c,) for c in range(self.NC))

    def buffer_index(self, n, c, st):
        """The shared-memory buffer (gather_dst's index) of chunk c of block n, st the pipeline state of its group.
        Default: the stage's own index (one chunk a stage)."""
        return st.index

    @cute.jit
    def produce(self, pipe, sK: cute.Tensor, mKv: cute.Tensor, mIdx: cute.Tensor, batch: Int32, row: Int32,
                row_len: Int32, n_blk: Int32, k_off: Int32, seqlen_k: Int32, tidx: Int32, sRows=None):
        """n_blk: a multiple of GATHER_PERIOD (blocks past the row's slots are zero-filled and marked invalid)."""
        per_row, lag, PER = 64 // PIECE, self.gather_lag(), self.GATHER_PERIOD
        order, groups = self.gather_order(), self.gather_groups()
        assert sorted(order) == [(b, g) for b in range(PER) for g in range(len(groups))] and lag <= len(order)
        copy = self.gather_copy(mKv)
        zero = cute.make_rmem_tensor((PIECE,), self.dt)
        zero.fill(0.0)
        gKv = mKv[None, None, batch]
        raw = cute.make_rmem_tensor((self.pieces, PER), Int32)      # next period's idx (loads in flight)
        rows = cute.make_rmem_tensor((self.pieces, PER), Int32)     # this period's gather rows (-1: zero-fill)
        for b in cutlass.range_constexpr(PER):
            self.load_slots(raw, mIdx, batch, row, Int32(b), row_len, tidx, b)
        for i in cutlass.range(n_blk // PER, unroll=1):
            n0 = i * PER
            for b in cutlass.range_constexpr(PER):
                for p in cutlass.range_constexpr(self.pieces):
                    rows[p, b] = Int32(cutlass.select_(raw[p, b] >= 0 and raw[p, b] < seqlen_k, k_off + raw[p, b],
                                                       Int32(-1)))
            for b in cutlass.range_constexpr(PER):
                self.load_slots(raw, mIdx, batch, row, n0 + PER + b, row_len, tidx, b)
            for e in cutlass.range_constexpr(len(order)):
                b, g = order[e]
                st = self.state(n0 + b, g, True)
                pipe.producer_acquire(st)
                if cutlass.const_expr(0 in groups[g] and sRows is not None):
                    self.publish_rows(sRows, rows, n0 + b, tidx, b)
                for c in groups[g]:
                    for p in cutlass.range_constexpr(self.pieces if cutlass.const_expr(self.MOVE_DATA) else 0):
                        dst = self.gather_dst(sK, (tidx + 128 * p) // per_row, tidx % per_row,
                                              self.buffer_index(n0 + b, c, st))
                        if rows[p, b] >= 0:
                            src = cute.local_tile(gKv[rows[p, b], None], (PIECE,), (c * per_row + tidx % per_row,))
                            copy(src, dst)
                        else:
                            cute.autovec_copy(zero, dst)
                cute.arch.cp_async_commit_group()
                if cutlass.const_expr(e >= lag):
                    bp, gp = order[e - lag]
                    publish(pipe, self.stages, self.state(n0 + bp, gp, True).index, lag)
            for j in cutlass.range_constexpr(lag):              # the period's last `lag` groups, oldest first
                bp, gp = order[len(order) - lag + j]
                publish(pipe, self.stages, self.state(n0 + bp, gp, True).index, lag - 1 - j)

    @cute.jit
    def publish_rows(self, sRows: cute.Tensor, rows, n: Int32, tidx: Int32, b: cutlass.Constexpr = 0):
        """sRows[n % 2, r] = the kv row slot r of block n gathers (the sequence's offset added; rows[:, b] holds
        them), -1 for an invalid slot: written by the first of the 8 threads of each key row, after chunk 0 of
        block n was acquired (so every consumer has released chunk 0 of block n - 2, after its last read of these
        words) and before chunk 0 is published (the full barrier's arrival orders these stores for the consumers
        that wait on it)."""
        per_row = 64 // PIECE
        if tidx % per_row == 0:
            for p in cutlass.range_constexpr(self.pieces):
                sRows[n % 2, (tidx + 128 * p) // per_row] = rows[p, b]

    @cute.jit
    def load_slots(self, raw, mIdx: cute.Tensor, batch: Int32, row: Int32, n: Int32, row_len: Int32, tidx: Int32,
                   b: cutlass.Constexpr = 0):
        """raw[p, b] = idx of the slot piece p of block n gathers, -1 past the row's slots."""
        for p in cutlass.range_constexpr(self.pieces):
            j = n * self.GATHER_BK + (tidx + 128 * p) // (64 // PIECE)
            v = Int32(-1)
            if j < row_len:
                v = mIdx[self.idx_coord(batch, row, j)]
            raw[p, b] = v

    @cute.jit
    def gather_pipeline(self, barrier_ptr, consumer_threads: cutlass.Constexpr, tile_bar, tidx: Int32):
        """The chunk pipeline (full: the 128 producer threads arrive; empty: `consumer_threads` consumer threads) and
        the resident tiles' TMA mbarrier, initialised and made visible to the CTA (one sync_threads)."""
        pipe = pipeline.PipelineAsync.create(barrier_storage=barrier_ptr, num_stages=self.stages,
                                             producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 128),
                                             consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                                                      consumer_threads),
                                             defer_sync=True)
        if tidx == 0:
            cute.arch.mbarrier_init(tile_bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        return pipe


@cute.jit
def load_resident_tiles(tile_bar, nbytes: cutlass.Constexpr, loads):
    """Warp 0 of the producer: the resident tiles by TMA on one mbarrier expecting `nbytes`; loads = ((atom, gmem
    partition, smem partition), ...)."""
    for atom, _, _ in loads:
        cpasync.prefetch_descriptor(atom)
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(tile_bar, nbytes)
    for atom, src, dst in loads:
        cute.copy(atom, src, dst, tma_bar_ptr=tile_bar)
