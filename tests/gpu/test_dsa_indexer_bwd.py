"""GPU tests of the sparse indexer backward kernel (ops/dsa/indexer/sparse_bwd.py) against float64
(tests/gpu/dsa_ref.py sparse_indexer_bwd from the same statistics): d_index_q, d_index_k, d_weights NaN-poisoned
before every run (d_index_k too: the seam zeroes it); gates: d_index_q's and d_weights' worst-row relative error and
d_index_k's rel_rms within 2x the float32 implementation that rounds where the kernel must (dA to bf16, dq to bf16);
no NaN/inf for finite inputs; rows with no valid slot and rows with index_lse = +inf: zero gradients; index_lse
-1e30 / -inf: finite (p clamped at 1).
Cases: BSHD and THD (empty segment, rows past cu_seqlens_q[-1]), Hi 16/32/64, Di 64/128, weights bf16/fp32,
topk_length random and 0, invalid / duplicate slots, NaN in a selected key row (reaches only the rows selecting it),
bitwise reruns of dq and d_weights (d_index_k: fp32 atomics, within the re-association bound), a CUDA graph capture.
Deterministic mode (deterministic=True, tests/gpu/workspace.py: poisoned staging buffer and keys): the same gates,
dq / d_weights equal to the default mode's bit for bit, d_index_k bitwise the same for every chunking and over 100
reruns, graph capture.
Run: python -m pytest -q tests/gpu/test_dsa_indexer_bwd.py
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from dsa_ref import rel_rms, sparse_indexer_bwd, sparse_indexer_scores  # noqa: E402
from ops.dsa.indexer.sparse_bwd import sparse_indexer_bwd as kernel_bwd  # noqa: E402
from workspace import TorchWorkspace  # noqa: E402

DEV = "cuda"
NAN = float("nan")


def rnd(*shape, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def indices(rows, K, sk, invalid_frac=0.1):
    idx = torch.randint(0, max(sk, 1), (*rows, K), device=DEV, dtype=torch.int32)
    bad = torch.rand(*rows, K, device=DEV) < invalid_frac
    junk = torch.where(torch.rand(*rows, K, device=DEV) < 0.5, torch.full_like(idx, -3), idx + sk + 5)
    return torch.where(bad, junk, idx)


def stats(q, k, w, idx, **kw):
    """index_score / index_lse (the sparse recompute's, float32) and a positive attention target with its l1 norm."""
    s, lse = sparse_indexer_scores(q, k, w, idx, **kw)
    s, lse = s.float(), lse.float()
    a = torch.rand(s.shape, device=DEV) * torch.isfinite(s)
    return s, lse, a, a.sum(-1)


def run(q, k, w, idx, s, lse, a, l1, c, *, topk_length=None, cu_q=None, cu_k=None, stream=None, det=None):
    """det: the deterministic keywords (deterministic, workspace_bytes, workspace: a poisoned TorchWorkspace unless
    given)."""
    dq = torch.full(q.shape, NAN, device=DEV, dtype=torch.bfloat16)
    dk = torch.full(k.shape, NAN, device=DEV)
    dw = torch.full(w.shape, NAN, device=DEV)
    det = dict(det or {})
    if det.get("deterministic"):
        det.setdefault("workspace", TorchWorkspace())
    kernel_bwd(q, k, w, idx, s, lse, a, l1, c, dq, dk, dw, topk_length=topk_length, cu_seqlens_q=cu_q,
               cu_seqlens_k=cu_k, stream=torch.cuda.current_stream().cuda_stream if stream is None else stream, **det)
    return dq, dk, dw


def worst_row(x, ex, scale=None):
    """The largest row error of x against ex, relative to the row's norm of ex, or of `scale` where given (d_weights:
    the row's sum_s |G| relu, dsa_ref dw_scale: its exact value cancels, so its own norm can be far below the
    rounding errors of any float32 order)."""
    d = (x.double() - ex).reshape(-1, ex.shape[-1]).norm(dim=-1)
    n = (ex if scale is None else scale).reshape(-1, ex.shape[-1]).norm(dim=-1)
    return (d / torch.where(n > 0, n, torch.ones_like(n))).max().item()


def check(q, k, w, idx, *, factor=2.0, spoil=None, finite=True, det=None, **kw):
    s, lse, a, l1 = stats(q, k, w, idx, **kw)
    if spoil is not None:
        lse = spoil(lse)
    c = torch.tensor([0.37], device=DEV)
    dq, dk, dw = run(q, k, w, idx, s, lse, a, l1, c, det=det, **kw)
    if det:     # the default mode on the same inputs: dq and d_weights do not depend on the mode
        dq0, dk0, dw0 = run(q, k, w, idx, s, lse, a, l1, c, **kw)
        assert torch.equal(dq, dq0) and torch.equal(dw, dw0)
        assert ((dk - dk0).abs() <= 2 ** -14 * dk0.abs().max()).all()
    torch.cuda.synchronize()
    ex = sparse_indexer_bwd(q, k, w, idx, s, lse, a, l1, c, dw_scale=True, **kw)
    fl = sparse_indexer_bwd(q, k, w, idx, s, lse, a, l1, c, dtype=torch.float32, floor=True, **kw)
    if finite:
        for name, x in (("d_index_q", dq), ("d_index_k", dk), ("d_weights", dw)):
            assert torch.isfinite(x).all(), f"{name}: {int((~torch.isfinite(x)).sum())} non-finite of {x.numel()}"
    e_k, e_f = worst_row(dq, ex[0]), worst_row(fl[0], ex[0])
    assert e_k <= factor * e_f + 1e-6, f"d_index_q worst-row rel err {e_k:.3e} > {factor} x floor {e_f:.3e}"
    e_k, e_f = rel_rms(dk, ex[1]), rel_rms(fl[1], ex[1])
    assert e_k <= factor * e_f + 1e-7, f"d_index_k rel_rms {e_k:.3e} > {factor} x floor {e_f:.3e}"
    e_k, e_f = worst_row(dw, ex[2], ex[3]), worst_row(fl[2], ex[2], ex[3])
    assert e_k <= factor * e_f + 1e-6, f"d_weights worst-row rel err {e_k:.3e} > {factor} x floor {e_f:.3e}"
    return dq, dk, dw


def inputs(rows, sk, H, D, w_dtype, seed):
    torch.manual_seed(seed)
    q = rnd(*rows, H, D)
    k = rnd(rows[0], sk, D) if len(rows) == 2 else rnd(sk, D)
    w = (torch.randn(*rows, H, device=DEV) * H ** -0.5).to(w_dtype)
    return q, k, w


CASES = [(64, 128, torch.float32), (16, 64, torch.bfloat16), (32, 128, torch.bfloat16), (64, 64, torch.float32)]


@pytest.mark.parametrize("H,D,w_dtype", CASES)
@pytest.mark.parametrize("Sq,Sk,K", [(1, 592, 128), (30, 1840, 256), (17, 100, 200)])
def test_dense(H, D, w_dtype, Sq, Sk, K):
    q, k, w = inputs((2, Sq), Sk, H, D, w_dtype, Sq + Sk + H)
    check(q, k, w, indices((2, Sq), K, Sk))


@pytest.mark.parametrize("H,D,w_dtype", CASES[:2])
def test_topk_length_invalid_and_lse_inf(H, D, w_dtype):
    Sq, Sk, K = 24, 300, 300
    q, k, w = inputs((2, Sq), Sk, H, D, w_dtype, 5)
    idx = indices((2, Sq), K, Sk)
    idx[0, 3] = -1                          # a whole row invalid
    idx[1, 5, 64:128] = Sk + 9              # a whole 64-slot block invalid
    # one key in half the slots (all K would make every gradient of that row cancel to rounding noise:
    # sum_k (t_k - p_k) = 0 when every slot holds the same key, and no relative error is defined there)
    idx[1, 6, :K // 2] = idx[1, 6, :1]
    tl = torch.randint(0, K + 20, (2, Sq), device=DEV, dtype=torch.int32)
    tl[0, 0] = 0

    def spoil(lse):
        lse = lse.clone()
        lse[1, 7] = float("inf")            # a row switched off: zero gradients
        return lse
    dq, _, dw = check(q, k, w, idx, topk_length=tl, spoil=spoil)
    for r in ((0, 0), (0, 3), (1, 7)):
        assert (dq[r] == 0).all() and (dw[r] == 0).all(), r


@pytest.mark.parametrize("bad", [-1e30, float("-inf")])
def test_degenerate_lse_low(bad):
    """index_lse -1e30 or -inf (below every score: x = s - lse is huge or +inf): p = e^min(x, 0) = 1 on each valid
    slot, no overflow; gradients finite and within the gate, other rows unaffected."""
    Sq, Sk, K = 24, 300, 256
    q, k, w = inputs((2, Sq), Sk, 64, 128, torch.float32, 13)
    idx = indices((2, Sq), K, Sk)

    def spoil(lse):
        lse = lse.clone()
        lse[0, 5] = bad
        lse[1, 11] = bad
        return lse
    check(q, k, w, idx, spoil=spoil)


@pytest.mark.parametrize("H,D,w_dtype", CASES[:3])
def test_thd(H, D, w_dtype):
    torch.manual_seed(11)
    lens_q, lens_k = [5, 0, 37, 1, 20], [300, 40, 129, 1, 517]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=DEV)
    Tq, Tk, K = int(cu_q[-1]) + 6, int(cu_k[-1]), 160
    q, k = rnd(Tq, H, D), rnd(Tk, D)
    w = (torch.randn(Tq, H, device=DEV) * H ** -0.5).to(w_dtype)
    idx = torch.randint(-2, 520, (Tq, K), device=DEV, dtype=torch.int32)
    tl = torch.randint(0, K + 1, (Tq,), device=DEV, dtype=torch.int32)
    for kw in ({}, {"topk_length": tl}, {"topk_length": tl, "det": dict(deterministic=True, workspace_bytes=0)},
               {"topk_length": tl, "det": dict(deterministic=True)}):      # deterministic: 1-row chunks, one chunk
        dq, _, dw = check(q, k, w, idx, cu_q=cu_q, cu_k=cu_k, **kw)
        assert (dq[int(cu_q[-1]):] == 0).all() and (dw[int(cu_q[-1]):] == 0).all()


def test_nan_only_through_selecting_rows():
    H, D, Sq, Sk, K = 64, 128, 16, 400, 128
    q, k, w = inputs((1, Sq), Sk, H, D, torch.float32, 3)
    idx = torch.randint(0, Sk - 1, (1, Sq, K), device=DEV, dtype=torch.int32)
    idx[0, :8, 5] = Sk - 1
    s, lse, a, l1 = stats(q, k, w, idx)
    k[0, Sk - 1, 7] = NAN                   # after the statistics: only the backward's recompute sees it
    dq, dk, dw = run(q, k, w, idx, s, lse, a, l1, torch.tensor([0.5], device=DEV))
    torch.cuda.synchronize()
    assert torch.isnan(dw[0, :8]).all() and torch.isfinite(dw[0, 8:]).all()
    assert torch.isfinite(dq[0, 8:]).all()
    # relu's slope keeps the NaN: dA is NaN in every head of the slot, so all of dq of those rows and the key's dk row
    assert torch.isnan(dq[0, :8]).all() and torch.isnan(dk[0, Sk - 1]).all()


def test_reruns():
    H, D, Sq, Sk, K = 64, 128, 40, 400, 512
    q, k, w = inputs((1, Sq), Sk, H, D, torch.float32, 4)
    idx = torch.randint(0, Sk, (1, Sq, K), device=DEV, dtype=torch.int32)
    s, lse, a, l1 = stats(q, k, w, idx)
    c = torch.tensor([0.3], device=DEV)
    dq0, dk0, dw0 = run(q, k, w, idx, s, lse, a, l1, c)
    for _ in range(10):
        dq, dk, dw = run(q, k, w, idx, s, lse, a, l1, c)
        assert torch.equal(dq, dq0) and torch.equal(dw, dw0)
        assert ((dk - dk0).abs() <= 2 ** -14 * dk0.abs().max()).all()


@pytest.mark.parametrize("det", [False, True], ids=["atomics", "deterministic"])
def test_cuda_graph_capture(det):
    """The seam captured in a CUDA graph (deterministic: its chunks, the sort and the segment sums too, 5-row
    chunks), replayed into NaN-poisoned outputs: dq and d_weights equal to an eager run's, d_index_k within the
    re-association bound (deterministic: equal)."""
    H, D, Sq, Sk, K = 32, 128, 12, 300, 128
    q, k, w = inputs((2, Sq), Sk, H, D, torch.bfloat16, 19 if det else 9)
    idx = indices((2, Sq), K, Sk)
    s, lse, a, l1 = stats(q, k, w, idx)
    c = torch.tensor([0.3], device=DEV)
    out = [torch.full(q.shape, NAN, device=DEV, dtype=torch.bfloat16), torch.full(k.shape, NAN, device=DEV),
           torch.full(w.shape, NAN, device=DEV)]
    kw = {}
    if det:
        kw = dict(deterministic=True, workspace=TorchWorkspace(), workspace_bytes=5 * row_bytes((2, Sq), K, D))
    st = torch.cuda.Stream()
    with torch.cuda.stream(st):
        kernel_bwd(q, k, w, idx, s, lse, a, l1, c, *out, stream=st.cuda_stream, **kw)
    torch.cuda.synchronize()
    for t in out:
        t.fill_(NAN)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=st):
        kernel_bwd(q, k, w, idx, s, lse, a, l1, c, *out, stream=st.cuda_stream, **kw)
    g.replay()
    torch.cuda.synchronize()
    ex = run(q, k, w, idx, s, lse, a, l1, c, det=dict(deterministic=det))
    torch.cuda.synchronize()
    assert torch.equal(out[0], ex[0]) and torch.equal(out[2], ex[2])
    if det:
        assert torch.equal(out[1], ex[1])
    else:
        assert ((out[1] - ex[1]).abs() <= 2 ** -14 * ex[1].abs().max()).all()


