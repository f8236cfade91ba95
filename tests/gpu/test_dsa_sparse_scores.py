"""GPU tests of the sparse score recompute kernels (ops/dsa/indexer/sparse.py, ops/dsa/attn_score/sparse.py) against
float64 (tests/gpu/dsa_ref.py): scores and statistics NaN-poisoned, gates as the dense tests (2x the float32
implementation's rel_rms; the -inf / 0 pattern of invalid slots exact; no NaN/inf for finite inputs).
Slots: indices drawn from [-3, Sk + 5) (negative and past-the-end ones invalid), duplicates, topk_length random or
0, whole rows and whole 64-slot blocks invalid, THD with an empty segment and rows past cu_seqlens_q[-1]. The
attention kernel runs its HEAD_SPLIT schedule (ops/common/sparse_head_sum_sm90.py, on since 2026-12-05).
Run: python -m pytest -q tests/gpu/test_dsa_sparse_scores.py
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

from dsa_ref import rel_rms, sparse_attn_scores, sparse_indexer_scores  # noqa: E402
from ops.dsa.attn_score.sparse import sparse_attn_score_fwd  # noqa: E402
from ops.dsa.indexer.sparse import sparse_indexer_fwd  # noqa: E402

DEV = "cuda"
NAN = float("nan")
def rnd(*shape, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def indices(rows, K, sk, invalid_frac=0.1):
    idx = torch.randint(0, max(sk, 1), (*rows, K), device=DEV, dtype=torch.int32)
    bad = torch.rand(*rows, K, device=DEV) < invalid_frac
    junk = torch.where(torch.rand(*rows, K, device=DEV) < 0.5, torch.full_like(idx, -1), idx + sk + 3)
    return torch.where(bad, junk, idx)


def run(kind, q, k, c, idx, *, topk_length=None, cu_q=None, cu_k=None, scale=None):
    s = torch.full(idx.shape, NAN, device=DEV)
    st = torch.full(idx.shape[:-1], NAN, device=DEV)
    stream = torch.cuda.current_stream().cuda_stream
    if kind == "indexer":
        sparse_indexer_fwd(q, k, c, idx, s, st, topk_length=topk_length, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                           stream=stream)
    else:
        sparse_attn_score_fwd(q, k, c, idx, s, st, softmax_scale=scale, topk_length=topk_length,
                              cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, stream=stream)
    return s, st


def reference(kind, q, k, c, idx, dtype, **kw):
    if kind == "indexer":
        kw.pop("scale", None)
        return sparse_indexer_scores(q, k, c, idx, dtype=dtype, **kw)
    scale = kw.pop("scale")
    return sparse_attn_scores(q, k, c, scale, idx, dtype=dtype, **kw)


def check(kind, q, k, c, idx, factor=2.0, **kw):
    s, st = run(kind, q, k, c, idx, **kw)
    torch.cuda.synchronize()
    ex_s, ex_t = reference(kind, q, k, c, idx, torch.float64, **dict(kw))
    fl_s, fl_t = reference(kind, q, k, c, idx, torch.float32, **dict(kw))
    assert not torch.isnan(s).any(), f"NaN in scores ({int(torch.isnan(s).sum())} of {s.numel()})"
    assert not torch.isnan(st).any(), f"NaN in the statistic ({int(torch.isnan(st).sum())})"
    masked = torch.isneginf(ex_s) if kind == "indexer" else ex_s == 0
    got = torch.isneginf(s) if kind == "indexer" else s == 0
    assert torch.equal(got, masked), f"mask pattern differs: {int(got.sum())} vs {int(masked.sum())}"
    assert torch.isfinite(s[~masked]).all() and torch.isfinite(st).all()
    for name, x, ex, fl in (("scores", s, ex_s, fl_s), ("stat", st, ex_t, fl_t)):
        e_k, e_f = rel_rms(x, ex), rel_rms(fl, ex)
        assert e_k <= factor * e_f + 1e-7, f"{name} rel_rms {e_k:.3e} > {factor} x floor {e_f:.3e}"
    return s, st


def inputs(kind, rows, sk, H, D, K, seed):
    torch.manual_seed(seed)
    q = rnd(*rows, H, D)
    k = rnd(rows[0], sk, D) if len(rows) == 2 else rnd(sk, D)
    if kind == "indexer":
        c = rnd(*rows, H, dtype=torch.float32)
    else:
        c = (torch.randn(rows[0], H, rows[1], device=DEV) + 6.0) if len(rows) == 2 else torch.randn(H, rows[0],
                                                                                                  device=DEV) + 6.0
    return q, k, c


CASES = [("indexer", 64, 128), ("indexer", 16, 64), ("indexer", 32, 128), ("attn", 128, 576), ("attn", 64, 512)]


@pytest.mark.parametrize("kind,H,D", CASES)
@pytest.mark.parametrize("Sq,Sk,K", [(1, 592, 128), (62, 1840, 256), (213, 1521, 512), (17, 100, 200)])
def test_dense(kind, H, D, Sq, Sk, K):
    q, k, c = inputs(kind, (2, Sq), Sk, H, D, K, Sq + Sk + H)
    idx = indices((2, Sq), K, Sk)
    check(kind, q, k, c, idx, scale=1 / math.sqrt(D))


@pytest.mark.parametrize("kind,H,D", CASES)
def test_topk_length_and_invalid_blocks(kind, H, D):
    """topk_length random (0 included) and past K; a row with every slot invalid; a whole 64-slot block invalid;
    duplicated indices."""
    q, k, c = inputs(kind, (1, 97), 700, H, D, 256, H + D)
    idx = indices((1, 97), 256, 700)
    idx[0, 5] = -1
    idx[0, 6, 64:128] = 700
    idx[0, 7] = 3
    tl = torch.randint(-2, 300, (1, 97), device=DEV, dtype=torch.int32)
    tl[0, 8] = 0
    check(kind, q, k, c, idx, topk_length=tl, scale=0.05)
    check(kind, q, k, c, idx, scale=0.05)


@pytest.mark.parametrize("kind,H,D", [CASES[0], CASES[3], CASES[4]])
def test_thd(kind, H, D):
    cu_q = torch.tensor([0, 70, 70, 171, 172], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 130, 131, 250, 250], dtype=torch.int32, device=DEV)
    Tq, Tk, K = 180, 260, 192
    q, k, c = inputs(kind, (Tq,), Tk, H, D, K, 3)
    idx = indices((Tq,), K, 130)
    tl = torch.randint(0, K + 5, (Tq,), device=DEV, dtype=torch.int32)
    check(kind, q, k, c, idx, cu_q=cu_q, cu_k=cu_k, scale=0.04)
    check(kind, q, k, c, idx, topk_length=tl, cu_q=cu_q, cu_k=cu_k, scale=0.04)


@pytest.mark.parametrize("kind,H,D", [CASES[0], CASES[3], CASES[4]])
def test_nan_only_through_valid_slots(kind, H, D):
    """A NaN key row reached only through invalid slots leaks nowhere; one reached through a valid slot poisons that
    slot's score and the row's statistic only."""
    q, k, c = inputs(kind, (1, 40), 300, H, D, 128, 9)
    idx = indices((1, 40), 128, 250, invalid_frac=0.0)
    k[0, 280] = NAN                  # no valid slot points here (idx < 250)
    idx[0, 3, 10] = 280 + 1000       # invalid: past Sk
    k[0, 7, 0] = NAN
    idx[0, 4, 20] = 7                # valid slot: row 4's slot 20 and its statistic become NaN
    idx[0, 4, 21] = 7 - 300          # invalid
    s, st = run(kind, q, k, c, idx, scale=0.05)
    ex, ex_t = reference(kind, q, k, c, idx, torch.float64, scale=0.05)
    torch.cuda.synchronize()
    assert torch.equal(torch.isnan(s), torch.isnan(ex)) and torch.equal(torch.isnan(st), torch.isnan(ex_t))
    assert torch.isnan(s[0, 4, 20]) and torch.isnan(st[0, 4])
    assert int(torch.isnan(s).sum()) == int((idx[0] == 7).sum())


def test_attn_degenerate_lse():
    kind = "attn"
    q, k, c = inputs(kind, (1, 30), 400, 128, 576, 256, 4)
    idx = indices((1, 30), 256, 400)
    c[0, :, 3] = -1e30
    c[0, :, 4] = float("-inf")
    c[0, :, 5] = float("inf")
    s, st = check(kind, q, k, c, idx, scale=1 / 24)
    assert (s[0, 5] == 0).all() and st[0, 5] == 0


@pytest.mark.parametrize("kind,H,D", [CASES[0], CASES[3]])
def test_cuda_graph_capture(kind, H, D):
    q, k, c = inputs(kind, (2, 50), 900, H, D, 512, 21)
    idx = indices((2, 50), 512, 900)
    s = torch.full(idx.shape, NAN, device=DEV)
    st = torch.full(idx.shape[:-1], NAN, device=DEV)

    def call(stream):
        if kind == "indexer":
            sparse_indexer_fwd(q, k, c, idx, s, st, stream=stream)
        else:
            sparse_attn_score_fwd(q, k, c, idx, s, st, softmax_scale=0.05, stream=stream)
    call(torch.cuda.current_stream().cuda_stream)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            call(side.cuda_stream)
    idx.copy_(indices((2, 50), 512, 900))
    s.fill_(NAN)
    st.fill_(NAN)
    g.replay()
    torch.cuda.synchronize()
    ex, ex_t = reference(kind, q, k, c, idx, torch.float64, scale=0.05)
    assert not torch.isnan(s).any() and not torch.isnan(st).any()
    assert rel_rms(s, ex) < 1e-5 and rel_rms(st, ex_t) < 1e-5


@pytest.mark.parametrize("kind,H,D", [CASES[0], CASES[3], CASES[4]])
@pytest.mark.parametrize("knobs", [dict(GATHER_PREFETCH=0), dict(GATHER_PREFETCH=1), dict(GATHER_PREFETCH=2),
                                   dict(GATHER_PREFETCH=3), dict(GATHER_PREFETCH=3, EVICT_LAST_KV_BYTES=0),
                                   dict(IDX_AHEAD=1), dict(IDX_AHEAD=2), dict(IDX_AHEAD=3),
                                   dict(LEAN_GATHER=True), dict(LEAN_GATHER=False),
                                   dict(LEAN_GATHER=False, IDX_AHEAD=2)])
def test_gather_hints(monkeypatch, kind, H, D, knobs):
    """The gather's copy forms (gather_sm90.GatherHints: 0 the DSL's cp.async.cg atom; 1 inline PTX with the L2::256B
    hint and the swizzled address computed by hand; 2 an evict_last policy; 3 evict_last or, with
    EVICT_LAST_KV_BYTES 0, evict_normal; the indexer's default is 3, the attention variant's 0) and the producer's
    idx lookahead (IDX_AHEAD 1 / 2 / 3: the same copies, issued in the same order) and the producer's copies by
    addresses formed once or rebuilt per copy (LEAN_GATHER: the same copies; the indexer's default is lean with
    IDX_AHEAD 1, the attention variant's not lean): float64 gates, and
    scores and statistic bitwise the default form's (BSHD with topk_length and invalid slots, THD with an empty
    segment and rows past cu_seqlens_q[-1]). A knob set equal to the kernel's defaults is skipped (it cannot fail)."""
    if kind == "indexer":
        from ops.dsa.indexer import sparse as seam, sparse_sm90 as kmod
        cls = kmod.SparseIndexerScoreSm90
    else:
        from ops.dsa.attn_score import sparse as seam, sparse_sm90 as kmod
        cls = kmod.SparseAttnScoreSm90
    q, k, c = inputs(kind, (2, 40), 600, H, D, 320, 7 + H)
    idx = indices((2, 40), 320, 600)
    tl = torch.randint(0, 330, (2, 40), device=DEV, dtype=torch.int32)
    cu_q = torch.tensor([0, 70, 70, 171, 172], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 130, 131, 250, 250], dtype=torch.int32, device=DEV)
    tq, tk, tc = inputs(kind, (180,), 260, H, D, 192, 9 + H)
    tidx = indices((180,), 192, 130)
    if all(getattr(cls, name) == value for name, value in knobs.items()):
        pytest.skip(f"{knobs} are {cls.__name__}'s defaults")
    base = [run(kind, q, k, c, idx, topk_length=tl, scale=0.05), run(kind, tq, tk, tc, tidx, cu_q=cu_q, cu_k=cu_k,
                                                                   scale=0.05)]
    for name, value in knobs.items():
        monkeypatch.setattr(cls, name, value)
    monkeypatch.setattr(seam, "_CACHE", {})
    got = [check(kind, q, k, c, idx, topk_length=tl, scale=0.05),
           check(kind, tq, tk, tc, tidx, cu_q=cu_q, cu_k=cu_k, scale=0.05)]
    for (s0, t0), (s1, t1) in zip(base, got):
        assert torch.equal(s0, s1) and torch.equal(t0, t1), "gather hints change the results"
