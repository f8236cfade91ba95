"""Seed 001 at full size (shared/seeds/001_*.txt, the FlyDSL lazy-rescale NaN): B=2 S=8192 H=32 D=128 bf16, K scaled
by 8, 16, 24, 32, 48, 64, non-causal and causal, through the forward seam (ops/flash_attention/fwd.py).

The seed's failure: a rescale that took the tile max instead of max(running max, tile max) scaled accumulators by
exp2(positive), overflowed to inf and gave inf/inf = NaN (9.2% of the output at K*32, all of it at K*64). Its table
compares rel L2 against an fp32 reference of a fixed kernel with the eager path's (5.3e-3 at K*8 .. 1.39e-2 at K*64,
non-causal); the two agree to 0.2%. Here, per case:
  - out and lse poisoned with NaN, then zero non-finite elements in either;
  - rel L2 (= relRMS) of out against the float64 reference from the same bf16 inputs is at most MARGIN (1.10) x the
    rel L2 of the fp32 "floor" path on the same inputs (fp32 softmax with the unnormalised P rounded to bf16 before
    P @ V and the output rounded to bf16: the eager flash computation, the analogue of the seed's eager column);
  - and at most the seed's own figure for that K scale (its eager column, 5.3e-3 .. 1.39e-2; the issue's literal bar;
    on the CPU, S=8192 D=128 one head, this floor measures 1.7e-3 at K*8 .. 9.5e-4 at K*64, output rounding dominating);
  - |lse - exact| within reference.lse_tol.
Backward at K*32 (non-causal and causal, default backward mode): out/lse from our forward, dq/dk/dv poisoned with NaN,
all finite, each relRMS vs float64 <= 2 x the fp32 floor (P and dS rounded to bf16, the stored out/lse), as
tests/gpu/test_flash_bwd.py gates. The references run per (batch, chunk of HEAD_CHUNK heads) so the S x S score
matrices stay a few GiB. Budget: about a minute on an H200 for the file.
Run: python -m pytest -q -s tests/gpu/test_seed001.py      (-s prints the rel L2 table rows)
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
from reference import attention_ref, lse_tol, rel_rms, visible_mask  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
B, S, H, D = 2, 8192, 32, 128
KSCALES = (8, 16, 24, 32, 48, 64)
# the seed's "eager (reference)" column (rel L2 vs fp32 on MI355X, non-causal): an upper bound for both mask modes
SEED_EAGER = {8: 5.298e-3, 16: 7.159e-3, 24: 8.637e-3, 32: 9.903e-3, 48: 1.205e-2, 64: 1.390e-2}
MARGIN = 1.10
HEAD_CHUNK = 8


# ------------------------------------------------------------------------------------------------ references
def forward_refs(q, k, v, *, causal, scale, head_chunk=HEAD_CHUNK):
    """float64 (out, lse) and the fp32 floor out (P rounded to q.dtype, out rounded), per (batch, head chunk).
    q/k/v [B,S,H,D] with H == Hkv."""
    nb, _, nh, _ = q.shape
    ex_o = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    ex_l = torch.empty(nb, nh, q.shape[1], dtype=torch.float64, device=q.device)
    fl_o = torch.empty_like(q)
    for b in range(nb):
        for h0 in range(0, nh, head_chunk):
            h1 = min(nh, h0 + head_chunk)
            qs, ks, vs = (x[b:b + 1, :, h0:h1] for x in (q, k, v))
            o, l_ = attention_ref(qs, ks, vs, causal=causal, softmax_scale=scale, upcast=torch.float64)
            ex_o[b:b + 1, :, h0:h1] = o
            ex_l[b:b + 1, h0:h1] = l_
            del o, l_
            o, _ = attention_ref(qs, ks, vs, causal=causal, softmax_scale=scale, upcast=torch.float32,
                                 round_p_to=q.dtype)
            fl_o[b:b + 1, :, h0:h1] = o.to(q.dtype)
            del o
    return ex_o, ex_l, fl_o


def _bwd_one(q, k, v, out, dout, lse, *, causal, scale, exact):
    """Gradients of one (batch, head chunk): q/k/v/out/dout [S,h,D], lse [h,S]; every row sees >= 1 key.
    exact: float64 with its own softmax; floor: fp32 from the stored out/lse, P and dS rounded to the input dtype
    before the matmuls that consume them, results rounded to the dtype."""
    up = torch.float64 if exact else torch.float32
    dt = q.dtype
    qf, kf, vf, dof = (x.to(up).permute(1, 0, 2) for x in (q, k, v, dout))        # h,S,D
    vis = visible_mask(q.shape[0], k.shape[0], causal=causal, device=q.device)
    p = torch.matmul(qf, kf.transpose(-1, -2)).mul_(scale)                            # h,Sq,Sk scores
    if exact:
        p.masked_fill_(~vis, float("-inf"))
        p.sub_(p.amax(-1, keepdim=True)).exp_()
        p.div_(p.sum(-1, keepdim=True))
        o = torch.matmul(p, vf)
    else:
        p.sub_(lse.to(up).unsqueeze(-1)).clamp_(max=0.0).exp_()
        p.masked_fill_(~vis, 0.0)
        o = out.to(up).permute(1, 0, 2)
    delta = (o * dof).sum(-1, keepdim=True)
    del o
    pr = p if exact else p.to(dt).to(up)
    dv = torch.matmul(pr.transpose(-1, -2), dof)
    del pr
    ds = torch.matmul(dof, vf.transpose(-1, -2)).sub_(delta).mul_(p)                # dS = P * (dP - Delta)
    del p
    if not exact:
        ds = ds.to(dt).to(up)
    dq = torch.matmul(ds, kf).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), qf).mul_(scale)
    del ds
    res = [x.permute(1, 0, 2) for x in (dq, dk, dv)]
    return res if exact else [x.to(dt) for x in res]


def backward_refs(q, k, v, out, dout, lse, *, causal, scale, head_chunk=HEAD_CHUNK):
    """(exact dq, dk, dv in float64), (floor dq, dk, dv in q.dtype); q/k/v [B,S,H,D] with H == Hkv, lse [B,H,S]."""
    ex = [torch.empty(x.shape, dtype=torch.float64, device=x.device) for x in (q, k, v)]
    fl = [torch.empty_like(x) for x in (q, k, v)]
    nb, _, nh, _ = q.shape
    for b in range(nb):
        for h0 in range(0, nh, head_chunk):
            h1 = min(nh, h0 + head_chunk)
            args = [x[b, :, h0:h1] for x in (q, k, v, out, dout)] + [lse[b, h0:h1]]
            for dst, exact in ((ex, True), (fl, False)):
                got = _bwd_one(*args, causal=causal, scale=scale, exact=exact)
                for d_, g_ in zip(dst, got):
                    d_[b, :, h0:h1] = g_
                del got
    return ex, fl


# ------------------------------------------------------------------------------------------------ harness
@pytest.fixture(autouse=True)
def _fp32_matmul_highest():
    """fp32 references must not run their matmuls in TF32."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)
    torch.cuda.empty_cache()


