"""GPU tests of the sparse MLA attention backward kernel (ops/dsa/sparse_attn/bwd.py) against float64
(tests/gpu/dsa_ref.py sparse_attention_bwd, from the same bf16 out and float32 lse): dq, dkv and d_sink_rows
NaN-poisoned before every run (dkv too: the seam zeroes it); gates: dq's worst (row, head) relative error and dkv's
rel_rms within 2x the float32 implementation that rounds where the kernel must (c dS and P to bf16, dq to bf16),
d_sink within 2x its absolute error; no NaN/inf for finite inputs; rows with no valid slot: dq exactly 0.
Cases: BSHD and THD (empty segment, rows past cu_seqlens_q[-1]), topk_length random and 0, invalid / duplicate
slots, whole invalid blocks, Skv < K, sinks and dlse, degenerate lse (-1e30, -inf, +inf), bitwise reruns of dq and
d_sink_rows (dkv: fp32 atomics, within the re-association bound), a CUDA graph capture. Deterministic mode
(deterministic=True, tests/gpu/workspace.py: staging buffer NaN-poisoned, keys poisoned with 0, so an unwritten key
or a read of an unwritten staging row puts NaN into dkv): the same gates, dq / d_sink_rows equal to the default mode's
bit for bit, dkv bitwise the same for every chunking (the per-key order is (row, slot, head group) whatever the
chunk size) and over 100 reruns, graph capture.
Run: python -m pytest -q tests/gpu/test_dsa_sparse_attn_bwd.py
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

from dsa_ref import rel_rms, sparse_attention, sparse_attention_bwd  # noqa: E402
from ops.dsa.sparse_attn.bwd import sparse_attn_bwd  # noqa: E402
from workspace import TorchWorkspace  # noqa: E402

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


def forward(q, kv, idx, scale, **kw):
    """The forward's bf16 out and float32 lse (float64 reference, rounded as the kernel stores them)."""
    o, l = sparse_attention(q, kv, scale, idx, dv=DV, **kw)
    return o.to(torch.bfloat16), l.float().contiguous()   # the reference's lse is a [B,Sq,H] view


def run(q, kv, idx, out, dout, lse, scale, *, sink=None, dlse=None, topk_length=None, cu_q=None, cu_k=None,
        stream=None, deterministic=False, workspace_bytes=1 << 30, workspace=None):
    dq = torch.full(q.shape, NAN, device=DEV, dtype=torch.bfloat16)
    dkv = torch.full(kv.shape, NAN, device=DEV)
    ds = None if sink is None else torch.full(q.shape[:-1], NAN, device=DEV)
    if deterministic and workspace is None:
        workspace = TorchWorkspace()
    sparse_attn_bwd(q, kv, idx, out, dout, lse, dq, dkv, softmax_scale=scale, attn_sink=sink, d_sink_rows=ds,
                    dlse=dlse, topk_length=topk_length, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                    deterministic=deterministic, workspace=workspace, workspace_bytes=workspace_bytes,
                    stream=torch.cuda.current_stream().cuda_stream if stream is None else stream)
    return dq, dkv, ds


def worst_row(x, ex):
    d = (x.double() - ex).reshape(-1, ex.shape[-1]).norm(dim=-1)
    n = ex.reshape(-1, ex.shape[-1]).norm(dim=-1)
    return (d / torch.where(n > 0, n, torch.ones_like(n))).max().item()


