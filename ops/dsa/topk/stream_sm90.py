"""Row-wise top-k of fp32 scores, streaming variant (Hopper sm_90a, CuTe DSL): same semantics, same output bits as
topk_sm90.TopkSm90, for rows whose base is 16-byte aligned (the seam picks it: scores' data pointer % 16 == 0 and
its row stride % 4 == 0).

Semantics (docs/dsa.md, "Top-k"): per row, the columns of the k largest FINITE scores in descending score order,
ties lower column first; -inf, +inf and NaN are never selected; slots past the number of selectable scores are -1;
with lengths, row r sees columns [0, lengths[r]). The key mapping, radix digits, candidate passes, tie ranking and
the bitonic sort are TopkSm90's (inherited): only the way the row is read changes.

Why a second kernel. TopkSm90 caches a row of up to 40960 columns in 160 KiB of shared memory, so one CTA of 16
warps owns an SM, and it walks the row one 4-byte element a thread at a time with a dependent chain per element
(cp.async, then key / match.any / atomic): at 32K x 32K it ran at ~0.4 TB/s, latency-bound. Here nothing of the
row is cached: the row is read from global memory twice (the second read mostly hits L2: three CTAs an SM keep
3 x 132 rows of 128 KiB, 50 MiB, about the L2) in tiles of NT x V x U columns (V = 4), each thread holding
U 16-byte vectors (U x 4 keys) in registers, so U loads are in flight per thread and the per-key work of a tile is
independent. Shared memory is 56 KiB (selection, candidates, histogram), so three CTAs share an SM
(MIN_BLOCKS = 3: min_blocks_per_mp caps registers at 42; ptxas: 38, no spills). U and MIN_BLOCKS are class
attributes that bench/topk_breakdown.py --sweep varies: on the H200 (2026-12-03 19:40, perf/device_2026-12-03T1940.txt)
(U 2, 3 CTAs) was the fastest of (4, 2) (2, 2) (2, 3) (1, 3) (1, 4) (8, 1) on all four rows, 4.24 ms against the
former default (4, 2)'s 4.33 at 32K x 32K k 2048 and 2.38 against 2.69 at W 4K, so it is the default.

Keys. key_bits gives finite scores key_of's order-preserving keys bit for bit, but keeps the bits of +-inf and NaN
(key_of maps them to 0): those land in the pass-0 digits 0-3 (-inf, negative NaN; columns past width read as -inf)
and 0x7FC-0x7FF (+inf, NaN), which no finite score shares. Pass A adds every score to the histogram, no branch
(digit0: x + 0.0 makes -0.0 bin with +0.0), and leaves those eight bins out of the selectable count (their sum)
and empties them before the digit is picked; the whole-row gather takes only keys of a finite digit.

Passes. A: every tile -> the pass-0 histogram (top 11 bits of the key) and, from it, the selectable count. If more
than k are selectable, the digit d0 of the k-th largest key is picked; B (when d0's bin holds at most CAND keys,
the common case): every tile again -> scores above d0 join the selection, scores in d0 become candidates. B forms
no key: d0 is the float range [f_lo, f_hi) (float_of_key of its lowest key and of the next digit's), and a score is
tested by three ordered float compares (no ftz: denormals compare exactly; -0.0 == +0.0 as in key_bits; NaN fails
every compare), each thread's U x 4 results in one mask (take_mask). Appends are batched a tile at a time: one
warp scan of the packed (selection, candidate) counts and one atomic a warp on the packed fills (misc[5]); then a
loop over the mask's set bits writes the columns (a warp runs its busiest lane's count, not a predicated store per
score), and for the score order the selection's raw bits; the candidates' keys (and the selection's) are formed
after the pass, the candidates' from one read of their column each (keys_by_column: the row was just read, so
those hit L2). tests/test_topk_float_range.py checks on the CPU that the float range and digit0 agree for every
finite d0, -0.0, denormals, +-inf and NaN included. Passes 1-3 (7-bit digits) and the gather then touch the
candidates only. When d0 holds more than CAND keys, passes 1-3 and the gather sweep the row from global memory in
tiles instead. Ties at the threshold that cannot all be taken are ranked by column over the whole row
(TopkSm90.take_ties, global reads).
One read (SAMPLE = 1, the default; sampled_select). Passes A and B read the row twice and add every score to the
histogram; most rows need neither. S: a sample of NT x V scores (one 16-byte vector a thread, at evenly spaced
columns) gives a threshold t_f: the lower edge of the 18-bit key prefix (the pass-0 digit, then a 7-bit one) of its
j-th largest finite key, j = m + 4 sqrt(m) + 2 (SAMPLE_SIGMA 4: 4 standard deviations; m + m / 2 + 10 at 0) for the
m = k NT V / W sample scores expected above the row's k-th largest; a sample with fewer than j finite scores takes
t_f = -FLT_MAX (every finite score). Rows of W <= CAND take the two passes (faster there: H100 A/B below). Then one
read of the row: the scores in [t_f, +inf) are appended to the candidates as (key, column) (append_above: one warp
scan and one atomic a warp per tile, entries past CAND counted, not written). If at most CAND passed and at least k
(or t_f is -FLT_MAX), the row's k largest are
all candidates: at most k of them are all taken, else the pass-0 histogram of the candidates alone and
passes 1-3 over them (refine) give T, and the gather and ties are the two passes' (ties ranked over the row). Every
key equal to T is >= t_f, so the tie count is exact; keys below t_f are all below T and change no digit's rank from
the top. Otherwise (a misleading sample, or more than CAND scores at or above t_f) misc and the histogram are zeroed
and the row runs passes A and B (two_pass_select), as with SAMPLE = 0. tests/test_topk_stream_select.py emulates it
(sampled_select) on adversarial rows, including a row built to mislead the sample; tests/gpu/test_dsa_topk.py
compares SAMPLE 1 and 0 bit for bit on rows that take each path. Which variants try it (one_read): every one since
the "bucket" ordering of the selection (sort_sm90; 2026-12-06 13:30): SAMPLE_SCORE_MAX_P = 2048. Before it the score
order took the one read only for P <= 512 (history below). H100 2026-12-06 13:30 (perf/topk_bucket_2026-12-06T1330_h100
_ab.txt, bench/ab_topk.py, 32K rows, base 27f67d8 = the key network with that gating, same selections): the bucket
ordering alone k 2048 score order 3.24 vs 3.62 ms, W 4K 1.82 vs 2.14, causal 3.18 vs 3.53, rounded 4.68 vs 5.58; with
the one read at every P besides: k 2048 2.86 (0.79x), k 1024 2.25 vs 3.01, causal 2.69 (0.76x), rounded 4.79 (0.86x);
test_dsa_topk 104 passed with SAMPLE_SCORE_MAX_P = 2048 (TOPK_KNOBS) in that call, and as the default at 14:06 (H100,
racecheck / memcheck clean; bench/dsa_indexer.py: top-k alone 2.82 ms against cuDNN frontend's 1.90, indexer + top-k
32K 10.21 against 12.05). H100 2026-12-06 12:13
(perf/topk_one_read_2026-12-06T1213_h100_ab.txt, bench/ab_topk.py against the two passes, 32K rows, same
selections): W 32K k 64 score order 1.71 vs 2.73 ms, column order k 2048 2.69 vs 3.24, k 64 1.78 vs 2.64, causal 2.48
vs 3.15; but score order k 2048 3.75 vs 3.64 (the bitonic ordering of 2048, no longer hidden under other CTAs' second
reads, bounds it) and rounded rows 1.03-1.08x; W 4K rows take the two passes. test_dsa_topk 90 passed, racecheck /
memcheck clean on that H100 with the one read in every variant (11:55 and 12:13).
L2 prefetch (L2_START = L2_AHEAD = 2, the default since 2026-12-06 16:10; ops/common/l2_prefetch.py). Thread 0 asks
the TMA unit for the row's first two tiles (32 KiB) into L2 as the sample is read, and at each tile of a read loop for
the tile two ahead: one instruction a tile, no shared memory, nothing to wait for, so a thread's two 16-byte loads a
tile mostly hit L2. Where the row's time goes (H100, 15:49, perf/topk_l2_2026-12-06T1549_h100_*; 32K rows of 32K, k
2048): the one read with the threshold and the candidates' radix passes 2.16 ms of 2.88 (bench/topk_breakdown.py
--stages), the gather 0.19, the bucket ordering 0.53 (the bitmap of the column order 0.34). ncu (8192 rows): 61.6 K
warp instructions a row, issue-bound rather than DRAM-bound (1.35 TB/s, SM 68 %, a warp eligible 68 % of cycles); the
one read's append loop (one iteration a set bit of the busiest lane, a select chain to pick the entry) is 22 % of
them, the tile loads, compares and warp scan 20 %, the candidates' four histogram passes 17 %. Same-run A/B on that
H100 (bench/ab_topk.py against 186f3ee, 15:49 and 16:10): W 32K k 2048 score order 2.82 vs 2.88 ms, k 64 0.95x,
causal 0.97x, rounded 0.99x, column order 0.95-0.97x, W 4K 1.0x (one tile a row). Tried, slower, removed: the whole row
at the start (k 64 1.25x: 396 rows of 128 KiB in flight overflow L2), and the head of the row the next CTA on the SM
is likely to take (row + 132 x 3) once this row's read ends (1.02-1.30x); an "APPEND ballot" form of append_above
(one ballot an entry slot, raw bits stored straight from their register, keys formed after the read: fewer
instructions on paper, 1.00-1.04x the time).
Fewer candidates, fewer passes over them (the defaults since 2026-12-06 17:30): SAMPLE_SIGMA = 4 puts the sample's
rank at 4 standard deviations (j = m + 4 sqrt(m) + 2: 2775 candidates a row of randn instead of 3255 in the NumPy
emulation, none below k in 300 rows), and ONE_READ_DIGITS = (11, 10) selects among the one read's candidates in two
radix passes below pass 0 instead of three (those passes were 17 % of the instructions). The two passes keep
REFINE_DIGITS (7, 7, 7): with (11, 10) there, rows of 4K columns took 1.02-1.03x the time (a 2048-bin histogram to
clear and walk for ~2 K keys). H100 17:20 (bench/ab_topk.py against the prefetch kernel, same selections): both on
every path 0.96x the time at W 32K k 2048 in both orders, causal 0.96x, rounded 0.96-0.98x, k 64 1.00x; test_dsa_topk
104 passed and racecheck / memcheck clean with that knob set. NumPy emulation of both: tests/test_topk_stream_select.py.
Trial knob (2026-12-06 20:40, CPU only: compiles, NumPy emulation): SelectionSort.BUCKETS_PER_KEY = 4 gives the
bucket sort 4 P buckets; at P 2048 that is 8192 counters, and the kernel declares cand_u and cand_c as one range lent
to the ordering (wide_scratch; both are last read by the gather, before the barrier that opens
sort_and_write; shared_storage). The default (2) traces to the same kernels as before.
The sample's keys formed once, its count shared with the other selects, two barriers before the one read dropped
(2026-12-06 19:20): H100 19:33-19:48, the whole GPU suite (test_dsa_topk 104 passed, 2 skipped) and racecheck /
memcheck clean; bench/ab_topk.py against 4bbc746 0.995-1.000x the time on every row, same selections
(perf/topk_cleanup_2026-12-06T19*). Where a like-for-like row's instructions go (ncu, causal rows with lengths):
docs/performance.md, 2026-12-06 19:00-20:05.
Shared-memory handoffs: histogram, selection, candidates, counters and scan partials are each read only after a CTA
barrier (sync_threads) that follows all their writers (after pass B: one barrier before the fills and the appended
columns are read, one after the keys are formed in place); the row itself never goes through shared memory. The one-read
select: the sample's histogram and count are read after a barrier of all their adders; a histogram is zeroed only after
the barrier that follows pick_digit's walk of it; misc[1] (the sample's digits) is read by every thread before the
barrier that ends the read, and next written after it (no barrier of its own since 2026-12-06 19:10, nor one to zero
misc[6]: it is 0 from the kernel's first barrier); the candidate fill misc[6] is read by every thread after the barrier
that ends the read, and the fallback zeroes misc and the histogram only after one more barrier.

Lean passes (this form, 2026-12-05): CPU-compiled for sm_90a with no spills (40 registers), emulated in NumPy
(tests/test_topk_stream_select.py, tests/test_topk_float_range.py); SASS per tile of 8 scores a thread (column
variant): pass A 147 -> 96 instructions, pass B 294 -> ~160 plus ~17 a set bit. On an H100
(2026-12-05 10:24, perf/device_next_2026-12-05T1005.txt) and again at 15:10 (perf/device_2026-12-05T1456.txt):
test_dsa_topk 89 passed, racecheck and memcheck clean. Same-run A/B against the former passes on that H100
(bench/ab_topk.py, 32K rows, score order): W 32K k 2048 3.64 vs 3.77 ms, k 64 2.72 vs 2.77, causal 3.55 vs 3.60,
rounded scores 5.62 vs 5.88, W 4K 2.16 vs 2.08 (geomean 0.985x); column order 0.91-1.05x. The figures below are of
the former passes.
Status (H200, 2026-12-03; at U 2 x 3 CTAs since 20:05: test_dsa_topk 73 passed, sanitize_dsa_topk clean, 32K x 32K
k 2048 4.24 ms, k 64 2.37, causal 4.05, W 4K 2.38; the figures below are of the former (4, 2)):
tests/gpu/test_dsa_topk.py passes for both kernels (indices equal to a stable sort, the
two kernels equal bit for bit), racecheck 0 hazards and memcheck 0 errors (sanitize_dsa_topk.py). 32K rows x 32K
columns, k 2048 (bench/topk_breakdown.py, 17:20 UTC): 4.33 ms (993 GB/s); the first form of this kernel (key_of
keys, a per-key count and match.any in pass A; removed since, strictly slower) 8.48 ms; TopkSm90 13.16 ms; k 64
instead of 2048: 2.50 ms (so the sort of 2048 is ~1.8 ms of the 4.33); causal scores 4.16 ms. cuDNN frontend's
top-k: 1.76 ms in the same session (bench/dsa_indexer.py). Tried: the bitonic network on packed 64-bit (key, column)
values, one compare a pair: correct, but 4.85 ms against 4.33 (17:33 UTC), not kept. Next: fewer instructions per
key in pass B, a sort with fewer stages than the 66 of a bitonic network of 2048, and the top-k fused into the
indexer's epilogue. 2026-12-05: the selection is ordered by sort_sm90's "key" sort (a key-only network, slots by rank):
3.77 ms (4.23 with the pair network, same run), top-k alone 3.71 ms against cuDNN's 1.78 in bench/dsa_indexer.py.
ncu (8192 rows, 03:41, perf/topk_key_sort_ncu_2026-12-05T0341.txt): L1 / shared-memory pipe 80 % busy (the top unit),
DRAM 22 %, SM 68 %, 76 K warp instructions a row: the pass-0 histogram atomics, the appends and the sort's
shared-memory traffic, not the score reads, set the pace. Tried (04:25, perf/topk_hist_copies_2026-12-05T0425.txt):
two interleaved pass-0 histogram copies (lane % 2; lanes adding to one bin split over two banks; 64 KiB of shared
memory): correct (test_dsa_topk 79 passed, racecheck / memcheck clean) but 3.79 ms against 3.72 with one, not kept.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...common.cta_scan import warp_inclusive_scan
from ...common.l2_prefetch import prefetch_l2_bulk
from .topk_sm90 import BINS0, CAND, NT, SHIFT0, SIGN, TopkSm90

V = 4                        # fp32 columns per 16-byte vector load (append_tile's column arithmetic assumes 4)
FLT_MAX = 3.4028234663852886e38
assert BINS0 == 4 * NT       # pass A: threads 0 and NT - 1 own exactly the non-finite bins 0-3 and 0x7FC-0x7FF
U = 2                        # vectors per thread per tile (TopkStreamSm90.U; bench/topk_breakdown.py --sweep)


def shared_storage(P, wide):
    """The kernel's shared storage (56 KiB at P 2048). wide (TopkStreamSm90.wide_scratch: the ordering needs 2 CAND
    counters): cand_u and cand_c declared as one range, cand_u its first half. Plain Python, outside the traced
    __call__, so the fields' `if` is not turned into traced control flow."""
    @cute.struct
    class SharedStorage:
        sel_u: cute.struct.Align[cute.struct.MemRange[Int32, P], 16]
        sel_c: cute.struct.MemRange[Int32, P]
        if wide:
            cand: cute.struct.MemRange[Int32, 2 * CAND]
        else:
            cand_u: cute.struct.MemRange[Int32, CAND]
            cand_c: cute.struct.MemRange[Int32, CAND]
        hist: cute.struct.MemRange[Int32, BINS0]
        part: cute.struct.MemRange[Int32, NT // 32]
        misc: cute.struct.MemRange[Int32, 8]
    return SharedStorage


class TopkStreamSm90(TopkSm90):
    """One compiled variant: (P = padded k, has_lengths, rank 3 inputs); scores rows 16-byte aligned."""

    U = U                        # 16-byte vectors a thread per tile: a tile is NT x V x U columns (4096 at U = 2)
    # a timing diagnostic: None (the kernel), or "A" / "threshold" / "selection": end after the select (since the
    # one-read select, "A" is "threshold"), after the threshold T is known, after the selection is gathered (before
    # the ordering)
    STOP = None
    MIN_BLOCKS = 3               # CTAs an SM the registers are capped for (3: 42 registers, 3 x 56 KiB of smem)
    SAMPLE = 1                   # 1: the one-read select above a sampled threshold first (sampled_select); 0: no
    SAMPLE_SCORE_MAX_P = 2048    # ... in the score order only for P up to this (512 while the network ordered them)
    # L2 prefetch (prefetch_l2_bulk; module docstring "L2 prefetch"): the row's first L2_START tiles are asked into L2
    # as the sample is read, and each tile of a read loop (the one read, pass A) asks for the tile L2_AHEAD ahead
    L2_START = 2
    L2_AHEAD = 2
    # the sample's rank j: 0 = m + m / 2 + 10; s > 0 = m + s sqrt(m) + 2 (s standard deviations; module docstring)
    SAMPLE_SIGMA = 4
    # the radix digits of the one read's candidates below pass 0 (refine; the two passes keep REFINE_DIGITS):
    # (11, 10), two passes over ~2.8 K candidates instead of three (module docstring)
    ONE_READ_DIGITS = (11, 10)

    def wide_scratch(self):
        """The bucket sort's counters need more than cand_u (BUCKETS_PER_KEY x P > CAND): cand_u and cand_c are then
        one range of 2 CAND, the ordering's scratch (both are free once the selection is gathered)."""
        return self.SORT == "bucket" and self.BUCKETS_PER_KEY * self.P > CAND

    def scratch_counters(self):
        """Counters of the ordering's scratch (sort_sm90.SelectionSort)."""
        return 2 * CAND if self.wide_scratch() else CAND

    def one_read(self):
        """Whether this variant tries the one-read select: SAMPLE, in the column order always, in the score order for
        P <= SAMPLE_SCORE_MAX_P (H100 A/B, 2026-12-06 13:30, bucket ordering: k 2048 0.88x the two passes' time, k 1024
        0.76x; with the key network, 12:13: k 64 0.63x, k 2048 1.03x)."""
        return bool(self.SAMPLE) and (self.by_column or self.P <= self.SAMPLE_SCORE_MAX_P)

    @cute.jit
    def __call__(self, mS: cute.Tensor, mOut: cute.Tensor, mLen: cute.Tensor, k: Int32, stream):
        P = self.P
        assert self.U * V <= 16, "take_mask packs a thread's U x V entries into 16-bit halves"

        self.shared_storage = shared_storage(P, self.wide_scratch())
        self.kernel(mS, mOut, mLen, k).launch(grid=(self.n_rows(mS), 1, 1), block=(NT, 1, 1), stream=stream,
                                              min_blocks_per_mp=self.MIN_BLOCKS, preferred_smem_carveout=100)

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mOut: cute.Tensor, mLen: cute.Tensor, k: Int32):
        P = self.P
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.shared_storage)
        sel_u = st.sel_u.get_tensor(cute.make_layout(P))
        sel_c = st.sel_c.get_tensor(cute.make_layout(P))
        if cutlass.const_expr(self.wide_scratch()):
            scratch = st.cand.get_tensor(cute.make_layout(2 * CAND))
            cand_u = cute.make_tensor(scratch.iterator, cute.make_layout(CAND))
            cand_c = cute.make_tensor(scratch.iterator + CAND, cute.make_layout(CAND))
        else:
            cand_u = st.cand_u.get_tensor(cute.make_layout(CAND))
            cand_c = st.cand_c.get_tensor(cute.make_layout(CAND))
            scratch = cand_u
        hist = st.hist.get_tensor(cute.make_layout(BINS0))
        part = st.part.get_tensor(cute.make_layout(NT // 32))
        # misc: 0 selectable count, 1 digit, 2 remaining, 3 eq, 4 selection fill, 5 tie carry (pass B: the packed
        # selection / candidate fills), 6 candidate fill
        misc = st.misc.get_tensor(cute.make_layout(8))
        ku = cute.make_rmem_tensor((self.U * V,), Int32)       # a tile's keys of this thread

        gS, gOut, width = self.row_of(mS, mOut, mLen, row)
        if tid < 8:
            misc[tid] = Int32(0)
        for i in cutlass.range_constexpr(BINS0 // NT):
            hist[tid + NT * i] = Int32(0)
        cute.arch.sync_threads()                    # hist and misc zeroed
        if cutlass.const_expr(self.one_read()):
            # one read of the row above a threshold estimated from a sample; the two passes where it does not hold
            take_all, t_u, need, eq, fast = self.sampled_select(gS, width, k, ku, hist, part, misc, cand_u, cand_c,
                                                                tid, lane, warp)
            use_cand = fast
            if not fast:
                cute.arch.sync_threads()            # every thread read misc[6] before it is zeroed
                if tid < 8:
                    misc[tid] = Int32(0)
                for i in cutlass.range_constexpr(BINS0 // NT):
                    hist[tid + NT * i] = Int32(0)
                cute.arch.sync_threads()
                take_all, t_u, need, eq, use_cand = self.two_pass_select(gS, width, k, ku, hist, part, misc, sel_u,
                                                                         sel_c, cand_u, cand_c, tid, lane, warp)
        else:
            take_all, t_u, need, eq, use_cand = self.two_pass_select(gS, width, k, ku, hist, part, misc, sel_u,
                                                                     sel_c, cand_u, cand_c, tid, lane, warp)
        if cutlass.const_expr(self.STOP == "A"):
            self.stop_here(gOut, misc, tid)
            return
        t_s = t_u ^ Int32(SIGN)
        if cutlass.const_expr(self.STOP == "threshold"):
            self.stop_here(gOut, misc, tid)
            return

        # ---- gather the selection (keys > T; ties: all, or the `need` lowest columns)
        ranked = (not take_all) and need < eq
        cute.arch.sync_threads()
        if use_cand:
            self.gather_candidates(cand_u, cand_c, sel_u, sel_c, misc, t_s, t_u, ranked, tid, lane)
        else:
            for t0 in cutlass.range(0, width, NT * V * self.U, unroll=1):
                self.load_keys(gS, t0, width, tid, ku)
                self.append_tile(ku, t0, tid, lane, t_s, t_u, not ranked, sel_u, sel_c, cand_u, cand_c, misc,
                                 by_range=False)
        if ranked:
            self.take_ties(cand_u, gS, width, False, t_u, need, sel_u, sel_c, part, misc, tid, lane, warp)
        if cutlass.const_expr(self.STOP == "selection"):
            cute.arch.sync_threads()
            self.stop_here(gOut, misc, tid)
            return
        # ---- order the selection (sort_sm90), descending by ks, then ascending by column; write k columns
        self.sort_and_write(sel_u, sel_c, scratch, part, misc, gOut, k, tid, width)

    # ------------------------------------------------------------------------------------------ pieces
    @cute.jit
    def two_pass_select(self, gS, width, k, ku, hist, part, misc, sel_u, sel_c, cand_u, cand_c, tid, lane, warp):
        """Passes A and B and the radix select (the module docstring): (take_all, T as u, need, eq, use_cand). Enters
        with hist and misc zeroed (after a barrier); leaves the keys above d0 in the selection (misc[4]) and the
        candidates of d0 (misc[6]) when use_cand."""
        # ---- A. keys, selectable count, pass-0 histogram
        n_ok = Int32(0)
        for t0 in cutlass.range(0, width, NT * V * self.U, unroll=1):
            self.prefetch_ahead(gS, t0, width, tid)
            self.load_keys(gS, t0, width, tid, ku, raw=True)
            for e in cutlass.range_constexpr(self.U * V):       # every score, finite or not: no branch
                cute.arch.atomic_add(hist.iterator + self.digit0(ku[e]), Int32(1))
        cute.arch.sync_threads()                    # every key counted before anyone sums
        # bins 0-3 and 0x7FC-0x7FF (threads 0 and NT - 1 own them here) hold the non-finite keys: not counted,
        # emptied for pick_digit (which reads them after the barrier below)
        if tid == 0 or tid == NT - 1:
            for i in cutlass.range_constexpr(BINS0 // NT):
                hist[tid * (BINS0 // NT) + i] = Int32(0)
        else:
            for i in cutlass.range_constexpr(BINS0 // NT):
                n_ok += hist[tid * (BINS0 // NT) + i]
        self.add_selectable(misc, n_ok, lane)
        cute.arch.sync_threads()
        n_valid = misc[0]

        # ---- radix select: T (as u) and the number of keys equal to T that are taken
        take_all = n_valid <= k
        t_u = Int32(1)           # below every selectable key: take all
        need = Int32(0)
        eq = Int32(0)
        use_cand = False
        if not take_all:
            self.pick_digit(hist, part, misc, k, BINS0, tid, lane, warp)
            cute.arch.sync_threads()
            d0 = misc[1]
            prefix = d0 << SHIFT0
            remaining = misc[2]
            eq = misc[3]
            use_cand = eq <= CAND
            if use_cand:
                # B. scores above digit d0 are selected; scores in it become candidates (with their columns). The
                # test is on the scores themselves, d0 as the float range [f_lo, f_hi): no key is formed per score,
                # the raw bits are appended and turned into keys afterwards (a few per thread)
                f_lo = self.float_of_key(d0 << SHIFT0)
                f_hi = self.float_of_key((d0 + 1) << SHIFT0)
                for t0 in cutlass.range(0, width, NT * V * self.U, unroll=1):
                    self.load_keys(gS, t0, width, tid, ku, raw=True)
                    self.append_tile(ku, t0, tid, lane, f_lo, f_hi, True, sel_u, sel_c, cand_u, cand_c, misc)
                cute.arch.sync_threads()                # every append and the packed fills complete
                fills = misc[5]
                self.keys_by_column(gS, cand_c, cand_u, fills >> 16, tid)
                if cutlass.const_expr(not self.by_column):     # the column order never reads sel_u
                    for i in cutlass.range(tid, fills & 0xFFFF, NT, unroll=1):
                        sel_u[i] = self.key_bits(Int32(sel_u[i]).bitcast(Float32))
                if tid == 0:                            # misc[5] is next written by take_ties, after a barrier
                    misc[4] = fills & 0xFFFF
                    misc[6] = fills >> 16
                cute.arch.sync_threads()                # keys in place (each thread wrote its own slots), fills
            prefix, remaining, eq = self.refine(hist, part, misc, cand_u, use_cand, (gS, ku), width, prefix,
                                                remaining, eq, tid, lane, warp)
            t_u = prefix
            need = remaining
        return take_all, t_u, need, eq, use_cand

    @cute.jit
    def sampled_select(self, gS, width, k, ku, hist, part, misc, cand_u, cand_c, tid, lane, warp):
        """The one-read select (SAMPLE; the module docstring): (take_all, T as u, need, eq, fast). Enters with hist
        and misc zeroed (after a barrier). fast: every score in [t_f, +inf) is a candidate in cand_u / cand_c
        (misc[6] of them, at most CAND) and they hold the row's k largest (at least k of them, or t_f is -FLT_MAX:
        every finite score), so the radix select runs on them alone; otherwise nothing is decided and the caller
        runs the two passes (misc[6] may exceed CAND: only the first CAND columns were written)."""
        # S. the threshold t_f: a sample of NT x V scores (one 16-byte vector a thread at evenly spaced columns) and
        # the digits (11 bits, then 7) of its j-th largest key, j = m + SAMPLE_SIGMA sqrt(m) + 2 (m + m / 2 + 10 at
        # SAMPLE_SIGMA 0) for the m = k NT V / width sample scores expected above the row's k-th largest
        eligible = width > CAND                     # a row that fits in the candidates takes the two passes
        t_all = False
        t_f = Float32(-FLT_MAX)
        if eligible:
            su = cute.make_rmem_tensor((V,), Float32)
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
            base = (tid * (width // V)) // NT      # a vector index below width // V (width > CAND > NT V)
            cute.copy(atom, cute.local_tile(gS, (V,), (base,)), su)
            if cutlass.const_expr(self.L2_START > 0):
                if tid == 0:
                    self.prefetch_span(gS, Int32(0), width, self.L2_START)
            sk = cute.make_rmem_tensor((V,), Int32)    # the sample's keys (key_of), kept for its second digit
            n_s = Int32(0)
            for e in cutlass.range_constexpr(V):
                sk[e] = self.key_of(su[e])
                n_s += self.count_pass0(hist, sk[e], lane)
            self.add_selectable(misc, n_s, lane)
            cute.arch.sync_threads()                # the sample's histogram and count complete
            m = (k * (NT * V)) // width
            j = m + (m >> 1) + 10
            if cutlass.const_expr(self.SAMPLE_SIGMA > 0):
                j = m + Int32(Float32(self.SAMPLE_SIGMA) * cute.math.sqrt(Float32(m))) + 2
            t_all = j > misc[0]
            if not t_all:
                self.pick_digit(hist, part, misc, j, BINS0, tid, lane, warp)
                cute.arch.sync_threads()
                d_s = misc[1]
                r_s = misc[2]
                if tid < 128:                       # pick_digit's reads of hist are behind the barrier above
                    hist[tid] = Int32(0)
                cute.arch.sync_threads()
                for e in cutlass.range_constexpr(V):
                    u = sk[e]
                    match = u != 0 and ((u ^ (d_s << SHIFT0)) >> SHIFT0) == 0
                    self.hist_add(hist, (u >> (SHIFT0 - 7)) & 127, match, lane)
                cute.arch.sync_threads()
                self.pick_digit(hist, part, misc, r_s, 128, tid, lane, warp)
                cute.arch.sync_threads()
                # misc[1] is next written by pick_digit after the barriers that follow the one read, and hist is next
                # written after the barrier that ends it: no barrier here
                t_f = self.float_of_key((d_s << SHIFT0) | (misc[1] << (SHIFT0 - 7)))

        # one read: every score in [t_f, +inf) a candidate (its key and column); the fill misc[6] is 0 since the
        # kernel's first barrier (nothing before writes it)
        for t0 in cutlass.range(0, Int32(cutlass.select_(eligible, width, Int32(0))), NT * V * self.U, unroll=1):
            self.prefetch_ahead(gS, t0, width, tid)
            self.load_keys(gS, t0, width, tid, ku, raw=True)
            self.append_above(ku, t0, tid, lane, t_f, cand_u, cand_c, misc)
        cute.arch.sync_threads()                    # every append and the fill complete
        n_above = misc[6]
        fast = eligible and n_above <= CAND and (n_above >= k or t_all)
        take_all = n_above <= k
        t_u = Int32(1)           # below every selectable key: take all
        need = Int32(0)
        eq = Int32(0)
        if fast:
            if not take_all:
                for i in cutlass.range_constexpr(BINS0 // NT):
                    hist[tid + NT * i] = Int32(0)
                cute.arch.sync_threads()            # hist zeroed (the candidates were written before the last barrier)
                for c0 in cutlass.range(0, n_above, NT, unroll=1):
                    i = c0 + tid
                    u = Int32(0)
                    if i < n_above:
                        u = cand_u[i]
                    self.hist_add(hist, (u >> SHIFT0) & (BINS0 - 1), u != 0, lane)
                cute.arch.sync_threads()
                self.pick_digit(hist, part, misc, k, BINS0, tid, lane, warp)
                cute.arch.sync_threads()
                prefix, remaining, eq = self.refine(hist, part, misc, cand_u, True, (gS, ku), width,
                                                    misc[1] << SHIFT0, misc[2], misc[3], tid, lane, warp,
                                                    self.ONE_READ_DIGITS)
                t_u = prefix
                need = remaining
        return take_all, t_u, need, eq, fast

    @cute.jit
    def append_above(self, ku, t0, tid, lane, t_f, cand_u, cand_c, misc):
        """This tile's scores in [t_f, +inf) (ku: raw bits; NaN fails the compares) appended as (key, column) to
        cand_u / cand_c at misc[6] (one warp scan, one atomic a warp; entries past CAND counted, not written). The
        key is formed from the registers (a select chain over the thread's U x V entries), not read back by column:
        a row's ~1.5 k candidates re-read from L2 cost more than the row's own read. Called by all 32 lanes
        (warp-uniform)."""
        m = Int32(0)
        for e in cutlass.range_constexpr(self.U * V):
            x = ku[e].bitcast(Float32)
            if x >= t_f and x < Float32(float("inf")):
                m = m | Int32(1 << e)
        cnt = cute.arch.popc(m)
        incl = warp_inclusive_scan(cnt, lane)
        total = cute.arch.shuffle_sync(incl, 31)
        base = Int32(0)
        if lane == 0:
            base = cute.arch.atomic_add(misc.iterator + 6, total)
        pc = cute.arch.shuffle_sync(base, 0) + incl - cnt
        cbase = t0 + tid * V
        mm = m
        while mm != 0:
            e = cute.arch.clz(cute.arch.brev(mm))              # lowest set bit
            mm = mm & (mm - 1)
            if pc < CAND:
                v = ku[0]
                for j in cutlass.range_constexpr(1, self.U * V):
                    v = Int32(cutlass.select_(e == j, ku[j], v))
                cand_u[pc] = self.key_bits(v.bitcast(Float32))       # finite: key_bits is key_of
                cand_c[pc] = cbase + (e >> 2) * (NT * V) + (e & 3)
            pc += 1

    @cute.jit
    def prefetch_span(self, gRow, c0, width, tiles: cutlass.Constexpr = 1):
        """L2 prefetch of `tiles` tiles of a row from column c0 (NT x V x U columns a tile, up to the last whole
        16-byte vector below width; nothing when c0 >= width): one instruction, nothing to wait for."""
        span = NT * V * self.U * tiles
        if c0 < width:
            nb = (cutlass.min(width - c0, span) // V) * (V * 4)
            if nb > 0:
                prefetch_l2_bulk((gRow.iterator + c0).toint(), nb)

    @cute.jit
    def prefetch_ahead(self, gRow, t0, width, tid):
        """L2_AHEAD: at the tile starting at column t0, thread 0 asks for the tile L2_AHEAD tiles ahead."""
        if cutlass.const_expr(self.L2_AHEAD > 0):
            if tid == 0:
                self.prefetch_span(gRow, t0 + self.L2_AHEAD * (NT * V * self.U), width)

    @cute.jit
    def stop_here(self, gOut, misc, tid):
        """STOP (a timing diagnostic, bench/topk_breakdown.py --stages): the kernel ends here, its output is NOT the
        top-k; one counter is written so that nothing before is dead code."""
        if tid == 0:
            gOut[0] = misc[0] + misc[4] + misc[6]

    @cute.jit
    def row_hist(self, src, width, prefix, shift, hist, tid, lane, bits: cutlass.Constexpr = 7):
        """The passes below pass 0 without candidates (refine): the row's keys matching the prefix, read in tiles.
        src = (scores row, this thread's key registers)."""
        gS, ku = src
        for t0 in cutlass.range(0, width, NT * V * self.U, unroll=1):
            self.load_keys(gS, t0, width, tid, ku)
            for e in cutlass.range_constexpr(self.U * V):
                u = ku[e]
                match = u != 0 and ((u ^ prefix) >> (shift + bits)) == 0
                self.hist_add(hist, (u >> shift) & ((1 << bits) - 1), match, lane)

    @cute.jit
    def load_keys(self, gRow, t0, width, tid, ku, raw: cutlass.Constexpr = False):
        """ku[v * V + e] = the key (key_bits) of column t0 + (v * NT + tid) * V + e (of -inf past width): U 16-byte
        loads, issued before any key is formed; a vector that crosses width is read element by element. raw: the
        score's own bits instead of its key."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128)
        vals = cute.make_rmem_tensor((self.U * V,), Float32)
        for v in cutlass.range_constexpr(self.U):
            base = t0 + (v * NT + tid) * V
            if base + V <= width:
                cute.copy(atom, cute.local_tile(gRow, (V,), (base // V,)),
                          cute.local_tile(vals, (V,), (v,)))
            else:
                for e in cutlass.range_constexpr(V):
                    x = Float32(float("-inf"))
                    if base + e < width:
                        x = gRow[base + e]
                    vals[v * V + e] = x
        for i in cutlass.range_constexpr(self.U * V):
            if cutlass.const_expr(raw):
                ku[i] = vals[i].bitcast(Int32)
            else:
                ku[i] = self.key_bits(vals[i])

    @cute.jit
    def key_bits(self, x):
        """key_of's order-preserving u for every float (-0.0 as +0.0), without zeroing +-inf and NaN."""
        b = Float32(x).bitcast(Int32)
        b = Int32(cutlass.select_(b == Int32(SIGN), Int32(0), b))
        return b ^ ((b >> 31) | Int32(SIGN))

    @cute.jit
    def digit0(self, b):
        """The pass-0 digit of key_bits of the float with bits b: x + 0.0 turns -0.0 into +0.0 (round to nearest,
        no ftz: denormals kept) in one add instead of key_bits' compare and select."""
        c = (b.bitcast(Float32) + Float32(0.0)).bitcast(Int32)
        return ((c ^ ((c >> 31) | Int32(SIGN))) >> SHIFT0) & (BINS0 - 1)

    @cute.jit
    def keys_by_column(self, gRow, cols, keys, n, tid):
        """keys[i] = key_bits(gRow[cols[i]]) for i < n, i = tid mod NT: KB reads in flight a thread (the row was
        just read, so they mostly hit L2)."""
        KB = 4
        for c0 in cutlass.range(0, n, NT * KB, unroll=1):
            x = cute.make_rmem_tensor((KB,), Float32)
            for j in cutlass.range_constexpr(KB):
                i = c0 + j * NT + tid
                x[j] = Float32(0.0)
                if i < n:
                    x[j] = gRow[cols[i]]
            for j in cutlass.range_constexpr(KB):
                i = c0 + j * NT + tid
                if i < n:
                    keys[i] = self.key_bits(x[j])

    @cute.jit
    def float_of_key(self, u):
        """The float whose key_bits is u (u not 0x7FFFFFFF, the pattern of -0.0, which key_bits maps to +0.0's)."""
        b = Int32(cutlass.select_(u < 0, u ^ Int32(SIGN), ~u))
        return b.bitcast(Float32)

    @cute.jit
    def finite_key(self, u):
        """u (key_bits) is a finite score: its pass-0 digit is none of 0-3 and 0x7FC-0x7FF."""
        dg = (u >> SHIFT0) & (BINS0 - 1)
        return dg >= 4 and dg < BINS0 - 4

    @cute.jit
    def append_tile(self, ku, t0, tid, lane, a, b, ties_too, sel_u, sel_c, cand_u, cand_c, misc,
                    by_range: cutlass.Constexpr = True):
        """Append this tile's entries to the selection and the candidates, batched: a thread classifies its U x V
        entries once into a mask (take_mask), one warp scan of the packed counts (selection low 16 bits,
        candidates high: at most 32 x U x V = 256 a warp) and one atomic per warp and buffer give each thread its
        slots. by_range: ku holds raw score bits, (a, b) = (f_lo, f_hi), the float range of digit d0: selection =
        scores in [f_hi, +inf), candidates = [f_lo, f_hi) (the entries appended are raw bits); else ku holds keys,
        (a, b) = (t_s, t_u): selection = key above T (or equal to it when ties_too), no candidates. Called by all
        32 lanes (warp-uniform)."""
        m = self.take_mask(ku, a, b, ties_too, by_range)
        cnt = cute.arch.popc(m & 0xFFFF) | (cute.arch.popc(m >> 16) << 16)
        incl = warp_inclusive_scan(cnt, lane)
        total = cute.arch.shuffle_sync(incl, 31)
        base = Int32(0)
        if lane == 0:
            # by_range: one atomic on the packed fills misc[5] (selection low 16 bits: < P; candidates high: at
            # most CAND), unpacked into misc[4] / misc[6] after the pass; else the selection fill misc[4]
            base = cute.arch.atomic_add(misc.iterator + (5 if cutlass.const_expr(by_range) else 4), total)
        base = cute.arch.shuffle_sync(base, 0)
        excl = incl - cnt
        ps = (base & 0xFFFF) + (excl & 0xFFFF)
        pc = (base >> 16) + (excl >> 16)
        if cutlass.const_expr(by_range):
            # only the columns, one iteration a set bit (a warp runs its busiest lane's count, ~3 of 8 entries
            # on random rows), not a predicated store per entry; the values are read back by column later
            # (keys_by_column)
            cbase = t0 + tid * V
            mm = m
            while mm != 0:
                e = cute.arch.clz(cute.arch.brev(mm))          # lowest set bit
                mm = mm & (mm - 1)
                ee = e & 15
                col = cbase + (ee >> 2) * (NT * V) + (ee & 3)
                if e >= 16:
                    cand_c[pc] = col
                    pc += 1
                else:
                    sel_c[ps] = col
                    if cutlass.const_expr(not self.by_column):     # the column order never reads sel_u
                        v = ku[0]
                        for j in cutlass.range_constexpr(1, self.U * V):
                            v = Int32(cutlass.select_(ee == j, ku[j], v))
                        sel_u[ps] = v
                    ps += 1
        else:
            for e in cutlass.range_constexpr(self.U * V):
                col = t0 + ((e // V) * NT + tid) * V + e % V
                if (m & (1 << e)) != 0:
                    sel_u[ps] = ku[e]
                    sel_c[ps] = col
                    ps += 1

    @cute.jit
    def take_mask(self, ku, a, b, ties_too, by_range: cutlass.Constexpr):
        """Bit e: entry e joins the selection; bit 16 + e: it is a candidate (a non-finite score is never taken).
        by_range: ku raw bits, [a, b) = [f_lo, f_hi) (ordered compares: NaN fails them all, -0.0 == +0.0 as in
        key_bits, denormals compared exactly: no ftz); else ku keys, a = t_s, b = t_u."""
        m = Int32(0)
        for e in cutlass.range_constexpr(self.U * V):
            u = ku[e]
            if cutlass.const_expr(by_range):
                x = u.bitcast(Float32)
                above = x >= b
                if above and x < Float32(float("inf")):
                    m = m | Int32(1 << e)
                if x >= a and not above:
                    m = m | Int32(((1 << (16 + e)) + 2**31) % 2**32 - 2**31)     # bit 31 as a negative int32
            else:
                ok = self.finite_key(u)
                take = ok and (u ^ Int32(SIGN)) > a
                take = take or (ties_too and ok and u == b)
                if take:
                    m = m | Int32(1 << e)
        return m
