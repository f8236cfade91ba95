"""CPU: a NumPy emulation of the index logic of the top-k "bucket" sort (ops/dsa/topk/sort_sm90.py,
SelectionSort.bucket_rank_sort): the range of the selection's keys, the shift s that maps it onto NB = max(2 P, 512)
buckets by arithmetic shifts of int32 keys, the arrival places from atomic counts in any order, the CTA scan of the
counts into first slots, the pairs grouped by bucket, and each pair's slot = its bucket's first slot + the pairs of
its bucket that sort before it; a bucket over BUCKET_MAX sends the row to the key sort. The emulation must give the
stable sort's order (descending key, ties lower column first) on every input, with every bucket index in [0, NB);
mutations of the rule must not. The kernel itself runs in tests/gpu/test_dsa_topk.py."""
import numpy as np
import pytest

NT = 512
BUCKET_MAX = 32
I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


def wrap32(x):
    """int64 array -> the int32 value of its low 32 bits (two's complement), as int64."""
    return ((np.asarray(x, dtype=np.int64) + 2 ** 31) % 2 ** 32) - 2 ** 31


def clz32(x):
    u = int(x) % 2 ** 32
    return 32 - u.bit_length()


def bucket_sort(ks, cols, P, rng, fix_shift=True, by_key_only=False, arrival=True, value_pass=True, ratio=2):
    """ks: int64 [n] signed keys (int32 values), cols: distinct columns. Returns the slot of each pair, or None when a
    bucket holds more than BUCKET_MAX pairs (the kernel's fallback). ratio: SelectionSort.BUCKETS_PER_KEY."""
    n = len(ks)
    NB = max(ratio * P, NT)
    log_nb = NB.bit_length() - 1
    kmax = int(ks.max()) if n else I32_MIN
    kmin = int(ks.min()) if n else I32_MAX
    bits = 32 - clz32(wrap32(kmax - kmin))
    s = max(bits - log_nb, 0)                        # s = 0 only when the range is below NB: no overflow
    if fix_shift and (kmax >> s) - (kmin >> s) >= NB:
        s += 1
    b = (kmax >> s) - (ks >> s)                       # Python ints / int64: arithmetic shifts, as shr.s32
    assert np.all(wrap32(b) == b), "bucket index overflows int32"
    if n and (b.min() < 0 or b.max() >= NB):
        raise IndexError(f"bucket index {b.min()}..{b.max()} outside [0, {NB})")
    counts = np.bincount(b, minlength=NB) if n else np.zeros(NB, dtype=np.int64)
    if counts.max() > BUCKET_MAX and value_pass:     # the second mapping: linear in the score value, in float32
        half = np.float32(0.5)
        fmax = float_of_ks(kmax) * half
        span = np.float32(fmax - float_of_ks(kmin) * half)
        scale = np.float32(NB - 1) / span if span > np.float32(1e-30) else np.float32(0)
        with np.errstate(over="raise", invalid="raise"):
            d = ((fmax - float_of_ks(ks) * half) * scale).astype(np.float32)
        assert np.all(d >= 0), "a value bucket below 0"
        b = np.minimum(d.astype(np.int64), NB - 1)   # cvt.rzi: truncation
        counts = np.bincount(b, minlength=NB)
    if counts.max() > BUCKET_MAX:
        return None
    at = np.zeros(n, dtype=np.int64)
    for bb in np.unique(b):                          # atomic_add: any arrival order within a bucket
        members = np.flatnonzero(b == bb)
        at[members] = rng.permutation(len(members)) if arrival else 0
    first = np.concatenate([[0], np.cumsum(counts)])[:NB]
    end = np.where(b + 1 < NB, first[np.minimum(b + 1, NB - 1)], n)
    gu = np.empty(n, dtype=np.int64)
    gc = np.empty(n, dtype=np.int64)
    gu[first[b] + at] = ks
    gc[first[b] + at] = cols
    slots = np.empty(n, dtype=np.int64)
    for i in range(n):
        u, c = gu[first[b[i]]:end[i]], gc[first[b[i]]:end[i]]
        before = (u > ks[i]) if by_key_only else ((u > ks[i]) | ((u == ks[i]) & (c < cols[i])))
        slots[i] = first[b[i]] + int(before.sum())
    return slots


def float_of_ks(ks):
    """The float32 score of signed keys ks (the kernel's float_of_ks: the bits ks ^ ((ks >> 31) & 0x7FFFFFFF))."""
    k = wrap32(np.asarray(ks, dtype=np.int64))
    bits = np.where(k < 0, k ^ 0x7FFFFFFF, k)
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def expected_slots(ks, cols):
    order = np.lexsort((cols, -ks))                  # descending key, then ascending column
    slots = np.empty(len(ks), dtype=np.int64)
    slots[order] = np.arange(len(ks))
    return slots


