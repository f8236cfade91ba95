"""Ordering the selected set of a top-k row (Hopper sm_90a, CuTe DSL): the last step of topk_sm90.TopkSm90 and
stream_sm90.TopkStreamSm90, shared by both through the SelectionSort mixin.

Input (shared memory, after a CTA barrier that follows every append): sel_u[0:n_sel] / sel_c[0:n_sel], the selected
(key u, column) pairs in any order, n_sel = misc[4] <= k <= P (P = k padded to a power of two, 32..2048). Output:
out[i] for i < k = the column of the i-th element in descending key order, ties lower column first, -1 for
i >= n_sel. ks = u ^ 0x80000000 orders keys as signed ints; padding is u = 0 (ks = INT_MIN), below every real key.

Four ways (SORT), same output bits:
  "bucket" (default, every P): a counting sort by key range, then a rank inside each bucket. The selection's largest
         and smallest keys (warp redux, one atomic max / min a warp) give a shift s that maps [kmin, kmax] onto NB =
         max(2 P, NT) buckets (BUCKETS_PER_KEY x P with that knob), bucket = (kmax >> s) - (ks >> s) (descending keys,
         ascending buckets); an atomic count a pair gives its place in the bucket (arrival order), a CTA scan of the
         counts (NB / NT buckets a thread) the buckets' first slots; the pairs are written grouped by bucket into sel_u
         / sel_c (free: every thread holds its own in registers), and each pair's slot = its bucket's first slot + the
         pairs of its bucket that sort before it (larger key, or equal key and lower column: exact, whatever the arrival
         order).
         7 barriers and about 4 shared-memory accesses a pair plus two a bucket neighbour, against the 66-stage
         network of "key". The key-linear buckets are log-like in the score (they absorb a sink far above the rest)
         but waste most buckets on the binades near zero when the selection reaches or crosses zero (the top half of
         a row of 4096: buckets of up to 80); when a bucket holds more than BUCKET_MAX the counts are redone with
         buckets linear in the score value, d = (vmax / 2 - v / 2) (NB - 1) / (vmax / 2 - vmin / 2) truncated (halves:
         no overflow; monotone in v, so still in key order; a span under 1e-30 gives one bucket), 3 barriers more.
         A bucket of more than BUCKET_MAX with both (a run of equal keys, or a sink in a selection that crosses
         zero) is seen before anything moves and sends the row to "key" (P < NT: "smem"). tests/
         test_topk_bucket_sort.py emulates the index logic on the CPU.
  "key"  (P >= NT): a bitonic network over the keys alone, then each pair's slot by rank. Keys are sorted
         descending with one max and one min per compare-exchange (every segment made descending by inverting the
         keys of ascending segments, ~ks, for the length of a merge phase), E = P / NT keys a thread in registers,
         partners closer than 32 E a shuffle away, farther ones through sel_u (write own, barrier, read partner,
         barrier). Then each pair finds its slot = the number of keys above its own (a binary search of the sorted
         keys, 11 steps at P 2048) and writes its column there. Equal keys form a run [lb, lb + g) of the sorted
         keys: its members take slots lb + an atomic count (cnt[lb], the scratch buffer), and the thread holding the
         run's first sorted key then puts the run's columns in ascending order (g <= GROUP_MAX). A longer run
         (many equal scores, e.g. exact zeros) sends the whole row to the pair network ("regs"), the pairs restored
         from registers first. Against "regs": one register a key instead of two, two instructions a
         compare-exchange instead of about ten, half the shuffles and shared-memory traffic.
  "regs" (P >= NT): the bitonic network on (key, column) pairs, E a thread in registers, the same exchange pattern.
  "smem": the same network entirely in shared memory, one barrier a stage (P < NT always takes it).
The column-order variant (by_column; topk_fwd(order="column"), indexer_topk(sorted=False)): the same selection in
ascending column order. Rows of up to 32 x BITMAP_WORDS columns: a bitmap of the row in cnt (one atomic or a
selected column), thread t owns a contiguous range of words, a CTA scan of their set-bit counts places its columns,
written in bit order; no sort. Wider rows: keys ks = ~column (unique) through the ordering above.
Shared-memory handoffs: sel_u (exchange, then the sorted keys), sel_c (the columns by slot), cnt (counters or the
bitmap), part (scan partials) and misc[7] (the long-run flag) are each read only after a CTA barrier that follows
all their writers; each thread reads back only its own slots of sel_u before it overwrites them. "bucket": misc[2] /
misc[3] (the range) are seeded before the barrier that precedes their atomics and read after the next (B1); the
counts after B2; part and the too-big flag misc[7] after B3, and misc[7] is cleared (for the value-linear counts or
the fallback) only after one more barrier; the value-linear counts: buckets zeroed and the flag cleared after B3a,
counted after B4a, read after B5a, part and the flag after B6a; the first slots after B4; the grouped pairs are written after B1 (every thread has read its own pairs)
and read after B5; the ordered columns are written after B6 (every grouped pair read) and read after B7.

Status of "bucket" (H100 only; no H200 was to be had): 2026-12-06 13:30 (perf/topk_bucket_2026-12-06T1330_h100_*,
key-linear buckets only) and 14:06 (perf/topk_bucket_2026-12-06T1405_h100_*, with the value-linear second count):
tests/gpu/test_dsa_topk.py 104 passed both times (test_sort_paths: every ordering at k 64, 300, 1000, 2048 with runs
of BUCKET_MAX and more, an outlier, denormal ties, selections that cross zero, with a sink, of tiny scores),
racecheck 0 hazards, memcheck 0 errors (sanitize_dsa_topk: every fallback); ptxas 39 registers, no spills.
bench/ab_topk.py, 32K rows, same run, base = the key network with the score order on two passes for k > 512: at
14:06 with the one read at every k, score order k 2048 2.88 vs 3.62 ms, W 4K 1.29 vs 2.16 (1.82 at 13:30, before the
value-linear count: its rows overflowed the key buckets), causal 2.62 vs 3.53, rounded 4.78 vs 5.59; column order
unchanged (its bitmap).
Status of "key" (H200, 2026-12-05, perf/topk_key_sort_2026-12-05T0341.txt): tests/gpu/test_dsa_topk.py 79 passed (every ordering,
both kernels, runs of 2..GROUP_MAX, exactly GROUP_MAX and GROUP_MAX + 1 equal keys), racecheck 0 hazards, memcheck 0
errors (sanitize_dsa_topk, with rows of short runs). 32K x 32K fp32, k 2048, streaming kernel, same run: "key" 3.77 ms
against "regs" 4.23 (randn), 3.57 / 4.04 (causal), 2.09 / 2.37 (W 4K); rows whose top k hold runs longer than
GROUP_MAX (randn x 4000 rounded) 6.13 / 6.09 (the fallback sorts twice). k 64: 2.37 ms, so the ordering of 2048 now
costs ~1.4 ms (was ~1.9). The first run found a race: a run's guarded loads of sel_c were merged by ptxas into one
unguarded 128-bit load reaching into the next run's slots; the index is now clamped into the run (order_run).
The index logic is also checked on the CPU by a NumPy emulation (tests/test_topk_key_sort.py). The run sort then
moved in place (insertion with clamped indices, no register array: the (lengths, rank 3) variant had spilled 8
bytes): test_dsa_topk 79 passed, racecheck / memcheck clean (H200 04:25, perf/topk_hist_copies_2026-12-05T0425.txt;
that tree's streaming kernel had two histogram copies, since removed: the final PTX equals that tree's with one).
The column-order variant (H200, 2026-12-05 05:08-05:12, perf/topk_column_2026-12-05T0508.txt): test_dsa_topk 89 passed
with test_column_order* (both kernels, bitmap and key-sort widths, reruns, graph capture), racecheck 0 hazards,
memcheck 0 errors; 32K x 32K k 2048: 2.77 ms (score order 3.72), W 4K 0.92 ms (2.08); the score-order variants'
PTX did not change when it was added.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ...common.cta_scan import add_warps_before, warp_inclusive_scan

NT = 512                     # threads of a top-k CTA
SIGN = -2147483648           # 0x80000000 as int32
GROUP_MAX = 8                # longest run of equal keys the "key" sort orders in place; a longer one -> "regs"
BUCKET_MAX = 32              # largest bucket the "bucket" sort ranks by a scan of it; a larger one -> "key" (or "smem")
BITMAP_WORDS = 4096          # column order: rows of up to 32 x this many columns go through a bitmap (cnt's 16 KiB)


def network_stages(p):
    """The bitonic network of p elements in stage order: (merge size, stride) pairs."""
    return [(1 << a, 1 << b) for a in range(1, p.bit_length()) for b in range(a - 1, -1, -1)]


class SelectionSort:
    """Mixin of topk_sm90.TopkSm90: needs self.P (padded k), self.by_column (the column-order variant) and
    self.scratch_counters() (how many int32 counters the cnt scratch passed to sort_and_write holds)."""

    SORT = "bucket"          # "bucket" | "key" | "regs" | "smem" (P < NT: "bucket" or else "smem")
    # "bucket": NB = max(BUCKETS_PER_KEY x P, NT) buckets; the scratch (cnt) must hold NB counters. 4 (a trial knob,
    # 2026-12-06, not run on a GPU yet) halves the keys a lane scans in its bucket (the rank loop ran 5.1 times a warp
    # and element at 2 on causal rows: docs/performance.md, 2026-12-06 19:00-20:05); stream_sm90 then lends the
    # candidates' two buffers as one scratch of 2 CAND counters
    BUCKETS_PER_KEY = 2

    @cute.jit
    def sort_and_write(self, sel_u, sel_c, cnt, part, misc, gOut, k, tid, width):
        """After every append (a barrier first): pad the selection to P (u = 0 sorts last), order it, write the k
        output columns (-1 past n_sel). cnt: max(P, BITMAP_WORDS) int32 of scratch shared memory and part NT / 32
        int32 (both free at this point). by_column: ascending columns instead of descending scores, through a
        bitmap of the row's columns when width <= 32 BITMAP_WORDS, else through the sorts below on keys made from
        the columns (ks = ~column: unique, so no runs)."""
        P = self.P
        cute.arch.sync_threads()
        n_sel = misc[4]
        if cutlass.const_expr(self.by_column):
            if width <= 32 * BITMAP_WORDS:
                self.columns_by_bitmap(sel_c, cnt, part, n_sel, tid, width)
            else:
                self.pad_and_sort(sel_u, sel_c, cnt, part, misc, n_sel, tid)
        else:
            self.pad_and_sort(sel_u, sel_c, cnt, part, misc, n_sel, tid)
        for i in cutlass.range(tid, k, NT, unroll=1):
            if i < P:
                gOut[i] = Int32(cutlass.select_(i < n_sel, sel_c[i], Int32(-1)))
            else:
                gOut[i] = Int32(-1)

    @cute.jit
    def pad_and_sort(self, sel_u, sel_c, cnt, part, misc, n_sel, tid):
        """Pad the selection to P and sort it (SORT); ends with the ordered columns in sel_c and a barrier."""
        P = self.P
        for i in cutlass.range(n_sel + tid, P, NT, unroll=1):
            sel_u[i] = Int32(0)
            sel_c[i] = Int32(2147483647)
        if cutlass.const_expr(self.by_column):
            for i in cutlass.range(tid, n_sel, NT, unroll=1):
                sel_u[i] = (sel_c[i] ^ Int32(-1)) ^ Int32(SIGN)     # ks = ~column: larger ks = lower column
        if tid == 0:
            misc[7] = Int32(0)
            if cutlass.const_expr(self.SORT == "bucket"):
                misc[2] = Int32(SIGN)               # the selection's largest key (ks), by atomic max
                misc[3] = Int32(2147483647)         # its smallest, by atomic min
        cute.arch.sync_threads()                    # padding, the flag and the range's seeds written
        if cutlass.const_expr(self.SORT == "bucket"):
            if self.bucket_rank_sort(sel_u, sel_c, cnt, part, misc, n_sel, tid):
                # a bucket over BUCKET_MAX: sel_u / sel_c as on entry; the key sort (P < NT: the network)
                if cutlass.const_expr(P >= NT):
                    cute.arch.sync_threads()        # every thread read the flag before it is cleared
                    if tid == 0:                    # (key_rank_sort adds to it only after a barrier of its own)
                        misc[7] = Int32(0)
                    if self.key_rank_sort(sel_u, sel_c, cnt, misc, tid):
                        if cutlass.const_expr(self.by_column):
                            self.bitonic(sel_u, sel_c, tid)
                        else:
                            self.bitonic_regs(sel_u, sel_c, tid)
                else:
                    self.bitonic(sel_u, sel_c, tid)
        elif cutlass.const_expr(P >= NT and self.SORT == "key"):
            if self.key_rank_sort(sel_u, sel_c, cnt, misc, tid):
                if cutlass.const_expr(self.by_column):
                    # not reached (ks = ~column are unique: no run); the shared-memory network keeps the column
                    # variant's registers below the register network's (which spilled 8 bytes there)
                    self.bitonic(sel_u, sel_c, tid)
                else:
                    self.bitonic_regs(sel_u, sel_c, tid)
        elif cutlass.const_expr(P >= NT and self.SORT == "regs"):
            self.bitonic_regs(sel_u, sel_c, tid)
        else:
            self.bitonic(sel_u, sel_c, tid)

    # ---------------------------------------------------------------------------------------------- by column
    @cute.jit
    def columns_by_bitmap(self, sel_c, bits, part, n_sel, tid, width):
        """sel_c[0:n_sel] (distinct columns < width) -> ascending order in place: a bit a column (bits, atomic or),
        thread t owns the words [t wpt, (t + 1) wpt), a CTA scan of its set bits gives where its columns go. Ends
        with a barrier."""
        lane = tid % 32
        warp = tid // 32
        nw = (width + 31) // 32
        wpt = (nw + (NT - 1)) // NT
        for w in cutlass.range(tid, nw, NT, unroll=1):
            bits[w] = Int32(0)
        cute.arch.sync_threads()                    # the bitmap cleared
        for i in cutlass.range(tid, n_sel, NT, unroll=1):
            c = sel_c[i]
            cute.arch.atomic_or(bits.iterator + (c >> 5), Int32(1) << (c & 31))
        cute.arch.sync_threads()                    # every bit set, every sel_c entry read
        cnt = Int32(0)
        for j in cutlass.range(wpt, unroll=1):
            w = tid * wpt + j
            if w < nw:
                cnt += cute.arch.popc(bits[w])
        incl = warp_inclusive_scan(cnt, lane)
        if lane == 31:
            part[warp] = incl
        cute.arch.sync_threads()                    # every warp's total written
        pos = add_warps_before(incl - cnt, part, warp, NT // 32)
        for j in cutlass.range(wpt, unroll=1):
            w = tid * wpt + j
            if w < nw:
                word = bits[w]
                for b in cutlass.range_constexpr(32):
                    if ((word >> b) & 1) != 0:
                        sel_c[pos] = w * 32 + b
                        pos = pos + 1
        cute.arch.sync_threads()                    # the ordered columns complete before the output loop

    # ---------------------------------------------------------------------------------------------- "bucket"
    @cute.jit
    def bucket_rank_sort(self, sel_u, sel_c, cnt, part, misc, n_sel, tid):
        """The "bucket" sort (module docstring). Returns True when a bucket holds more than BUCKET_MAX keys: then
        nothing was moved (sel_u / sel_c as on entry, misc[7] nonzero) and the caller orders the row another way.
        Needs misc[2] = INT_MIN, misc[3] = INT_MAX and misc[7] = 0 written before its first barrier."""
        P = self.P
        E = max(P // NT, 1)                         # elements a thread (tid * E + r); P < NT: threads past P idle
        NB = max(self.BUCKETS_PER_KEY * P, NT)      # buckets, in cnt[0:NB]
        assert NB <= self.scratch_counters(), f"bucket sort: {NB} buckets, {self.scratch_counters()} counters"
        BPT = NB // NT                              # buckets a thread owns in the scan
        LOG_NB = NB.bit_length() - 1
        lane = tid % 32
        warp = tid // 32
        ka = cute.make_rmem_tensor((E,), Int32)     # keys (ks) of this thread's pairs
        cc = cute.make_rmem_tensor((E,), Int32)     # their columns
        bk = cute.make_rmem_tensor((E,), Int32)     # their buckets, then their slots
        at = cute.make_rmem_tensor((E,), Int32)     # their places within the bucket (arrival order)
        hi = Int32(SIGN)
        lo = Int32(2147483647)
        for r in cutlass.range_constexpr(E):
            i = tid * E + r
            ka[r] = Int32(SIGN)
            cc[r] = Int32(0)
            if i < n_sel:
                ka[r] = sel_u[i] ^ Int32(SIGN)
                cc[r] = sel_c[i]
                hi = cutlass.max(hi, ka[r])
                lo = cutlass.min(lo, ka[r])
        for j in cutlass.range_constexpr(BPT):
            cnt[tid * BPT + j] = Int32(0)
        hi = cute.arch.warp_redux_sync(hi, "max")
        lo = cute.arch.warp_redux_sync(lo, "min")
        if lane == 0:
            cute.arch.atomic_max(misc.iterator + 2, hi)
            cute.arch.atomic_min(misc.iterator + 3, lo)
        cute.arch.sync_threads()                    # B1: buckets zeroed, the range complete, every pair read
        kmax = misc[2]
        kmin = misc[3]
        # the bucket of ks is (kmax >> s) - (ks >> s) (arithmetic shifts), at most (R >> s) + 1 for the range
        # R = kmax - kmin (< 2^32: its wrapped int32 bits read as unsigned by clz); s = bits(R) - LOG_NB makes
        # R >> s < NB, one more bit when the bucket of kmin would still be NB; s = 0 only for R < NB, so the int32
        # differences never overflow (s >= 1 halves the keys' span)
        bits = Int32(32) - Int32(cute.arch.clz(kmax - kmin))
        s = cutlass.max(bits - LOG_NB, Int32(0))
        s = s + Int32(cutlass.select_((kmax >> s) - (kmin >> s) >= NB, Int32(1), Int32(0)))
        top = kmax >> s
        for r in cutlass.range_constexpr(E):
            if tid * E + r < n_sel:
                bk[r] = top - (ka[r] >> s)
                at[r] = cute.arch.atomic_add(cnt.iterator + bk[r], Int32(1))
        cute.arch.sync_threads()                    # B2: every bucket's count complete
        mine = cute.make_rmem_tensor((BPT,), Int32)
        sc = cute.make_rmem_tensor((2,), Int32)     # (this thread's inclusive warp prefix, its buckets' total)
        self.count_buckets(cnt, part, misc, mine, sc, tid, BPT)
        cute.arch.sync_threads()                    # B3: the warps' totals and the flag complete
        if misc[7] != 0:
            # key-linear buckets failed (the keys of a selection that crosses zero or reaches near it spread over
            # many binades): buckets linear in the score value, from halves (no overflow), one pass more
            cute.arch.sync_threads()                # B3a: every thread read the flag and its buckets
            for j in cutlass.range_constexpr(BPT):
                cnt[tid * BPT + j] = Int32(0)
            if tid == 0:
                misc[7] = Int32(0)
            fmax = self.float_of_ks(kmax) * Float32(0.5)
            span = fmax - self.float_of_ks(kmin) * Float32(0.5)
            scale = Float32(cutlass.select_(span > Float32(1e-30), Float32(NB - 1) / span, Float32(0.0)))
            cute.arch.sync_threads()                # B4a: buckets zeroed, the flag cleared
            for r in cutlass.range_constexpr(E):
                if tid * E + r < n_sel:
                    d = (fmax - self.float_of_ks(ka[r]) * Float32(0.5)) * scale   # monotone in the key, >= 0
                    bk[r] = cutlass.min(Int32(d), Int32(NB - 1))
                    at[r] = cute.arch.atomic_add(cnt.iterator + bk[r], Int32(1))
            cute.arch.sync_threads()                # B5a: every bucket's count complete
            self.count_buckets(cnt, part, misc, mine, sc, tid, BPT)
            cute.arch.sync_threads()                # B6a: the warps' totals and the flag complete
        too_big = misc[7] != 0
        if misc[7] == 0:
            incl = sc[0]
            total = sc[1]
            start = add_warps_before(incl - total, part, warp, NT // 32)
            for j in cutlass.range_constexpr(BPT):  # own buckets: counts -> first slots
                cnt[tid * BPT + j] = start
                start = start + mine[j]
            cute.arch.sync_threads()                # B4: every bucket's first slot written
            for r in cutlass.range_constexpr(E):    # the pairs grouped by bucket (every thread read its own: B1)
                if tid * E + r < n_sel:
                    b = bk[r]
                    first = cnt[b]
                    sel_u[first + at[r]] = ka[r]
                    sel_c[first + at[r]] = cc[r]
                    at[r] = Int32(cutlass.select_(b + 1 < NB, cnt[cutlass.min(b + 1, NB - 1)], n_sel))   # its end
                    bk[r] = first
            cute.arch.sync_threads()                # B5: the grouped pairs complete
            for r in cutlass.range_constexpr(E):    # slot = first slot + the bucket's pairs that sort before
                if tid * E + r < n_sel:
                    n = Int32(0)
                    for j in cutlass.range(bk[r], at[r], 1, unroll=1):
                        u = sel_u[j]
                        before = u > ka[r] or (u == ka[r] and sel_c[j] < cc[r])
                        n = n + Int32(cutlass.select_(before, Int32(1), Int32(0)))
                    bk[r] = bk[r] + n
            cute.arch.sync_threads()                # B6: every grouped pair read
            for r in cutlass.range_constexpr(E):
                if tid * E + r < n_sel:
                    sel_c[bk[r]] = cc[r]
            cute.arch.sync_threads()                # B7: every column at its slot
        return too_big

    @cute.jit
    def count_buckets(self, cnt, part, misc, mine, sc, tid, BPT: cutlass.Constexpr):
        """After the counts' barrier: this thread's buckets' counts into mine, sc = (its inclusive warp prefix of
        their total, the total), the warp's total to part[warp], misc[7] |= 1 when one holds more than BUCKET_MAX."""
        lane = tid % 32
        total = Int32(0)
        big = Int32(0)
        for j in cutlass.range_constexpr(BPT):
            mine[j] = cnt[tid * BPT + j]
            total = total + mine[j]
            big = big | Int32(cutlass.select_(mine[j] > BUCKET_MAX, Int32(1), Int32(0)))
        if big != 0:
            cute.arch.atomic_or(misc.iterator + 7, Int32(1))
        incl = warp_inclusive_scan(total, lane)
        if lane == 31:
            part[tid // 32] = incl
        sc[0] = incl
        sc[1] = total

    @cute.jit
    def float_of_ks(self, ks):
        """The score of signed key ks (key_of's order-preserving map inverted; its own inverse on the bits)."""
        return (ks ^ ((ks >> 31) & 0x7FFFFFFF)).bitcast(Float32)

    # ---------------------------------------------------------------------------------------------- "key"
    @cute.jit
    def key_rank_sort(self, sel_u, sel_c, cnt, misc, tid):
        """The "key" sort (module docstring). Returns True when a run of equal keys is longer than GROUP_MAX: then
        sel_u / sel_c hold the selection again (as on entry) for the pair network, and nothing is ordered."""
        P = self.P
        E = P // NT
        pad = Int32(SIGN)
        ka = cute.make_rmem_tensor((E,), Int32)     # keys (ks), sorted in place
        k0 = cute.make_rmem_tensor((E,), Int32)     # this thread's pairs as loaded
        cc = cute.make_rmem_tensor((E,), Int32)
        for r in cutlass.range_constexpr(E):
            ka[r] = sel_u[tid * E + r] ^ Int32(SIGN)
            k0[r] = ka[r]
            cc[r] = sel_c[tid * E + r]
        for size, stride in network_stages(P):
            if cutlass.const_expr(stride == size // 2):
                self.orient(ka, tid, size)          # a merge phase begins
            if cutlass.const_expr(stride < E):
                for r in cutlass.range_constexpr(E):
                    j = r ^ stride
                    if cutlass.const_expr(j > r):
                        hi = cutlass.max(ka[r], ka[j])
                        ka[j] = cutlass.min(ka[r], ka[j])
                        ka[r] = hi
            else:
                m = stride // E
                o, = self.partners((ka,), (sel_u,), tid, m)
                lower = (tid & m) == 0              # the lower slot of a descending pair keeps the max
                for r in cutlass.range_constexpr(E):
                    ka[r] = Int32(cutlass.select_(lower, cutlass.max(ka[r], o[r]), cutlass.min(ka[r], o[r])))
            if cutlass.const_expr(stride == 1):
                self.orient(ka, tid, size)          # the phase ends
        for r in cutlass.range_constexpr(E):
            sel_u[tid * E + r] = ka[r]
            cnt[tid * E + r] = Int32(0)
        cute.arch.sync_threads()                    # sorted keys and zeroed counters complete
        for r in cutlass.range_constexpr(E):
            i = tid * E + r
            far = sel_u[cutlass.min(i + GROUP_MAX, P - 1)]
            if ka[r] != pad and i + GROUP_MAX < P and far == ka[r]:
                cute.arch.atomic_add(misc.iterator + 7, Int32(1))     # a run longer than GROUP_MAX
        cute.arch.sync_threads()                    # the flag complete
        too_long = misc[7] != 0
        if too_long:
            for r in cutlass.range_constexpr(E):
                sel_u[tid * E + r] = k0[r] ^ Int32(SIGN)
                sel_c[tid * E + r] = cc[r]
            cute.arch.sync_threads()                # the selection restored for the pair network
        else:
            for r in cutlass.range_constexpr(E):
                key = k0[r]
                if key != pad:
                    lb = Int32(0)                   # keys above `key`: its run starts at lb
                    for b in cutlass.range_constexpr(self.P.bit_length() - 1):
                        step = self.P >> (b + 1)
                        lb = lb + Int32(cutlass.select_(sel_u[lb + (step - 1)] > key, Int32(step), Int32(0)))
                    slot = lb
                    nxt = sel_u[cutlass.min(lb + 1, self.P - 1)]
                    if lb + 1 < self.P and nxt == key:
                        slot = lb + cute.arch.atomic_add(cnt.iterator + lb, Int32(1))
                    sel_c[slot] = cc[r]
            cute.arch.sync_threads()                # every column at its slot
            for r in cutlass.range_constexpr(E):
                self.order_run(sel_u, sel_c, tid * E + r, ka[r])
            cute.arch.sync_threads()                # runs ordered before the output loop
        return too_long

    @cute.jit
    def partners(self, vals, bufs, tid, m: cutlass.Constexpr):
        """For each register array of vals (E = P / NT a thread, element tid * E + r), the same registers of thread
        tid ^ m: a shuffle when m < 32, else through the shared buffer of bufs at the same position (write own,
        barrier, read partner, barrier)."""
        E = self.P // NT
        outs = tuple(cute.make_rmem_tensor((E,), Int32) for _ in vals)
        if cutlass.const_expr(m < 32):
            for r in cutlass.range_constexpr(E):
                for a in cutlass.range_constexpr(len(vals)):
                    outs[a][r] = cute.arch.shuffle_sync_bfly(vals[a][r], offset=m)
        else:
            for r in cutlass.range_constexpr(E):
                for a in cutlass.range_constexpr(len(vals)):
                    bufs[a][tid * E + r] = vals[a][r]
            cute.arch.sync_threads()                # every thread's elements written
            for r in cutlass.range_constexpr(E):
                for a in cutlass.range_constexpr(len(vals)):
                    outs[a][r] = bufs[a][(tid ^ m) * E + r]
            cute.arch.sync_threads()                # every partner read before the next write
        return outs

    @cute.jit
    def orient(self, ka, tid, size: cutlass.Constexpr):
        """Invert (~ks) the keys of the ascending segments of merge phase `size` (element i ascends when i & size),
        so that every compare-exchange of the phase is descending; applied again after the phase to undo it."""
        E = self.P // NT
        if cutlass.const_expr(size < self.P):
            for r in cutlass.range_constexpr(E):
                flip = ((tid * E + r) & size) != 0
                ka[r] = ka[r] ^ Int32(cutlass.select_(flip, Int32(-1), Int32(0)))

    @cute.jit
    def order_run(self, sel_u, sel_c, i, v):
        """If slot i starts a run of equal keys (sorted key v = sel_u[i], not padding): sort the run's columns
        sel_c[i : i + g] ascending (g <= GROUP_MAX), in place."""
        P = self.P
        prev = sel_u[cutlass.max(i - 1, 0)]
        nxt = sel_u[cutlass.min(i + 1, P - 1)]
        starts = v != Int32(SIGN) and i + 1 < P and nxt == v and (i == 0 or prev != v)
        if starts:
            g = Int32(1)
            for j in cutlass.range_constexpr(1, GROUP_MAX):
                same = i + j < P and sel_u[cutlass.min(i + j, P - 1)] == v
                g = g + Int32(cutlass.select_(same, Int32(1), Int32(0)))
            # insertion sort in place; every index is clamped into the run [i, i + g): ptxas turns guarded loads
            # into unguarded (vector) ones, and a load past the run would race with the next run's thread
            # (racecheck, 2026-12-05)
            for a in cutlass.range_constexpr(1, GROUP_MAX):
                if a < g:
                    x = sel_c[i + cutlass.min(Int32(a), g - 1)]
                    pos = Int32(a)
                    for b in cutlass.range_constexpr(a - 1, -1, -1):
                        y = sel_c[i + cutlass.min(Int32(b), g - 1)]
                        if y > x:                   # the sorted prefix's larger columns move up one slot
                            sel_c[i + b + 1] = y
                            pos = Int32(b)
                    sel_c[i + pos] = x

    # ---------------------------------------------------------------------------------------------- "regs"
    @cute.jit
    def before(self, ua, ca, ub, cb):
        """(ua, ca) sorts before (ub, cb): larger key first, then lower column."""
        ka, kb = ua ^ Int32(SIGN), ub ^ Int32(SIGN)
        return ka > kb or (ka == kb and ca < cb)

    @cute.jit
    def bitonic_regs(self, sel_u, sel_c, tid):
        """The bitonic network of bitonic() on (key, column) pairs, E = P / NT elements a thread in registers
        (element i = tid * E + r): partners closer than E are in the thread, closer than 32 E a shuffle away,
        farther ones exchanged through shared memory (write own, barrier, read partner, barrier): 10 barrier stages
        at P = 2048 instead of 66. A pair (lo, hi) of a descending segment keeps the element that sorts first at
        lo; each thread keeps, of itself and its partner, the one its position wants. Ends with the sorted pairs in
        sel_u / sel_c and a barrier."""
        P = self.P
        E = P // NT
        ru = cute.make_rmem_tensor((E,), Int32)
        rc = cute.make_rmem_tensor((E,), Int32)
        for r in cutlass.range_constexpr(E):
            ru[r] = sel_u[tid * E + r]
            rc[r] = sel_c[tid * E + r]
        for size, stride in network_stages(P):
            if cutlass.const_expr(stride < E):
                for r in cutlass.range_constexpr(E):
                    j = r ^ stride
                    if cutlass.const_expr(j > r):
                        desc = ((tid * E + r) & size) == 0
                        ua, ub, ca, cb = ru[r], ru[j], rc[r], rc[j]
                        swap = self.before(ua, ca, ub, cb) != desc
                        ru[r] = Int32(cutlass.select_(swap, ub, ua))
                        ru[j] = Int32(cutlass.select_(swap, ua, ub))
                        rc[r] = Int32(cutlass.select_(swap, cb, ca))
                        rc[j] = Int32(cutlass.select_(swap, ca, cb))
            else:
                ou, oc = self.partners((ru, rc), (sel_u, sel_c), tid, stride // E)
                for r in cutlass.range_constexpr(E):
                    i = tid * E + r
                    want_first = ((i & stride) == 0) == ((i & size) == 0)
                    take = self.before(ru[r], rc[r], ou[r], oc[r]) != want_first
                    ru[r] = Int32(cutlass.select_(take, ou[r], ru[r]))
                    rc[r] = Int32(cutlass.select_(take, oc[r], rc[r]))
        for r in cutlass.range_constexpr(E):
            sel_u[tid * E + r] = ru[r]
            sel_c[tid * E + r] = rc[r]
        cute.arch.sync_threads()                    # the sorted selection complete before the output loop

    # ---------------------------------------------------------------------------------------------- "smem"
    @cute.jit
    def bitonic(self, sel_u, sel_c, tid):
        """The bitonic network in shared memory, one barrier a stage."""
        P = self.P
        for size, stride in network_stages(P):
            for i in cutlass.range(tid, P // 2, NT, unroll=1):
                lo = 2 * i - (i & (stride - 1))
                hi = lo + stride
                desc = (lo & size) == 0
                ua, ub = sel_u[lo], sel_u[hi]
                ca, cb = sel_c[lo], sel_c[hi]
                if self.before(ua, ca, ub, cb) != desc:
                    sel_u[lo] = ub
                    sel_u[hi] = ua
                    sel_c[lo] = cb
                    sel_c[hi] = ca
            cute.arch.sync_threads()
