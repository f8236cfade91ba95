"""Row-wise top-k of fp32 scores for Hopper (sm_90a), CuTe DSL: radix select, then a bitonic sort of the selection.

Semantics (docs/dsa.md, "Top-k"): per row, the columns of the k largest FINITE scores in descending score order,
ties lower column first (a total order: the output is bitwise deterministic); -inf, +inf and NaN are never
selected; slots past the number of selectable scores are -1; with lengths, row r sees columns [0, lengths[r]).

Keys. A finite float x maps to the order-preserving 32-bit pattern u = ks ^ 0x80000000, ks = b ^ ((b >> 31) &
0x7fffffff) (b the bits of x; ks orders like x as a signed int). Every finite x has u != 0; u = 0 marks a score that
cannot be selected. Radix digits are 8-bit fields of u; orderings compare ks (signed).

Algorithm. One CTA (512 threads) per row.
  1. Load: each thread reads columns tid, tid + 512, ... (coalesced), forms u, counts the selectable ones, and
     caches u in shared memory when the row fits (W <= CAP columns; longer rows re-read global memory each pass).
  2. If at most k are selectable, all are taken. Otherwise radix select, 4 passes of 8 bits from the top: a
     shared-memory histogram (atomics) of the digit of every key matching the prefix so far, a suffix scan over the
     256 bins finds the digit holding the k-th largest; after 4 passes T (the k-th largest u) is exact, with `need`
     = how many keys equal to T are taken and `eq` = how many exist.
  3. Gather: keys > T (and all keys == T when need == eq) go to the selection buffer through a shared counter; when
     need < eq the ties are ranked by column (ordered chunks of 512 columns: ballot + warp prefix + block prefix)
     and the first `need` are taken.
  4. Bitonic sort of the P (= k padded to a power of two) selected (u, column) pairs, descending by ks then
     ascending by column (padding: u = 0 sorts last), one barrier per stage; write the first k columns (-1 where
     u = 0).
Shared-memory handoffs: every buffer written by many threads (histogram, scan partials, selection, counters) is
read only after a CTA barrier (sync_threads) that follows all its writers.

Status (H200, 2026-12-02): tests/gpu/test_dsa_topk.py 27 passed (indices equal to a stable sort), racecheck and
memcheck clean; speed not measured yet (one CTA of 512 threads per row, 1 CTA per SM for the 160 KiB row cache).
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32

NT = 512
WARPS = NT // 32
CAP = 40960                  # row columns cached in shared memory (160 KiB)
SIGN = -2147483648           # 0x80000000 as int32


def pad_k(k):
    """The sort size for k: the next power of two, at least 32."""
    p = 32
    while p < k:
        p *= 2
    return p


class TopkSm90:
    """One compiled variant: (P = padded k, has_lengths, rank 3 inputs)."""

    def __init__(self, p: int, has_lengths: bool, rank3: bool):
        assert p >= 32 and p & (p - 1) == 0 and p <= 2048, p
        self.P = p
        self.has_lengths = has_lengths
        self.rank3 = rank3

    @cute.jit
    def __call__(self, mS: cute.Tensor, mOut: cute.Tensor, mLen: cute.Tensor, k: Int32, stream):
        P = self.P
        if cutlass.const_expr(self.rank3):
            # [B, Sq, W] -> [B * Sq, W] (the seam checks the two leading axes merge)
            rows = mS.shape[0] * mS.shape[1]
            mS = cute.make_tensor(mS.iterator, cute.make_layout((rows, mS.shape[2]), stride=(mS.stride[1], 1)))
            mOut = cute.make_tensor(mOut.iterator, cute.make_layout((rows, mOut.shape[2]), stride=(mOut.stride[1], 1)))
            if cutlass.const_expr(self.has_lengths):
                mLen = cute.make_tensor(mLen.iterator, cute.make_layout((rows,), stride=(mLen.stride[1],)))

        @cute.struct
        class SharedStorage:
            keys: cute.struct.Align[cute.struct.MemRange[Int32, CAP], 16]
            sel_u: cute.struct.MemRange[Int32, P]
            sel_c: cute.struct.MemRange[Int32, P]
            hist: cute.struct.MemRange[Int32, 256]
            part: cute.struct.MemRange[Int32, WARPS]
            misc: cute.struct.MemRange[Int32, 8]

        self.shared_storage = SharedStorage
        self.kernel(mS, mOut, mLen, k).launch(grid=(mS.shape[0], 1, 1), block=(NT, 1, 1), stream=stream)

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
        sel_u = st.sel_u.get_tensor(cute.make_layout(P))
        sel_c = st.sel_c.get_tensor(cute.make_layout(P))
        hist = st.hist.get_tensor(cute.make_layout(256))
        part = st.part.get_tensor(cute.make_layout(WARPS))
        misc = st.misc.get_tensor(cute.make_layout(8))   # 0 selectable count, 1 digit, 2 remaining, 3 eq, 4 fill

        width = mS.shape[1]
        if cutlass.const_expr(self.has_lengths):
            width = cutlass.max(cutlass.min(mLen[row], width), 0)
        cached = width <= CAP

        # ---- 1. load, count, cache
        if tid < 8:
            misc[tid] = Int32(0)
        cute.arch.sync_threads()
        n_ok = Int32(0)
        for j in cutlass.range(tid, width, NT, unroll=1):
            u = self.key_of(mS[row, j])
            if cached:
                keys[j] = u
            n_ok += Int32(cutlass.select_(u != 0, Int32(1), Int32(0)))
        n_ok = self.warp_sum(n_ok)
        if lane == 0:
            cute.arch.atomic_add(misc.iterator + 0, n_ok)
        cute.arch.sync_threads()
        n_valid = misc[0]

        # ---- 2. radix select: T (as u) and the number of keys equal to T that are taken
        take_all = n_valid <= k
        t_u = Int32(1)           # below every selectable key: take all
        need = Int32(0)
        eq = Int32(0)
        if not take_all:
            prefix = Int32(0)
            remaining = k
            for ps in cutlass.range_constexpr(4):
                shift = 24 - 8 * ps
                if tid < 256:
                    hist[tid] = Int32(0)
                cute.arch.sync_threads()
                for j in cutlass.range(tid, width, NT, unroll=1):
                    u = self.load_key(keys, mS, row, j, cached)
                    match = u != 0
                    if cutlass.const_expr(ps > 0):
                        match = match and ((u ^ prefix) >> (shift + 8)) == 0
                    if match:
                        cute.arch.atomic_add(hist.iterator + ((u >> shift) & 255), Int32(1))
                cute.arch.sync_threads()
                self.pick_digit(hist, part, misc, remaining, tid, lane, warp)
                cute.arch.sync_threads()
                prefix = prefix | (misc[1] << shift)
                remaining = misc[2]
                eq = misc[3]
            t_u = prefix
            need = remaining
        t_s = t_u ^ Int32(SIGN)

        # ---- 3. gather the selection (keys > T; ties: all, or the `need` lowest columns)
        ranked = (not take_all) and need < eq
        cute.arch.sync_threads()
        for j in cutlass.range(tid, width, NT, unroll=1):
            u = self.load_key(keys, mS, row, j, cached)
            ks = u ^ Int32(SIGN)
            take = u != 0 and ks > t_s
            if not ranked:
                take = take or (u != 0 and u == t_u)
            if take:
                slot = cute.arch.atomic_add(misc.iterator + 4, Int32(1))
                sel_u[slot] = u
                sel_c[slot] = j
        if ranked:
            self.take_ties(keys, mS, row, width, cached, t_u, need, sel_u, sel_c, part, misc, tid, lane, warp)
        cute.arch.sync_threads()
        n_sel = misc[4]
        for i in cutlass.range(n_sel + tid, P, NT, unroll=1):
            sel_u[i] = Int32(0)
            sel_c[i] = Int32(2147483647)
        cute.arch.sync_threads()

        # ---- 4. bitonic sort, descending by ks, then ascending by column
        self.bitonic(sel_u, sel_c, tid)
        for i in cutlass.range(tid, k, NT, unroll=1):
            if i < P:
                mOut[row, i] = Int32(cutlass.select_(sel_u[i] != 0, sel_c[i], Int32(-1)))
            else:
                mOut[row, i] = Int32(-1)

    # ------------------------------------------------------------------------------------------ pieces
    @cute.jit
    def key_of(self, x):
        """Order-preserving u of a float (-0.0 as +0.0: equal scores tie); 0 for +-inf and NaN (never selected)."""
        b = cutlass.Float32(x).bitcast(Int32)
        b = Int32(cutlass.select_(b == Int32(SIGN), Int32(0), b))     # -0.0 ties with +0.0
        finite = (b & 0x7F800000) != 0x7F800000
        ks = b ^ ((b >> 31) & 0x7FFFFFFF)
        return Int32(cutlass.select_(finite, ks ^ Int32(SIGN), Int32(0)))

    @cute.jit
    def load_key(self, keys, mS, row, j, cached):
        u = Int32(0)
        if cached:
            u = keys[j]
        else:
            u = self.key_of(mS[row, j])
        return u

    @cute.jit
    def warp_sum(self, v):
        for off in cutlass.range_constexpr(5):
            v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << off)
        return v

    @cute.jit
    def warp_inclusive_scan(self, v, lane):
        for off in cutlass.range_constexpr(5):
            o = cute.arch.shuffle_sync_up(v, offset=1 << off)
            if lane >= (1 << off):
                v = v + o
        return v

    @cute.jit
    def pick_digit(self, hist, part, misc, remaining, tid, lane, warp):
        """Threads 0..255 hold bin 255 - tid (descending digits); a scan over them finds the digit d with
        (count above d) < remaining <= (count at or above d): misc[1] = d, misc[2] = remaining - count above d,
        misc[3] = count at d. Readers wait for the caller's barrier."""
        c = Int32(0)
        if tid < 256:
            c = hist[255 - tid]
        incl = self.warp_inclusive_scan(c, lane)
        if lane == 31 and tid < 256:
            part[warp] = incl
        cute.arch.sync_threads()                    # part written by 8 warps
        if tid < 256:
            for w in cutlass.range_constexpr(8):
                if w < warp:
                    incl = incl + part[w]
            excl = incl - c
            if excl < remaining and remaining <= incl:
                misc[1] = 255 - tid
                misc[2] = remaining - excl
                misc[3] = c

    @cute.jit
    def take_ties(self, keys, mS, row, width, cached, t_u, need, sel_u, sel_c, part, misc, tid, lane, warp):
        """Keys equal to T, in column order: the first `need` of them join the selection (block-ordered ranks over
        chunks of NT consecutive columns; misc[5] carries the ties seen in earlier chunks)."""
        if tid == 0:
            misc[5] = Int32(0)
        cute.arch.sync_threads()
        for c0 in cutlass.range(0, width, NT, unroll=1):
            j = c0 + tid
            u = Int32(0)
            if j < width:
                u = self.load_key(keys, mS, row, j, cached)
            is_eq = u == t_u and j < width
            ballot = cute.arch.vote_ballot_sync(is_eq)
            below = cute.arch.popc(ballot & ((Int32(1) << lane) - 1))
            if lane == 0:
                part[warp] = cute.arch.popc(ballot)
            cute.arch.sync_threads()                # part written by all warps
            base = misc[5]
            total = Int32(0)
            for w in cutlass.range_constexpr(WARPS):
                total = total + part[w]
                if w < warp:
                    base = base + part[w]
            if is_eq and base + below < need:
                slot = cute.arch.atomic_add(misc.iterator + 4, Int32(1))
                sel_u[slot] = u
                sel_c[slot] = j
            cute.arch.sync_threads()                # everyone read part and misc[5]
            if tid == 0:
                misc[5] = misc[5] + total
            cute.arch.sync_threads()

    @cute.jit
    def bitonic(self, sel_u, sel_c, tid):
        P = self.P
        size = 2
        for _ in cutlass.range_constexpr(P.bit_length() - 1):
            stride = size // 2
            for _s in cutlass.range_constexpr(size.bit_length() - 1):
                for i in cutlass.range(tid, P // 2, NT, unroll=1):
                    lo = 2 * i - (i & (stride - 1))
                    hi = lo + stride
                    desc = (lo & size) == 0
                    ua, ub = sel_u[lo], sel_u[hi]
                    ca, cb = sel_c[lo], sel_c[hi]
                    ka, kb = ua ^ Int32(SIGN), ub ^ Int32(SIGN)
                    a_first = ka > kb or (ka == kb and ca < cb)
                    if a_first != desc:
                        sel_u[lo] = ub
                        sel_u[hi] = ua
                        sel_c[lo] = cb
                        sel_c[hi] = ca
                cute.arch.sync_threads()
                stride = stride // 2
            size = size * 2