def keys_of(x):
    """float32 scores -> signed order keys ks (the kernel's u ^ 0x80000000 of key_of)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)
    u = np.where(b & 0x80000000, (~b) & 0xFFFFFFFF, b | 0x80000000)
    return wrap32(u ^ 0x80000000)


def cases(rng):
    """(name, P, ks, cols): randn selections, wide key ranges, ties, few keys, column keys."""
    out = []
    for P in (32, 256, 512, 1024, 2048):
        for n in sorted({1, 2, P // 2 + 1, P}):
            x = np.sort(rng.standard_normal(32768).astype(np.float32))[::-1][:n]
            cols = rng.permutation(32768)[:n]
            out.append((f"randn-top P{P} n{n}", P, keys_of(x), cols))
    x = rng.standard_normal(2048).astype(np.float32)
    x[0] = 3e38                                      # one outlier: the range spans almost every key
    out.append(("outlier", 2048, keys_of(x), rng.permutation(40000)[:2048]))
    x = (rng.standard_normal(2048) * 4000).round().astype(np.float32)
    out.append(("rounded", 2048, keys_of(x), rng.permutation(40000)[:2048]))
    x = np.sort(rng.standard_normal(4096).astype(np.float32))[::-1][:2048]
    out.append(("top half of 4096 (crosses zero)", 2048, keys_of(x), rng.permutation(4096)[:2048]))
    x = np.array([3e38, -3e38, 1.0, -1.0, 0.0, 1e-45], dtype=np.float32)
    out.append(("value span past float max", 32, keys_of(x), np.arange(6)))
    x = np.full(20, 1.5, dtype=np.float32)
    out.append(("one key, 20", 2048, keys_of(x), rng.permutation(100)[:20]))
    ks = wrap32(np.array([I32_MAX, I32_MIN + 1, 0, -1, 1, I32_MAX - 1, I32_MIN + 2]))
    out.append(("int32 extremes", 512, ks, np.arange(7)))
    x = np.array([-0.0, 0.0, -1e-45, 1e-45, -3e38, 3e38], dtype=np.float32)
    out.append(("zeros, denormals, extremes", 32, keys_of(x), np.array([5, 3, 9, 1, 0, 7])))
    c = np.sort(rng.permutation(140000)[:2048])
    out.append(("column keys ~c", 2048, ~c, c))
    c = np.arange(70000, 70000 + 2048)                # consecutive columns: buckets of 1
    out.append(("consecutive columns", 2048, ~c, c))
    ks = np.array([1, 1 + 1023, 500, 7], dtype=np.int64)   # R >> s = NB - 1 with a borrow: the shift's one more bit
    out.append(("shift fix-up", 32, ks, np.arange(4)))
    out.append(("empty", 2048, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)))
    return out


@pytest.mark.parametrize("ratio", [2, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucket_sort_matches_stable_sort(seed, ratio):
    rng = np.random.default_rng(seed)
    fallbacks = 0
    for name, P, ks, cols in cases(rng):
        slots = bucket_sort(ks, cols, P, rng, ratio=ratio)
        if slots is None:
            fallbacks += 1
            assert np.bincount(np.unique(ks, return_inverse=True)[1]).max() > 1 or name in ("outlier",), name
            continue
        assert np.array_equal(slots, expected_slots(ks, cols)), name
    assert fallbacks <= 3


@pytest.mark.parametrize("ratio", [2, 4])
def test_randn_selections_never_fall_back(ratio):
    """The common cases fit in buckets of <= BUCKET_MAX: the top 2048 of a randn row of 32K (key-linear buckets),
    the top half of a row of 4096 or most of one of 2500 (the selection crosses or nears zero: value-linear buckets),
    the top 64, relu-like scores with a sink 1000 times the rest. (A sink in a selection that crosses zero defeats
    both mappings: such a row takes the network.)"""
    rng = np.random.default_rng(7)
    for _ in range(50):
        for P, n, W in ((2048, 2048, 32768), (64, 64, 32768), (1024, 1000, 32768), (2048, 2048, 4096),
                        (2048, 2048, 2500)):
            x = np.sort(rng.standard_normal(W).astype(np.float32))[::-1][:n]
            assert bucket_sort(keys_of(x), rng.permutation(W)[:n], P, rng, ratio=ratio) is not None, (P, n, W)
        x = np.sort(np.maximum(rng.standard_normal(32768), 0).astype(np.float32))[::-1][:2048]
        x[0] = 1000.0 * x[1]                          # a sink: key-linear buckets (log-like) absorb it
        assert bucket_sort(keys_of(x), rng.permutation(32768)[:2048], 2048, rng, ratio=ratio) is not None


def test_long_run_falls_back():
    rng = np.random.default_rng(3)
    ks = keys_of(np.full(BUCKET_MAX + 1, 2.0, dtype=np.float32))
    assert bucket_sort(ks, np.arange(BUCKET_MAX + 1), 2048, rng) is None
    ks = keys_of(np.full(BUCKET_MAX, 2.0, dtype=np.float32))
    assert np.array_equal(bucket_sort(ks, np.arange(BUCKET_MAX)[::-1].copy(), 2048, rng),
                          expected_slots(ks, np.arange(BUCKET_MAX)[::-1]))


def test_mutations_are_caught():
    """Ties ranked by key alone, no shift fix-up, and no arrival places each break some case."""
    def broken(**kw):
        rng = np.random.default_rng(0)
        for _, P, ks, cols in cases(rng):
            try:
                slots = bucket_sort(ks, cols, P, rng, **kw)
            except (IndexError, AssertionError):
                return True
            if slots is not None and not np.array_equal(slots, expected_slots(ks, cols)):
                return True
        return False
    assert not broken()
    assert broken(by_key_only=True)
    assert broken(fix_shift=False)
    assert broken(arrival=False)
    rng = np.random.default_rng(5)
    x = np.sort(rng.standard_normal(2500).astype(np.float32))[::-1][:2048]
    assert bucket_sort(keys_of(x), np.arange(2048), 2048, rng, value_pass=False) is None     # key buckets alone fail
