"""CPU model of the flash forward's online softmax with the folded scale (ops/common/softmax.py).

The kernel keeps (m, l) in scaled (base-2) units, takes the block max over the raw scores and forms each exponent
as one fma, P = 2^(fma(s, c, -m~)); a row whose |m~| reaches FOLD_LIMIT (2^28) scales its scores first. This mirrors
that step in numpy float32 (fma emulated exactly in float64: a float32 product is exact there) and checks lse and the
largest P against float64 over logit offsets from 0 to 1e12, blocks of 128 keys, one block fully masked. A model
without the FOLD_LIMIT branch must fail the huge-offset cases (the failure the GPU test test_large_logits met).
The rescale skip (RESCALE_SKIP): a block whose max is at most skip above the running max keeps it; lse stays exact and
the largest P stays within 2^(skip + 8) (float16's range for skip <= 7), also on rows whose max climbs block by block.
"""
import math

import numpy as np
import pytest

from ops.common.softmax import FOLD_LIMIT

F32 = np.float32
LOG2E = math.log2(math.e)


def fma32(a, b, c):
    """rn32(a * b + c) for float32 a, b, c: the product is exact in float64, the sum rounds once to float64 and
    then to float32 (a double rounding only on exact ties, far rarer than this test can see)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def folded_softmax(s_blocks, c, limit=FOLD_LIMIT, skip=0):
    """Rows of raw float32 scores in key blocks (-inf = masked) -> (lse, largest P) as the kernel forms them; skip:
    the forward's RESCALE_SKIP (a block max at most skip above the running max keeps the running max)."""
    rows = s_blocks[0].shape[0]
    m = np.full(rows, -np.inf, F32)
    l = np.zeros(rows, F32)
    p_max = np.zeros(rows, F32)
    c = F32(c)
    for s in s_blocks:
        s = s.astype(F32)
        m_blk = (s.max(axis=1) * c).astype(F32)                   # rn(c max s)
        m_new = np.maximum(m, m_blk)
        if skip:
            m_new = np.where(m_blk <= (m + F32(skip)).astype(F32), m, m_new).astype(F32)
        m_use = np.where(m_new == -np.inf, F32(0), m_new).astype(F32)
        with np.errstate(invalid="ignore", over="ignore"):
            corr = np.exp2((m - m_use).astype(F32)).astype(F32)
        m = m_new
        big = np.abs(m_use) >= limit
        with np.errstate(invalid="ignore", over="ignore"):
            x_fold = fma32(s, c, -m_use[:, None])
            x_big = ((s * c).astype(F32) - m_use[:, None]).astype(F32)
            p = np.exp2(np.where(big[:, None], x_big, x_fold)).astype(F32)
        p_max = np.maximum(p_max * corr, p.max(axis=1))
        l = (l * corr + p.sum(axis=1, dtype=F32)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = ((m + np.log2(l)) * F32(math.log(2.0))).astype(F32)
    return lse, p_max


def exact_lse(s_blocks, scale):
    s = np.concatenate(s_blocks, axis=1).astype(np.float64) * scale
    mx = s.max(axis=1, keepdims=True)
    return (mx[:, 0] + np.log(np.exp(s - mx).sum(axis=1)))


def case(offset, spread, seed, rows=64, blocks=4, bn=128):
    rng = np.random.default_rng(seed)
    s = (offset + spread * rng.standard_normal((rows, blocks * bn))).astype(F32)
    s[:, bn:2 * bn] = -np.inf                                     # one fully masked block
    s[0, :] = F32(offset)                                         # one row of equal logits (uniform softmax)
    return [s[:, i * bn:(i + 1) * bn] for i in range(blocks)]


OFFSETS = [0.0, 1e3, 1e5, 3.0e6, 1e7, -3e6, 1.8e8, 1.9e8, -2e8, 1e10, 1.1e12]   # c 1.86e8 = FOLD_LIMIT at scale 1


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("scale", [0.125, 1.0])
def test_folded_lse_and_largest_p(offset, scale):
    blocks = case(offset, 8.0, seed=int(abs(offset)) % 1000 + 7)
    lse, p_max = folded_softmax(blocks, scale * LOG2E)
    ex = exact_lse(blocks, scale)
    assert np.isfinite(lse).all()
    # the float32 lse itself rounds at 2^-24 relative; the scores' own float32 rounding at |offset| adds ulp(s)/2
    tol = 4 * 2.0 ** -24 * np.maximum(1.0, np.abs(ex)) + 0.5 * scale * np.spacing(F32(abs(offset) + 64))
    assert np.all(np.abs(lse - ex) <= tol), float(np.max(np.abs(lse - ex) - tol))
    # the largest P: 1 up to the rounding of m~ (2^(+-ulp(m~)/2), at most 2^8 under the limit), exactly 1 above it
    c = F32(scale * LOG2E)
    m = np.abs(np.concatenate(blocks, axis=1).max(axis=1) * c).astype(F32)
    bound = np.where(m >= FOLD_LIMIT, 0.0, np.spacing(m) / 2) + 1e-6      # + the rounding of exp2 and of the sum
    assert np.all(np.abs(np.log2(p_max)) <= bound), float(np.max(np.abs(np.log2(p_max)) - bound))
    assert np.all(bound <= 8.0 + 1e-6)


def test_huge_logits_row_exact():
    """test_large_logits' row: 64 equal logits of 133120^2 * 64 at scale 0.125: l must be 64, P exactly 1."""
    s = np.full((2, 64), F32(133120.0) ** 2 * 64, F32)
    lse, p_max = folded_softmax([s], 0.125 * LOG2E)
    assert np.all(p_max == 1.0)
    assert np.allclose(lse, exact_lse([s], 0.125), rtol=2e-7)


@pytest.mark.parametrize("offset", [1e10, 1.1e12])
def test_without_fold_limit_fails(offset):
    """The model can fail: with the FOLD_LIMIT branch removed, the huge offsets overflow or vanish (2^e with e up to
    ulp(m~)/2: 512 and 32768 here; the GPU failure of 2026-12-07 14:50 at logits of 1.1e12)."""
    blocks = case(offset, 8.0, seed=3)
    lse, p_max = folded_softmax(blocks, 1.0 * LOG2E, limit=np.inf)
    ex = exact_lse(blocks, 1.0)
    with np.errstate(divide="ignore"):
        bad = ~np.isfinite(lse) | (np.abs(np.log2(p_max)) > 8) | (np.abs(lse - ex) > 1e-6 * np.abs(ex))
    assert bad.any()


def test_nonpositive_scale_is_not_folded():
    """c <= 0 is never folded: the max over raw scores would be the min. The kernel prescales; with mult 1 the
    model is the unfolded form and still matches float64."""
    blocks = case(0.0, 8.0, seed=11)
    for scale in (-0.125, 0.0):
        c = F32(scale * LOG2E)
        with np.errstate(invalid="ignore"):
            scaled = [np.where(np.isneginf(b), -np.inf, b * c).astype(F32) for b in blocks]   # masked after scaling
        lse, _ = folded_softmax(scaled, 1.0)
        ex = exact_lse(scaled, 1.0 / LOG2E)
        assert np.allclose(lse, ex, rtol=1e-6, atol=1e-6)


def climbing(rows=64, blocks=8, bn=128, step=3.0, seed=5):
    """Rows whose max climbs by about `step` (base-2 units at scale 1 / LOG2E) a block, one row by 12 a block, one row
    flat: the skip keeps the running max on some blocks and moves it on others."""
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((rows, blocks * bn)).astype(F32)
    for i in range(blocks):
        s[:, i * bn:(i + 1) * bn] += F32(i * step / LOG2E)
        s[1, i * bn:(i + 1) * bn] += F32(i * 9.0 / LOG2E)
    s[2, :] = F32(1.0)
    return [s[:, i * bn:(i + 1) * bn] for i in range(blocks)]


@pytest.mark.parametrize("skip", [1, 4, 7])
@pytest.mark.parametrize("offset", [0.0, 1e5, 1.8e8, -2e8, 1.1e12])
def test_rescale_skip_keeps_lse_and_bounds_p(skip, offset):
    blocks = [b + F32(offset) for b in climbing()] + case(offset, 8.0, seed=skip, blocks=2)[:1]
    lse, p_max = folded_softmax(blocks, LOG2E, skip=skip)
    ex = exact_lse(blocks, 1.0)
    tol = 8 * 2.0 ** -24 * np.maximum(1.0, np.abs(ex)) + 0.5 * np.spacing(F32(abs(offset) + 64))
    assert np.all(np.abs(lse - ex) <= tol), float(np.max(np.abs(lse - ex) - tol))
    assert np.all(p_max <= 2.0 ** (skip + 8) * (1 + 1e-6)) and np.all(p_max < 65504.0)
    if offset == 0.0:     # the bound is reached in spirit: some rows keep a max that their P exceed
        assert (p_max > 1.5).any()


def test_rescale_skip_first_block_and_masked_rows():
    """A fully masked block first (m stays -inf: no skip from -inf), then finite blocks; a row masked throughout keeps
    l = 0 (lse -inf)."""
    blocks = case(0.0, 8.0, seed=2, blocks=4)
    blocks = [blocks[1]] + blocks                                   # the masked block first
    blocks = [b.copy() for b in blocks]
    for b in blocks:
        b[3, :] = -np.inf
    lse, p_max = folded_softmax(blocks, LOG2E, skip=7)
    ex = exact_lse([b[np.arange(64) != 3] for b in blocks], 1.0)
    assert lse[3] == -np.inf and p_max[3] == 0.0
    keep = np.arange(64) != 3
    assert np.allclose(lse[keep], ex, rtol=4e-7, atol=4e-7)


# ---------------------------------------------------------------------------------------- output accuracy (seed 001)
def bf16(x):
    """Round float32 to bfloat16 (nearest even), kept as float32."""
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(F32)


def folded_attention(q, k, v, scale, skip, bn=128):
    """The forward's output for bf16 q, k, v (one head, no mask): the online softmax above with P rounded to bf16
    before P V (fp32 accumulation), l summed from the unrounded P, out = bf16(O / l)."""
    c = F32(scale * LOG2E)
    s_all = (q.astype(np.float64) @ k.astype(np.float64).T).astype(F32)
    rows = q.shape[0]
    m = np.full(rows, -np.inf, F32)
    l = np.zeros(rows, F32)
    o = np.zeros((rows, v.shape[1]), F32)
    for j0 in range(0, k.shape[0], bn):
        s = s_all[:, j0:j0 + bn]
        m_blk = (s.max(axis=1) * c).astype(F32)
        m_new = np.maximum(m, m_blk)
        if skip:
            m_new = np.where(m_blk <= (m + F32(skip)).astype(F32), m, m_new).astype(F32)
        with np.errstate(invalid="ignore", over="ignore"):
            corr = np.exp2((m - m_new).astype(F32)).astype(F32)
        m = m_new
        p = np.exp2(fma32(s, c, -m[:, None])).astype(F32)
        l = (l * corr + p.sum(axis=1, dtype=F32)).astype(F32)
        o = (o * corr[:, None] + (bf16(p).astype(np.float64) @ v[j0:j0 + bn].astype(np.float64)).astype(F32))
    return bf16(o / l[:, None])


def seed001_rows(kscale, seed, rows=64, keys=4096, d=128):
    """Seed 001's inputs (q, v ~ N(0, 1), k ~ N(0, kscale^2), bf16): peaked rows, most of a row's weight on a few
    keys. Returns q, k, v, the float64 output and the fp32 floor's (P = 2^(c s - c max s) rounded to bf16, the output
    rounded; test_seed001's floor)."""
    rng = np.random.default_rng(seed)
    q = bf16(rng.standard_normal((rows, d)).astype(F32))
    k = bf16((rng.standard_normal((keys, d)) * kscale).astype(F32))
    v = bf16(rng.standard_normal((keys, d)).astype(F32))
    scale = d ** -0.5
    s = q.astype(np.float64) @ k.astype(np.float64).T
    p = np.exp2((s - s.max(axis=1, keepdims=True)) * scale * LOG2E)
    exact = (p @ v.astype(np.float64)) / p.sum(axis=1, keepdims=True)
    t = (s.astype(F32) * F32(scale * LOG2E)).astype(F32)
    pf = np.exp2(t - t.max(axis=1, keepdims=True)).astype(F32)
    floor = bf16((bf16(pf).astype(np.float64) @ v) / pf.sum(axis=1, dtype=F32, keepdims=True))
    return q, k, v, scale, exact, floor


def rel_l2(a, ref):
    return float(np.sqrt(((a - ref) ** 2).sum() / (ref ** 2).sum()))


def default_skip_d128():
    """The forward's rescale skip at head_dim 128 as the class attributes set it (0: off)."""
    fwd = pytest.importorskip("ops.flash_attention.forward_sm90")
    from ops.common.switches import dims_knob
    cls = fwd.FlashFwdSm90
    return int(cls.RESCALE_SKIP) if 128 in dims_knob(cls.RESCALE_SKIP_DIMS) else 0


@pytest.mark.parametrize("kscale", [8, 16])
def test_default_forward_within_seed001_margin_of_the_floor(kscale):
    """test_seed001's gate (rel L2 <= 1.10 x the fp32 floor) on the model of the default D 128 forward. The rescale
    skip failed it on the H100 (2026-12-08 00:59: K*8 1.972e-3 against the floor's 1.708e-3, 1.154x; 12 of 14
    cases): the running max kept below a row's max leaves that row's largest P = 2^(positive fraction), rounded to
    bf16, where the exact max gives P = 1 exactly; on peaked rows that term carries most of the output."""
    skip = default_skip_d128()
    for seed in range(3):
        q, k, v, scale, exact, floor = seed001_rows(kscale, seed)
        e_k, e_f = rel_l2(folded_attention(q, k, v, scale, skip), exact), rel_l2(floor, exact)
        assert e_k <= 1.10 * e_f, (skip, seed, e_k, e_f)


def test_rescale_skip_costs_accuracy_on_peaked_rows():
    """Why the skip is off: at 7 (its former default) the model's error on seed 001's K*8 rows is well above the
    floor, where without it the error is at the floor (so the test above can fail)."""
    ratios = {}
    for skip in (0, 7):
        r = []
        for seed in range(3):
            q, k, v, scale, exact, floor = seed001_rows(8, seed)
            r.append(rel_l2(folded_attention(q, k, v, scale, skip), exact) / rel_l2(floor, exact))
        ratios[skip] = float(np.mean(r))
    assert ratios[0] <= 1.02 and ratios[7] >= 1.08, ratios