def make_inputs(kscale, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(1000 + kscale + seed)
    q = torch.randn(B, S, H, D, generator=gen, device=DEV).to(BF16)
    k = (torch.randn(B, S, H, D, generator=gen, device=DEV) * float(kscale)).to(BF16)
    v = torch.randn(B, S, H, D, generator=gen, device=DEV).to(BF16)
    return q, k, v


def run_fwd(q, k, v, *, causal, scale):
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float32, device=DEV)
    flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=(-1, -1),
                   stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return out, lse


def report(line):
    """Print a result row; also append it to $OUT/test_seed001.table, which tests/gpu/run_device.sh prints."""
    print(line)
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        with open(os.path.join(out, "test_seed001.table"), "a") as fh:
            fh.write(line + "\n")


def _nonfinite(x):
    return int(torch.isnan(x).sum()), int(torch.isinf(x).sum())


def assert_finite(name, x):
    nan, inf = _nonfinite(x)
    assert nan == 0 and inf == 0, f"{name}: {nan} NaN and {inf} inf of {x.numel()} elements"


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("kscale", KSCALES)
def test_seed001_forward_full_size(kscale, causal):
    scale = 1.0 / math.sqrt(D)
    q, k, v = make_inputs(kscale)
    out, lse = run_fwd(q, k, v, causal=causal, scale=scale)
    assert_finite("out", out)
    assert_finite("lse", lse)
    ex_o, ex_l, fl_o = forward_refs(q, k, v, causal=causal, scale=scale)
    e_k, e_f = rel_rms(out, ex_o), rel_rms(fl_o, ex_o)
    lse_err = float((lse.double() - ex_l).abs().max())
    tol = lse_tol(q, k, scale)
    seed = f" (seed's eager {SEED_EAGER[kscale]:.3e})"
    report(f"[seed001] K*{kscale:<2d} causal={int(causal)}: rel L2 kernel {e_k:.3e}  floor {e_f:.3e}  "
          f"ratio {e_k / max(e_f, 1e-30):.3f}{seed}  |lse err| {lse_err:.2e} (tol {tol:.2e})")
    assert lse_err <= tol, f"lse error {lse_err:.3e} > {tol:.3e}"
    assert e_k <= MARGIN * e_f, f"rel L2 {e_k:.3e} > {MARGIN} x fp32 floor {e_f:.3e}"
    assert e_k <= SEED_EAGER[kscale], f"rel L2 {e_k:.3e} above the seed's figure {SEED_EAGER[kscale]:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_seed001_backward_k32(causal):
    from ops.flash_attention import bwd as bwd_mod

    scale = 1.0 / math.sqrt(D)
    q, k, v = make_inputs(32, seed=7)
    out, lse = run_fwd(q, k, v, causal=causal, scale=scale)
    assert_finite("out", out)
    assert_finite("lse", lse)
    gen = torch.Generator(device=DEV).manual_seed(77)
    dout = torch.randn(q.shape, generator=gen, device=DEV).to(BF16)
    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))

    def alloc(shape, dtype):
        dt = {"float32": torch.float32, "int32": torch.int32}[dtype]
        if dt == torch.float32:
            return torch.full(tuple(shape), float("nan"), dtype=dt, device=DEV)
        return torch.full(tuple(shape), -123457, dtype=dt, device=DEV)

    bwd_mod.flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=scale, causal=causal,
                           window=(-1, -1), alloc=alloc, stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    for name, g_ in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert_finite(name, g_)
    ex, fl = backward_refs(q, k, v, out, dout, lse, causal=causal, scale=scale)
    msgs, bad = [], []
    for name, g_, e_, f_ in zip(("dq", "dk", "dv"), (dq, dk, dv), ex, fl):
        ek, ef = rel_rms(g_, e_), rel_rms(f_, e_)
        msgs.append(f"{name} {ek:.3e} / floor {ef:.3e} = {ek / max(ef, 1e-30):.2f}")
        if not ek <= 2.0 * ef + 1e-6:
            bad.append(name)
    report(f"[seed001 bwd] K*32 causal={int(causal)} mode={bwd_mod.FAST}: " + "; ".join(msgs))
    assert not bad, f"{bad} above 2 x the fp32 floor: " + "; ".join(msgs)
