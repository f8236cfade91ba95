"""CPU: a NumPy emulation of the streaming top-k's selection (ops/dsa/topk/stream_sm90.py, TopkStreamSm90.kernel up
to the ordering): pass A (digit0 of every score into the 2048-bin histogram, the eight non-finite bins left out of
the selectable count and emptied), the pick of the threshold digit d0, pass B (take_mask's float-range tests against
[f_lo, f_hi), each thread's mask walked bit by bit into columns by append_tile's arithmetic, the selection's raw
bits picked by the select chain, the packed fills), the candidates' keys read back by column (keys_by_column), radix
passes 1-3 over the candidates, the gather and the column-ranked ties. The tile / thread / register mapping is the
kernel's (NT threads, U 16-byte vectors of V scores each). The selected set must equal the reference's (the k
largest finite scores, ties lower column first) on adversarial rows; mutations of the new pieces must not. The
kernel itself runs in tests/gpu/test_dsa_topk.py."""
import numpy as np
import pytest

NT, V, U = 512, 4, 2
CAND = 4096
SHIFT0 = 21
BINS0 = 1 << (32 - SHIFT0)
SIGN = np.int32(-2 ** 31)


def key_bits(x):
    b = np.asarray(x, np.float32).view(np.int32).copy()
    b[b == SIGN] = 0
    return b ^ ((b >> 31) | SIGN)


def digit0(x, plus_zero=True):
    x = np.asarray(x, np.float32)
    c = (x + np.float32(0.0) if plus_zero else x).view(np.int32)
    return ((c ^ ((c >> 31) | SIGN)) >> SHIFT0) & (BINS0 - 1)


def float_of_key(u):
    u = np.int32(np.uint32(u & 0xFFFFFFFF).view(np.int32))
    b = u ^ SIGN if u < 0 else ~u
    return np.array([b], np.int32).view(np.float32)[0]