def row_bytes(rows, K, D):
    return (rows[0] if len(rows) == 2 else 1) * K * D * 4


@pytest.mark.parametrize("H,D,w_dtype", CASES)
def test_deterministic_dense(H, D, w_dtype):
    """Invalid / duplicate slots, topk_length 0 and random, a row with index_lse = +inf; 5-row chunks."""
    Sq, Sk, K = 17, 300, 200
    q, k, w = inputs((2, Sq), Sk, H, D, w_dtype, 50 + H + D)
    idx = indices((2, Sq), K, Sk)
    idx[1, 6, :K // 2] = idx[1, 6, :1]
    tl = torch.randint(0, K + 20, (2, Sq), device=DEV, dtype=torch.int32)
    tl[0, 0] = 0
    ws = TorchWorkspace()

    def spoil(lse):
        lse = lse.clone()
        lse[1, 7] = float("inf")
        return lse
    dq, _, dw = check(q, k, w, idx, topk_length=tl, spoil=spoil,
                      det=dict(deterministic=True, workspace_bytes=5 * row_bytes((2, Sq), K, D), workspace=ws))
    assert ws.chunks == 4
    for r in ((0, 0), (1, 7)):
        assert (dq[r] == 0).all() and (dw[r] == 0).all(), r


def test_deterministic_bitwise():
    """All three gradients bit for bit over 100 reruns and for chunks of 1, 3 and all rows (the per-key order is
    (row, slot) whatever the chunking); many rows share each key (Sk 48, K 512, duplicates)."""
    H, D, Sq, Sk, K = 64, 128, 40, 48, 512
    q, k, w = inputs((2, Sq), Sk, H, D, torch.float32, 14)
    idx = torch.randint(0, Sk, (2, Sq, K), device=DEV, dtype=torch.int32)
    s, lse, a, l1 = stats(q, k, w, idx)
    c = torch.tensor([0.3], device=DEV)
    base = run(q, k, w, idx, s, lse, a, l1, c, det=dict(deterministic=True))
    assert all(torch.isfinite(t).all() for t in base)
    for wb in (0, 3 * row_bytes((2, Sq), K, D)):
        got = run(q, k, w, idx, s, lse, a, l1, c, det=dict(deterministic=True, workspace_bytes=wb))
        assert all(torch.equal(x, y) for x, y in zip(got, base)), wb
    for _ in range(100):
        got = run(q, k, w, idx, s, lse, a, l1, c, det=dict(deterministic=True))
        assert all(torch.equal(x, y) for x, y in zip(got, base))
