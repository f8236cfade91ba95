"""CPU: a NumPy emulation of the sparse attention forward's ping-pong online softmax (ops/dsa/sparse_attn/fwd_sm90.py,
consume_first / consume_second / epilogue), one head row at a time, in float32 with the kernel's roundings (P to
bf16 before P V, W0's P rescaled from m0 to m1 in fp32 before rounding, exp2 of arguments <= 0, m~ = 0 while
m = -inf). The emulated out and lse must match the float64 reference to bf16 accuracy on adversarial rows (all
slots invalid, invalid leading / trailing / middle blocks, an odd block count and its padding block, one valid
slot, logits x5000, a sink); mutations of the recurrence (the tile max instead of the running max, W0's P not
rescaled to m1, W1's O not rescaled, the padding block counted) must fail. The kernel itself runs in
tests/gpu/test_dsa_sparse_attn.py."""
import numpy as np
import pytest

BK = 64
F32 = np.float32


def bf16(x):
    """Round float32 to bfloat16 (nearest even), back in float32."""
    b = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(F32)


def exp2(x):
    with np.errstate(over="ignore"):
        return np.exp2(np.asarray(x, F32)).astype(F32)


def use(m):
    return F32(0.0) if m == -np.inf else F32(m)


def kernel_row(x, valid, v, sink=None, mutate=None):
    """x: [K] float32 logits already scaled by c (log2 domain), valid: [K] bool, v: [K, Dv] float32 (bf16 values);
    returns (out [Dv] float32, lse float)."""
    K, dv = v.shape
    n_pair = (K + 2 * BK - 1) // (2 * BK)
    pad = n_pair * 2 * BK
    xs = np.full(pad, -np.inf, F32)
    ok = np.zeros(pad, bool)
    vs = np.zeros((pad, dv), F32)
    xs[:K], ok[:K], vs[:K] = x, valid, v
    if mutate == "pad_counts":
        ok[K:] = True
        xs[K:] = 0.0
    half = dv // 2
    o = [np.zeros(half, F32), np.zeros(half, F32)]          # W0: columns [0, 256), W1: [256, 512)
    m = [F32(-np.inf), F32(-np.inf)]                         # the max each O half is scaled to
    l = [F32(0.0), F32(0.0)]                                 # each consumer's row sum of its own blocks
    for i in range(n_pair):
        a, b = slice(2 * i * BK, (2 * i + 1) * BK), slice((2 * i + 1) * BK, (2 * i + 2) * BK)
        xa = np.where(ok[a], xs[a], -np.inf).astype(F32)
        xb = np.where(ok[b], xs[b], -np.inf).astype(F32)
        # W0: m0, its O and l rescaled, P_a, own P V
        blk_a = F32(np.max(xa))
        m0 = blk_a if mutate == "tile_max" else max(m[0], blk_a)
        corr = exp2(m[0] - use(m0))
        pa = exp2(xa - use(m0))
        l[0] = F32(l[0] * corr + pa.sum(dtype=F32))
        o[0] = (o[0] * corr).astype(F32)
        o[0] = (o[0] + bf16(pa) @ vs[a][:, :half]).astype(F32)
        m[0] = m0
        # W1: m1 from m0, its O and l rescaled, P_b, own P V, then W0's rescaled P_a
        m1 = max(max(m[1], m0), F32(np.max(xb)))
        corr1 = exp2(m[1] - use(m1)) if mutate != "w1_no_rescale" else F32(1.0)
        pb = exp2(xb - use(m1))
        l[1] = F32(l[1] * corr1 + pb.sum(dtype=F32))
        o[1] = (o[1] * corr1).astype(F32)
        o[1] = (o[1] + bf16(pb) @ vs[b][:, half:]).astype(F32)
        m[1] = m1
        # W0: f = 2^(m0 - m1~), P_a' = P_a f (fp32, then bf16), l0 and O0 rescaled, the other's P V
        f = exp2(m[0] - use(m1)) if mutate != "w0_no_rescale" else F32(1.0)
        pa2 = (pa * f).astype(F32)
        l[0] = F32(l[0] * f)
        o[0] = (o[0] * f).astype(F32)
        o[0] = (o[0] + bf16(pb) @ vs[b][:, :half]).astype(F32)
        o[1] = (o[1] + bf16(pa2) @ vs[a][:, half:]).astype(F32)
        m[0] = m1
    assert m[0] == m[1] or n_pair == 0
    ls = F32(l[0] + l[1])
    mm = m[0]
    if ls == 0:
        return np.zeros(dv, F32), -np.inf
    den = ls
    if sink is not None:
        den = F32(ls + exp2(min(F32(sink * np.log2(np.e)) - mm, F32(126.0))))
    out = bf16(np.concatenate(o) / den)
    return out, float(np.log(2.0) * (mm + np.log2(ls)))


