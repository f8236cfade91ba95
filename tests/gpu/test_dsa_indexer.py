"""GPU tests of the lightning-indexer score kernel (ops/dsa/indexer/fwd.py) against float64 (tests/gpu/dsa_ref.py).

Each case: scores and lse NaN-poisoned, kernel vs the float64 reference from the same bf16 inputs and the float32
implementation ("floor"). Gates:
  rel_rms(scores - exact) <= 2 x rel_rms(floor - exact) + 1e-7 over the visible entries
  the -inf pattern equals the reference's exactly (every column of every row written)
  |lse - exact| <= 2 x max|lse_floor - exact| + 2^-22 max(1, |lse|); rows that see no key: lse == 0 exactly
Run: python -m pytest -q tests/gpu/test_dsa_indexer.py
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

from dsa_ref import indexer_scores, rel_rms  # noqa: E402
from ops.dsa.indexer.fwd import indexer_fwd  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
NAN = float("nan")


def rnd(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def run(q, k, w, *, causal=True, ratio=1, q_offsets=None, cu_q=None, cu_k=None, width=None, max_q=0,
        with_lse=True, stream=None):
    if cu_q is None:
        B, Sq = q.shape[:2]
        s = torch.full((B, Sq, k.shape[1]), NAN, device=DEV)
        lse = torch.full((B, Sq), NAN, device=DEV) if with_lse else None
    else:
        s = torch.full((q.shape[0], width), NAN, device=DEV)
        lse = torch.full((q.shape[0],), NAN, device=DEV) if with_lse else None
    indexer_fwd(q, k, w, s, lse, causal=causal, ratio=ratio, q_offsets=q_offsets, cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                stream=(stream or torch.cuda.current_stream()).cuda_stream)
    return s, lse


def check(q, k, w, *, factor=2.0, **kw):
    s, lse = run(q, k, w, **kw)
    torch.cuda.synchronize()
    ref_kw = {n: kw[n] for n in ("causal", "ratio", "q_offsets", "width") if n in kw}
    ref_kw.update(cu_q=kw.get("cu_q"), cu_k=kw.get("cu_k"))
    ex_s, ex_l = indexer_scores(q, k, w, dtype=torch.float64, **ref_kw)
    fl_s, fl_l = indexer_scores(q, k, w, dtype=torch.float32, **ref_kw)
    assert not torch.isnan(s).any(), f"NaN in scores ({int(torch.isnan(s).sum())} of {s.numel()})"
    assert not torch.isnan(lse).any(), f"NaN in lse ({int(torch.isnan(lse).sum())})"
    dead = torch.isneginf(ex_s)
    assert torch.equal(torch.isneginf(s), dead), \
        f"-inf pattern differs: kernel {int(torch.isneginf(s).sum())} vs reference {int(dead.sum())}"
    assert torch.isfinite(s[~dead]).all(), "inf among visible scores"
    e_k, e_f = rel_rms(s, ex_s), rel_rms(fl_s, ex_s)
    assert e_k <= factor * e_f + 1e-7, f"scores rel_rms {e_k:.3e} > {factor} x floor {e_f:.3e}"
    no_key = dead.all(dim=-1)
    assert (lse[no_key] == 0).all(), "rows that see no key must have lse 0"
    err = (lse.double() - ex_l).abs()
    tol = factor * (fl_l.double() - ex_l).abs().max().item() + 2.0 ** -22 * ex_l.abs().clamp_min(1.0)
    assert (err <= tol).all(), f"lse error {err.max().item():.3e} (floor {(fl_l.double() - ex_l).abs().max():.3e})"
    return e_k / max(e_f, 1e-30)


# ------------------------------------------------------------------------------------------------ dense
@pytest.mark.parametrize("S", [1, 17, 255, 300])
@pytest.mark.parametrize("H", [16, 32, 64])
@pytest.mark.parametrize("D", [64, 128])
def test_dense_causal(S, H, D):
    torch.manual_seed(S * 31 + H + D)
    B = 2
    check(rnd(B, S, H, D), rnd(B, S, D), rnd(B, S, H, dtype=torch.float32), causal=True)


@pytest.mark.parametrize("Sq,Sk", [(1, 519), (300, 77), (77, 300), (129, 4097)])
@pytest.mark.parametrize("wdt", [BF16, torch.float32])
def test_dense_not_causal(Sq, Sk, wdt):
    torch.manual_seed(Sq + Sk)
    check(rnd(2, Sq, 64, 128), rnd(2, Sk, 128), rnd(2, Sq, 64, dtype=wdt), causal=False)


def test_long_4097():
    torch.manual_seed(4097)
    check(rnd(1, 4097, 64, 128), rnd(1, 4097, 128), rnd(1, 4097, 64, dtype=torch.float32), causal=True)


@pytest.mark.parametrize("ratio,offs", [(1, [0, 37]), (4, [0, 300]), (4, [-9, 5]), (3, [-1000, 2])])
def test_ratio_offsets(ratio, offs):
    """Context-parallel chunks: query t sits at q_offsets[b] + t; keys compressed by ratio; negative offsets give
    rows that see no key (all -inf, lse 0)."""
    torch.manual_seed(ratio * 100 + offs[1])
    Sq, Sk = 200, 150
    off = torch.tensor(offs, dtype=torch.int32, device=DEV)
    check(rnd(2, Sq, 32, 128), rnd(2, Sk, 128), rnd(2, Sq, 32), causal=True, ratio=ratio, q_offsets=off)


@pytest.mark.parametrize("kscale", [8.0, 64.0, 5000.0])
def test_wide_score_range(kscale):
    """K scaled 8..5000: scores up to ~1e5..1e6; the lse is dominated by the max, exp never overflows."""
    torch.manual_seed(int(kscale))
    check(rnd(1, 255, 64, 128), rnd(1, 255, 128, scale=kscale), rnd(1, 255, 64, dtype=torch.float32))


def test_signed_weights_and_strides():
    """Negative weights (relu before the weight), index_k with a padded row stride, weights strided."""
    torch.manual_seed(5)
    q = rnd(2, 190, 16, 64)
    k = rnd(2, 190, 64 + 64)[..., :64]
    w = rnd(2, 190, 16 + 3, dtype=torch.float32)[..., :16]
    check(q, k, w, causal=True)


# ------------------------------------------------------------------------------------------------ THD
@pytest.mark.parametrize("H,D", [(64, 128), (16, 64), (32, 128)])
def test_thd(H, D):
    """Empty and off-grid segments, rows past cu_seqlens_q[-1], a score width beyond the longest key sequence."""
    torch.manual_seed(H + D)
    cu_q = torch.tensor([0, 70, 70, 171, 172], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 130, 131, 250, 250], dtype=torch.int32, device=DEV)
    Tq, Tk, W = 180, 260, 135
    off = torch.tensor([60, 0, 3, 0], dtype=torch.int32, device=DEV)
    q, k, w = rnd(Tq, H, D), rnd(Tk, D), rnd(Tq, H, dtype=torch.float32)
    for causal in (True, False):
        check(q, k, w, causal=causal, cu_q=cu_q, cu_k=cu_k, width=W, max_q=101, q_offsets=off)


def test_thd_ratio_no_lse():
    torch.manual_seed(7)
    cu_q = torch.tensor([0, 1, 18, 273], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 1, 5, 69], dtype=torch.int32, device=DEV)
    q, k, w = rnd(273, 64, 128), rnd(69, 128), rnd(273, 64)
    s, lse = run(q, k, w, causal=True, ratio=4, cu_q=cu_q, cu_k=cu_k, width=64, max_q=255, with_lse=False)
    ex, _ = indexer_scores(q, k, w, causal=True, ratio=4, cu_q=cu_q, cu_k=cu_k, width=64)
    fl, _ = indexer_scores(q, k, w, causal=True, ratio=4, cu_q=cu_q, cu_k=cu_k, width=64, dtype=torch.float32)
    assert lse is None and not torch.isnan(s).any()
    assert torch.equal(torch.isneginf(s), torch.isneginf(ex))
    assert rel_rms(s, ex) <= 2 * rel_rms(fl, ex) + 1e-7


# ------------------------------------------------------------------------------------------------ NaN, graphs, size
def test_nan_reaches_what_it_influences():
    """NaN in q[b,t] -> that row's visible scores and lse; NaN in k[b,j] -> column j where visible and those rows' lse;
    NaN in w[b,t,h] -> row t; nothing else."""
    torch.manual_seed(13)
    B, S, H, D = 1, 130, 32, 64
    q, k, w = rnd(B, S, H, D), rnd(B, S, D), rnd(B, S, H, dtype=torch.float32)
    q[0, 40, 3, 7] = NAN
    k[0, 90, 5] = NAN
    w[0, 100, 0] = NAN
    s, lse = run(q, k, w, causal=True)
    ex, ex_l = indexer_scores(q, k, w)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(s), torch.isnan(ex)), "NaN pattern of the scores differs from the formula's"
    assert torch.equal(torch.isnan(lse), torch.isnan(ex_l)), "NaN pattern of the lse differs from the formula's"
    assert torch.isnan(s[0, 40, :41]).all() and torch.isnan(s[0, 95:, 90]).all() and torch.isnan(lse[0, 100])
    assert not torch.isnan(s[0, :40]).any()


def test_cuda_graph_capture():
    torch.manual_seed(17)
    q, k, w = rnd(2, 300, 64, 128), rnd(2, 300, 128), rnd(2, 300, 64, dtype=torch.float32)
    s = torch.full((2, 300, 300), NAN, device=DEV)
    lse = torch.full((2, 300), NAN, device=DEV)
    indexer_fwd(q, k, w, s, lse, causal=True, stream=torch.cuda.current_stream().cuda_stream)   # compile outside
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            indexer_fwd(q, k, w, s, lse, causal=True, stream=side.cuda_stream)
    q.copy_(rnd(2, 300, 64, 128))
    s.fill_(NAN)
    lse.fill_(NAN)
    g.replay()
    torch.cuda.synchronize()
    ex, ex_l = indexer_scores(q, k, w)
    assert not torch.isnan(s).any()
    assert torch.equal(torch.isneginf(s), torch.isneginf(ex))
    assert rel_rms(s, ex) < 1e-5 and (lse.double() - ex_l).abs().max() < 1e-3


def test_output_past_2g_elements():
    """B * Sq * Sk > 2^31 (64-bit offsets): the last batch's last rows checked against the reference."""
    B, S, H, D = 3, 27000, 16, 64
    torch.manual_seed(1)
    q, k, w = rnd(B, S, H, D), rnd(B, S, D), rnd(B, S, H, dtype=torch.float32)
    s = torch.full((B, S, S), NAN, device=DEV)
    lse = torch.full((B, S), NAN, device=DEV)
    indexer_fwd(q, k, w, s, lse, causal=True, stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    rows = slice(S - 70, S)
    ex, ex_l = indexer_scores(q[2:, rows], k[2:], w[2:, rows], causal=True, q_offsets=torch.tensor([S - 70]))
    got = s[2:, rows]
    assert not torch.isnan(got).any() and not torch.isnan(s[:, ::997]).any()
    assert torch.equal(torch.isneginf(got), torch.isneginf(ex))
    assert rel_rms(got, ex) < 1e-5 and (lse[2:, rows].double() - ex_l).abs().max() < 1e-3
    del s
