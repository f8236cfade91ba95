"""GPU tests of the dense attention-score recompute kernel (ops/dsa/attn_score/dense.py) against float64.

Each case: scores and l1norm NaN-poisoned; kernel vs the float64 reference from the same bf16 inputs and the
float32 implementation ("floor", tests/gpu/dsa_ref.attn_scores). Gates:
  rel_rms(scores - exact) <= 2 x rel_rms(floor - exact) + 1e-7, the same for l1norm
  the zero pattern of masked entries exact (every element written), no NaN/inf for finite inputs
softmax_lse is the attention's own lse (probabilities <= 1) unless a test sets degenerate values.
Run: python -m pytest -q tests/gpu/test_dsa_attn_score.py
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

from dsa_ref import attn_scores, rel_rms, true_lse  # noqa: E402
from ops.dsa.attn_score.dense import dense_attn_score_fwd  # noqa: E402

DEV = "cuda"
NAN = float("nan")


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).bfloat16()


def run(q, kv, lse, scale, *, causal=True, ratio=1, q_offsets=None, cu_q=None, cu_k=None, width=None, max_q=0,
        stream=None):
    if cu_q is None:
        a = torch.full((q.shape[0], q.shape[1], kv.shape[1]), NAN, device=DEV)
        l1 = torch.full(q.shape[:2], NAN, device=DEV)
    else:
        a = torch.full((q.shape[0], width), NAN, device=DEV)
        l1 = torch.full((q.shape[0],), NAN, device=DEV)
    dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=scale, causal=causal, ratio=ratio, q_offsets=q_offsets,
                         cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                         stream=(stream or torch.cuda.current_stream()).cuda_stream)
    return a, l1


def check(q, kv, lse, scale, factor=2.0, **kw):
    a, l1 = run(q, kv, lse, scale, **kw)
    torch.cuda.synchronize()
    ref_kw = {n: kw[n] for n in ("causal", "ratio", "q_offsets", "cu_q", "cu_k", "width") if n in kw}
    ex_a, ex_l = attn_scores(q, kv, lse, scale, **ref_kw)
    fl_a, fl_l = attn_scores(q, kv, lse, scale, dtype=torch.float32, **ref_kw)
    assert not torch.isnan(a).any(), f"NaN in scores ({int(torch.isnan(a).sum())} of {a.numel()})"
    assert not torch.isnan(l1).any(), f"NaN in l1norm ({int(torch.isnan(l1).sum())})"
    assert torch.isfinite(a).all() and torch.isfinite(l1).all(), "inf in the outputs"
    assert torch.equal(a == 0, ex_a == 0), f"zero pattern differs: {int((a == 0).sum())} vs {int((ex_a == 0).sum())}"
    e_k, e_f = rel_rms(a, ex_a), rel_rms(fl_a, ex_a)
    assert e_k <= factor * e_f + 1e-7, f"scores rel_rms {e_k:.3e} > {factor} x floor {e_f:.3e}"
    e_k, e_f = rel_rms(l1, ex_l), rel_rms(fl_l, ex_l)
    assert e_k <= factor * e_f + 1e-7, f"l1norm rel_rms {e_k:.3e} > {factor} x floor {e_f:.3e}"
    return a, l1


@pytest.mark.parametrize("S", [1, 17, 255, 300])
@pytest.mark.parametrize("H", [64, 128])
@pytest.mark.parametrize("D", [576, 512])
def test_dense_causal(S, H, D):
    torch.manual_seed(S + H + D)
    q, kv = rnd(2, S, H, D), rnd(2, S, D)
    scale = 1 / math.sqrt(D)
    check(q, kv, true_lse(q, kv, scale), scale)


@pytest.mark.parametrize("Sq,Sk", [(1, 519), (300, 77), (77, 300), (129, 1025)])
def test_dense_not_causal(Sq, Sk):
    torch.manual_seed(Sq * Sk)
    q, kv = rnd(1, Sq, 64, 576), rnd(1, Sk, 576)
    scale = 0.1
    check(q, kv, true_lse(q, kv, scale, causal=False), scale, causal=False)


def test_long_1025():
    torch.manual_seed(1025)
    q, kv = rnd(1, 1025, 128, 576), rnd(1, 1025, 576)
    scale = 1 / math.sqrt(576)
    check(q, kv, true_lse(q, kv, scale), scale)


@pytest.mark.parametrize("ratio,offs", [(1, [0, 37]), (4, [0, 300]), (3, [-1000, 2])])
def test_ratio_offsets(ratio, offs):
    torch.manual_seed(ratio + offs[1])
    q, kv = rnd(2, 200, 64, 576), rnd(2, 150, 576)
    off = torch.tensor(offs, dtype=torch.int32, device=DEV)
    scale = 1 / 24
    lse = true_lse(q, kv, scale, ratio=ratio, q_offsets=off)
    check(q, kv, lse, scale, ratio=ratio, q_offsets=off)


def test_sharp_and_wide_scores():
    """kv scaled x8: logits ~ +-200 around a true lse; terms far below the max flush to 0."""
    torch.manual_seed(8)
    q, kv = rnd(1, 255, 64, 576), rnd(1, 255, 576, scale=8.0)
    scale = 1 / math.sqrt(576)
    check(q, kv, true_lse(q, kv, scale), scale)


def test_degenerate_lse():
    """softmax_lse of -1e30, -inf, +inf and a too-small finite value: no inf, no NaN; +inf gives a zero row,
    -1e30 / -inf saturate each term at 2^120 (the reference's rule)."""
    torch.manual_seed(3)
    q, kv = rnd(1, 130, 128, 576), rnd(1, 130, 576)
    scale = 1 / math.sqrt(576)
    lse = true_lse(q, kv, scale)
    lse[0, :, 5] = -1e30
    lse[0, :, 6] = float("-inf")
    lse[0, :, 7] = float("inf")
    lse[0, 3, 8] = -50.0
    lse[0, :64, 9] = float("inf")
    lse[0, 64:, 9] = -1e30
    a, l1 = check(q, kv, lse, scale)
    assert (a[0, 7] == 0).all() and l1[0, 7] == 0
    assert (a[0, 6, :7] == 128 * 2.0 ** 120).all()


def test_thd():
    torch.manual_seed(11)
    cu_q = torch.tensor([0, 70, 70, 171, 172], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 130, 131, 250, 250], dtype=torch.int32, device=DEV)
    Tq, Tk, W, H, D = 180, 260, 135, 64, 576
    q, kv = rnd(Tq, H, D), rnd(Tk, D)
    lse = torch.randn(H, Tq, device=DEV) * 2 + 5
    off = torch.tensor([60, 0, 3, 0], dtype=torch.int32, device=DEV)
    for causal in (True, False):
        check(q, kv, lse, 0.05, causal=causal, cu_q=cu_q, cu_k=cu_k, width=W, max_q=101, q_offsets=off)