def check(q, kv, idx, scale, *, dlse_scale=0.0, lse_override=None, factor=2.0, det=None, **kw):
    """det: run()'s deterministic keywords (deterministic, workspace_bytes, workspace)."""
    out, lse = forward(q, kv, idx, scale, **kw)
    if lse_override is not None:
        lse = lse_override(lse)
    dout = rnd(*out.shape)
    dlse = None if not dlse_scale else torch.randn(lse.shape, device=DEV) * dlse_scale
    dq, dkv, ds = run(q, kv, idx, out, dout, lse, scale, dlse=dlse, **kw, **(det or {}))
    torch.cuda.synchronize()
    ref = dict(dv=DV, dlse=dlse, **kw)
    ex = sparse_attention_bwd(q, kv, scale, idx, out, dout, lse, **ref)
    fl = sparse_attention_bwd(q, kv, scale, idx, out, dout, lse, dtype=torch.float32, floor=True, **ref)
    for name, x in (("dq", dq), ("dkv", dkv), ("d_sink_rows", ds)):
        if x is not None:
            assert torch.isfinite(x).all(), f"{name}: {int((~torch.isfinite(x)).sum())} non-finite of {x.numel()}"
    e_k, e_f = worst_row(dq, ex[0]), worst_row(fl[0], ex[0])
    assert e_k <= factor * e_f + 1e-6, f"dq worst-row rel err {e_k:.3e} > {factor} x floor {e_f:.3e}"
    e_k, e_f = rel_rms(dkv, ex[1]), rel_rms(fl[1], ex[1])
    assert e_k <= factor * e_f + 1e-7, f"dkv rel_rms {e_k:.3e} > {factor} x floor {e_f:.3e}"
    if ds is not None:
        d_k = (ds.double() - ex[2]).abs().max().item()
        d_f = (fl[2].double() - ex[2]).abs().max().item()
        assert d_k <= factor * d_f + 1e-6 * (1 + ex[2].abs().max().item()), f"d_sink err {d_k:.3e} vs {d_f:.3e}"
    if det:     # the same inputs in the default mode: dq and d_sink_rows do not depend on the mode
        dq0, dkv0, ds0 = run(q, kv, idx, out, dout, lse, scale, dlse=dlse, **kw)
        assert torch.equal(dq, dq0) and (ds is None or torch.equal(ds, ds0))
        assert ((dkv - dkv0).abs() <= 2 ** -14 * dkv0.abs().max()).all()
    return dq, dkv, ds


def inputs(rows, skv, H, D, seed):
    torch.manual_seed(seed)
    q = rnd(*rows, H, D)
    kv = rnd(rows[0], skv, D) if len(rows) == 2 else rnd(skv, D)
    return q, kv


def thd_inputs(H, D, K, seed):
    """THD: five sequences (one empty, one of a single row), 6 query rows past cu_seqlens_q[-1], K indices a row in
    [-2, 520) (negative and past-the-sequence ones invalid). Returns q, kv, idx, cu_seqlens_q, cu_seqlens_k."""
    torch.manual_seed(seed)
    lens_q, lens_k = [5, 0, 37, 1, 20], [300, 40, 129, 1, 517]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=DEV)
    Tq, Tk = int(cu_q[-1]) + 6, int(cu_k[-1])
    q, kv = rnd(Tq, H, D), rnd(Tk, D)
    idx = torch.randint(-2, 520, (Tq, K), device=DEV, dtype=torch.int32)
    return q, kv, idx, cu_q, cu_k


HD = [(64, 576), (128, 576), (64, 512), (128, 512)]


@pytest.mark.parametrize("H,D", HD)
@pytest.mark.parametrize("Sq,Skv,K", [(1, 592, 128), (30, 1840, 256), (17, 100, 200)])
def test_dense(H, D, Sq, Skv, K):
    q, kv = inputs((2, Sq), Skv, H, D, Sq + Skv + H + D)
    check(q, kv, indices((2, Sq), K, Skv), 1 / math.sqrt(D))


