"""The Paddle side of the DSA GPU seams, on CPU: fake ops.dsa modules stand in for the CuTe kernels.

With PORT.is_gpu patched to True, indexer_score, dense_indexer_score_recompute, indexer_topk and
sparse_indexer_score_recompute take the kernel path (paddle_dsa/kernels/dsa.py): the tensors are exported through
the port, outputs come from ``_empty`` (NaN- / -7-poisoned here, so an unwritten element or a buffer the seam did
not hand to the kernel shows up), and the ops seam is called with its keyword signature. The fakes read their
inputs back through DLPack, compute with the reference path and write through the raw pointer; the results must
equal the reference path's (kernels disabled) bit for bit.
"""
import ast
import inspect
import pathlib
import types

import numpy as np
import paddle
import pytest

import paddle_dsa as P
from paddle_dsa._port import PORT
from paddle_dsa.kernels import dsa as seam
from paddle_dsa.nn.functional import _dsa_inputs
from paddle_dsa.reference.dsa import _common as C
from paddle_dsa.reference.dsa import indexer as ref_index
from paddle_dsa.reference.dsa import topk as ref_topk

from dlpack_io import read, write


def _layout(index_q, index_k, q_offsets, cu_q, cu_k):
    offs = None if q_offsets is None else q_offsets.numpy()
    if cu_q is None:
        b, sq = index_q.shape[:2]
        return C.Layout.bshd(b, sq, index_k.shape[1], offs)
    return C.Layout.thd(index_q.shape[0], index_k.shape[0], cu_q.numpy(), cu_k.numpy(), offs)


def _rows(x, thd):
    return x if thd else x.reshape([x.shape[0] * x.shape[1]] + list(x.shape[2:]))


class FakeKernels:
    def __init__(self):
        self.calls = []

    def indexer_fwd(self, index_q, index_k, weights, scores, lse=None, *, causal=True, ratio=1, q_offsets=None,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0):
        self.calls.append(("indexer", stream, lse is not None))
        q, k, w, off, cq, ck = (read(x) for x in (index_q, index_k, weights, q_offsets, cu_seqlens_q, cu_seqlens_k))
        thd = cq is not None
        layout = _layout(q, k, off, cq, ck)
        if thd:
            assert max_seqlen_q >= max(seg[1] for seg in layout.segments)
        s, l = ref_index.dense_scores(_rows(q, thd), _rows(k, thd), _rows(w, thd), layout,
                                      C.row_limits(layout, causal, ratio), paddle.float32, with_lse=True)
        write(scores, s.reshape(read(scores).shape))
        if lse is not None:
            write(lse, l.astype("float32").reshape(read(lse).shape))

    def topk_fwd(self, scores, out, *, lengths=None, stream=0):
        self.calls.append(("topk", stream))
        s, ln = read(scores), read(lengths)
        k = read(out).shape[-1]
        rows = int(np.prod(s.shape[:-1]))
        idx = ref_topk.topk(s.reshape([rows, s.shape[-1]]), k, None if ln is None else ln.reshape([rows]))
        write(out, idx.reshape(read(out).shape))

    def sparse_indexer_fwd(self, index_q, index_k, weights, topk_indices, scores, lse, *, topk_length=None,
                           cu_seqlens_q=None, cu_seqlens_k=None, stream=0):
        self.calls.append(("sparse_indexer", stream))
        q, k, w, idx, tl, cq, ck = (read(x) for x in (index_q, index_k, weights, topk_indices, topk_length,
                                                      cu_seqlens_q, cu_seqlens_k))
        thd = cq is not None
        layout = _layout(q, k, None, cq, ck)
        K = idx.shape[-1]
        gidx, valid = C.slot_validity(layout, idx.reshape([layout.tq, K]), None if tl is None else tl.reshape([-1]),
                                      q.place)
        s = ref_index.sparse_scores(_rows(q, thd), _rows(k, thd), _rows(w, thd), gidx, valid)
        write(scores, s.astype("float32").reshape(read(scores).shape))
        write(lse, ref_index.index_lse(s, valid).astype("float32").reshape(read(lse).shape))


@pytest.fixture
def fake(monkeypatch):
    kernels = FakeKernels()
    mod = types.SimpleNamespace(indexer_fwd=kernels.indexer_fwd, topk_fwd=kernels.topk_fwd,
                                sparse_indexer_fwd=kernels.sparse_indexer_fwd)
    monkeypatch.setattr(seam, "_MODULES", {name: mod for name in seam._NAMES})
    monkeypatch.setattr(PORT, "is_gpu", lambda t: True)
    monkeypatch.setattr(PORT, "stream_handle", lambda t: 4321)

    def poisoned(shape, dtype):
        return paddle.full(list(shape), -7 if dtype == paddle.int32 else float("nan"), dtype=dtype)
    monkeypatch.setattr(seam, "_empty", poisoned)
    return kernels


def reference(monkeypatch, fn, *args, **kw):
    """The same call on the reference path (no kernel installed)."""
    monkeypatch.setattr(seam, "_MODULES", {name: None for name in seam._NAMES})
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="reference path"):
        return fn(*args, **kw)


def bf16(rng, shape):
    return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)).astype("bfloat16")


def f32(rng, shape):
    return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))


def i32(a):
    return paddle.to_tensor(np.asarray(a, np.int32))