def reference(x, valid, v, sink=None):
    """float64: softmax over the valid slots (log2-domain logits x), sink in the denominator only."""
    x64 = np.where(valid, x.astype(np.float64), -np.inf)
    if not valid.any():
        return np.zeros(v.shape[1]), -np.inf
    mx = x64.max()
    p = np.exp2(x64 - mx)
    s = p.sum()
    den = s + (np.exp2(sink * np.log2(np.e) - mx) if sink is not None else 0.0)
    return (p @ v.astype(np.float64)) / den, np.log(2.0) * (mx + np.log2(s))


def case(name, rng):
    K, dv = {"odd": (5 * BK - 20, 512), "odd_flat": (5 * BK - 20, 512), "one": (1, 512), "even": (4 * BK, 512),
             "late_big": (4 * BK, 512)}.get(name, (3 * BK + 7, 512))
    x = (rng.standard_normal(K) * 3).astype(F32)
    valid = rng.random(K) > 0.1
    v = bf16(rng.standard_normal((K, dv)).astype(F32))
    sink = None
    if name == "all_invalid":
        valid[:] = False
    elif name == "lead_invalid":
        valid[:2 * BK] = False                 # the whole first pair: W0 and W1 see only -inf first
    elif name == "b_only":
        valid[:] = False
        valid[BK + 3] = True                   # the only valid slot in W1's block: W0's m0 stays -inf
    elif name == "a_then_big_b":
        x[BK:2 * BK] += 40.0                   # W1's block dominates: W0's P_a rescaled by ~2^-40
    elif name == "late_big":
        x[3 * BK:] += 40.0                     # the max jumps in W1's block of the second pair: O1 rescaled by 2^-40
    elif name == "odd_flat":
        x *= 0.1                               # near-uniform weights: a counted padding slot would show
    elif name == "wide":
        x *= 5000.0
    elif name == "sink":
        sink = 2.5
    elif name == "one":
        valid[:] = True
    return x, valid, v, sink


CASES = ["odd", "odd_flat", "even", "one", "all_invalid", "lead_invalid", "b_only", "a_then_big_b", "late_big", "wide",
         "sink", "mixed"]


def err(name, seed=0, mutate=None):
    rng = np.random.default_rng(seed + 17 * CASES.index(name))
    x, valid, v, sink = case(name, rng)
    o, lse = kernel_row(x, valid, v, sink, mutate)
    eo, el = reference(x, valid, v, sink)
    assert np.isfinite(o).all()
    if el == -np.inf:
        return float(np.abs(o).max()), (0.0 if lse == -np.inf else np.inf)
    return float(np.linalg.norm(o - eo) / max(np.linalg.norm(eo), 1e-30)), abs(lse - el)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pingpong_recurrence_matches_reference(name, seed):
    e_o, e_l = err(name, seed)
    assert e_o < 8e-3, f"{name}: out rel err {e_o:.3e}"     # bf16 P and bf16 out (seen: <= 2.6e-3)
    assert e_l < 1e-5, f"{name}: lse err {e_l:.3e}"        # fp32 sums (seen: <= 1.4e-6)


@pytest.mark.parametrize("mutate,name", [("tile_max", "wide"), ("w0_no_rescale", "a_then_big_b"),
                                         ("w1_no_rescale", "late_big"), ("pad_counts", "odd_flat")])
def test_mutations_fail(mutate, name):
    """A mutation gives a wrong out or lse, or a non-finite out (tile_max: an exp2 argument > 0 overflows at
    x5000 logits; in exact arithmetic its scale errors cancel, which is why the clamp-free recurrence needs it)."""
    worst = 0.0
    for s in range(3):
        try:
            with np.errstate(invalid="ignore", over="ignore"):
                e_o, e_l = err(name, s, mutate)
        except AssertionError:
            return
        worst = max(worst, e_o, e_l)
    assert worst > 5e-2, f"mutation {mutate} not caught (err {worst:.3e})"
