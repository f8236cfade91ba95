"""GPU tests of the sm90 flash-attention backward (ops/flash_attention/bwd.py).

Reference: float64 analytic gradients from the same bf16/fp16 inputs ("exact"), and an fp32 "floor" that recomputes
like a flash kernel (P from the stored fp32 LSE, Delta from the stored rounded O, P and dS rounded to the input dtype
before the matmuls that consume them, results rounded to the dtype). Gate: relRMS(kernel-exact) <= 2 x
relRMS(floor-exact) + 1e-6. The forward input (out, lse) comes from the torch fp32 reference (out rounded to dtype).
Every test runs for each kernel of the non-deterministic path: "simple" (backward_sm90.py, PADDLE_DSA_BWD_FAST=0),
"fast" (the pipelined backward_fast_sm90.py, PADDLE_DSA_BWD_FAST=1) and "fast2" (the same with column-split dQ for
D = 128, PADDLE_DSA_BWD_FAST=2); deterministic cases run for each kernel of the deterministic path: under "simple"
(PADDLE_DSA_BWD_DET=recompute: the simple kernels, dQ recomputed) and under "ordered" (PADDLE_DSA_BWD_DET=ordered: the
pipelined kernel with the dQ tiles' reduces in a fixed order, ops/common/tile_order.py; the ``test_ordered_*`` tests
run under "ordered" only).
FLASH_BWD_KNOBS="NAME=VALUE,..." sets FlashBwdSm90Fast class knobs first (the knobs on trial; ops.common.switches).
Run:  python -m pytest -x -q tests/gpu/test_flash_bwd.py     (only the pipelined kernels: add  -k fast;
      the ordered deterministic kernel first, in a time limit (a hang cannot be caught here):
      timeout 300 python tests/gpu/test_flash_bwd.py smoke ordered)
Bench table (all kernels):  python tests/gpu/test_flash_bwd.py bench      (quick check: ... smoke)
"""
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ops.flash_attention.bwd as bwd_mod  # noqa: E402
from ops.flash_attention.bwd import flash_attn_bwd  # noqa: E402
from reference import attention_ref, visible_mask  # noqa: E402
from ops.common.switches import knob_specs  # noqa: E402
from ops.flash_attention.backward_fast_sm90 import FlashBwdSm90Fast  # noqa: E402

DEV = "cuda"
for _name, _value in knob_specs(os.environ.get("FLASH_BWD_KNOBS", "")).items():   # knobs on trial (also for
    assert hasattr(FlashBwdSm90Fast, _name), f"FLASH_BWD_KNOBS: no knob {_name}"  # sanitize_bwd.py, which imports
    setattr(FlashBwdSm90Fast, _name, _value)                                      # this module), e.g. DQ_COLS_DIMS=64:128


_DET_ONLY = {"test_deterministic_numerics", "test_deterministic_bitwise_100"}


_VARIANTS = {"simple": 0, "fast": 1, "fast2": 2, "ordered": 3}


@pytest.fixture(autouse=True, params=list(_VARIANTS))
def bwd_variant(request, monkeypatch):
    """Runs every test with the module defaults switched to each kernel: simple / fast / fast2 for the
    non-deterministic path (the deterministic cases under "simple" with DET = "recompute"), "ordered" for the
    deterministic cases (and the test_ordered_* tests) with DET = "ordered"."""
    fast = _VARIANTS[request.param]
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    name = request.node.originalname
    det_case = params.get("deterministic") is True or name in _DET_ONLY
    if request.param == "ordered":
        if not (det_case or name.startswith("test_ordered_")):
            pytest.skip("the ordered kernel serves the deterministic mode only")
        monkeypatch.setattr(bwd_mod, "DET", "ordered")
        return fast
    if name.startswith("test_ordered_"):
        pytest.skip("runs under the ordered variant only")
    if fast and det_case:
        pytest.skip("deterministic cases run under simple (recompute) and ordered")
    monkeypatch.setattr(bwd_mod, "FAST", fast)
    monkeypatch.setattr(bwd_mod, "DET", "recompute")
    return fast


def alloc(shape, dtype):
    dt = {"float32": torch.float32, "int32": torch.int32}[dtype]
    if dt == torch.float32:
        return torch.full(tuple(shape), float("nan"), dtype=dt, device=DEV)
    return torch.full(tuple(shape), -123457, dtype=dt, device=DEV)


