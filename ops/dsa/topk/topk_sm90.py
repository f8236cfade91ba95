"""Row-wise top-k of fp32 scores for Hopper (sm_90a), CuTe DSL: radix select, then an ordering of the selection.

Semantics (docs/dsa.md, "Top-k"): per row, the columns of the k largest FINITE scores in descending score order,
ties lower column first (a total order: the output is bitwise deterministic); -inf, +inf and NaN are never
selected; slots past the number of selectable scores are -1; with lengths, row r sees columns [0, lengths[r]).

Keys. A finite float x maps to the order-preserving 32-bit pattern u = ks ^ 0x80000000, ks = b ^ ((b >> 31) &
0x7fffffff) (b the bits of x; ks orders like x as a signed int). Every finite x has u != 0; u = 0 marks a score that
cannot be selected. Radix digits are bit fields of u (11, 7, 7, 7 bits from the top); orderings compare ks (signed).

Algorithm. One CTA (512 threads) per row.
  1. Load: a row that fits (W <= CAP columns) is copied into shared memory with 4-byte cp.async, every column's
     copy in flight at once (one wait, then a CTA barrier), and turned into keys u in place; a longer row is read
     from global memory in each pass. The same sweep counts the selectable keys and builds the histogram of the
     top 11-bit digit (pass 0; a quarter of a binade per bin, so the threshold's bin holds few keys).
  2. If at most k are selectable, all are taken. Otherwise radix select, 4 passes from the top (digits of 11, 7,
     7 and 7 bits): a shared-memory histogram of the digit of every key matching the prefix so far, a suffix scan
     over the bins finds the digit holding the k-th largest; after 4 passes T (the k-th largest u) is exact, with `need` = how
     many keys equal to T are taken and `eq` = how many exist. Candidate mode (the row is cached and pass 0's digit
     holds at most CAND keys, the common case): one sweep appends the keys above that digit to the selection and
     the keys in it (with their columns) to a candidate buffer; passes 1-3 and the final gather then touch only
     the candidates. Otherwise passes 1-3 and the gather sweep the whole row.
  3. Gather: keys > T (and all keys == T when need == eq) join the selection; when need < eq the ties are ranked
     by column over the whole row (ordered chunks of 512 columns: ballot + warp prefix + block prefix) and the
     first `need` are taken.
  4. Order the selection (sort_sm90.SelectionSort, shared with the streaming kernel): by default a bitonic network
     over the keys alone, then each (key, column) pair's slot by rank, runs of equal keys ordered by column; write
     the first k columns (-1 past the selected count).
Histogram adds are warp-aggregated (match.any: one atomic per distinct digit of a warp, so scores sharing their top
bits do not serialise 32 atomics on one bin); appends to the selection / candidates are warp-aggregated (ballot:
one atomic per warp). Shared-memory handoffs: every buffer written by many threads (row cache, histogram, scan
partials, selection, candidates, counters) is read only after a CTA barrier (sync_threads) that follows all its
writers; the cp.async row copy is waited for by each thread (cp.async.wait_group 0) before that barrier.

Rows whose base is 16-byte aligned (the common case) go to the streaming kernel, stream_sm90.TopkStreamSm90 (same
output bits, 3x faster at 32K x 32K); this kernel serves the others and PADDLE_DSA_TOPK_STREAM=0.

Status (H200, 2026-12-03): tests/gpu/test_dsa_topk.py passes on this kernel and on the streaming one (equal bits),
racecheck and memcheck clean. 32K rows x 32K columns, k 2048: 13.16 ms with the register / shuffle sort (SORT "regs";
10.31 ms on the indexer's own scores, 15.6 ms first version), against 4.33 ms for stream_sm90 on aligned rows: the
per-column load and sweeps (~1.3 ns a column per SM: 4-byte cp.async and match.any per element, one CTA an SM) are
what the streaming kernel removed. This kernel now only serves unaligned rows.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

from ...common.cta_scan import add_warps_before, add_warps_before_and_total, warp_inclusive_scan
from .sort_sm90 import BITMAP_WORDS, NT, SIGN, SelectionSort

WARPS = NT // 32
CAP = 40960                  # row columns cached in shared memory (160 KiB)
CAND = 4096                  # candidate (key, column) pairs after pass 0 (32 KiB)
assert CAND >= max(2048, BITMAP_WORDS)     # cand_u is sort_sm90's scratch (counters, the column bitmap)
SHIFT0 = 21                  # pass 0 digit: the top 11 bits of u (sign, exponent, 2 mantissa bits: 1/4 binade)
BINS0 = 1 << (32 - SHIFT0)


def pad_k(k):
    """The sort size for k: the next power of two, at least 32."""
    p = 32
    while p < k:
        p *= 2
    return p


class TopkSm90(SelectionSort):
    """One compiled variant: (P = padded k, has_lengths, rank 3 inputs)."""

    # the radix digits below the pass-0 digit, from the top (bits each; they sum to SHIFT0, each at most 11: hist
    # holds BINS0 bins). (11, 10): one pass fewer, but a 2048-bin histogram to clear and walk in each (on the H100,
    # 2026-12-06 17:20: rows of 4K columns 1.02-1.03x the time, 32K-column rows 0.96x; the streaming kernel's one
    # read has its own digits, TopkStreamSm90.ONE_READ_DIGITS)
    REFINE_DIGITS = (7, 7, 7)

    def __init__(self, p: int, has_lengths: bool, rank3: bool, by_column: bool = False):
        assert p >= 32 and p & (p - 1) == 0 and p <= 2048, p
        self.P = p
        self.has_lengths = has_lengths
        self.rank3 = rank3
        self.by_column = by_column       # output in ascending column order (sort_sm90), not by descending score

    @cute.jit
    def __call__(self, mS: cute.Tensor, mOut: cute.Tensor, mLen: cute.Tensor, k: Int32, stream):
        P = self.P

        @cute.struct
        class SharedStorage:
            keys: cute.struct.Align[cute.struct.MemRange[Int32, CAP], 16]
            sel_u: cute.struct.MemRange[Int32, P]
            sel_c: cute.struct.MemRange[Int32, P]
            cand_u: cute.struct.MemRange[Int32, CAND]
            cand_c: cute.struct.MemRange[Int32, CAND]
            hist: cute.struct.MemRange[Int32, BINS0]
            part: cute.struct.MemRange[Int32, WARPS]
            misc: cute.struct.MemRange[Int32, 8]

        self.shared_storage = SharedStorage
        self.kernel(mS, mOut, mLen, k).launch(grid=(self.n_rows(mS), 1, 1), block=(NT, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mOut: cute.Tensor, mLen: cute.Tensor, k: Int32):
        P = self.P
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(self.shared_storage)
        keys = st.keys.get_tensor(cute.make_layout(CAP))
        keys_f = cute.make_tensor(cute.recast_ptr(keys.iterator, dtype=cutlass.Float32), cute.make_layout(CAP))
        sel_u = st.sel_u.get_tensor(cute.make_layout(P))
        sel_c = st.sel_c.get_tensor(cute.make_layout(P))
        cand_u = st.cand_u.get_tensor(cute.make_layout(CAND))
        cand_c = st.cand_c.get_tensor(cute.make_layout(CAND))
        hist = st.hist.get_tensor(cute.make_layout(BINS0))
        part = st.part.get_tensor(cute.make_layout(WARPS))
        # misc: 0 selectable count, 1 digit, 2 remaining, 3 eq, 4 selection fill, 5 tie carry, 6 candidate fill
        misc = st.misc.get_tensor(cute.make_layout(8))

        gS, gOut, width = self.row_of(mS, mOut, mLen, row)
        cached = width <= CAP

        # ---- 1. load (cp.async into the cache, or global reads), keys, count, pass-0 histogram
        if tid < 8:
            misc[tid] = Int32(0)
        for i in cutlass.range_constexpr(BINS0 // NT):
            hist[tid + NT * i] = Int32(0)
        if cached:
            atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Float32, num_bits_per_copy=32)
            for j in cutlass.range(tid, width, NT, unroll=1):
                cute.copy(atom, cute.local_tile(gS, (1,), (j,)), cute.local_tile(keys_f, (1,), (j,)))
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()                    # the row cache, hist and misc complete
        n_ok = Int32(0)
        for c0 in cutlass.range(0, width, NT, unroll=1):
            j = c0 + tid
            u = Int32(0)
            if j < width:
                if cached:
                    u = self.key_of(keys_f[j])
                    keys[j] = u                     # in place: this thread's own element
                else:
                    u = self.key_of(gS[j])
            n_ok += self.count_pass0(hist, u, lane)
        self.add_selectable(misc, n_ok, lane)
        cute.arch.sync_threads()
        n_valid = misc[0]

        # ---- 2. radix select: T (as u) and the number of keys equal to T that are taken
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
            use_cand = cached and eq <= CAND
            if use_cand:
                # keys above digit d0 are selected; keys in it become candidates (with their columns)
                for c0 in cutlass.range(0, width, NT, unroll=1):
                    j = c0 + tid
                    u = Int32(0)
                    if j < width:
                        u = keys[j]
                    dg = (u >> SHIFT0) & (BINS0 - 1)
                    self.append(sel_u, sel_c, misc, 4, u, j, u != 0 and dg > d0, lane)
                    self.append(cand_u, cand_c, misc, 6, u, j, u != 0 and dg == d0, lane)
                cute.arch.sync_threads()
            prefix, remaining, eq = self.refine(hist, part, misc, cand_u, use_cand, (keys, gS, cached), width,
                                                prefix, remaining, eq, tid, lane, warp)
            t_u = prefix
            need = remaining
        t_s = t_u ^ Int32(SIGN)

        # ---- 3. gather the selection (keys > T; ties: all, or the `need` lowest columns)
        ranked = (not take_all) and need < eq
        cute.arch.sync_threads()
        if use_cand:
            self.gather_candidates(cand_u, cand_c, sel_u, sel_c, misc, t_s, t_u, ranked, tid, lane)
        else:
            for c0 in cutlass.range(0, width, NT, unroll=1):
                j = c0 + tid
                u = Int32(0)
                if j < width:
                    u = self.load_key(keys, gS, j, cached)
                take = u != 0 and (u ^ Int32(SIGN)) > t_s
                if not ranked:
                    take = take or (u != 0 and u == t_u)
                self.append(sel_u, sel_c, misc, 4, u, j, take, lane)
        if ranked:
            self.take_ties(keys, gS, width, cached, t_u, need, sel_u, sel_c, part, misc, tid, lane, warp)
        # ---- 4. order the selection (sort_sm90), descending by ks, then ascending by column; write k columns
        self.sort_and_write(sel_u, sel_c, cand_u, part, misc, gOut, k, tid, width)

    # ------------------------------------------------------------------------------------------ pieces
    @cute.jit
    def row_hist(self, src, width, prefix, shift, hist, tid, lane, bits: cutlass.Constexpr = 7):
        """A pass below pass 0 without candidates (refine): the histogram of digit (u >> shift) & (2^bits - 1) of every
        key of the row that matches the prefix above it. src = (row cache, scores row, cached)."""
        keys, gS, cached = src
        for c0 in cutlass.range(0, width, NT, unroll=1):
            j = c0 + tid
            u = Int32(0)
            if j < width:
                u = self.load_key(keys, gS, j, cached)
            match = u != 0 and ((u ^ prefix) >> (shift + bits)) == 0
            self.hist_add(hist, (u >> shift) & ((1 << bits) - 1), match, lane)

    @cute.jit
    def refine(self, hist, part, misc, cand_u, use_cand, src, width, prefix, remaining, eq, tid, lane, warp,
               digits: cutlass.Constexpr = None):
        """The radix passes below the pass-0 digit, one a digit of `digits` (from the top; REFINE_DIGITS when None,
        7, 7, 7 bits by default): over the candidates when use_cand, else over the whole row (row_hist, the kernel's
        own reader of src). Returns (prefix = T, remaining = how many keys equal to T are taken, eq = how many
        exist). Every histogram is read after the barrier that follows its writers."""
        if cutlass.const_expr(digits is None):
            digits = self.REFINE_DIGITS
        assert sum(digits) == SHIFT0 and max(digits) <= 32 - SHIFT0, "refine digits: the bits below pass 0, each digit's bins in hist"
        n_cand = misc[6]
        for ps in cutlass.range_constexpr(len(digits)):
            bits = digits[ps]
            nb = 1 << bits
            shift = SHIFT0 - sum(digits[:ps + 1])   # default 14, 7, 0: 7-bit digits below the 11-bit first one
            if cutlass.const_expr(nb <= NT):
                if tid < nb:
                    hist[tid] = Int32(0)
            else:
                for i in cutlass.range_constexpr(nb // NT):
                    hist[tid + NT * i] = Int32(0)
            cute.arch.sync_threads()
            if use_cand:
                for c0 in cutlass.range(0, n_cand, NT, unroll=1):
                    i = c0 + tid
                    u = Int32(0)
                    if i < n_cand:
                        u = cand_u[i]
                    match = u != 0 and ((u ^ prefix) >> (shift + bits)) == 0
                    self.hist_add(hist, (u >> shift) & (nb - 1), match, lane)
            else:
                self.row_hist(src, width, prefix, shift, hist, tid, lane, bits)
            cute.arch.sync_threads()
            self.pick_digit(hist, part, misc, remaining, nb, tid, lane, warp)
            cute.arch.sync_threads()
            prefix = prefix | (misc[1] << shift)
            remaining = misc[2]
            eq = misc[3]
        return prefix, remaining, eq

    @cute.jit
    def gather_candidates(self, cand_u, cand_c, sel_u, sel_c, misc, t_s, t_u, ranked, tid, lane):
        """Candidates above T join the selection, and those equal to T unless they are ranked (take_ties)."""
        n_cand = misc[6]
        for c0 in cutlass.range(0, n_cand, NT, unroll=1):
            i = c0 + tid
            u = Int32(0)
            c = Int32(0)
            if i < n_cand:
                u = cand_u[i]
                c = cand_c[i]
            take = u != 0 and (u ^ Int32(SIGN)) > t_s
            if not ranked:
                take = take or (u != 0 and u == t_u)
            self.append(sel_u, sel_c, misc, 4, u, c, take, lane)

    @cute.jit
    def n_rows(self, mS):
        """Rows of the grid: R, or B x Sq for rank-3 scores (one CTA a row)."""
        n = mS.shape[0]
        if cutlass.const_expr(self.rank3):
            n = mS.shape[0] * mS.shape[1]
        return n

    @cute.jit
    def row_of(self, mS, mOut, mLen, row):
        """(scores row, out row, width) of grid row `row`; rank 3: batch row // Sq, query row % Sq, each tensor with
        its own strides (no axis merge). width: W, or min(lengths, W) clamped at 0."""
        if cutlass.const_expr(self.rank3):
            b = row // mS.shape[1]
            s = row - b * mS.shape[1]
            gS, gOut, width = mS[b, s, None], mOut[b, s, None], mS.shape[2]
            if cutlass.const_expr(self.has_lengths):
                width = cutlass.max(cutlass.min(mLen[b, s], width), 0)
        else:
            gS, gOut, width = mS[row, None], mOut[row, None], mS.shape[1]
            if cutlass.const_expr(self.has_lengths):
                width = cutlass.max(cutlass.min(mLen[row], width), 0)
        return gS, gOut, width

    @cute.jit
    def key_of(self, x):
        """Order-preserving u of a float (-0.0 as +0.0: equal scores tie); 0 for +-inf and NaN (never selected)."""
        b = cutlass.Float32(x).bitcast(Int32)
        b = Int32(cutlass.select_(b == Int32(SIGN), Int32(0), b))     # -0.0 ties with +0.0
        finite = (b & 0x7F800000) != 0x7F800000
        ks = b ^ ((b >> 31) & 0x7FFFFFFF)
        return Int32(cutlass.select_(finite, ks ^ Int32(SIGN), Int32(0)))

    @cute.jit
    def load_key(self, keys, gS, j, cached):
        u = Int32(0)
        if cached:
            u = keys[j]
        else:
            u = self.key_of(gS[j])
        return u

    @cute.jit
    def hist_add(self, hist, digit, active, lane):
        """hist[digit] += 1 for each active lane, one atomic per distinct digit of the warp (match.any groups the
        lanes; the lowest active lane of a group adds the group's size). Called by all 32 lanes (warp-uniform)."""
        v = Int32(cutlass.select_(active, digit, Int32(-1)))
        peers = Int32(cute.arch.match_sync(-1, v))
        if active and (peers & ((Int32(1) << lane) - 1)) == 0:
            cute.arch.atomic_add(hist.iterator + digit, cute.arch.popc(peers))

    @cute.jit
    def append(self, buf_u, buf_c, misc, counter: cutlass.Constexpr, u, c, take, lane):
        """Append (u, c) of each lane with `take` to buf_u / buf_c at misc[counter]: one atomic per warp (ballot),
        slots in lane order. Called by all 32 lanes (warp-uniform)."""
        ballot = cute.arch.vote_ballot_sync(take)
        base = Int32(0)
        if lane == 0 and ballot != 0:
            base = cute.arch.atomic_add(misc.iterator + counter, cute.arch.popc(ballot))
        base = cute.arch.shuffle_sync(base, 0)
        if take:
            slot = base + cute.arch.popc(ballot & ((Int32(1) << lane) - 1))
            buf_u[slot] = u
            buf_c[slot] = c

    def scratch_counters(self):
        """Counters of the ordering's scratch (cand_u, sort_sm90.SelectionSort)."""
        return CAND

    @cute.jit
    def count_pass0(self, hist, u, lane):
        """Pass 0 of key u (key_of; 0: not selectable): its digit added to hist (hist_add, warp-uniform); returns 1
        when u is selectable, else 0 (the caller's count for add_selectable)."""
        self.hist_add(hist, (u >> SHIFT0) & (BINS0 - 1), u != 0, lane)
        return Int32(cutlass.select_(u != 0, Int32(1), Int32(0)))

    @cute.jit
    def add_selectable(self, misc, n, lane):
        """misc[0] += the warp's sum of n (one atomic a warp); read after the caller's barrier."""
        n = self.warp_sum(n)
        if lane == 0:
            cute.arch.atomic_add(misc.iterator + 0, n)

    @cute.jit
    def warp_sum(self, v):
        for off in cutlass.range_constexpr(5):
            v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << off)
        return v

    @cute.jit
    def pick_digit(self, hist, part, misc, remaining, nbins: cutlass.Constexpr, tid, lane, warp):
        """The digit d holding the remaining-th largest key: (count above d) < remaining <= (count at or above d).
        Thread t holds the bpt bins nbins-1-t*bpt .. (descending digits); a CTA scan of the per-thread sums finds the
        thread, which walks its bins: misc[1] = d, misc[2] = remaining - count above d, misc[3] = count at d.
        Readers wait for the caller's barrier."""
        bpt = max(1, nbins // NT)
        nact = nbins // bpt
        c = Int32(0)
        if tid < nact:
            for b in cutlass.range_constexpr(bpt):
                c = c + hist[nbins - 1 - (tid * bpt + b)]
        incl = warp_inclusive_scan(c, lane)
        if lane == 31:
            part[warp] = incl
        cute.arch.sync_threads()                    # part written by every warp
        if tid < nact:
            incl = add_warps_before(incl, part, warp, WARPS)
            excl = incl - c
            if excl < remaining and remaining <= incl:
                run = excl
                for b in cutlass.range_constexpr(bpt):
                    d = nbins - 1 - (tid * bpt + b)
                    h = hist[d]
                    if run < remaining and remaining <= run + h:
                        misc[1] = d
                        misc[2] = remaining - run
                        misc[3] = h
                    run = run + h

    @cute.jit
    def take_ties(self, keys, gS, width, cached, t_u, need, sel_u, sel_c, part, misc, tid, lane, warp):
        """Keys equal to T, in column order: the first `need` of them join the selection (block-ordered ranks over
        chunks of NT consecutive columns; misc[5] carries the ties seen in earlier chunks)."""
        if tid == 0:
            misc[5] = Int32(0)
        cute.arch.sync_threads()
        for c0 in cutlass.range(0, width, NT, unroll=1):
            j = c0 + tid
            u = Int32(0)
            if j < width:
                u = self.load_key(keys, gS, j, cached)
            is_eq = u == t_u and j < width
            ballot = cute.arch.vote_ballot_sync(is_eq)
            below = cute.arch.popc(ballot & ((Int32(1) << lane) - 1))
            if lane == 0:
                part[warp] = cute.arch.popc(ballot)
            cute.arch.sync_threads()                # part written by all warps
            base, total = add_warps_before_and_total(misc[5], part, warp, WARPS)
            if is_eq and base + below < need:
                slot = cute.arch.atomic_add(misc.iterator + 4, Int32(1))
                sel_u[slot] = u
                sel_c[slot] = j
            cute.arch.sync_threads()                # everyone read part and misc[5]
            if tid == 0:
                misc[5] = misc[5] + total
            cute.arch.sync_threads()
