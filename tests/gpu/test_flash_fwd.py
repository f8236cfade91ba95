"""GPU tests of the sm90 flash-attention forward seam (ops/flash_attention/fwd.py).

Each case: NaN-poisoned out/lse, kernel vs float64 reference ("exact") from the same bf16/fp16 inputs, and the fp32
"floor" (P rounded to the dtype, output rounded) from tests/gpu/reference.py. Gates:
  relRMS(out - exact) <= 2 x relRMS(floor - exact)   (+1e-7 slack for cases where both are ~0)
  |lse - exact| <= 2^-16 max(1, max|S|) on rows that see keys; rows that see no key: out == 0 and lse == -inf exactly
  no NaN/inf anywhere else (every element written).
FLASH_FWD_KNOBS="NAME=VALUE,..." sets the knobs on trial first (ops.flash_attention.fwd.set_trial_knobs: FlashFwdSm90
class knobs such as FOLD=0, and BM64=<unmasked>/<masked>, the D 64 row tiles).
Run: python -m pytest -q tests/gpu/test_flash_fwd.py
"""
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from ops.flash_attention.fwd import flash_attn_fwd  # noqa: E402
from reference import attention_ref, gate_ratio, lse_tol  # noqa: E402
from ops.common.switches import knob_specs  # noqa: E402
from ops.flash_attention.fwd import set_trial_knobs  # noqa: E402

set_trial_knobs(knob_specs(os.environ.get("FLASH_FWD_KNOBS", "")))     # knobs on trial (sanitize_fwd.py: the same)

DEV = "cuda"
BF16, F16 = torch.bfloat16, torch.float16


def run_fwd(q, k, v, *, causal=False, window=(-1, -1), scale=None, cu_q=None, cu_k=None, max_q=0, max_k=0):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.full(q.shape[:-1] + v.shape[-1:], float("nan"), dtype=q.dtype, device=DEV)   # [.., Dv]
    if cu_q is None:
        B, Sq, H, _ = q.shape
        lse = torch.full((B, H, Sq), float("nan"), dtype=torch.float32, device=DEV)
    else:
        lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float32, device=DEV)
    flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=window, cu_seqlens_q=cu_q,
                   cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                   stream=torch.cuda.current_stream().cuda_stream)
    return out, lse