def tiles(row, width, U=U):
    """(t0, cols [NT, U*V], vals [NT, U*V]) per tile, load_keys' mapping: entry v * V + e of thread tid is column
    t0 + (v * NT + tid) * V + e, -inf past width."""
    tid = np.arange(NT)[:, None]
    idx = np.arange(U * V)[None, :]
    for t0 in range(0, width, NT * V * U):
        cols = t0 + ((idx // V) * NT + tid) * V + idx % V
        vals = np.where(cols < width, row[np.minimum(cols, len(row) - 1)], np.float32(-np.inf)).astype(np.float32)
        yield t0, cols, vals


def pick(hist, remaining):
    """(d, remaining - count above d, count at d) for the digit holding the remaining-th largest."""
    above = 0
    for d in range(len(hist) - 1, -1, -1):
        if above < remaining <= above + hist[d]:
            return d, remaining - above, int(hist[d])
        above += int(hist[d])
    raise AssertionError("remaining exceeds the histogram")


def stream_select(row, k, width=None, mut=None, U=U):
    """The kernel's selection as a set of columns; mut names one deliberate defect; U the kernel's vectors a thread
    per tile (TopkStreamSm90.U: 2 by default, up to 4 with the 16-bit mask halves)."""
    width = len(row) if width is None else width
    hist = np.zeros(BINS0, np.int64)
    for _, _, vals in tiles(row, width, U):
        np.add.at(hist, digit0(vals, plus_zero=mut != "no_plus_zero").ravel(), 1)
    n_ok = int(hist[4:BINS0 - 4].sum())
    hist[:4] = 0
    hist[BINS0 - 4:] = 0
    fin = [c for c in range(width) if np.isfinite(row[c])]
    if n_ok <= k:
        return set(fin)
    d0, remaining, eq = pick(hist, k)
    if eq > CAND:
        return None             # the kernel sweeps the row instead (code unchanged by the lean passes)
    f_lo = float_of_key(d0 << SHIFT0)
    f_hi = float_of_key((d0 + 1) << SHIFT0)
    if mut == "f_hi_next":
        f_hi = float_of_key((d0 + 2) << SHIFT0)
    sel_c, sel_raw, cand_c, fills = [], [], [], 0
    for t0, cols, vals in tiles(row, width, U):
        with np.errstate(invalid="ignore"):
            above = vals > f_hi if mut == "strict_hi" else vals >= f_hi
            s = above & (vals < np.float32(np.inf))
            c = (vals >= f_lo) & ~above
        m = (s * (1 << np.arange(U * V))).sum(1) | (c * (1 << (16 + np.arange(U * V)))).sum(1)
        for w in range(NT // 32):                  # one packed atomic a warp
            ms = m[w * 32:(w + 1) * 32]
            fills += int(sum(bin(x & 0xFFFF).count("1") for x in ms)) | \
                (int(sum(bin(x >> 16).count("1") for x in ms)) << 16)
            assert (fills & 0xFFFF) < 65536 and fills >> 16 <= CAND
        for tid in range(NT):                       # the bit loop: columns from the bit's index alone
            mm = int(m[tid])
            while mm:
                e = (mm & -mm).bit_length() - 1
                mm &= mm - 1
                ee = e & 15
                col = t0 + tid * V + (ee >> 2) * (NT * (2 if mut == "col_stride" else V)) + (ee & 3)
                assert col == cols[tid, ee], "append_tile's column arithmetic differs from load_keys' mapping"
                if e >= 16:
                    cand_c.append(col)
                else:
                    sel_c.append(col)
                    sel_raw.append(vals[tid, ee])
    assert len(sel_c) == fills & 0xFFFF and len(cand_c) == fills >> 16
    assert len(cand_c) == eq, "pass B's candidates must be pass A's bin d0"
    sel_u = key_bits(np.array(sel_raw, np.float32))
    cand_u = key_bits(row[np.array(cand_c, np.int64)]) if cand_c else np.zeros(0, np.int32)
    assert np.array_equal(sel_u, key_bits(row[np.array(sel_c, np.int64)])) if sel_c else True
    # radix passes 1-3 over the candidates (7-bit digits below the 11-bit first one)
    prefix = np.int64(d0) << SHIFT0
    cu = cand_u.astype(np.int64) & 0xFFFFFFFF
    for ps in range(1, 4):
        shift = SHIFT0 - 7 * ps
        match = ((cu ^ prefix) >> (shift + 7)) == 0
        h = np.bincount(((cu[match] >> shift) & 127).astype(np.int64), minlength=128)
        dgt, remaining, eq = pick(h, remaining)
        prefix |= np.int64(dgt) << shift
    t = prefix                                      # the k-th largest key, as unsigned
    out = set(sel_c) | {c for c, u in zip(cand_c, cu) if u > t}
    ties = sorted(c for c in range(width) if (int(key_bits(row[c:c + 1])[0]) & 0xFFFFFFFF) == t)
    assert len(ties) == eq
    out |= set(ties[:remaining])
    return out


def key_of(x):
    """topk_sm90.key_of: key_bits for finite scores, 0 for +-inf and NaN."""
    x = np.asarray(x, np.float32)
    return np.where(np.isfinite(x), key_bits(x), np.int32(0)).astype(np.int32)


def radix_from(cu, prefix, remaining, digits=(7, 7, 7)):
    """Radix passes over unsigned keys cu matching prefix, one a digit of `digits` (bits, from the top, below the
    11-bit first one: TopkSm90.REFINE_DIGITS): (T, remaining, eq)."""
    eq = None
    shift = SHIFT0
    for bits in digits:
        shift -= bits
        match = ((cu ^ prefix) >> (shift + bits)) == 0
        h = np.bincount(((cu[match] >> shift) & ((1 << bits) - 1)).astype(np.int64), minlength=1 << bits)
        dgt, remaining, eq = pick(h, remaining)
        prefix |= np.int64(dgt) << shift
    return prefix, remaining, eq


def sampled_select(row, k, width=None, mut=None, sigma=4, digits=(11, 10)):
    """TopkStreamSm90.sampled_select (SAMPLE): (fast, selected columns); fast False: the kernel runs the two passes
    (stream_select) instead (always for W <= CAND). mut names one deliberate defect; sigma: SAMPLE_SIGMA; digits:
    ONE_READ_DIGITS (the defaults are the kernel's: test_emulation_defaults_are_the_kernels)."""
    width = len(row) if width is None else width
    if width <= CAND:
        return False, None          # rows that fit in the candidates take the two passes
    t_f = np.float32(-np.finfo(np.float32).max)
    w4 = width // V
    cols = np.concatenate([np.arange(((tid * w4) // NT) * V, ((tid * w4) // NT) * V + V) for tid in range(NT)])
    assert cols.max() < width
    su = key_of(row[cols]).astype(np.int64) & 0xFFFFFFFF
    su = su[su != 0]
    m = (k * NT * V) // width
    j = m + (m >> 1) + 10
    if sigma > 0:
        j = m + int(np.float32(sigma) * np.sqrt(np.float32(m))) + 2
    t_all = j > len(su)
    if not t_all:
        d_s, r_s, _ = pick(np.bincount((su >> SHIFT0).astype(np.int64), minlength=BINS0), j)
        match = (su >> SHIFT0) == d_s
        d1, _, _ = pick(np.bincount(((su[match] >> (SHIFT0 - 7)) & 127).astype(np.int64), minlength=128), r_s)
        t_f = float_of_key((d_s << SHIFT0) | (d1 << (SHIFT0 - 7)))
    cand_c = []
    for t0, tcols, vals in tiles(row, width):
        with np.errstate(invalid="ignore"):
            take = (vals >= t_f) & ((vals < np.float32(np.inf)) | (mut == "inf_taken"))
        m_ = (take * (1 << np.arange(U * V))).sum(1)
        for tid in range(NT):
            mm = int(m_[tid])
            while mm:
                e = (mm & -mm).bit_length() - 1
                mm &= mm - 1
                col = t0 + tid * V + (e >> 2) * (NT * V) + (e & 3)
                assert col == tcols[tid, e]
                cand_c.append(col)
    n_above = len(cand_c)
    fast = n_above <= CAND and (n_above >= k or t_all or mut == "no_count_check")
    if not fast:
        return False, None
    cand_c = cand_c[:CAND]
    cu = key_bits(row[np.array(cand_c, np.int64)]).astype(np.int64) & 0xFFFFFFFF if cand_c else np.zeros(0, np.int64)
    if n_above <= k:
        return True, set(cand_c)
    d0, remaining, eq = pick(np.bincount((cu >> SHIFT0).astype(np.int64), minlength=BINS0), k)
    t, remaining, eq = radix_from(cu, np.int64(d0) << SHIFT0, remaining, digits)
    out = {c for c, u in zip(cand_c, cu) if u > t}
    ties = sorted(c for c in range(width) if (int(key_bits(row[c:c + 1])[0]) & 0xFFFFFFFF) == t)
    assert len(ties) == eq, "every score equal to T is a candidate"
    if remaining == eq:
        out |= set(ties)
    else:
        out |= set(ties[:remaining])
    return True, out


def reference(row, k, width=None):
    width = len(row) if width is None else width
    fin = [(-float(row[c]), c) for c in range(width) if np.isfinite(row[c])]
    return {c for _, c in sorted(fin)[:k]}


def draw(rng, kind, w):
    x = rng.standard_normal(w).astype(np.float32)
    if kind == "scaled":
        x *= np.float32(rng.choice([8.0, 5000.0]))
    elif kind == "ties":
        x = np.round(x * 4).astype(np.float32)
        x[rng.random(w) < 0.3] = np.float32(-0.0)
    elif kind == "zeros":
        x = np.where(rng.random(w) < 0.5, np.float32(0.0), np.float32(-0.0)).astype(np.float32)
        x[rng.random(w) < 0.05] = np.float32(1e-45)
    elif kind == "denormal":
        x = (rng.integers(1, 0x800000, w) | np.where(rng.random(w) < 0.5, SIGN, 0)).astype(np.int32).view(np.float32)
    elif kind == "nonfinite":
        r = rng.random(w)
        x[r < 0.1] = np.inf
        x[(r >= 0.1) & (r < 0.2)] = -np.inf
        x[(r >= 0.2) & (r < 0.3)] = np.nan
        x[(r >= 0.3) & (r < 0.35)] = np.array([0xFFC00000], np.uint32).view(np.float32)[0]
    elif kind == "causal":
        x[w // 3:] = -np.inf
    elif kind == "edges":                           # scores at and around the bin boundaries of their own digits
        d = digit0(x)
        lo = np.array([float_of_key(int(v) << SHIFT0) for v in d], np.float32)
        x = np.where(rng.random(w) < 0.5, lo, x).astype(np.float32)
    return x


CASES = [(kind, w, k) for kind in ("randn", "scaled", "ties", "zeros", "denormal", "nonfinite", "causal", "edges")
         for w, k in ((17, 5), (255, 64), (4097, 2048), (9000, 300))] + [("randn", 32768, 2048), ("edges", 1, 1)]


@pytest.mark.parametrize("kind,w,k", CASES)
def test_selection_equals_reference(kind, w, k):
    rng = np.random.default_rng([w, k, len(kind)])
    row = draw(rng, kind, w)
    got = stream_select(row, k)
    if got is not None:
        assert stream_select(row, k, U=4) == got      # the (4, 2) launch shape of bench/topk_breakdown.py --sweep
    if got is None:
        assert kind == "zeros" and w > CAND, "only rows of > CAND equal scores leave the candidate path"
        return
    assert got == reference(row, k)


def test_lengths_cut_the_row():
    rng = np.random.default_rng(3)
    row = rng.standard_normal(5000).astype(np.float32)
    for width in (0, 1, 4093, 4096, 4099):
        assert stream_select(row, 100, width=width) == reference(row, 100, width=width)


@pytest.mark.parametrize("mut", ["no_plus_zero", "f_hi_next", "strict_hi", "col_stride"])
def test_mutations_fail(mut):
    """Each defect is caught on at least one of the rows above (an assertion inside, or a wrong set)."""
    caught = False
    for kind, w, k in CASES[:32]:
        row = draw(np.random.default_rng([w, k, len(kind)]), kind, w)
        try:
            caught = stream_select(row, k, mut=mut) != reference(row, k)
        except AssertionError:
            caught = True
        if caught:
            break
    assert caught, mut


SAMPLED_CASES = CASES + [("randn", 32768, 64), ("scaled", 32768, 2048), ("causal", 32768, 2048),
                         ("randn", 16384, 2048), ("narrow", 32768, 2048), ("sorted", 32768, 2048),
                         ("randn", 8192, 2048), ("ties", 32768, 2048), ("trap", 32768, 2048)]


def draw_sampled(rng, kind, w):
    if kind == "narrow":            # every score in [100, 110): one pass-0 digit
        return (100 + 10 * rng.random(w)).astype(np.float32)
    if kind == "sorted":            # ascending by column: the sample's positions matter
        return np.sort(rng.standard_normal(w)).astype(np.float32)
    if kind == "trap":              # the first score of every other sampled vector is large: the sample misleads
        x = rng.standard_normal(w).astype(np.float32)
        w4 = w // V
        x[np.array([((tid * w4) // NT) * V for tid in range(0, NT, 2)])] = (100 + rng.random(NT // 2)).astype(
            np.float32)
        return x
    return draw(rng, kind, w)


# rows the one-read path must take (not fall back to the two passes): the common shapes
MUST_BE_FAST = {("randn", 32768, 2048), ("randn", 32768, 64), ("scaled", 32768, 2048), ("causal", 32768, 2048),
                ("randn", 16384, 2048), ("narrow", 32768, 2048), ("sorted", 32768, 2048), ("randn", 8192, 2048),
                ("randn", 9000, 300), ("randn", 4097, 2048)}


@pytest.mark.parametrize("sigma,digits", [(0, (7, 7, 7)), (4, (7, 7, 7)), (4, (11, 10))])
@pytest.mark.parametrize("kind,w,k", SAMPLED_CASES)
def test_sampled_selection_equals_reference(kind, w, k, sigma, digits):
    rng = np.random.default_rng([w, k, len(kind), 7])
    row = draw_sampled(rng, kind, w)
    fast, got = sampled_select(row, k, sigma=sigma, digits=digits)
    if (kind, w, k) in MUST_BE_FAST:
        assert fast, "a common row fell back to the two passes"
    if kind == "trap":
        assert not fast, "a misleading sample must send the row to the two passes"
    if not fast:
        got = stream_select(row, k)
        if got is None:             # the two passes' row sweep (not emulated here)
            assert kind == "zeros" and w > CAND
            return
    assert got == reference(row, k)


def test_emulation_defaults_are_the_kernels():
    pytest.importorskip("cutlass")
    import inspect

    from ops.dsa.topk.stream_sm90 import TopkStreamSm90
    d = inspect.signature(sampled_select).parameters
    assert d["sigma"].default == TopkStreamSm90.SAMPLE_SIGMA
    assert d["digits"].default == TopkStreamSm90.ONE_READ_DIGITS
    assert inspect.signature(radix_from).parameters["digits"].default == TopkStreamSm90.REFINE_DIGITS


def test_sampled_lengths_cut_the_row():
    rng = np.random.default_rng(5)
    row = rng.standard_normal(9000).astype(np.float32)
    for width in (0, 1, 4096, 4097, 5000, 8999):
        fast, got = sampled_select(row, 100, width=width)
        assert fast == (width > CAND)
        if not fast:
            got = stream_select(row, 100, width=width)
        assert got == reference(row, 100, width=width)


@pytest.mark.parametrize("mut", ["no_count_check", "inf_taken"])
def test_sampled_mutations_fail(mut):
    caught = False
    for kind, w, k in SAMPLED_CASES:
        row = draw_sampled(np.random.default_rng([w, k, len(kind), 7]), kind, w)
        try:
            fast, got = sampled_select(row, k, mut=mut)
            caught = fast and got != reference(row, k)
        except AssertionError:
            caught = True
        if caught:
            break
    assert caught, mut