# ----------------------------------------------------------------------------------------------- references
def _bwd_dense(q, k, v, out, dout, lse, dlse, *, causal, window, scale, upcast, round_to):
    """Gradients for one dense problem q [B,Sq,H,D], k/v [B,Sk,Hkv,D]. exact: upcast=f64, round_to=None (uses its
    own O/LSE); floor: upcast=f32, round_to=dtype (uses the stored out/lse, rounds P, dS and the results)."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = H // Hkv
    qf = q.to(upcast).permute(0, 2, 1, 3)
    kf = k.to(upcast).repeat_interleave(g, dim=2).permute(0, 2, 1, 3)
    vf = v.to(upcast).repeat_interleave(g, dim=2).permute(0, 2, 1, 3)
    dof = dout.to(upcast).permute(0, 2, 1, 3)
    vis = visible_mask(Sq, Sk, causal=causal, window=window, device=q.device)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    s = s.masked_fill(~vis, float("-inf"))
    if round_to is None:
        m = s.amax(-1, keepdim=True)
        dead = torch.isneginf(m)
        L = torch.where(dead, torch.zeros_like(m), m) + torch.log(
            torch.exp(s - torch.where(dead, torch.zeros_like(m), m)).sum(-1, keepdim=True))
        L = torch.where(dead, torch.full_like(L, float("inf")), L)
        p = torch.exp(s - L)
        o = torch.matmul(p, vf)
    else:
        L = lse.to(upcast).unsqueeze(-1)
        L = torch.where(torch.isneginf(L), torch.full_like(L, float("inf")), L)
        p = torch.exp(torch.clamp(s - L, max=0.0))
        p = torch.where(vis, p, torch.zeros_like(p))
        o = out.to(upcast).permute(0, 2, 1, 3)
    delta = (o * dof).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.to(upcast).unsqueeze(-1)
    pr = p.to(round_to).to(upcast) if round_to is not None else p
    dv = torch.matmul(pr.transpose(-1, -2), dof)
    dp = torch.matmul(dof, vf.transpose(-1, -2))
    ds = p * (dp - delta)
    dsr = ds.to(round_to).to(upcast) if round_to is not None else ds
    dq = torch.matmul(dsr, kf) * scale
    dk = torch.matmul(dsr.transpose(-1, -2), qf) * scale
    dk = dk.reshape(B, Hkv, g, Sk, D).sum(2)
    dv = dv.reshape(B, Hkv, g, Sk, v.shape[-1]).sum(2)
    res = [dq.permute(0, 2, 1, 3), dk.permute(0, 2, 1, 3), dv.permute(0, 2, 1, 3)]
    if round_to is not None:
        res = [x.to(round_to).to(upcast) for x in res]
    return res


def bwd_ref(q, k, v, out, dout, lse, dlse, *, causal, window, scale, cu_q=None, cu_k=None, exact=True):
    kw = dict(causal=causal, window=window, scale=scale,
              upcast=torch.float64 if exact else torch.float32, round_to=None if exact else q.dtype)
    if cu_q is None:
        return _bwd_dense(q, k, v, out, dout, lse, dlse, **kw)
    up = kw["upcast"]
    dq = torch.zeros(q.shape, dtype=up, device=q.device)
    dk = torch.zeros(k.shape, dtype=up, device=q.device)
    dv = torch.zeros(v.shape, dtype=up, device=q.device)
    cq, ck = [int(x) for x in cu_q.tolist()], [int(x) for x in cu_k.tolist()]
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        r = _bwd_dense(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], out[None, q0:q1], dout[None, q0:q1],
                       lse[None, :, q0:q1], None if dlse is None else dlse[None, :, q0:q1], **kw)
        dq[q0:q1], dk[k0:k1], dv[k0:k1] = r[0][0], r[1][0], r[2][0]
    return dq, dk, dv


def rel_rms(x, ref):
    x, ref = x.double(), ref.double()
    num = (x - ref).pow(2).mean().sqrt()
    den = ref.pow(2).mean().sqrt()
    return float(num / den) if float(den) > 0 else float(num)


# -------------------------------------------------------------------------------------------------- harness
def make_inputs(B, Sq, Sk, H, Hkv, D, dtype, *, causal, window, scale, cu_q=None, cu_k=None, Tq=None, Tk=None,
                dout_zero=False, with_dlse=False, seed=0, mag=1.0, Dv=None):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    Dv = D if Dv is None else Dv
    if cu_q is None:
        qs, ks = (B, Sq, H, D), (B, Sk, Hkv, D)
    else:
        qs, ks = (Tq, H, D), (Tk, Hkv, D)
    q = (torch.randn(qs, generator=gen, device=DEV) * mag).to(dtype)
    k = (torch.randn(ks, generator=gen, device=DEV) * mag).to(dtype)
    v = torch.randn(ks[:-1] + (Dv,), generator=gen, device=DEV).to(dtype)
    out32, lse = attention_ref(q, k, v, causal=causal, window=window, softmax_scale=scale,
                               cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, upcast=torch.float32)
    out = out32.to(dtype)
    lse = lse.float().contiguous()
    dout = torch.zeros_like(out) if dout_zero else torch.randn(out.shape, generator=gen, device=DEV).to(dtype)
    dlse = torch.randn(lse.shape, generator=gen, device=DEV) if with_dlse else None
    return q, k, v, out, dout, lse, dlse


def run_kernel(q, k, v, out, dout, lse, dlse, *, causal, window, scale, cu_q=None, cu_k=None, mq=0, mk=0,
               deterministic=False, fast=None, det=None):
    dq = torch.full_like(q, float("nan"))
    dk = torch.full_like(k, float("nan"))
    dv = torch.full_like(v, float("nan"))
    flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, dlse=dlse, softmax_scale=scale, causal=causal,
                   window=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk,
                   deterministic=deterministic, alloc=alloc, stream=torch.cuda.current_stream().cuda_stream,
                   fast=fast, det=det)
    torch.cuda.synchronize()
    return dq, dk, dv


def check(case, *, B=1, Sq=128, Sk=128, H=2, Hkv=2, D=64, dtype=torch.bfloat16, causal=False, window=(-1, -1),
          scale=None, cu_q=None, cu_k=None, Tq=None, Tk=None, dout_zero=False, with_dlse=False,
          deterministic=False, seed=0, mag=1.0, fast=None, Dv=None, det=None, reruns=0):
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if cu_q is not None:
        cu_q = torch.tensor(cu_q, dtype=torch.int32, device=DEV)
        cu_k = torch.tensor(cu_k, dtype=torch.int32, device=DEV)
    q, k, v, out, dout, lse, dlse = make_inputs(B, Sq, Sk, H, Hkv, D, dtype, causal=causal, window=window,
                                                scale=scale, cu_q=cu_q, cu_k=cu_k, Tq=Tq, Tk=Tk,
                                                dout_zero=dout_zero, with_dlse=with_dlse, seed=seed, mag=mag,
                                                Dv=Dv)
    mq = mk = 0
    if cu_q is not None:
        mq = int((cu_q[1:] - cu_q[:-1]).max())
        mk = int((cu_k[1:] - cu_k[:-1]).max())
    got = run_kernel(q, k, v, out, dout, lse, dlse, causal=causal, window=window, scale=scale, cu_q=cu_q,
                     cu_k=cu_k, mq=mq, mk=mk, deterministic=deterministic, fast=fast, det=det)
    ex = bwd_ref(q, k, v, out, dout, lse, dlse, causal=causal, window=window, scale=scale, cu_q=cu_q, cu_k=cu_k)
    fl = bwd_ref(q, k, v, out, dout, lse, dlse, causal=causal, window=window, scale=scale, cu_q=cu_q, cu_k=cu_k,
                 exact=False)
    msgs = []
    for name, g_, e_, f_ in zip(("dq", "dk", "dv"), got, ex, fl):
        assert torch.isfinite(g_).all(), f"{case}: {name} has non-finite values ({(~torch.isfinite(g_)).sum()})"
        ek, ef = rel_rms(g_, e_), rel_rms(f_, e_)
        ok = ek <= 2.0 * ef + 1e-6
        msgs.append(f"{name} k={ek:.3e} f={ef:.3e} r={ek / max(ef, 1e-30):.2f}")
        assert ok, f"{case}: {name} relRMS {ek:.3e} > 2 x floor {ef:.3e}; " + "; ".join(msgs)
    print(f"[bwd] {case}: " + "; ".join(msgs))
    for _ in range(reruns):   # deterministic mode: every rerun bitwise the first (fresh NaN-poisoned outputs)
        again = run_kernel(q, k, v, out, dout, lse, dlse, causal=causal, window=window, scale=scale, cu_q=cu_q,
                           cu_k=cu_k, mq=mq, mk=mk, deterministic=deterministic, fast=fast, det=det)
        for name, a, b in zip(("dq", "dk", "dv"), got, again):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{case}: {name} differs on a rerun"
    return got, (q, k, v, out, dout, lse, dlse)


DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ----------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_basic(dt, D, causal):
    check(f"dense {dt} D{D} causal={causal}", B=2, Sq=128, Sk=128, H=2, Hkv=2, D=D, dtype=DT[dt], causal=causal)


@pytest.mark.parametrize("S", [1, 17, 255, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_seqlens(S, causal):
    check(f"S={S} causal={causal}", B=1, Sq=S, Sk=S, H=2, Hkv=2, D=128, causal=causal)


@pytest.mark.parametrize("sq,sk", [(113, 203), (300, 190), (1, 257), (255, 17)])
@pytest.mark.parametrize("causal", [False, True])
def test_sq_ne_sk(sq, sk, causal):
    check(f"Sq={sq} Sk={sk} causal={causal}", B=2, Sq=sq, Sk=sk, H=2, Hkv=1, D=64, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_8to1(causal):
    check(f"GQA 8:1 causal={causal}", B=1, Sq=255, Sk=255, H=8, Hkv=1, D=128, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_long_4097(causal):
    check(f"S=4097 GQA 2:1 causal={causal}", B=1, Sq=4097, Sk=4097, H=2, Hkv=1, D=128, causal=causal)


@pytest.mark.parametrize("window,causal", [((32, 16), False), ((64, -1), True), ((-1, 0), False),
                                           ((0, 0), False), ((100, 7), True)])
def test_window(window, causal):
    check(f"window={window} causal={causal}", B=1, Sq=300, Sk=257, H=2, Hkv=2, D=64, causal=causal, window=window)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen(causal, deterministic):
    cu_q = [0, 0, 1, 18, 300, 301, 301]
    cu_k = [0, 5, 5, 40, 200, 201, 330]
    check(f"varlen causal={causal} det={deterministic}", H=4, Hkv=2, D=128, causal=causal, cu_q=cu_q, cu_k=cu_k,
          Tq=320, Tk=345, deterministic=deterministic)


def test_varlen_window_fp16():
    check("varlen window fp16", H=2, Hkv=2, D=64, dtype=torch.float16, window=(20, 3), cu_q=[0, 70, 70, 200],
          cu_k=[0, 100, 130, 131], Tq=200, Tk=140)


@pytest.mark.parametrize("deterministic", [False, True])
def test_dlse(deterministic):
    check(f"dlse det={deterministic}", B=1, Sq=200, Sk=300, H=2, Hkv=1, D=64, causal=True, with_dlse=True,
          deterministic=deterministic)


def test_lse_only_loss_dv_exactly_zero():
    got, _ = check("lse-only", B=1, Sq=200, Sk=200, H=2, Hkv=2, D=64, causal=True, dout_zero=True, with_dlse=True)
    assert torch.count_nonzero(got[2]) == 0, "dV must be exactly 0 for an LSE-only loss"


@pytest.mark.parametrize("D", [64, 96, 128])
def test_deterministic_numerics(D):
    check(f"deterministic D{D}", B=2, Sq=255, Sk=300, H=4, Hkv=2, D=D, causal=True, deterministic=True)


# D = 96 (64-byte swizzled tiles, dQ in one 96-column chunk on the pipelined kernel), added 2026-12-03
@pytest.mark.parametrize("S", [1, 17, 255, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_d96_seqlens(S, causal):
    check(f"D96 S={S} causal={causal}", B=1, Sq=S, Sk=S, H=2, Hkv=2, D=96, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_d96_gqa_sq_ne_sk_window(causal):
    check(f"D96 GQA 4:1 Sq 300 Sk 190 causal={causal}", B=2, Sq=300, Sk=190, H=4, Hkv=1, D=96, causal=causal)
    check(f"D96 window causal={causal}", B=1, Sq=300, Sk=257, H=2, Hkv=2, D=96, causal=causal, window=(100, 7))


@pytest.mark.parametrize("deterministic", [False, True])
def test_d96_varlen_dlse(deterministic):
    check(f"D96 varlen det={deterministic}", H=4, Hkv=2, D=96, causal=True, cu_q=[0, 0, 1, 18, 300, 301, 301],
          cu_k=[0, 5, 5, 40, 200, 201, 330], Tq=320, Tk=345, deterministic=deterministic)
    check(f"D96 dlse det={deterministic}", B=1, Sq=200, Sk=300, H=2, Hkv=1, D=96, causal=True, with_dlse=True,
          deterministic=deterministic)


def test_d96_long_4097():
    check("D96 S=4097 causal", B=1, Sq=4097, Sk=4097, H=2, Hkv=1, D=96, causal=True)


# The wide pairs (supported.BWD_WIDE_HEAD_DIMS: backward_sm90.py's split form, dV / dK / dQ in three launches, no
# atomics), written 2026-12-03 and compiled on CPU; they run here (once, the form has no kernel modes) before
# paddle_dsa routes them.
WIDE = [(192, 128), (192, 192), (256, 256)]
wide_ids = [f"{d}-{dv}" for d, dv in WIDE]


@pytest.fixture
def one_form(bwd_variant):
    """The wide pairs have a single kernel form: run them once (under the "simple" variant)."""
    if bwd_variant:
        pytest.skip("the wide pairs have one kernel form")


@pytest.mark.parametrize("dims", WIDE, ids=wide_ids)
@pytest.mark.parametrize("S", [1, 17, 255, 1000])
@pytest.mark.parametrize("causal", [False, True])
def test_wide_seqlens(dims, S, causal, one_form):
    check(f"D{dims} S={S} causal={causal}", B=1, Sq=S, Sk=S, H=2, Hkv=2, D=dims[0], Dv=dims[1], causal=causal)


@pytest.mark.parametrize("dims", WIDE, ids=wide_ids)
def test_wide_gqa_window_varlen_dlse_fp16(dims, one_form):
    D, Dv = dims
    check(f"D{dims} GQA 4:1 Sq 300 Sk 190 causal", B=2, Sq=300, Sk=190, H=4, Hkv=1, D=D, Dv=Dv, causal=True)
    check(f"D{dims} window", B=1, Sq=300, Sk=257, H=2, Hkv=2, D=D, Dv=Dv, window=(100, 7))
    check(f"D{dims} varlen", H=4, Hkv=2, D=D, Dv=Dv, causal=True, cu_q=[0, 0, 1, 18, 300, 301, 301],
          cu_k=[0, 5, 5, 40, 200, 201, 330], Tq=320, Tk=345)
    check(f"D{dims} dlse", B=1, Sq=200, Sk=300, H=2, Hkv=1, D=D, Dv=Dv, causal=True, with_dlse=True)
    check(f"D{dims} fp16", B=1, Sq=255, Sk=255, H=2, Hkv=2, D=D, Dv=Dv, dtype=torch.float16, causal=True)
    check(f"D{dims} K x 30", B=1, Sq=200, Sk=200, H=2, Hkv=2, D=D, Dv=Dv, causal=True, mag=30.0)


@pytest.mark.parametrize("dims", WIDE, ids=wide_ids)
def test_wide_long_and_bitwise(dims, one_form):
    D, Dv = dims
    check(f"D{dims} S=4097 GQA 2:1 causal", B=1, Sq=4097, Sk=4097, H=2, Hkv=1, D=D, Dv=Dv, causal=True)
    scale = 1.0 / math.sqrt(D)
    inp = make_inputs(1, 300, 300, 2, 1, D, torch.bfloat16, causal=True, window=(-1, -1), scale=scale, seed=5, Dv=Dv)
    ref = run_kernel(*inp, causal=True, window=(-1, -1), scale=scale)
    for _ in range(10):   # no atomics: every rerun is bitwise the first
        got = run_kernel(*inp, causal=True, window=(-1, -1), scale=scale)
        for a, b in zip(ref, got):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), "wide backward rerun differs"


def test_deterministic_bitwise_100():
    scale = 0.125
    q, k, v, out, dout, lse, dlse = make_inputs(1, 200, 200, 2, 1, 64, torch.bfloat16, causal=True,
                                                window=(-1, -1), scale=scale, seed=3)
    ref = run_kernel(q, k, v, out, dout, lse, dlse, causal=True, window=(-1, -1), scale=scale, deterministic=True)
    for _ in range(100):
        got = run_kernel(q, k, v, out, dout, lse, dlse, causal=True, window=(-1, -1), scale=scale,
                         deterministic=True)
        for a, b in zip(ref, got):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), "deterministic rerun differs"


# The ordered deterministic kernel (PADDLE_DSA_BWD_DET=ordered, written 2026-12-05): the pipelined kernel whose dQ
# tiles take their bulk reduces in a fixed order of the key blocks (the highest first). Each case: the floor gate and
# three reruns bitwise equal to the first. The cases cover every shape of the turn formula (nb_last of a query block):
# causal and not, windows bounded on either side or both, Sq != Sk both ways, varlen with empty segments, GQA.
ORDERED_CASES = {
    "D128 causal multi-block": dict(B=2, Sq=1000, Sk=1000, H=4, Hkv=2, D=128, causal=True),
    "D128 Sq<Sk": dict(B=1, Sq=700, Sk=1100, H=2, Hkv=2, D=128),
    "D64 causal Sq>Sk GQA 4:1": dict(B=2, Sq=300, Sk=190, H=4, Hkv=1, D=64, causal=True),
    "D96 causal Sq<Sk": dict(B=1, Sq=113, Sk=603, H=2, Hkv=1, D=96, causal=True),
    "D64 window (32, 16)": dict(B=1, Sq=600, Sk=557, H=2, Hkv=2, D=64, window=(32, 16)),
    "D128 window (100, 7) causal": dict(B=1, Sq=900, Sk=900, H=2, Hkv=2, D=128, causal=True, window=(100, 7)),
    "D128 window (-1, 0)": dict(B=1, Sq=520, Sk=700, H=2, Hkv=2, D=128, window=(-1, 0)),
    "D96 window (0, 300)": dict(B=1, Sq=640, Sk=640, H=2, Hkv=2, D=96, window=(0, 300)),
    "D128 window (64, -1)": dict(B=1, Sq=777, Sk=500, H=2, Hkv=2, D=128, window=(64, -1)),
    "D128 S 1": dict(B=1, Sq=1, Sk=1, H=2, Hkv=2, D=128),
    "D64 Sq 1 Sk 257 causal": dict(B=1, Sq=1, Sk=257, H=2, Hkv=1, D=64, causal=True),
    "D128 Sq 255 Sk 17 causal": dict(B=2, Sq=255, Sk=17, H=2, Hkv=1, D=128, causal=True),
    "varlen D128 causal": dict(H=4, Hkv=2, D=128, causal=True, cu_q=[0, 0, 1, 18, 300, 301, 301],
                               cu_k=[0, 5, 5, 40, 200, 201, 330], Tq=320, Tk=345),
    "varlen D64 window": dict(H=2, Hkv=1, D=64, window=(200, 50), cu_q=[0, 700, 700, 1500],
                              cu_k=[0, 600, 900, 1800], Tq=1500, Tk=1800),
    "D96 dlse": dict(B=1, Sq=200, Sk=300, H=2, Hkv=1, D=96, causal=True, with_dlse=True),
    "D128 fp16 causal": dict(B=1, Sq=600, Sk=600, H=2, Hkv=2, D=128, dtype=torch.float16, causal=True),
    "D128 GQA 8:1 causal": dict(B=1, Sq=1000, Sk=1000, H=8, Hkv=1, D=128, causal=True),
    "D64 K x 30": dict(B=1, Sq=400, Sk=400, H=2, Hkv=2, D=64, causal=True, mag=30.0),
}


@pytest.mark.parametrize("case", list(ORDERED_CASES))
def test_ordered_cases(case):
    check(f"ordered {case}", deterministic=True, reruns=3, **ORDERED_CASES[case])


@pytest.mark.parametrize("D,causal,window,Hkv", [(128, False, (-1, -1), 16), (128, True, (-1, -1), 16),
                                                 (64, False, (256, 64), 4)])
def test_ordered_many_waves(D, causal, window, Hkv):
    """B2 H16 S4096: 32 key blocks x Hkv x 2 CTAs (1024 at Hkv 16, about 8 waves; 256 at Hkv 4), so the CTAs that
    wait run beside CTAs dispatched later. Five reruns
    bitwise equal; dK and dV bitwise the non-deterministic pipelined kernel's (same kernel code for them: mode 2 for
    D = 128, mode 1 otherwise); dQ within bf16 rounding of it (the same fp32 partials summed in another order)."""
    B, S, H = 2, 4096, 16
    scale = 1.0 / math.sqrt(D)
    inp = make_inputs(B, S, S, H, Hkv, D, torch.bfloat16, causal=causal, window=window, scale=scale, seed=11)
    ref = run_kernel(*inp, causal=causal, window=window, scale=scale, deterministic=True)
    for g_ in ref:
        assert torch.isfinite(g_).all()
    for _ in range(5):
        got = run_kernel(*inp, causal=causal, window=window, scale=scale, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv"), ref, got):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"ordered rerun: {name} differs"
    fast = run_kernel(*inp, causal=causal, window=window, scale=scale, fast=2)
    assert torch.equal(ref[1].view(torch.int16), fast[1].view(torch.int16)), "dk differs from the pipelined kernel"
    assert torch.equal(ref[2].view(torch.int16), fast[2].view(torch.int16)), "dv differs from the pipelined kernel"
    r = rel_rms(ref[0], fast[0])
    print(f"[bwd] ordered many waves D{D} causal={causal} window={window}: dq relRMS vs pipelined {r:.2e}")
    assert r <= 2e-3, f"dq relRMS {r:.2e} against the pipelined kernel"


def test_seed000_dv_finite():
    """flash-dmattn #121 (seed 000): B1 H1 S256 D64 causal bf16, loss = out.sum(): dV finite and within tolerance."""
    scale = 1.0 / 8.0
    gen = torch.Generator(device=DEV).manual_seed(42)
    q = torch.randn(1, 256, 1, 64, generator=gen, device=DEV).to(torch.bfloat16)
    k = torch.randn(1, 256, 1, 64, generator=gen, device=DEV).to(torch.bfloat16)
    v = torch.randn(1, 256, 1, 64, generator=gen, device=DEV).to(torch.bfloat16)
    out32, lse = attention_ref(q, k, v, causal=True, softmax_scale=scale, upcast=torch.float32)
    out, lse = out32.to(torch.bfloat16), lse.float().contiguous()
    dout = torch.ones_like(q)
    got = run_kernel(q, k, v, out, dout, lse, None, causal=True, window=(-1, -1), scale=scale)
    ex = bwd_ref(q, k, v, out, dout, lse, None, causal=True, window=(-1, -1), scale=scale)
    fl = bwd_ref(q, k, v, out, dout, lse, None, causal=True, window=(-1, -1), scale=scale, exact=False)
    assert torch.isfinite(got[2]).all()
    for g_, e_, f_ in zip(got, ex, fl):
        assert torch.isfinite(g_).all()
        assert rel_rms(g_, e_) <= 2 * rel_rms(f_, e_) + 1e-6


