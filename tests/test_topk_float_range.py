"""CPU check of the streaming top-k's pass-0 arithmetic (ops/dsa/topk/stream_sm90.py), emulated in NumPy float32
(IEEE, no flush to zero, as the kernel's PTX: no .ftz): pass A bins a score by digit0 (x + 0.0, then key_bits' top
11 bits); pass B tests the score itself against the float range [f_lo, f_hi) of the threshold digit d0
(float_of_key). Both must agree for every score and every finite digit d0, or the selection and candidate counts
disagree with the histogram: -0.0 / +0.0, denormals of both signs, +-FLT_MAX, +-inf and NaN included."""
import numpy as np

SIGN = np.int32(-2147483648)
SHIFT0 = 21
BINS0 = 1 << (32 - SHIFT0)


def digit0(x):
    c = (x.astype(np.float32) + np.float32(0.0)).view(np.int32)
    u = c ^ ((c >> 31) | SIGN)
    return (u >> SHIFT0) & (BINS0 - 1)


def float_of_key(u):
    u = np.int32(u)
    b = u ^ SIGN if u < 0 else ~u
    return np.array([b], dtype=np.int32).view(np.float32)[0]


def scores(rng):
    bits = rng.integers(-2**31, 2**31, size=60000, dtype=np.int64).astype(np.int32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 2.0, -2.0,
                        np.finfo(np.float32).max, -np.finfo(np.float32).max, np.finfo(np.float32).tiny,
                        -np.finfo(np.float32).tiny], dtype=np.float32)
    denorm = np.array([1, 2, 0x1FFFFF, 0x200000, 0x200001, 0x7FFFFF], dtype=np.int32)
    edges = []
    for d in range(BINS0):                       # each bin's lowest key and the key below it, as floats
        for u in (d << SHIFT0, (d << SHIFT0) - 1, (d << SHIFT0) + 1):
            u &= 0xFFFFFFFF
            if u != 0x7FFFFFFF:
                edges.append(float_of_key(u - (1 << 32) if u >= 1 << 31 else u))
    return np.concatenate([bits.view(np.float32), special, denorm.view(np.float32), (denorm | SIGN).view(np.float32),
                           np.array(edges, dtype=np.float32), rng.standard_normal(20000).astype(np.float32)])


def test_float_range_matches_digit():
    x = scores(np.random.default_rng(7))
    d = digit0(x)
    with np.errstate(invalid="ignore"):
        for d0 in range(4, BINS0 - 4):           # every finite digit can be the threshold's
            f_lo = float_of_key((d0 << SHIFT0) - (1 << 32) if d0 >= 1024 else d0 << SHIFT0)
            k_hi = (d0 + 1) << SHIFT0
            f_hi = float_of_key(k_hi - (1 << 32) if k_hi >= 1 << 31 else k_hi)
            above = x >= f_hi
            sel = above & (x < np.float32(np.inf))
            cand = (x >= f_lo) & ~above
            np.testing.assert_array_equal(sel, (d > d0) & (d < BINS0 - 4), err_msg=f"selection, d0 {d0:#x}")
            np.testing.assert_array_equal(cand, d == d0, err_msg=f"candidates, d0 {d0:#x}")


def test_non_finite_bins():
    """+-inf and NaN (any sign or payload) land in bins 0-3 / 0x7FC-0x7FF, which pass A leaves out; -0.0 bins
    with +0.0; no finite score lands there."""
    nan_bits = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFF800001, 0xFFFFFFFF], dtype=np.uint32)
    bad = np.concatenate([np.array([np.inf, -np.inf], np.float32), nan_bits.view(np.int32).view(np.float32)])
    assert all(v < 4 or v >= BINS0 - 4 for v in digit0(bad))
    fin = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    assert all(4 <= v < BINS0 - 4 for v in digit0(fin))
    assert digit0(np.array([-0.0], np.float32))[0] == digit0(np.array([0.0], np.float32))[0] == 0x400
    # a mutation the test must catch: without the + 0.0, -0.0 would bin below +0.0
    c = np.array([-0.0], np.float32).view(np.int32)
    assert ((c ^ ((c >> 31) | SIGN)) >> SHIFT0) & (BINS0 - 1) != 0x400
