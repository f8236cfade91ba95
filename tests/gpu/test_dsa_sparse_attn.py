"""GPU tests of the sparse MLA attention forward kernel (ops/dsa/sparse_attn/fwd.py) against float64
(tests/gpu/dsa_ref.py sparse_attention): out and softmax_lse NaN-poisoned before every run; gates: the worst
(row, head) relative error of out and the worst lse error within 2x the float32 implementation that rounds where the
kernel must (P and out to bf16), rows with no valid slot exactly out 0 / lse -inf, no NaN/inf for finite inputs.
Slots: indices drawn from [-3, Skv + 5) (negative and past-the-end ones invalid), duplicates, topk_length random and
0, whole rows and whole 64-slot blocks invalid, K not a multiple of 64, Skv < K, THD with an empty segment, an
off-grid segment and rows past cu_seqlens_q[-1], sinks (none, finite, huge, -inf, NaN), logits scaled up to x5000,
NaN in a gathered kv row, 100 bitwise-identical reruns, a CUDA graph capture, Sq = 70000 (grid limits), out as a
view inside a guarded buffer (the TMA store writes nothing outside out).
Run: python -m pytest -q tests/gpu/test_dsa_sparse_attn.py
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

from dsa_ref import sparse_attention  # noqa: E402
from ops.dsa.sparse_attn.fwd import sparse_attn_fwd  # noqa: E402

DEV = "cuda"
NAN = float("nan")
DV = 512


def rnd(*shape, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def indices(rows, K, sk, invalid_frac=0.1):
    idx = torch.randint(0, max(sk, 1), (*rows, K), device=DEV, dtype=torch.int32)
    bad = torch.rand(*rows, K, device=DEV) < invalid_frac
    junk = torch.where(torch.rand(*rows, K, device=DEV) < 0.5, torch.full_like(idx, -3), idx + sk + 5)
    return torch.where(bad, junk, idx)


def run(q, kv, idx, scale, *, sink=None, topk_length=None, cu_q=None, cu_k=None, stream=None):
    H = q.shape[-2]
    out = torch.full(q.shape[:-1] + (DV,), NAN, device=DEV, dtype=torch.bfloat16)
    lse_shape = (H, q.shape[0]) if cu_q is not None else (q.shape[0], H, q.shape[1])
    lse = torch.full(lse_shape, NAN, device=DEV)
    sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=scale, attn_sink=sink, topk_length=topk_length,
                    cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    stream=torch.cuda.current_stream().cuda_stream if stream is None else stream)
    return out, lse


def row_err(x, ex):
    """Worst (row, head) relative error of out (L2 over Dv; rows whose reference is 0 use an absolute error)."""
    d = (x.double() - ex).reshape(-1, ex.shape[-1]).norm(dim=-1)
    n = ex.reshape(-1, ex.shape[-1]).norm(dim=-1)
    return (d / torch.where(n > 0, n, torch.ones_like(n))).max().item()


def check(q, kv, idx, scale, *, factor=2.0, finite=True, **kw):
    out, lse = run(q, kv, idx, scale, **kw)
    torch.cuda.synchronize()
    ex_o, ex_l = sparse_attention(q, kv, scale, idx, dv=DV, **kw)
    fl_o, fl_l = sparse_attention(q, kv, scale, idx, dv=DV, dtype=torch.float32, floor=True, **kw)
    if finite:
        assert not torch.isnan(out).any(), f"NaN in out ({int(torch.isnan(out).sum())} of {out.numel()})"
        assert torch.isfinite(out).all(), "inf in out"
        assert not torch.isnan(lse).any(), f"NaN in lse ({int(torch.isnan(lse).sum())})"
    empty = torch.isneginf(ex_l)
    assert torch.equal(torch.isneginf(lse), empty), "rows with no valid slot differ from the reference"
    e_k, e_f = row_err(out, ex_o), row_err(fl_o, ex_o)
    assert e_k <= factor * e_f + 1e-6, f"out worst-row rel err {e_k:.3e} > {factor} x floor {e_f:.3e}"
    live = ~empty
    if live.any():
        d_k = (lse.double() - ex_l)[live].abs().max().item()
        d_f = (fl_l.double() - ex_l)[live].abs().max().item()
        assert d_k <= factor * d_f + 2e-6 * (1 + ex_l[live].abs().max().item()), \
            f"lse max err {d_k:.3e} > {factor} x floor {d_f:.3e}"
    if empty.any():   # exact zeros for empty (row, head)s
        eo = empty.permute(0, 2, 1) if kw.get("cu_q") is None else empty.T
        assert (out[eo] == 0).all(), "out not 0 on a row with no valid slot"
    return out, lse


def inputs(rows, skv, H, D, seed, q_scale=1.0):
    torch.manual_seed(seed)
    q = rnd(*rows, H, D, scale=q_scale)
    kv = rnd(rows[0], skv, D) if len(rows) == 2 else rnd(skv, D)
    return q, kv


HD = [(64, 576), (128, 576), (64, 512), (128, 512)]


@pytest.mark.parametrize("H,D", HD)
@pytest.mark.parametrize("Sq,Skv,K", [(1, 592, 128), (62, 1840, 256), (213, 1521, 512), (17, 100, 200)])
def test_dense(H, D, Sq, Skv, K):
    q, kv = inputs((2, Sq), Skv, H, D, Sq + Skv + H + D)
    idx = indices((2, Sq), K, Skv)
    check(q, kv, idx, 1 / math.sqrt(D))


@pytest.mark.parametrize("H,D", [(64, 576), (128, 512)])
def test_topk_length_and_invalid_blocks(H, D):
    Sq, Skv, K = 40, 700, 300
    q, kv = inputs((2, Sq), Skv, H, D, 7)
    idx = indices((2, Sq), K, Skv)
    idx[0, 3] = -1                          # a whole row invalid
    idx[1, 5, 64:128] = Skv + 9             # a whole 64-slot block invalid
    idx[1, 6, :] = idx[1, 6, :1]            # one key repeated K times
    tl = torch.randint(0, K + 20, (2, Sq), device=DEV, dtype=torch.int32)
    tl[0, 0] = 0
    tl[1, 1] = -4
    check(q, kv, idx, 1 / math.sqrt(D), topk_length=tl)


@pytest.mark.parametrize("H,D", [(128, 576), (64, 512)])
def test_thd(H, D):
    torch.manual_seed(11)
    lens_q, lens_k = [5, 0, 37, 1, 70], [300, 40, 129, 1, 517]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=DEV)
    Tq, Tk, K = int(cu_q[-1]) + 6, int(cu_k[-1]), 192          # 6 rows past cu_seqlens_q[-1]
    q, kv = rnd(Tq, H, D), rnd(Tk, D)
    idx = torch.randint(-2, 520, (Tq, K), device=DEV, dtype=torch.int32)
    tl = torch.randint(0, K + 1, (Tq,), device=DEV, dtype=torch.int32)
    for kw in ({}, {"topk_length": tl}):
        check(q, kv, idx, 1 / math.sqrt(D), cu_q=cu_q, cu_k=cu_k, **kw)


@pytest.mark.parametrize("H", [64, 128])
def test_sink(H):
    D, Sq, Skv, K = 576, 33, 900, 256
    q, kv = inputs((1, Sq), Skv, H, D, 21)
    idx = indices((1, Sq), K, Skv)
    idx[0, 2] = -1
    sink = torch.randn(H, device=DEV) * 3
    sink[0], sink[1], sink[2] = 80.0, -float("inf"), -80.0   # out ~ 0, no sink, negligible
    check(q, kv, idx, 1 / math.sqrt(D), sink=sink)
    sink[3] = NAN                                            # reaches head 3 of rows with a valid slot, only there
    out, lse = run(q, kv, idx, 1 / math.sqrt(D), sink=sink)
    torch.cuda.synchronize()
    assert torch.isnan(out[0, :, 3]).sum() == (Sq - 1) * DV and (out[0, 2, 3] == 0).all()
    assert not torch.isnan(out[:, :, torch.arange(H, device=DEV) != 3]).any()
    assert not torch.isnan(lse).any()                        # lse does not include the sink


@pytest.mark.parametrize("q_scale", [8.0, 300.0, 5000.0])
def test_wide_logits(q_scale):
    H, D, Sq, Skv, K = 64, 576, 20, 2000, 512
    q, kv = inputs((1, Sq), Skv, H, D, int(q_scale), q_scale=q_scale)
    idx = indices((1, Sq), K, Skv)
    check(q, kv, idx, 1 / math.sqrt(D))


def test_skv_below_topk_and_sq1():
    H, D = 128, 576
    for Sq, Skv, K in ((1, 50, 2048), (3, 1, 64), (5, 63, 65)):
        q, kv = inputs((1, Sq), Skv, H, D, Skv)
        idx = torch.arange(K, device=DEV, dtype=torch.int32).view(1, 1, K).expand(1, Sq, K).contiguous()
        check(q, kv, idx, 1 / math.sqrt(D))


def test_nan_only_through_selected_rows():
    H, D, Sq, Skv, K = 64, 576, 16, 400, 128
    q, kv = inputs((1, Sq), Skv, H, D, 5)
    idx = torch.randint(0, Skv - 1, (1, Sq, K), device=DEV, dtype=torch.int32)
    idx[0, :8, 7] = Skv - 1                   # rows 0..7 select the NaN row, rows 8.. never do
    kv[0, Skv - 1, 3] = NAN
    out, lse = run(q, kv, idx, 1 / math.sqrt(D))
    torch.cuda.synchronize()
    assert torch.isnan(out[0, :8]).all() and torch.isnan(lse[0, :, :8]).all()
    assert torch.isfinite(out[0, 8:]).all() and torch.isfinite(lse[0, :, 8:]).all()


def test_deterministic():
    H, D, Sq, Skv, K = 128, 576, 50, 3000, 1024
    q, kv = inputs((1, Sq), Skv, H, D, 3)
    idx = indices((1, Sq), K, Skv)
    o0, l0 = run(q, kv, idx, 0.04)
    for _ in range(100):
        o, l = run(q, kv, idx, 0.04)
        assert torch.equal(o, o0) and torch.equal(l, l0)


def test_cuda_graph_capture():
    H, D, Sq, Skv, K = 64, 512, 24, 800, 256
    q, kv = inputs((2, Sq), Skv, H, D, 9)
    idx = indices((2, Sq), K, Skv)
    out = torch.full((2, Sq, H, DV), NAN, device=DEV, dtype=torch.bfloat16)
    lse = torch.full((2, H, Sq), NAN, device=DEV)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):                 # compile + warm up outside the capture
        sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=0.05, stream=s.cuda_stream)
    torch.cuda.synchronize()
    out.fill_(NAN)
    lse.fill_(NAN)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=0.05, stream=s.cuda_stream)
    g.replay()
    torch.cuda.synchronize()
    ex_o, ex_l = run(q, kv, idx, 0.05)
    torch.cuda.synchronize()
    assert torch.equal(out, ex_o) and torch.equal(lse, ex_l)


def test_long_sq_grid():
    H, D, Sq, Skv, K = 64, 512, 70000, 256, 64
    q, kv = inputs((1, Sq), Skv, H, D, 1)
    idx = indices((1, Sq), K, Skv)
    out, lse = run(q, kv, idx, 1 / math.sqrt(D))
    torch.cuda.synchronize()
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    rows = torch.tensor([0, 1, 65535, 65536, 69999], device=DEV)
    ex_o, ex_l = sparse_attention(q[:, rows], kv, 1 / math.sqrt(D), idx[:, rows], dv=DV)
    fl_o, _ = sparse_attention(q[:, rows], kv, 1 / math.sqrt(D), idx[:, rows], dv=DV, dtype=torch.float32, floor=True)
    assert row_err(out[:, rows], ex_o) <= 2 * row_err(fl_o, ex_o) + 1e-6


@pytest.mark.parametrize("H,varlen", [(128, False), (64, True)])
def test_out_store_stays_in_place(H, varlen):
    """out goes out by TMA stores (64 heads x 256 columns a consumer): with out a view inside a larger buffer whose
    guard rows hold a sentinel, every guard element is unchanged and out is still within the floor gate (dense
    with a batch stride past out's rows; THD with rows past cu_seqlens_q[-1])."""
    torch.manual_seed(5)
    D, K = 576, 128
    scale = 1 / math.sqrt(D)
    if varlen:
        lens_q, lens_k = [3, 0, 9], [100, 20, 180]
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEV)
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=DEV)
        Tq = int(cu_q[-1]) + 2
        q, kv = rnd(Tq, H, D), rnd(int(cu_k[-1]), D)
        idx = torch.randint(-1, 185, (Tq, K), device=DEV, dtype=torch.int32)
        buf = torch.full((Tq + 2, H, DV), 7.0, device=DEV, dtype=torch.bfloat16)
        out, guards = buf[1:-1], (buf[0], buf[-1])
        lse = torch.full((H, Tq), NAN, device=DEV)
        kw = dict(cu_q=cu_q, cu_k=cu_k)
    else:
        B, Sq, Skv = 2, 5, 300
        q, kv = rnd(B, Sq, H, D), rnd(B, Skv, D)
        idx = indices((B, Sq), K, Skv)
        buf = torch.full((B, Sq + 2, H, DV), 7.0, device=DEV, dtype=torch.bfloat16)
        out, guards = buf[:, 1:-1], (buf[:, 0], buf[:, -1])
        lse = torch.full((B, H, Sq), NAN, device=DEV)
        kw = {}
    out.fill_(NAN)
    sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=scale, cu_seqlens_q=kw.get("cu_q"),
                    cu_seqlens_k=kw.get("cu_k"), stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    for g in guards:
        assert torch.equal(g, torch.full_like(g, 7.0)), "a write landed outside out"
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ex_o, _ = sparse_attention(q, kv, scale, idx, dv=DV, **kw)
    fl_o, _ = sparse_attention(q, kv, scale, idx, dv=DV, dtype=torch.float32, floor=True, **kw)
    assert row_err(out, ex_o) <= 2 * row_err(fl_o, ex_o) + 1e-6