def same(a, b):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_seam_signatures_match_ops_modules():
    """The keyword signatures the fakes take (and the seam calls) are those the ops.dsa modules declare."""
    root = pathlib.Path(__file__).resolve().parents[1] / "ops" / "dsa"
    for rel, fn in (("indexer/fwd.py", "indexer_fwd"), ("topk/fwd.py", "topk_fwd"),
                    ("indexer/sparse.py", "sparse_indexer_fwd")):
        tree = ast.parse((root / rel).read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        pos = [a.arg for a in node.args.args]
        kw = {a.arg for a in node.args.kwonlyargs}
        params = inspect.signature(getattr(FakeKernels, fn)).parameters
        fake_pos = [p for p, v in params.items() if v.kind == v.POSITIONAL_OR_KEYWORD and p != "self"]
        fake_kw = {p for p, v in params.items() if v.kind == v.KEYWORD_ONLY}
        assert pos == fake_pos, (fn, pos, fake_pos)
        assert fake_kw == kw, (fn, fake_kw ^ kw)


@pytest.mark.parametrize("causal,ratio,offs", [(True, 1, None), (True, 4, [0, 50]), (False, 1, None)])
def test_indexer_dense(rng, fake, monkeypatch, causal, ratio, offs):
    q, k, w = bf16(rng, [2, 33, 16, 64]), bf16(rng, [2, 40, 64]), f32(rng, [2, 33, 16])
    off = None if offs is None else i32(offs)
    kw = dict(causal=causal, ratio=ratio, q_offsets=off)
    s = P.indexer_score(q, k, w, **kw)
    s2, lse2 = P.dense_indexer_score_recompute(q, k, w, **kw)
    assert [c[0] for c in fake.calls] == ["indexer", "indexer"] and fake.calls[0][1] == 4321
    assert fake.calls[0][2] is False and fake.calls[1][2] is True         # lse only for the recompute
    r = reference(monkeypatch, P.indexer_score, q, k, w, **kw)
    r2, rl2 = P.dense_indexer_score_recompute(q, k, w, **kw)
    same(s, r)
    same(s2, r2)
    same(lse2, rl2)


def test_indexer_thd(rng, fake, monkeypatch):
    cu_q, cu_k = i32([0, 5, 5, 20]), i32([0, 9, 12, 30])
    q, k, w = bf16(rng, [22, 32, 128]), bf16(rng, [31, 128]), bf16(rng, [22, 32])
    kw = dict(causal=True, ratio=2, q_offsets=i32([3, 0, 7]), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    s, lse = P.dense_indexer_score_recompute(q, k, w, **kw)
    assert list(s.shape) == [22, 18] and fake.calls == [("indexer", 4321, True)]
    r, rl = reference(monkeypatch, P.dense_indexer_score_recompute, q, k, w, **kw)
    same(s, r)
    same(lse, rl)


def test_topk(rng, fake, monkeypatch):
    s = f32(rng, [2, 7, 50])
    lengths = i32(rng.integers(-2, 60, (2, 7)))
    idx = P.indexer_topk(s, 20, lengths=lengths)
    assert fake.calls == [("topk", 4321)] and idx.dtype == paddle.int32
    same(idx, reference(monkeypatch, P.indexer_topk, s, 20, lengths=lengths))


def test_topk_beyond_kernel_k_uses_reference(rng, fake):
    from paddle_dsa.ops.dsa import supported
    s = f32(rng, [3, supported.TOPK_MAX_K + 10])
    with pytest.warns(UserWarning, match="reference path"):
        idx = P.indexer_topk(s, supported.TOPK_MAX_K + 1)
    assert fake.calls == [] and list(idx.shape) == [3, supported.TOPK_MAX_K + 1]


@pytest.mark.parametrize("thd", [False, True])
def test_sparse_indexer(rng, fake, monkeypatch, thd):
    if thd:
        cu_q, cu_k = i32([0, 4, 4, 11]), i32([0, 6, 9, 20])
        q, k, w = bf16(rng, [12, 64, 128]), bf16(rng, [21, 128]), f32(rng, [12, 64])
        idx = i32(rng.integers(-1, 12, (12, 24)))
        tl = i32(rng.integers(0, 30, (12,)))
        kw = dict(topk_length=tl, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    else:
        q, k, w = bf16(rng, [2, 9, 64, 128]), bf16(rng, [2, 30, 128]), f32(rng, [2, 9, 64])
        idx = i32(rng.integers(-1, 33, (2, 9, 24)))
        kw = {}
    s, lse = P.sparse_indexer_score_recompute(q, k, w, idx, **kw)
    assert fake.calls == [("sparse_indexer", 4321)]
    r, rl = reference(monkeypatch, P.sparse_indexer_score_recompute, q, k, w, idx, **kw)
    same(s, r)
    same(lse, rl)


def test_other_dsa_ops_stay_on_reference(rng, fake):
    """The attention-score recomputes, the backward pieces, sparse_attention and the loss have no kernel route
    yet: on a GPU place they run the reference path (with the warning) even with every kernel installed."""
    q, kv = bf16(rng, [1, 4, 64, 576]), bf16(rng, [1, 5, 576])
    lse = f32(rng, [1, 64, 4]) + 5.0
    with pytest.warns(UserWarning, match="reference path"):
        a, l1 = P.dense_attn_score_recompute(q, kv, lse)
    assert fake.calls == [] and list(a.shape) == [1, 4, 5]