def test_sharp_softmax_and_zero_scale():
    check("sharp logits", B=1, Sq=257, Sk=519, H=1, Hkv=1, D=64, mag=4.0, causal=True)
    got, _ = check("scale 0", B=1, Sq=100, Sk=100, H=1, Hkv=1, D=64, scale=0.0)
    assert torch.count_nonzero(got[0]) == 0 and torch.count_nonzero(got[1]) == 0


def test_through_forward_kernel():
    try:
        from ops.flash_attention.fwd import flash_attn_fwd
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"forward kernel not importable: {e}")
    B, S, H, D, scale = 1, 300, 2, 128, 1.0 / math.sqrt(128)
    gen = torch.Generator(device=DEV).manual_seed(7)
    q, k, v, dout = [torch.randn(B, S, H, D, generator=gen, device=DEV).to(torch.bfloat16) for _ in range(4)]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, S, dtype=torch.float32, device=DEV)
    try:
        flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=True, window=(-1, -1),
                       stream=torch.cuda.current_stream().cuda_stream)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"forward kernel failed: {e}")
    torch.cuda.synchronize()
    got = run_kernel(q, k, v, out, dout, lse, None, causal=True, window=(-1, -1), scale=scale)
    ex = bwd_ref(q, k, v, out, dout, lse, None, causal=True, window=(-1, -1), scale=scale)
    fl = bwd_ref(q, k, v, out, dout, lse, None, causal=True, window=(-1, -1), scale=scale, exact=False)
    for g_, e_, f_ in zip(got, ex, fl):
        assert torch.isfinite(g_).all()
        assert rel_rms(g_, e_) <= 2 * rel_rms(f_, e_) + 1e-6