def test_rejects_unsupported():
    q, kv = rnd(1, 4, 32, 576), rnd(1, 64, 576)
    idx = torch.zeros(1, 4, 64, dtype=torch.int32, device=DEV)
    out = torch.empty(1, 4, 32, DV, dtype=torch.bfloat16, device=DEV)
    lse = torch.empty(1, 32, 4, device=DEV)
    with pytest.raises(ValueError, match="heads"):
        sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=0.1)
    q, out, lse = rnd(1, 4, 64, 576), torch.empty(1, 4, 64, 576, dtype=torch.bfloat16, device=DEV), \
        torch.empty(1, 64, 4, device=DEV)
    with pytest.raises(ValueError, match="Dqk, Dv"):
        sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=0.1)


@pytest.mark.parametrize("knobs", [dict(LAG=2), dict(LAG=4), dict(GATHER_PREFETCH=0), dict(GATHER_PREFETCH=1),
                                   dict(GATHER_PREFETCH=2), dict(GATHER_PREFETCH=3, EVICT_LAST_KV_BYTES=0)])
def test_schedules(monkeypatch, knobs):
    """Producer lags (SparseAttnFwdSm90.LAG: chunk groups of cp.async in flight before the oldest is published, up
    to the 4 groups of a pair) and the gather's copy forms (GATHER_PREFETCH: 0 the DSL's cp.async.cg atom, 1 inline
    PTX with the L2::256B hint and the swizzled address computed by hand, 2 and an evict_last policy, 3 (the default)
    evict_last or evict_normal by the kv's size at run time, EVICT_LAST_KV_BYTES 0 forcing evict_normal) give bitwise
    the default's results: dense with topk_length and invalid blocks (odd and even block counts)."""
    from ops.dsa.sparse_attn import fwd, fwd_sm90
    cls = fwd_sm90.SparseAttnFwdSm90
    H, D, Sq, Skv, K = 128, 576, 30, 900, 320
    q, kv = inputs((2, Sq), Skv, H, D, 77)
    idx = indices((2, Sq), K, Skv)
    idx[1, 4, 64:192] = -1
    tl = torch.randint(0, K + 5, (2, Sq), device=DEV, dtype=torch.int32)
    o0, l0 = run(q, kv, idx, 1 / math.sqrt(D), topk_length=tl)
    assert any(getattr(cls, name) != value for name, value in knobs.items()), knobs   # else it cannot fail
    for name, value in knobs.items():
        monkeypatch.setattr(cls, name, value)
    monkeypatch.setattr(fwd, "_CACHE", {})
    o1, l1 = check(q, kv, idx, 1 / math.sqrt(D), topk_length=tl)
    assert torch.equal(o0, o1) and torch.equal(l0, l1), "schedules differ bitwise"