def test_nan_reaches_what_it_influences():
    torch.manual_seed(5)
    q, kv = rnd(1, 130, 64, 512), rnd(1, 130, 512)
    scale = 1 / math.sqrt(512)
    lse = true_lse(q, kv, scale)
    q[0, 40, 3, 7] = NAN
    kv[0, 90, 5] = NAN
    lse[0, 10, 100] = NAN
    a, l1 = run(q, kv, lse, scale)
    ex, ex_l = attn_scores(q, kv, lse, scale)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(a), torch.isnan(ex)) and torch.equal(torch.isnan(l1), torch.isnan(ex_l))
    assert torch.isnan(a[0, 40, :41]).all() and torch.isnan(a[0, 95:, 90]).all() and torch.isnan(l1[0, 100])
    assert not torch.isnan(a[0, :40]).any()


def test_cuda_graph_capture():
    torch.manual_seed(17)
    q, kv = rnd(2, 300, 64, 576), rnd(2, 300, 576)
    scale = 1 / 24
    lse = true_lse(q, kv, scale)
    a = torch.full((2, 300, 300), NAN, device=DEV)
    l1 = torch.full((2, 300), NAN, device=DEV)
    dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=scale, stream=torch.cuda.current_stream().cuda_stream)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=scale, stream=side.cuda_stream)
    kv.copy_(rnd(2, 300, 576))
    a.fill_(NAN)
    l1.fill_(NAN)
    g.replay()
    torch.cuda.synchronize()
    ex, ex_l = attn_scores(q, kv, lse, scale)
    assert not torch.isnan(a).any() and torch.equal(a == 0, ex == 0)
    assert rel_rms(a, ex) < 1e-5 and rel_rms(l1, ex_l) < 1e-5