# ------------------------------------------------------------------------------------------------------ bench
def bench(variants=("simple", "fast", "fast2")):
    rows = []
    for (B, S, H, D, causal, det) in [(2, 4096, 16, 128, False, False), (2, 4096, 16, 128, True, False),
                                      (2, 4096, 16, 64, True, False), (2, 4096, 16, 128, True, True),
                                      (2, 8192, 16, 128, False, False), (2, 8192, 16, 128, True, False)]:
        q, k, v, dout = [torch.randn(B, S, H, D, device=DEV, dtype=torch.bfloat16) for _ in range(4)]
        out = torch.randn_like(q) * 0.1
        lse = torch.full((B, H, S), 8.0, device=DEV)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for var in (("simple",) if det else variants):
            def call():
                flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=D ** -0.5, causal=causal,
                               window=(-1, -1), deterministic=det, alloc=alloc,
                               stream=torch.cuda.current_stream().cuda_stream, fast=_VARIANTS[var])
            call()
            torch.cuda.synchronize()
            st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            st.record()
            n = 5
            for _ in range(n):
                call()
            en.record()
            torch.cuda.synchronize()
            ms = st.elapsed_time(en) / n
            flops = 10.0 * B * H * S * S * D * (0.5 if causal else 1.0)
            rows.append(f"B{B} S{S} H{H} D{D} causal={causal} det={det} {var:6s}: {ms:.3f} ms  "
                        f"{flops / ms / 1e9:.1f} TFLOP/s")
            print(rows[-1], flush=True)
    print("\n".join(rows))