@pytest.mark.parametrize("H,D", [(64, 576), (128, 512)])
def test_topk_length_invalid_and_duplicates(H, D):
    Sq, Skv, K = 24, 300, 300
    q, kv = inputs((2, Sq), Skv, H, D, 5)
    idx = indices((2, Sq), K, Skv)
    idx[0, 3] = -1                          # a whole row invalid
    idx[1, 5, 32:96] = Skv + 9              # whole 32-slot blocks invalid
    # one key in half the slots: K/2 contributions to one dkv row (all K would make the row's dS, hence dq, cancel
    # to rounding noise, where no relative error is defined)
    idx[1, 6, :K // 2] = idx[1, 6, :1]
    tl = torch.randint(0, K + 20, (2, Sq), device=DEV, dtype=torch.int32)
    tl[0, 0] = 0
    dq, _, _ = check(q, kv, idx, 1 / math.sqrt(D), topk_length=tl)
    assert (dq[0, 0] == 0).all() and (dq[0, 3] == 0).all()


@pytest.mark.parametrize("H,D", [(128, 576), (64, 512)])
def test_thd(H, D):
    """Empty segment, rows past cu_seqlens_q[-1] (dq 0; deterministic: their keys -1), topk_length."""
    K = 96
    q, kv, idx, cu_q, cu_k = thd_inputs(H, D, K, 11)
    Tq = q.shape[0]
    tl = torch.randint(0, K + 1, (Tq,), device=DEV, dtype=torch.int32)
    sink = torch.randn(H, device=DEV) * 3
    det = {"topk_length": tl, "sink": sink, "dlse_scale": 0.5}   # deterministic: one-row chunks and one chunk
    for kw in ({}, {"topk_length": tl}, dict(det, det=dict(deterministic=True, workspace_bytes=0)),
               dict(det, det=dict(deterministic=True))):
        dq, _, _ = check(q, kv, idx, 1 / math.sqrt(D), cu_q=cu_q, cu_k=cu_k, **kw)
        assert (dq[int(cu_q[-1]):] == 0).all()


@pytest.mark.parametrize("H", [64, 128])
def test_sink_and_dlse(H):
    D, Sq, Skv, K = 576, 20, 700, 192
    q, kv = inputs((1, Sq), Skv, H, D, 21)
    idx = indices((1, Sq), K, Skv)
    idx[0, 2] = -1
    sink = torch.randn(H, device=DEV) * 3
    sink[0], sink[1] = 30.0, -float("inf")
    check(q, kv, idx, 1 / math.sqrt(D), sink=sink)
    check(q, kv, idx, 1 / math.sqrt(D), sink=sink, dlse_scale=0.5)
    check(q, kv, idx, 1 / math.sqrt(D), dlse_scale=1.0)


@pytest.mark.parametrize("bad", [-1e30, float("-inf"), float("inf")])
def test_degenerate_lse(bad):
    """A degenerate lse (smaller than every logit: -1e30 or -inf, or +inf) gives finite gradients: the probabilities are clamped to
    <= 1 (an lse of +inf: all 0)."""
    H, D, Sq, Skv, K = 64, 576, 8, 200, 64
    q, kv = inputs((1, Sq), Skv, H, D, 3)
    idx = indices((1, Sq), K, Skv)

    def spoil(lse):
        lse = lse.clone()
        lse[0, :5, 1] = bad
        return lse
    check(q, kv, idx, 1 / math.sqrt(D), lse_override=spoil)


def test_skv_below_topk():
    H, D, Sq, Skv, K = 128, 576, 3, 50, 512
    q, kv = inputs((1, Sq), Skv, H, D, 2)
    idx = torch.arange(K, device=DEV, dtype=torch.int32).view(1, 1, K).expand(1, Sq, K).contiguous()
    check(q, kv, idx, 1 / math.sqrt(D))


def test_reruns():
    """dq and d_sink_rows bitwise across reruns; dkv (fp32 atomics in any order) within the re-association bound
    (n - 1) 2^-24 sum |t_i| of its contributions, taken as 2^-20 of the reference's magnitude here."""
    H, D, Sq, Skv, K = 64, 576, 40, 400, 256
    q, kv = inputs((1, Sq), Skv, H, D, 4)
    idx = torch.randint(0, Skv, (1, Sq, K), device=DEV, dtype=torch.int32)
    out, lse = forward(q, kv, idx, 0.05)
    dout = rnd(*out.shape)
    sink = torch.randn(H, device=DEV)
    dq0, dkv0, ds0 = run(q, kv, idx, out, dout, lse, 0.05, sink=sink)
    for _ in range(10):
        dq, dkv, ds = run(q, kv, idx, out, dout, lse, 0.05, sink=sink)
        assert torch.equal(dq, dq0) and torch.equal(ds, ds0)
        assert ((dkv - dkv0).abs() <= 2 ** -14 * dkv0.abs().max()).all()


@pytest.mark.parametrize("det", [False, True], ids=["atomics", "deterministic"])
def test_cuda_graph_capture(det):
    """The seam captured in a CUDA graph (deterministic: its chunks, the sort and the segment sums too, 3-row
    chunks), replayed into NaN-poisoned outputs: dq equal to an eager run's, dkv within the re-association bound
    (deterministic: equal)."""
    H, D, Sq, Skv, K = (128, 576, 12, 300, 128) if det else (64, 512, 12, 300, 128)
    q, kv = inputs((2, Sq), Skv, H, D, 19 if det else 9)
    idx = indices((2, Sq), K, Skv)
    out, lse = forward(q, kv, idx, 0.05)
    dout = rnd(*out.shape)
    dq = torch.full(q.shape, NAN, device=DEV, dtype=torch.bfloat16)
    dkv = torch.full(kv.shape, NAN, device=DEV)
    kw = dict(softmax_scale=0.05)
    if det:
        kw.update(deterministic=True, workspace=TorchWorkspace(), workspace_bytes=3 * row_bytes((2, Sq), K, H, D))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        sparse_attn_bwd(q, kv, idx, out, dout, lse, dq, dkv, stream=s.cuda_stream, **kw)
    torch.cuda.synchronize()
    dq.fill_(NAN)
    dkv.fill_(NAN)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        sparse_attn_bwd(q, kv, idx, out, dout, lse, dq, dkv, stream=s.cuda_stream, **kw)
    g.replay()
    torch.cuda.synchronize()
    ex = run(q, kv, idx, out, dout, lse, 0.05, deterministic=det)
    torch.cuda.synchronize()
    assert torch.equal(dq, ex[0]) and torch.isfinite(dkv).all()
    if det:
        assert torch.equal(dkv, ex[1])
    else:
        assert ((dkv - ex[1]).abs() <= 2 ** -14 * ex[1].abs().max()).all()


def row_bytes(rows, K, H, D):
    """Staging bytes of one query row (the seam's chunk unit)."""
    return (rows[0] if len(rows) == 2 else 1) * K * (H // 64) * D * 4


@pytest.mark.parametrize("H,D", HD)
def test_deterministic_dense(H, D):
    """Invalid / duplicate slots, a whole invalid row, topk_length 0 and random; 7-row chunks (4 chunks)."""
    Sq, Skv, K = 24, 300, 200
    q, kv = inputs((2, Sq), Skv, H, D, 31 + H + D)
    idx = indices((2, Sq), K, Skv)
    idx[0, 3] = -1
    idx[1, 6, :K // 2] = idx[1, 6, :1]
    tl = torch.randint(0, K + 20, (2, Sq), device=DEV, dtype=torch.int32)
    tl[0, 0] = 0
    ws = TorchWorkspace()
    det = dict(deterministic=True, workspace_bytes=7 * row_bytes((2, Sq), K, H, D), workspace=ws)
    dq, _, _ = check(q, kv, idx, 1 / math.sqrt(D), topk_length=tl, det=det)
    assert ws.chunks == 4 and (dq[0, 0] == 0).all() and (dq[0, 3] == 0).all()
    check(q, kv, idx, 1 / math.sqrt(D), det=dict(deterministic=True))


@pytest.mark.parametrize("H", [64, 128])
def test_deterministic_bitwise(H):
    """dkv, dq and d_sink_rows bit for bit: over 100 reruns, and for chunks of 1, 5 and all rows (the per-key sum
    order is (row, slot, head group) whatever the chunking). Many rows share each key (Skv 64, K 256, duplicates)."""
    D, Sq, Skv, K = 576, 40, 64, 256
    q, kv = inputs((2, Sq), Skv, H, D, 41)
    idx = torch.randint(0, Skv, (2, Sq, K), device=DEV, dtype=torch.int32)
    out, lse = forward(q, kv, idx, 0.05)
    dout = rnd(*out.shape)
    sink = torch.randn(H, device=DEV)
    rb = row_bytes((2, Sq), K, H, D)
    base = run(q, kv, idx, out, dout, lse, 0.05, sink=sink, deterministic=True)
    assert all(torch.isfinite(t).all() for t in base)
    for wb in (0, 5 * rb + 1, 1 << 30):
        got = run(q, kv, idx, out, dout, lse, 0.05, sink=sink, deterministic=True, workspace_bytes=wb)
        assert all(torch.equal(a, b) for a, b in zip(got, base)), wb
    for _ in range(100):
        got = run(q, kv, idx, out, dout, lse, 0.05, sink=sink, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(got, base))


@pytest.mark.parametrize("value", [1, 2, 3])
def test_gather_prefetch(monkeypatch, value):
    """GatherHints.GATHER_PREFETCH (the gather's copies by inline PTX with the L2::256B hint; 2: an evict_last policy;
    3: evict_last or evict_normal by the kv's size; the swizzled shared-memory address computed by hand): THD with
    rows past cu_seqlens_q[-1], float64 gates, and the deterministic mode's dq, dkv, d_sink_rows bitwise the default
    copies'."""
    from ops.dsa.sparse_attn import bwd, bwd_sm90
    cls = bwd_sm90.SparseAttnBwdSm90
    H, D = 128, 576
    q, kv, idx, cu_q, cu_k = thd_inputs(H, D, 160, 23 + value)
    sink = torch.randn(H, device=DEV)
    kw = dict(cu_q=cu_q, cu_k=cu_k)
    out, lse = forward(q, kv, idx, 0.05, **kw)
    dout = rnd(*out.shape)
    got = []
    for setting in (value, 0):
        monkeypatch.setattr(cls, "GATHER_PREFETCH", setting)
        monkeypatch.setattr(bwd, "_CACHE", {})
        if setting:
            check(q, kv, idx, 0.05, sink=sink, **kw)
        got.append(run(q, kv, idx, out, dout, lse, 0.05, sink=sink, deterministic=True, **kw))
    assert all(torch.equal(a, b) for a, b in zip(*got)), "prefetching copies differ bitwise (deterministic mode)"