def check(q, k, v, *, causal=False, window=(-1, -1), scale=None, cu_q=None, cu_k=None, max_q=0, max_k=0,
          out=None, lse=None, factor=2.0):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if out is None:
        out, lse = run_fwd(q, k, v, causal=causal, window=window, scale=scale, cu_q=cu_q, cu_k=cu_k,
                           max_q=max_q, max_k=max_k)
    torch.cuda.synchronize()
    kw = dict(causal=causal, window=window, softmax_scale=scale, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    ex_o, ex_l = attention_ref(q, k, v, upcast=torch.float64, **kw)
    fl_o, _ = attention_ref(q, k, v, upcast=torch.float32, round_p_to=q.dtype, **kw)
    fl_o = fl_o.to(q.dtype)
    assert not torch.isnan(out).any(), f"NaN in out ({int(torch.isnan(out).sum())} elements)"
    assert torch.isfinite(out).all(), "inf in out"
    assert not torch.isnan(lse).any(), f"NaN in lse ({int(torch.isnan(lse).sum())} elements)"
    dead = torch.isneginf(ex_l)
    assert torch.equal(torch.isneginf(lse), dead), \
        f"-inf lse pattern differs: kernel {int(torch.isneginf(lse).sum())} vs reference {int(dead.sum())}"
    # dead rows: out exactly 0 (lse [B,H,S] / [H,T] -> out row index)
    if cu_q is None:
        dead_rows = dead.permute(0, 2, 1)  # B,S,H
    else:
        dead_rows = dead.permute(1, 0)     # T,H
    if dead_rows.any():
        assert (out[dead_rows] == 0).all(), "rows that see no key must have out == 0"
    alive = ~dead
    if alive.any():
        err = (lse.double() - ex_l)[alive].abs().max().item()
        tol = lse_tol(q, k, scale)
        assert err <= tol, f"lse error {err:.3e} > {tol:.3e}"
        ratio, e_k, e_f = gate_ratio(out, ex_o, fl_o)
        assert e_k <= factor * e_f + 1e-7, f"out relRMS {e_k:.3e} > {factor} x floor {e_f:.3e} (ratio {ratio:.2f})"
        return ratio
    return 0.0


def rnd(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale).to(dtype)


# ------------------------------------------------------------------------------------------------ dense
@pytest.mark.parametrize("S", [1, 17, 128, 255, 384, 1000, 4097])     # 384: two whole 192-row tiles at D 64
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_lengths(S, D, causal):
    torch.manual_seed(S * 7 + D + causal)
    B, H = (1, 2) if S > 1000 else (2, 3)
    q, k, v = rnd(B, S, H, D), rnd(B, S, H, D), rnd(B, S, H, D)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_fp16(D, causal):
    torch.manual_seed(11 + D)
    q, k, v = (rnd(2, 300, 4, D, dtype=F16) for _ in range(3))
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("Sq,Sk", [(113, 203), (203, 113), (301, 190), (1, 519), (512, 1), (128, 777), (777, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])          # D 64: the 192-row tile (Sq below, across and past one tile)
def test_sq_ne_sk(Sq, Sk, causal, D):
    torch.manual_seed(Sq + 3 * Sk + D)
    q, k, v = rnd(2, Sq, 2, D), rnd(2, Sk, 2, D), rnd(2, Sk, 2, D)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("H,Hkv", [(8, 1), (4, 2)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_gqa(H, Hkv, causal, D):
    torch.manual_seed(H * 10 + Hkv)
    q, k, v = rnd(2, 333, H, D), rnd(2, 290, Hkv, D), rnd(2, 290, Hkv, D)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("window,causal,Sq,Sk", [((64, 0), True, 500, 500), ((32, 16), False, 400, 400),
                                                  ((-1, 8), False, 300, 300), ((100, -1), False, 300, 350),
                                                  ((16, 16), True, 260, 200), ((0, 0), False, 200, 200),
                                                  ((200, 0), False, 700, 129), ((5, 7), False, 129, 700)])
def test_window(window, causal, Sq, Sk):
    torch.manual_seed(Sq + Sk + window[0])
    q, k, v = rnd(1, Sq, 4, 64), rnd(1, Sk, 2, 64), rnd(1, Sk, 2, 64)
    check(q, k, v, causal=causal, window=window)


@pytest.mark.parametrize("Sq,Sk,D", [(1000, 300, 64), (1, 1, 128), (64, 1, 64), (799, 3, 128)])
def test_causal_dead_rows(Sq, Sk, D):
    """Sq > Sk bottom-right causal: the first Sq - Sk rows see no key (out 0, lse -inf), off the 128-row grid."""
    torch.manual_seed(Sq + Sk)
    q, k, v = rnd(2, Sq, 2, D), rnd(2, Sk, 1, D), rnd(2, Sk, 1, D)
    check(q, k, v, causal=True)


@pytest.mark.parametrize("scale", [0.0, -0.125, 0.5, 1.2])
def test_scales(scale):
    torch.manual_seed(5)
    q, k, v = rnd(1, 257, 2, 64), rnd(1, 519, 2, 64), rnd(1, 519, 2, 64)
    check(q, k, v, scale=scale, causal=True)


def test_strided_layouts():
    """Every tensor with its own (non-contiguous) strides: BSHD views of BHSD / padded storage."""
    torch.manual_seed(3)
    B, S, H, D = 2, 300, 4, 128
    q = rnd(B, H, S, D).transpose(1, 2)                      # BSHD view of BHSD
    k = rnd(S, B, H, D).transpose(0, 1)                      # BSHD view of SBHD
    v = rnd(B, S, H, D + 64)[..., :D]                        # padded head_dim
    check(q, k, v, causal=True)


def test_sharp_softmax():
    """q, k ~ N(0, 16): logit std ~ 16 (AOTriton 'sharp softmax'), 257 x 519."""
    torch.manual_seed(9)
    q, k, v = rnd(1, 257, 2, 64, scale=4.0), rnd(1, 519, 2, 64, scale=4.0), rnd(1, 519, 2, 64)
    check(q, k, v)


def test_large_logits():
    """q = k = v = 133120 (bf16 exact), scale 0.125: huge equal logits must not overflow."""
    q = torch.full((1, 64, 1, 64), 133120.0, device=DEV, dtype=BF16)
    out, lse = run_fwd(q, q, q, scale=0.125)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert (out.float() == 133120.0).all()


@pytest.mark.parametrize("A,step", [(1448.0, 1.0), (2048.0, 1.0), (16384.0, 8.0)])   # c A^2 at scale 1: 3.0e6,
@pytest.mark.parametrize("D", [64, 128])                                              # 6.1e6 (folded), 3.9e8
@pytest.mark.parametrize("causal", [False, True])                                     # (over 2^28: scaled first)
def test_logits_near_fold_limit(A, step, D, causal):
    """Logits A^2 + b_i d_j (exact in fp32: b, d = step x integers in [-3, 3]) at scale 1, where the scaled row max
    m is off c max S by up to ulp(m) / 2 (ops/common/softmax.py: the folded exponent keeps every difference exact, where
    scaling first would round c S to 1/4 at 6e6) and, at 16384, past FOLD_LIMIT, where the scores are scaled first
    (their spread, 64 c, is far over that rounding there). All must meet the float64 reference like ordinary logits."""
    torch.manual_seed(int(A) + D + causal)
    S, H = 300, 2
    q, k = torch.zeros(1, S, H, D, device=DEV), torch.zeros(1, S, H, D, device=DEV)
    q[..., 0], k[..., 0] = A, A
    q[..., 1] = step * torch.randint(-3, 4, (1, S, H), device=DEV).float()
    k[..., 1] = step * torch.randint(-3, 4, (1, S, H), device=DEV).float()
    v = rnd(1, S, H, D)
    check(q.to(BF16), k.to(BF16), v, causal=causal, scale=1.0)


@pytest.mark.parametrize("inc", [3.0, 6.9, 7.5, 12.0])
@pytest.mark.parametrize("D,dtype", [(128, torch.float16), (128, BF16), (64, BF16)])
@pytest.mark.parametrize("causal", [False, True])
def test_climbing_row_max(inc, D, dtype, causal):
    """Logits that climb by about inc (base-2 units) from one 128-key block to the next, plus a spread inside each
    block: O is rescaled at every block. Written for the rescale skip (a knob, FlashFwdSm90.RESCALE_SKIP_DIMS, off by
    default since 2026-12-08): with it (FLASH_FWD_KNOBS=RESCALE_SKIP_DIMS=128) the running max is kept over the blocks
    that climb by 3 or 6.9 (their P up to 2^6.9, float16 included) and moved at 7.5 and 12 (O rescaled, the warp's
    vote). Every form must meet the float64 reference like ordinary logits."""
    torch.manual_seed(int(inc * 10) + D + causal)
    S, H = 1000, 2
    j = torch.arange(S, device=DEV, dtype=torch.float32)
    q, k = torch.zeros(1, S, H, D, device=DEV), torch.zeros(1, S, H, D, device=DEV)
    q[..., 0] = 1.0
    k[..., 0] = ((j // 128) * inc * math.log(2.0))[None, :, None]          # scale 1: c s = s log2(e)
    q[..., 1] = torch.randint(-3, 4, (1, S, H), device=DEV).float()
    k[..., 1] = 0.25 * torch.randint(-3, 4, (1, S, H), device=DEV).float()
    v = rnd(1, S, H, D, dtype=dtype)
    check(q.to(dtype), k.to(dtype), v, causal=causal, scale=1.0)


# ------------------------------------------------------------------------------------------------ varlen
def _varlen_case(seg_q, seg_k, H, Hkv, D, extra_q=0, extra_k=0, dtype=BF16, Dv=None):
    cu_q = torch.tensor([0] + list(torch.tensor(seg_q).cumsum(0).tolist()), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(seg_k).cumsum(0).tolist()), dtype=torch.int32, device=DEV)
    Tq, Tk = int(cu_q[-1]) + extra_q, int(cu_k[-1]) + extra_k
    q, k, v = rnd(Tq, H, D, dtype=dtype), rnd(Tk, Hkv, D, dtype=dtype), rnd(Tk, Hkv, Dv or D, dtype=dtype)
    return q, k, v, cu_q, cu_k, max(seg_q), max(seg_k)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_varlen(causal, D):
    torch.manual_seed(21 + D)
    # an empty q segment, an empty k segment, a length-1 segment, long ones; 37 q rows past cu_seqlens_q[-1]
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case([5, 0, 1, 294, 1000, 3], [7, 3, 0, 390, 500, 513], 4, 2, D,
                                              extra_q=37, extra_k=5)
    check(q, k, v, causal=causal, cu_q=cu_q, cu_k=cu_k, max_q=mq, max_k=mk)


def test_varlen_tail_strides():
    """D 64 (192-row tile), a small max_seqlen_q (one query block a segment) and 500 rows past cu_seqlens_q[-1]: the
    tail clearing walks them in several grid-strides of BM rows."""
    torch.manual_seed(25)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case([5, 100, 0, 60], [50, 300, 7, 60], 4, 2, 64, extra_q=500)
    for causal in (False, True):
        check(q, k, v, causal=causal, cu_q=cu_q, cu_k=cu_k, max_q=mq, max_k=mk)


def test_varlen_window_gqa():
    torch.manual_seed(22)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case([511, 3, 307, 1], [1, 513, 256, 40], 8, 1, 128, extra_q=200)
    check(q, k, v, causal=True, window=(48, -1), cu_q=cu_q, cu_k=cu_k, max_q=mq, max_k=mk)


def test_varlen_fp16_mqa_window():
    """fp16, MQA (8:1), window without causal, max_seqlen_q larger than any segment."""
    torch.manual_seed(24)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case([129, 1, 0, 640], [300, 2, 5, 64], 8, 1, 64, extra_q=3, dtype=F16)
    check(q, k, v, window=(20, 30), cu_q=cu_q, cu_k=cu_k, max_q=mq + 200, max_k=mk)


def test_varlen_issue443():
    """flash-attention #443: varlen causal, q segment 256, k segments of length 1."""
    torch.manual_seed(23)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case([256, 256, 256], [1, 1, 1], 2, 2, 64)
    check(q, k, v, causal=True, cu_q=cu_q, cu_k=cu_k, max_q=mq, max_k=mk)


# ------------------------------------------------------------------------------------------------ robustness
@pytest.mark.parametrize("kscale", [8, 16, 32, 64])
def test_seed001_wide_logits(kscale):
    """seed 001 (FlyDSL lazy-rescale NaN): K scaled by 8..64 at B=1 S=4096 H=8 D=128; zero non-finite outputs."""
    torch.manual_seed(1000 + kscale)
    B, S, H, D = 1, 4096, 8, 128
    q = rnd(B, S, H, D)
    k = rnd(B, S, H, D, scale=float(kscale))
    v = rnd(B, S, H, D)
    out, lse = run_fwd(q, k, v)
    torch.cuda.synchronize()
    assert int((~torch.isfinite(out)).sum()) == 0, "non-finite out"
    assert int((~torch.isfinite(lse)).sum()) == 0, "non-finite lse"
    check(q[:, :, :2], k[:, :, :2], v[:, :, :2])  # numerics gate on 2 heads (reference cost)


def test_nan_reaches_only_the_rows_that_see_it():
    """A NaN in one key of one head reaches out and lse of exactly the query rows of that head that see the key (the
    finalize treats a NaN row sum as NaN, not as a row with no key: never replaced by 0 / -inf); other heads and the
    causal rows before the key stay finite and equal to the clean run."""
    torch.manual_seed(5)
    B, S, H, D = 1, 300, 4, 128
    q, k, v = (torch.randn(B, S, H, D, device=DEV, dtype=BF16) for _ in range(3))
    clean_o, clean_l = run_fwd(q, k, v, causal=True)
    k[0, 200, 2, 5] = float("nan")
    out, lse = run_fwd(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert torch.isnan(out[0, 200:, 2]).all() and torch.isnan(lse[0, 2, 200:]).all()
    assert torch.equal(out[0, :200, 2], clean_o[0, :200, 2]) and torch.equal(lse[0, 2, :200], clean_l[0, 2, :200])
    others = [h for h in range(H) if h != 2]
    assert torch.equal(out[:, :, others], clean_o[:, :, others]) and torch.equal(lse[:, others], clean_l[:, others])


def test_deterministic_reruns():
    torch.manual_seed(77)
    q, k, v = rnd(2, 777, 4, 128), rnd(2, 777, 2, 128), rnd(2, 777, 2, 128)
    o0, l0 = run_fwd(q, k, v, causal=True)
    for _ in range(100):
        o1, l1 = run_fwd(q, k, v, causal=True)
        assert torch.equal(o0, o1) and torch.equal(l0, l1), "forward not bitwise reproducible"


def test_validation_errors():
    q = rnd(1, 16, 2, 64)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 16, device=DEV)
    with pytest.raises(ValueError, match="k"):
        flash_attn_fwd(q, q.half(), q, out, lse, softmax_scale=0.1, causal=False, window=(-1, -1))
    with pytest.raises(ValueError, match="head_dim"):
        x = rnd(1, 16, 2, 80)
        flash_attn_fwd(x, x, x, torch.empty_like(x), lse, softmax_scale=0.1, causal=False, window=(-1, -1))
    with pytest.raises(ValueError, match="lse"):
        flash_attn_fwd(q, q, q, out, lse.half(), softmax_scale=0.1, causal=False, window=(-1, -1))
    with pytest.raises(ValueError, match="16"):
        bad = rnd(1, 16 * 2 * 64 + 4)[:, 4:].reshape(1, 16, 2, 64)  # base offset 8 B
        flash_attn_fwd(bad, q, q, out, lse, softmax_scale=0.1, causal=False, window=(-1, -1))


# ------------------------------------------------------------------------------------------------ head dims 96, 192, 256
# The pairs added on 2026-12-03 (supported.FWD_HEAD_DIMS beyond (64, 64) / (128, 128)): (192, 128) is MLA in MHA form
# (DeepSeek's dense warm-up). Each pair: sequence lengths on and off the tile grids (BN 128 or 64), causal, GQA with
# Sq != Sk, windows, dead rows, fp16, varlen with empty segments and tail rows, wide logits.
NEW_DIMS = [(96, 96), (192, 128), (192, 192), (256, 256)]
ids = [f"{d}-{dv}" for d, dv in NEW_DIMS]


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
@pytest.mark.parametrize("S", [1, 17, 255, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_dense(dims, S, causal):
    D, Dv = dims
    torch.manual_seed(S * 7 + D + Dv + causal)
    q, k, v = rnd(2, S, 3, D), rnd(2, S, 3, D), rnd(2, S, 3, Dv)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
def test_head_dims_long(dims):
    D, Dv = dims
    torch.manual_seed(D + Dv)
    q, k, v = rnd(1, 4097, 2, D), rnd(1, 4097, 2, D), rnd(1, 4097, 2, Dv)
    check(q, k, v, causal=True)


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_gqa_sq_ne_sk(dims, causal):
    D, Dv = dims
    torch.manual_seed(3 * D + Dv)
    q, k, v = rnd(2, 333, 8, D), rnd(2, 290, 2, D), rnd(2, 290, 2, Dv)
    check(q, k, v, causal=causal)
    q, k, v = rnd(1, 203, 4, D), rnd(1, 519, 1, D), rnd(1, 519, 1, Dv)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
def test_head_dims_window_and_dead_rows(dims):
    D, Dv = dims
    torch.manual_seed(5 * D + Dv)
    q, k, v = rnd(1, 500, 4, D), rnd(1, 500, 2, D), rnd(1, 500, 2, Dv)
    check(q, k, v, causal=True, window=(64, 0))
    check(q, k, v, window=(32, 16))
    q, k, v = rnd(2, 799, 2, D), rnd(2, 3, 1, D), rnd(2, 3, 1, Dv)   # rows 0..795 see no key
    check(q, k, v, causal=True)


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
def test_head_dims_fp16(dims):
    D, Dv = dims
    torch.manual_seed(11 + D + Dv)
    q, k, v = rnd(2, 300, 4, D, dtype=F16), rnd(2, 300, 4, D, dtype=F16), rnd(2, 300, 4, Dv, dtype=F16)
    check(q, k, v, causal=True)


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_varlen(dims, causal):
    D, Dv = dims
    torch.manual_seed(21 + D + Dv)
    q, k, v, cu_q, cu_k, mq, mk = _varlen_case([5, 0, 1, 294, 1000, 3], [7, 3, 0, 390, 500, 513], 4, 2, D,
                                              extra_q=37, extra_k=5, Dv=Dv)
    check(q, k, v, causal=causal, cu_q=cu_q, cu_k=cu_k, max_q=mq, max_k=mk)


@pytest.mark.parametrize("dims", NEW_DIMS, ids=ids)
@pytest.mark.parametrize("kscale", [8, 5000])
def test_head_dims_wide_logits(dims, kscale):
    """K scaled x8 and x5000: sharp softmax rows, lse up to ~1e5; no overflow, out at the floor."""
    D, Dv = dims
    torch.manual_seed(kscale + D + Dv)
    q, k, v = rnd(1, 384, 2, D), rnd(1, 384, 2, D, scale=kscale), rnd(1, 384, 2, Dv)
    check(q, k, v, causal=True)


def test_head_dims_validation():
    """k's head_dim must be q's; v's may differ only as the table allows; out follows v."""
    lse = torch.empty(1, 2, 16, device=DEV)
    q, k = rnd(1, 16, 2, 192), rnd(1, 16, 2, 192)
    for dv in (64, 96, 256):                                    # (192, dv) not in the table
        v = rnd(1, 16, 2, dv)
        with pytest.raises(ValueError, match="not supported"):
            flash_attn_fwd(q, k, v, rnd(1, 16, 2, dv), lse, softmax_scale=0.1, causal=False, window=(-1, -1))
    v = rnd(1, 16, 2, 128)
    with pytest.raises(ValueError, match="out: shape"):          # out shaped like q, not like v
        flash_attn_fwd(q, k, v, torch.empty_like(q), lse, softmax_scale=0.1, causal=False, window=(-1, -1))
    with pytest.raises(ValueError, match="k: head_dim"):
        flash_attn_fwd(q, rnd(1, 16, 2, 128), v, rnd(1, 16, 2, 128), lse, softmax_scale=0.1, causal=False,
                       window=(-1, -1))