def smoke(modes=(0, 1, 2)):
    """Small and multi-tile cases per kernel mode (0 simple, 1 fast, 2 fast2), each printed PASS/FAIL as it goes;
    exits 1 if any failed. First thing to run on a new kernel (wrap in `timeout`: a hang cannot be caught here)."""
    cases = [
        ("D64 causal Sq!=Sk GQA", dict(B=1, Sq=200, Sk=300, H=2, Hkv=1, D=64, causal=True)),
        ("D128 GQA multi-tile", dict(B=2, Sq=1000, Sk=777, H=4, Hkv=2, D=128)),
        ("D128 causal dlse", dict(B=1, Sq=700, Sk=700, H=2, Hkv=2, D=128, causal=True, with_dlse=True)),
        ("D128 window fp16", dict(B=1, Sq=300, Sk=257, H=2, Hkv=2, D=128, dtype=torch.float16, window=(64, 7))),
        ("varlen D128 causal", dict(H=4, Hkv=2, D=128, causal=True, cu_q=[0, 0, 1, 18, 300, 301, 301],
                                    cu_k=[0, 5, 5, 40, 200, 201, 330], Tq=320, Tk=345)),
        ("varlen D64", dict(H=2, Hkv=1, D=64, cu_q=[0, 1, 70, 70], cu_k=[0, 3, 80, 90], Tq=75, Tk=96)),
    ]
    bad = 0
    for fast in modes:
        for name, kw in cases:
            try:
                if fast == "ordered":   # the deterministic mode's ordered kernel, bitwise reruns
                    check(f"smoke ordered {name}", deterministic=True, det="ordered", reruns=2, **kw)
                else:
                    check(f"smoke mode={fast} {name}", fast=fast, **kw)
                print(f"PASS mode={fast} {name}", flush=True)
            except Exception as e:  # noqa: BLE001
                bad += 1
                print(f"FAIL mode={fast} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    print("smoke ok" if bad == 0 else f"smoke: {bad} failed", flush=True)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "smoke":
        smoke(tuple(a if a == "ordered" else int(a) for a in sys.argv[2:]) or (0, 1, 2))
    if len(sys.argv) > 1 and sys.argv[1] == "bench":
        bench(("fast", "fast2") if "--fast" in sys.argv else ("simple", "fast", "fast2"))
