"""The Paddle side of the DSA GPU seams, on CPU: fake ops.dsa modules (tests/dsa_fakes.py) stand in for the kernels.

With PORT.is_gpu patched to True, the kernel-backed DSA ops take the kernel path (paddle_dsa/kernels/dsa.py): the
tensors are exported through the port, outputs come from ``_empty`` (NaN- / -7-poisoned here, so an unwritten
element or a buffer the seam did not hand to the kernel shows up), and the ops seam is called with its keyword
signature. The fakes compute with the reference path; the results must equal the reference path's (kernel modules
not importable) bit for bit. Also: empty problems launch nothing, THD with max_seqlen_* and
check_cu_seqlens_values off reads nothing on the host, a missing or unrouted kernel falls back with the warning.
"""
import ast
import contextlib
import inspect
import pathlib
import warnings

import numpy as np
import paddle
import pytest

import paddle_dsa as P
from paddle_dsa import config
from paddle_dsa._port import PORT
from paddle_dsa.kernels import dsa as seam
from paddle_dsa.nn.functional import _dsa_inputs
from paddle_dsa.nn.functional import dsa as P_dsa
from paddle_dsa.ops.dsa import supported

from dsa_fakes import SEAMS, STREAM, FakeKernels, in_fake, install, poisoned_empty

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch)


def reference(monkeypatch, fn, *args, **kw):
    """The same call on the reference path of a GPU place (no kernel module imports): it warns."""
    monkeypatch.setattr(seam, "_MODULES", {name: None for name in seam._NAMES})
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="cannot be imported.*reference path on the GPU"):
        return fn(*args, **kw)


def bf16(rng, shape):
    return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)).astype("bfloat16")


def f32(rng, shape, dtype="float32"):
    return paddle.to_tensor(rng.standard_normal(shape).astype(dtype))


def i32(a):
    return paddle.to_tensor(np.asarray(a, np.int32))


def same(a, b):
    a, b = a.numpy(), b.numpy()
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert not np.isnan(a.astype(np.float64)).any(), "NaN: an element the kernel did not write, or a copied buffer"
    np.testing.assert_array_equal(a, b)


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def attn_inputs(rng, rows, keys, heads=64, dqk=576, lse_dtype="float32"):
    """query, kv, softmax_lse (public layout: [B,H,Sq] for rows (B, Sq), [H,Tq] for (Tq,))."""
    lse_shape = [rows[0], heads, rows[1]] if len(rows) == 2 else [heads, rows[0]]
    return (bf16(rng, list(rows) + [heads, dqk]), bf16(rng, list(keys) + [dqk]),
            f32(rng, lse_shape, lse_dtype) + 4.0)


def test_seam_signatures_match_ops_modules():
    """The signatures the fakes take (so the ones the seams call) are those the ops.dsa modules declare."""
    checked = 0
    for which, (rel, fn) in SEAMS.items():
        assert seam._NAMES[which].replace(".", "/") + ".py" == rel
        path = ROOT / "ops" / "dsa" / rel
        if not path.exists():           # not written yet: the op falls back (test_missing_kernel_module_...)
            continue
        node = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == fn)
        params = inspect.signature(getattr(FakeKernels, fn)).parameters
        fake_pos = [p for p, v in params.items() if v.kind == v.POSITIONAL_OR_KEYWORD and p != "self"]
        fake_kw = {p for p, v in params.items() if v.kind == v.KEYWORD_ONLY}
        assert [a.arg for a in node.args.args] == fake_pos, fn
        assert {a.arg for a in node.args.kwonlyargs} == fake_kw, fn
        checked += 1
    assert checked == len(SEAMS)        # all eight exist at this commit


@pytest.mark.parametrize("causal,ratio,offs", [(True, 1, None), (True, 4, [0, 50]), (False, 1, None)])
def test_indexer_dense(rng, fake, monkeypatch, causal, ratio, offs):
    q, k, w = bf16(rng, [2, 33, 16, 64]), bf16(rng, [2, 40, 64]), f32(rng, [2, 33, 16])
    kw = dict(causal=causal, ratio=ratio, q_offsets=None if offs is None else i32(offs))
    s = P.indexer_score(q, k, w, **kw)
    s2, lse2 = P.dense_indexer_score_recompute(q, k, w, **kw)
    assert fake.calls == [("indexer", STREAM, False), ("indexer", STREAM, True)]   # lse only for the recompute
    r = reference(monkeypatch, P.indexer_score, q, k, w, **kw)
    r2, rl2 = reference(monkeypatch, P.dense_indexer_score_recompute, q, k, w, **kw)
    same(s, r)
    same(s2, r2)
    same(lse2, rl2)


@pytest.mark.parametrize("maxes", [None, (16, 21)])
def test_indexer_thd(rng, fake, monkeypatch, maxes):
    # an empty query segment, rows 20-21 past cu_seqlens_q[-1], key 30 past cu_seqlens_k[-1]
    cu_q, cu_k = i32([0, 5, 5, 20]), i32([0, 9, 12, 30])
    q, k, w = bf16(rng, [22, 32, 128]), bf16(rng, [31, 128]), bf16(rng, [22, 32])
    kw = dict(causal=True, ratio=2, q_offsets=i32([3, 0, 7]), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    if maxes:
        kw.update(max_seqlen_q=maxes[0], max_seqlen_k=maxes[1])
    s, lse = P.dense_indexer_score_recompute(q, k, w, **kw)
    s1 = P.indexer_score(q, k, w, **kw)
    assert list(s.shape) == [22, 18 if maxes is None else 21]      # width: max_seqlen_k, else the longest key run
    assert fake.calls == [("indexer", STREAM, True), ("indexer", STREAM, False)]
    r, rl = reference(monkeypatch, P.dense_indexer_score_recompute, q, k, w, **kw)
    same(s, r)
    same(lse, rl)
    same(s1, reference(monkeypatch, P.indexer_score, q, k, w, **kw))


def test_topk(rng, fake, monkeypatch):
    s = f32(rng, [2, 7, 50])
    lengths = i32(rng.integers(-2, 60, (2, 7)))
    idx = P.indexer_topk(s, 20, lengths=lengths)
    assert fake.calls == [("topk", STREAM)] and idx.dtype == paddle.int32
    same(idx, reference(monkeypatch, P.indexer_topk, s, 20, lengths=lengths))


def test_topk_unsorted(rng, fake, monkeypatch):
    """sorted=False on a GPU place: the score-ordered kernel, reordered by column on the Paddle side."""
    s = f32(rng, [2, 7, 50])
    lengths = i32(rng.integers(-2, 60, (2, 7)))
    idx = P.indexer_topk(s, 20, lengths=lengths, sorted=False)
    assert fake.calls == [("topk", STREAM)] and idx.dtype == paddle.int32
    same(idx, reference(monkeypatch, P.indexer_topk, s, 20, lengths=lengths, sorted=False))


def test_topk_beyond_kernel_k_uses_reference(rng, fake):
    s = f32(rng, [3, supported.TOPK_MAX_K + 10])
    with pytest.warns(UserWarning, match=f"k = {supported.TOPK_MAX_K + 1} > {supported.TOPK_MAX_K}.*reference path"):
        idx = P.indexer_topk(s, supported.TOPK_MAX_K + 1)
    assert fake.calls == [] and list(idx.shape) == [3, supported.TOPK_MAX_K + 1]


@pytest.mark.parametrize("thd", [False, True])
def test_sparse_indexer(rng, fake, monkeypatch, thd):
    if thd:   # an empty query segment, row 11 past cu_seqlens_q[-1]
        q, k, w = bf16(rng, [12, 64, 128]), bf16(rng, [21, 128]), f32(rng, [12, 64])
        idx = i32(rng.integers(-1, 12, (12, 24)))
        kw = dict(topk_length=i32(rng.integers(0, 30, (12,))), cu_seqlens_q=i32([0, 4, 4, 11]),
                  cu_seqlens_k=i32([0, 6, 9, 20]))
    else:
        q, k, w = bf16(rng, [2, 9, 64, 128]), bf16(rng, [2, 30, 128]), f32(rng, [2, 9, 64])
        idx = i32(rng.integers(-1, 33, (2, 9, 24)))
        kw = {}
    s, lse = P.sparse_indexer_score_recompute(q, k, w, idx, **kw)
    assert fake.calls == [("sparse_indexer", STREAM)]
    r, rl = reference(monkeypatch, P.sparse_indexer_score_recompute, q, k, w, idx, **kw)
    same(s, r)
    same(lse, rl)


@pytest.mark.parametrize("thd,lse_dtype", [(False, "float32"), (False, "float64"), (True, "float32")])
def test_dense_attn_score(rng, fake, monkeypatch, thd, lse_dtype):
    if thd:   # an empty query segment, rows past cu_seqlens_q[-1], max_seqlen_k wider than the longest key run
        q, kv, lse = attn_inputs(rng, (13,), (15,), 128, 512, lse_dtype)
        kw = dict(ratio=2, q_offsets=i32([1, 0, 4]), cu_seqlens_q=i32([0, 4, 4, 11]), cu_seqlens_k=i32([0, 5, 5, 14]),
                  max_seqlen_q=7, max_seqlen_k=10)
    else:
        q, kv, lse = attn_inputs(rng, (2, 9), (2, 12), lse_dtype=lse_dtype)
        kw = dict(ratio=3, q_offsets=i32([0, 20]), softmax_scale=0.07)
    a, l1 = P.dense_attn_score_recompute(q, kv, lse, **kw)
    assert fake.calls == [("attn_score", STREAM)] and list(a.shape) == ([13, 10] if thd else [2, 9, 12])
    r, rl = reference(monkeypatch, P.dense_attn_score_recompute, q, kv, lse, **kw)
    same(a, r)
    same(l1, rl)


@pytest.mark.parametrize("thd", [False, True])
def test_sparse_attn_score(rng, fake, monkeypatch, thd):
    if thd:
        q, kv, lse = attn_inputs(rng, (12,), (21,))
        idx = i32(rng.integers(-1, 12, (12, 16)))
        kw = dict(topk_length=i32(rng.integers(0, 20, (12,))), cu_seqlens_q=i32([0, 4, 4, 11]),
                  cu_seqlens_k=i32([0, 6, 9, 20]))
    else:
        q, kv, lse = attn_inputs(rng, (2, 5), (2, 30), 128, 512)
        idx = i32(rng.integers(-1, 33, (2, 5, 16)))
        kw = dict(topk_length=i32(rng.integers(0, 20, (2, 5))), softmax_scale=0.05)
    a, l1 = P.sparse_attn_score_recompute(q, kv, lse, idx, **kw)
    assert fake.calls == [("sparse_attn_score", STREAM)]
    r, rl = reference(monkeypatch, P.sparse_attn_score_recompute, q, kv, lse, idx, **kw)
    same(a, r)
    same(l1, rl)


def _sparse_attention_case(rng, thd, extras):
    """(query, kv, topk_indices, kwargs) of sparse_attention within the GPU table: out-of-range and -1 slots, a row
    with no valid slot. THD: an empty query segment, rows 12-13 past cu_seqlens_q[-1], key 20 past cu_seqlens_k[-1];
    BSHD: H 128, Dqk 512."""
    if thd:
        q, kv, _ = attn_inputs(rng, (14,), (21,))
        idx = rng.integers(-1, 12, (14, 16))
        idx[1] = 6                  # sequence 0 has 6 keys: all out of range
        kw = dict(cu_seqlens_q=i32([0, 4, 4, 12]), cu_seqlens_k=i32([0, 6, 9, 20]))
        rows, h = (14,), 64
    else:
        q, kv, _ = attn_inputs(rng, (2, 5), (2, 30), 128, 512)
        idx = rng.integers(-1, 33, (2, 5, 16))
        idx[1, 2] = -1
        kw = dict(softmax_scale=0.05)
        rows, h = (2, 5), 128
    idx = i32(idx)
    if extras:      # a float64 sink: the seam gets it as float32, the reference path computes in float32 too
        kw.update(topk_length=i32(rng.integers(-1, 20, rows)), attn_sink=f32(rng, [h], "float64"))
    for t in (q, kv) + ((kw["attn_sink"],) if extras else ()):
        t.stop_gradient = False
    return q, kv, idx, kw


def _sparse_attention_run(q, kv, idx, dout, dlse, upstream="out+lse", **kw):
    """Forward (out, softmax_lse) and the gradients to query, kv (and attn_sink) of the upstream gradients: "out"
    (return_softmax_lse off: dlse is None in the backward), "out+lse" (dout and dlse), "lse" (dlse only: dout is None
    in the backward)."""
    for t in (q, kv, kw.get("attn_sink")):
        if t is not None:
            t.clear_gradient()
    if upstream == "out":
        out = P.sparse_attention(q, kv, idx, **kw)
        paddle.autograd.backward([out], [dout])
        lse = None
    else:
        out, lse = P.sparse_attention(q, kv, idx, return_softmax_lse=True, **kw)
        pairs = ([out, lse], [dout, dlse]) if upstream == "out+lse" else ([lse], [dlse])
        paddle.autograd.backward(*pairs)
    grads = [t.grad.clone() for t in (q, kv, kw.get("attn_sink")) if t is not None]
    return [out] + ([] if lse is None else [lse]) + grads


def _upstream(rng, q, kw, dv=512):
    """(dout, dlse) of a sparse_attention call: bf16 [rows.., H, dv] and float32 in the public lse layout."""
    shp = list(q.shape)
    rows, h = shp[:-2], shp[-2]
    return bf16(rng, rows + [h, dv]), f32(rng, [h] + rows if "cu_seqlens_q" in kw else [rows[0], h, rows[1]])


def _same_grads(got, want):
    """Bit for bit, d_attn_sink included. d_query and d_kv: the fake runs the reference backward itself (and the
    float32 -> bfloat16 casts are the reference path's). d_attn_sink: the fake writes each row's d_sink_rows from the
    reference backward of that row alone (exactly the negated term the reference sums for that row), and the seam
    wrapper's float32 sum over the rows gives the reference's own float32 sum over the rows bit for bit on these
    problems (one row chunk, a few rows: observed, not guaranteed by Paddle; a float64 sink gets that sum, cast)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and list(g.shape) == list(w.shape), (g.dtype, w.dtype, g.shape, w.shape)
        gn, wn = g.astype("float32").numpy(), w.astype("float32").numpy()
        assert not np.isnan(gn).any(), "NaN: an element the kernel did not write, or a copied buffer"
        np.testing.assert_array_equal(gn, wn)


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "topk_length+sink"])
@pytest.mark.parametrize("upstream", ["out", "out+lse", "lse"])
def test_sparse_attention(rng, fake, monkeypatch, thd, extras, upstream):
    """Forward and backward on the kernel route (both seams routed here, as install() does): out, softmax_lse and the
    gradients to query, kv, attn_sink equal the reference path's bit for bit, with and without a gradient into
    softmax_lse (and with only that one: dout None -> zeros)."""
    q, kv, idx, kw = _sparse_attention_case(rng, thd, extras)
    dout, dlse = _upstream(rng, q, kw)
    got = _sparse_attention_run(q, kv, idx, dout, dlse, upstream, **kw)
    assert fake.calls == [("sparse_attention", STREAM, extras, extras),
                          ("sparse_attention_bwd", STREAM, extras, extras, upstream != "out")]
    assert got[0].dtype == paddle.bfloat16
    want = reference(monkeypatch, _sparse_attention_run, q, kv, idx, dout, dlse, upstream, **kw)
    assert len(got) == (1 if upstream == "out" else 2) + 2 + extras
    _same_grads(got, want)
    if upstream != "out":
        assert got[1].dtype == paddle.float32 and np.isneginf(got[1].numpy()).any()
    assert (got[-2 - extras].astype("float32").numpy() != 0).any()      # d_query
    if extras:      # d_attn_sink = -sum exp(sink - lse+) (out . dout): zero with no gradient into out
        assert got[-1].dtype == paddle.float64 and (got[-1].numpy() != 0).any() == (upstream != "lse")


@pytest.mark.parametrize("thd", [False, True])
def test_sparse_attention_deterministic_backward(rng, fake, monkeypatch, thd):
    """config.deterministic_backward reaches the backward seam with Paddle's workspace (its sort of the entry keys
    checked by the fake against numpy's lexsort: keys ascending, -1 last, ties by entry) and the byte budget of
    config.deterministic_workspace_bytes; results equal the default run's bit for bit (the fake computes both the
    same way) and the reference path's."""
    q, kv, idx, kw = _sparse_attention_case(rng, thd, True)
    dout, dlse = _upstream(rng, q, kw)
    monkeypatch.setattr(config, "deterministic_backward", True)
    monkeypatch.setattr(config, "deterministic_workspace_bytes", 12345)
    got = _sparse_attention_run(q, kv, idx, dout, dlse, "out+lse", **kw)
    assert fake.deterministic == [("sparse_attention_bwd", 12345)]
    monkeypatch.setattr(config, "deterministic_backward", False)
    _same_grads(got, _sparse_attention_run(q, kv, idx, dout, dlse, "out+lse", **kw))
    assert len(fake.deterministic) == 1
    _same_grads(got, reference(monkeypatch, _sparse_attention_run, q, kv, idx, dout, dlse, "out+lse", **kw))


@pytest.mark.parametrize("n,n_kv", [(1, 1), (37, 5), (4096, 300), (5000, 1)])
def test_deterministic_workspace_sort_keys(rng, n, n_kv):
    """seam.DeterministicWorkspace.sort_keys on CPU: every key in [-1, n_kv) with many ties; the result is numpy's
    stable sort by key (-1 as n_kv, last), as int32, and the same on a rerun."""
    keys = rng.integers(-1, n_kv, size=n).astype(np.int32)
    ws = seam.DeterministicWorkspace()
    buf = ws.alloc((n, 2), "float32")
    assert buf.dtype == paddle.float32 and list(buf.shape) == [n, 2]
    t = paddle.to_tensor(keys)
    sk, order = ws.sort_keys(t, n_kv)
    assert sk.dtype == order.dtype == paddle.int32
    k = np.where(keys < 0, n_kv, keys)
    want = np.argsort(k, kind="stable")
    np.testing.assert_array_equal(order.numpy(), want)
    np.testing.assert_array_equal(sk.numpy(), k[want])
    sk2, order2 = ws.sort_keys(t, n_kv)
    np.testing.assert_array_equal(order2.numpy(), order.numpy())


@pytest.mark.parametrize("thd", [False, True])
def test_sparse_attention_backward_unrouted_stays_on_reference(rng, monkeypatch, thd):
    """With "sparse_attention_bwd" taken out of ROUTED (the fallback while a backward kernel is off): the forward on
    the kernel seam, the backward on the reference path (kernel route: rows and the slot table rebuilt there) with a
    warning naming the unrouted backward kernel; every result equals the reference path's bit for bit."""
    kernels = install(monkeypatch, routed=False)
    monkeypatch.setattr(seam, "ROUTED", seam.ROUTED - {"sparse_attention_bwd"})
    assert "sparse_attention" in seam.ROUTED
    q, kv, idx, kw = _sparse_attention_case(rng, thd, True)
    dout, dlse = _upstream(rng, q, kw)
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="paddle_dsa.sparse_attention: the paddle_dsa.ops.dsa.sparse_attn.bwd kernel "
                                         "is not routed yet.*reference path on the GPU"):
        got = _sparse_attention_run(q, kv, idx, dout, dlse, **kw)
    assert kernels.calls == [("sparse_attention", STREAM, True, True)]
    with no_warnings():                 # once per op and reason
        _sparse_attention_run(q, kv, idx, dout, dlse, "lse", **kw)
    _same_grads(got, reference(monkeypatch, _sparse_attention_run, q, kv, idx, dout, dlse, **kw))


@pytest.mark.parametrize("bwd_routed", [True, False])
def test_sparse_attention_kernel_route_guards_its_slot_tensors(rng, monkeypatch, bwd_routed):
    """The kernel route's backward (its seam, or the reference path, which builds the slot table there) reads
    topk_indices / topk_length / cu_seqlens: an in-place change to one of them after the forward raises instead of
    giving wrong gradients."""
    install(monkeypatch, routed=bwd_routed)
    q, kv, idx, kw = _sparse_attention_case(rng, True, True)
    for name, t in (("topk_indices", idx), ("topk_length", kw["topk_length"]), ("cu_seqlens_k", kw["cu_seqlens_k"])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # the unrouted backward's fallback warning
            out = P.sparse_attention(q, kv, idx, **kw)
        t.add_(paddle.zeros_like(t))        # same values, a new inplace version
        # Paddle may re-raise an error from a PyLayer backward wrapped (OSError on 3.3)
        with pytest.raises((RuntimeError, OSError), match=f"sparse_attention: `{name}`, saved for the backward"):
            out.astype("float32").sum().backward()


def _sparse_index_case(rng, thd, with_length, w_dtype):
    """((index_q, index_k, weights), (query, kv, softmax_lse), topk_indices, kwargs) of the sparse indexer backward /
    the sparse KL loss within the GPU table: -1 and out-of-range slots, a row with no valid slot. THD: an empty query
    segment, rows 11-12 past cu_seqlens_q[-1], key 20 past cu_seqlens_k[-1], Hi 32, Di 64, H 64, Dqk 576; BSHD: Hi
    64, Di 128, H 128, Dqk 512."""
    wt = bf16 if w_dtype == "bfloat16" else f32
    if thd:
        ind = (bf16(rng, [13, 32, 64]), bf16(rng, [21, 64]), wt(rng, [13, 32]))
        att = attn_inputs(rng, (13,), (21,))
        idx = rng.integers(-1, 12, (13, 16))
        idx[1] = 6                  # sequence 0 has 6 keys: all out of range
        kw = dict(cu_seqlens_q=i32([0, 4, 4, 11]), cu_seqlens_k=i32([0, 6, 9, 20]))
        rows = (13,)
    else:
        ind = (bf16(rng, [2, 5, 64, 128]), bf16(rng, [2, 30, 128]), wt(rng, [2, 5, 64]))
        att = attn_inputs(rng, (2, 5), (2, 30), 128, 512)
        idx = rng.integers(-1, 33, (2, 5, 16))
        idx[1, 2] = -1
        kw = {}
        rows = (2, 5)
    if with_length:
        kw["topk_length"] = i32(rng.integers(-1, 20, rows))
    return ind, att, i32(idx), kw


def _sparse_stats(ind, att, idx, kw):
    """(index_score, index_lse, attn_score, attn_l1norm) of the case from the sparse recompute ops."""
    return P.sparse_indexer_score_recompute(*ind, idx, **kw) + P.sparse_attn_score_recompute(*att, idx, **kw)


def _same_index_grads(got, want, ind):
    """Bit for bit, in the inputs' dtypes: the fake runs the reference grad signal and sparse backward on the same
    float32 statistics and the same float32 grad_scale (the device product equals the reference's
    grad_loss * (loss_coeff / N)), and d_index_k / d_weights are cast from float32 as the reference path casts."""
    assert len(got) == len(want) == len(ind)
    for g, w, x in zip(got, want, ind):
        assert g.dtype == x.dtype and list(g.shape) == list(x.shape)
        same(g, w)


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("with_length", [False, True], ids=["all-slots", "topk_length"])
@pytest.mark.parametrize("w_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("grad_loss", ["tensor", "number"])
def test_sparse_indexer_backward(rng, fake, monkeypatch, thd, with_length, w_dtype, grad_loss):
    """sparse_indexer_backward on the kernel route (its seam routed, as install() does): d_index_q, d_index_k,
    d_weights equal the reference path's bit for bit, with grad_loss as a device tensor and as a number."""
    ind, att, idx, kw = _sparse_index_case(rng, thd, with_length, w_dtype)
    stats = _sparse_stats(ind, att, idx, kw)
    fake.calls.clear()
    gl = f32(rng, [1]) if grad_loss == "tensor" else 1.75
    got = P.sparse_indexer_backward(*ind, idx, *stats, gl, loss_coeff=0.3, **kw)
    assert fake.calls == [("sparse_indexer_bwd", STREAM, with_length, w_dtype == "float32")]
    want = reference(monkeypatch, P.sparse_indexer_backward, *ind, idx, *stats, gl, loss_coeff=0.3, **kw)
    _same_index_grads(got, want, ind)
    assert all((g.astype("float32").numpy() != 0).any() for g in got)


@pytest.mark.parametrize("thd", [False, True])
def test_sparse_indexer_backward_deterministic(rng, fake, monkeypatch, thd):
    """config.deterministic_backward reaches the sparse indexer backward seam with Paddle's workspace (its sort of
    the entry keys checked by the fake) and config.deterministic_workspace_bytes; gradients equal the default run's
    and the reference path's bit for bit (the fake computes them the same way)."""
    ind, att, idx, kw = _sparse_index_case(rng, thd, True, "float32")
    stats = _sparse_stats(ind, att, idx, kw)
    monkeypatch.setattr(config, "deterministic_backward", True)
    monkeypatch.setattr(config, "deterministic_workspace_bytes", 4096)
    got = P.sparse_indexer_backward(*ind, idx, *stats, 1.5, loss_coeff=0.3, **kw)
    assert fake.deterministic == [("sparse_indexer_bwd", 4096)]
    monkeypatch.setattr(config, "deterministic_backward", False)
    _same_index_grads(got, P.sparse_indexer_backward(*ind, idx, *stats, 1.5, loss_coeff=0.3, **kw), ind)
    assert len(fake.deterministic) == 1
    want = reference(monkeypatch, P.sparse_indexer_backward, *ind, idx, *stats, 1.5, loss_coeff=0.3, **kw)
    _same_index_grads(got, want, ind)


def test_sparse_indexer_backward_float64_stats_and_no_counted_row(rng, fake, monkeypatch):
    """float64 statistics reach the seam as float32 (the reference path computes in float32 too); THD with
    cu_seqlens_q[-1] = 0 (N = 0, every row past the last sequence): grad_scale 0 on the device, even for a NaN
    grad_loss (the reference's zero scale), zero gradients; both equal the reference path's."""
    ind, att, idx, kw = _sparse_index_case(rng, True, True, "float32")
    stats = tuple(t.astype("float64") for t in _sparse_stats(ind, att, idx, kw))
    fake.calls.clear()
    gl = f32(rng, [1])
    got = P.sparse_indexer_backward(*ind, idx, *stats, gl, **kw)
    assert [c[0] for c in fake.calls] == ["sparse_indexer_bwd"]
    _same_index_grads(got, reference(monkeypatch, P.sparse_indexer_backward, *ind, idx, *stats, gl, **kw), ind)
    kw0 = dict(kw, cu_seqlens_q=i32([0, 0, 0, 0]))
    nan = paddle.to_tensor([float("nan")], dtype="float32")
    kernels = install(monkeypatch)
    got = P.sparse_indexer_backward(*ind, idx, *stats, nan, **kw0)
    assert [c[0] for c in kernels.calls] == ["sparse_indexer_bwd"]
    _same_index_grads(got, reference(monkeypatch, P.sparse_indexer_backward, *ind, idx, *stats, nan, **kw0), ind)
    assert all((g.astype("float32").numpy() == 0).all() for g in got)


def test_sparse_indexer_backward_unrouted_stays_on_reference(rng, monkeypatch):
    """With "sparse_indexer_bwd" taken out of ROUTED: the reference path on the GPU, with a warning naming the
    unrouted kernel, once; its gradients equal the reference path's."""
    kernels = install(monkeypatch, routed=False)
    monkeypatch.setattr(seam, "ROUTED", seam.ROUTED - {"sparse_indexer_bwd"})
    ind, att, idx, kw = _sparse_index_case(rng, True, True, "bfloat16")
    stats = _sparse_stats(ind, att, idx, kw)
    kernels.calls.clear()
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="paddle_dsa.sparse_indexer_backward: the paddle_dsa.ops.dsa.indexer."
                                         "sparse_bwd kernel is not routed yet.*reference path on the GPU"):
        got = P.sparse_indexer_backward(*ind, idx, *stats, 0.5, **kw)
    with no_warnings():                 # once per op and reason
        P.sparse_indexer_backward(*ind, idx, *stats, 0.5, **kw)
    assert kernels.calls == []
    monkeypatch.setattr(seam, "ROUTED", frozenset(seam._NAMES))     # reference(): the "cannot be imported" fallback
    _same_index_grads(got, reference(monkeypatch, P.sparse_indexer_backward, *ind, idx, *stats, 0.5, **kw), ind)


def _kl_run(ind, att, idx, upstream=2.5, **kw):
    """The sparse-stage indexer_kl_loss and its gradients to index_q, index_k, weights for an upstream gradient."""
    for t in ind:
        t.stop_gradient = False
        t.clear_gradient()
    loss = P.indexer_kl_loss(*ind, *att, topk_indices=idx, loss_coeff=0.3, **kw)
    (loss * upstream).backward()
    return [loss] + [t.grad.clone() for t in ind]


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("with_length", [False, True], ids=["all-slots", "topk_length"])
@pytest.mark.parametrize("w_dtype", ["bfloat16", "float32"])
def test_indexer_kl_loss_sparse_kernel_route(rng, fake, monkeypatch, thd, with_length, w_dtype):
    """The sparse stage with sparse_indexer, sparse_attn_score and sparse_indexer_bwd routed: the forward takes the
    statistics from the two score seams, the backward recomputes them there and calls the backward seam; the loss
    and the gradients equal the reference path's bit for bit."""
    ind, att, idx, kw = _sparse_index_case(rng, thd, with_length, w_dtype)
    got = _kl_run(ind, att, idx, **kw)
    assert [c[0] for c in fake.calls] == ["sparse_indexer", "sparse_attn_score"] * 2 + ["sparse_indexer_bwd"]
    want = reference(monkeypatch, _kl_run, ind, att, idx, **kw)
    same(got[0], want[0])
    assert got[0].dtype == paddle.float32 and list(got[0].shape) == [] and float(got[0]) > 0
    _same_index_grads(got[1:], want[1:], ind)


def test_indexer_kl_loss_sparse_stage_unrouted_stays_on_reference(rng, monkeypatch):
    """With "sparse_indexer_bwd" taken out of ROUTED: the sparse stage runs forward and backward on the reference
    path (no seam called), with one warning naming the unrouted backward kernel; the dense stage still has no kernel
    at all."""
    kernels = install(monkeypatch, routed=False)
    monkeypatch.setattr(seam, "ROUTED", seam.ROUTED - {"sparse_indexer_bwd"})
    ind, att, idx, kw = _sparse_index_case(rng, True, True, "float32")
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="paddle_dsa.indexer_kl_loss: the paddle_dsa.ops.dsa.indexer.sparse_bwd "
                                         "kernel is not routed yet.*reference path on the GPU"):
        got = _kl_run(ind, att, idx, **kw)
    assert kernels.calls == []
    monkeypatch.setattr(seam, "ROUTED", frozenset(seam._NAMES))
    want = reference(monkeypatch, _kl_run, ind, att, idx, **kw)
    same(got[0], want[0])
    _same_index_grads(got[1:], want[1:], ind)


def _kl_dense_run(ind, att, upstream=2.5, **kw):
    """The dense-stage indexer_kl_loss and its gradients to index_q, index_k, weights for an upstream gradient."""
    for t in ind:
        t.stop_gradient = False
        t.clear_gradient()
    loss = P.indexer_kl_loss(*ind, *att, loss_coeff=0.3, **kw)
    (loss * upstream).backward()
    return [loss] + [t.grad.clone() for t in ind]


def _close(got, want):
    """The kernel route's loss and gradients against the reference path's: the same float32 math summed in other
    row chunks (not bit for bit: float32 re-association, 2e-5 of the largest magnitude; a bfloat16 gradient may
    round the other way, one bf16 ulp: 2^-7 of it); no NaN (an unwritten element)."""
    for g, w in zip(got, want):
        rtol = 2.0 ** -7 if g.dtype == paddle.bfloat16 else 2e-5
        a, b = g.astype("float32").numpy().astype(np.float64), w.astype("float32").numpy().astype(np.float64)
        assert a.shape == b.shape and np.isfinite(a).all()
        assert np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-30) + 1e-7, (np.abs(a - b).max(), np.abs(b).max())


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("mask", ["causal", "ratio2-offsets", "full"])
def test_indexer_kl_loss_dense_kernel_route(rng, fake, monkeypatch, thd, mask):
    """The dense stage on the kernel route (its three seams routed, as install() does): forward from the dense
    recompute seams (loss reduced in Paddle with the visible-key mask built on the device), backward through them and
    dense_indexer_bwd; loss and gradients equal the reference path's to float32 re-association."""
    causal, ratio, offsets = {"causal": (True, 1, False), "ratio2-offsets": (True, 2, True),
                              "full": (False, 1, False)}[mask]
    ind, att, kw = _dense_index_case(rng, thd, "float32", causal, ratio, offsets)
    fake.calls.clear()
    got = _kl_dense_run(ind, att, **kw)
    assert [c[0] for c in fake.calls] == ["indexer", "attn_score"] * 2 + ["dense_indexer_bwd"]
    want = reference(monkeypatch, _kl_dense_run, ind, att, **kw)
    _close(got, want)
    assert all((g.numpy() != 0).any() for g in got[1:])


@pytest.mark.parametrize("thd", [False, True])
def test_indexer_kl_loss_dense_deterministic(rng, fake, monkeypatch, thd):
    """The dense stage with config.deterministic_backward: dense_indexer_bwd gets Paddle's workspace (the fake checks
    its sort of the entries (row, key below the row's ratio-causal limit)); loss and gradients as the default run's."""
    ind, att, kw = _dense_index_case(rng, thd, "float32", True, 2, True)
    monkeypatch.setattr(config, "deterministic_backward", True)
    got = _kl_dense_run(ind, att, **kw)
    assert fake.deterministic == [("dense_indexer_bwd", config.deterministic_workspace_bytes)]
    monkeypatch.setattr(config, "deterministic_backward", False)
    want = _kl_dense_run(ind, att, **kw)
    for g, w in zip(got, want):
        same(g, w)


def test_indexer_kl_loss_dense_kernel_route_chunks(rng, fake, monkeypatch):
    """BSHD row chunks (DENSE_KL_ELEMS small: 2 rows a chunk, the last one short): each chunk's rows keep the whole
    problem's mask (q_offsets + r0); the result equals the one-chunk run's."""
    ind, att, kw = _dense_index_case(rng, False, "bfloat16", True, 2, True)
    whole = _kl_dense_run(ind, att, **kw)
    monkeypatch.setattr(P_dsa, "DENSE_KL_ELEMS", 2 * 2 * 30)
    fake.calls.clear()
    got = _kl_dense_run(ind, att, **kw)
    assert [c[0] for c in fake.calls].count("dense_indexer_bwd") == 3
    _close(got, whole)


def test_indexer_kl_loss_dense_stage_unrouted_stays_on_reference(rng, monkeypatch):
    """dense_indexer_bwd taken out of ROUTED: the dense stage runs the reference path with one warning naming that
    seam; no seam is called."""
    kernels = install(monkeypatch, routed=False)
    monkeypatch.setattr(seam, "ROUTED", seam.ROUTED - {"dense_indexer_bwd"})
    ind, att, kw = _dense_index_case(rng, True, "float32")
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="paddle_dsa.indexer_kl_loss: the paddle_dsa.ops.dsa.indexer.dense_bwd "
                                         "kernel is not routed yet.*reference path on the GPU"):
        _kl_dense_run(ind, att, **kw)
    assert kernels.calls == []


def _nbytes(allocs):
    size = {paddle.float32: 4, paddle.bfloat16: 2, paddle.int32: 4}
    return sum(int(np.prod(shape)) * size[dtype] for shape, dtype in allocs)


def test_indexer_kl_loss_kernel_route_buffers_match_docs(rng, monkeypatch):
    """docs/dsa.md's statement of what the sparse stage allocates on the kernel path, pinned: every buffer the seams
    write comes from _empty, and those are, in the forward, the four statistics (2 x Tq x K x 4 + 2 x Tq x 4 bytes)
    and, in the backward, the same again plus d_index_k float32 (Tk x Di x 4), d_index_q bf16 (Tq x Hi x Di x 2)
    and d_weights float32 (Tq x Hi x 4)."""
    install(monkeypatch)
    allocs = []

    def counting_empty(shape, dtype):
        allocs.append((tuple(shape), dtype))
        return poisoned_empty(shape, dtype)
    monkeypatch.setattr(seam, "_empty", counting_empty)
    ind, att, idx, kw = _sparse_index_case(rng, True, True, "float32")
    (tq, hi, di), (tk, _), kk = ind[0].shape, ind[1].shape, idx.shape[-1]
    for t in ind:
        t.stop_gradient = False
    loss = P.indexer_kl_loss(*ind, *att, topk_indices=idx, **kw)
    fwd = list(allocs)
    allocs.clear()
    loss.backward()
    stats = 2 * tq * kk * 4 + 2 * tq * 4
    assert sorted(s for s, _ in fwd) == sorted([(tq, kk), (tq,)] * 2) and _nbytes(fwd) == stats
    assert _nbytes(allocs) == stats + tk * di * 4 + tq * hi * di * 2 + tq * hi * 4
    assert ((tk, di), paddle.float32) in allocs and ((tq, hi, di), paddle.bfloat16) in allocs
    doc = (ROOT / "docs" / "dsa.md").read_text()
    for text in ("2 x Tq x K x 4 + 2 x Tq x 4 bytes", "Tk x Di x 4", "Tq x Hi x Di x 2", "Tq x Hi x 4"):
        assert text in doc, text


def test_indexer_kl_loss_dense_kernel_route_buffers_match_docs(rng, fake, monkeypatch):
    """docs/dsa.md's statement of what the dense stage allocates on the kernel route, pinned (BSHD, 3 chunks of 2 rows
    and 1): every seam buffer from _empty; forward per chunk the four statistics (2 x B x R x Sk x 4 + 2 x B x R x 4
    bytes), backward per chunk those again plus d_index_q bf16 (B x R x Hi x Di x 2), d_weights float32 (B x R x Hi x
    4) and a float32 d_index_k (B x Sk x Di x 4)."""
    allocs = []

    def counting_empty(shape, dtype):
        allocs.append((tuple(shape), dtype))
        return poisoned_empty(shape, dtype)
    monkeypatch.setattr(seam, "_empty", counting_empty)
    ind, att, kw = _dense_index_case(rng, False, "float32")
    (b, _, hi, di), sk = ind[0].shape, ind[1].shape[1]
    assert P_dsa.DENSE_KL_ELEMS == 2 ** 26                  # as docs/dsa.md states
    monkeypatch.setattr(P_dsa, "DENSE_KL_ELEMS", b * 2 * sk)
    for t in ind:
        t.stop_gradient = False
    loss = P.indexer_kl_loss(*ind, *att, **kw)
    fwd = list(allocs)
    allocs.clear()
    loss.backward()
    chunks = [2, 2, 1]
    stats = sum(2 * b * r * sk * 4 + 2 * b * r * 4 for r in chunks)
    assert sorted(s for s, _ in fwd) == sorted([(b, r, sk) for r in chunks] * 2 + [(b, r) for r in chunks] * 2)
    assert _nbytes(fwd) == stats
    grads = sum(b * r * hi * di * 2 + b * r * hi * 4 + b * sk * di * 4 for r in chunks)
    assert _nbytes(allocs) == stats + grads
    doc = (ROOT / "docs" / "dsa.md").read_text()
    for text in ("B x R x Sk <= 2^26", "2 x B x R x Sk x 4 + 2 x B x R x 4 bytes", "B x R x Hi x Di x 2",
                 "B x R x Hi x 4", "B x Sk x Di x 4"):
        assert text in doc, text


def _empty_cases(rng):
    """(op, args, kwargs, expected fills) of problems with an empty axis, within the GPU table."""
    thd = lambda cq, ck, **kw: dict(cu_seqlens_q=i32(cq), cu_seqlens_k=i32(ck), **kw)  # noqa: E731
    ind = lambda tq, tk: (bf16(rng, [tq, 16, 64]), bf16(rng, [tk, 64]), f32(rng, [tq, 16]))  # noqa: E731
    att = lambda tq, tk: attn_inputs(rng, (tq,), (tk,))  # noqa: E731
    idx = lambda rows, kk: i32(np.zeros(list(rows) + [kk]))  # noqa: E731
    stats = lambda rows, kk: (f32(rng, list(rows) + [kk]), f32(rng, rows), f32(rng, list(rows) + [kk]),  # noqa: E731
                              f32(rng, rows))
    return [
        (P.indexer_score, ind(0, 5), thd([0, 0], [0, 5]), (-np.inf,)),                 # no query row
        (P.dense_indexer_score_recompute, ind(3, 0), thd([0, 3], [0, 0]), (-np.inf, 0)),  # no key
        (P.dense_indexer_score_recompute, ind(3, 4), thd([0, 3], [0, 0]), (-np.inf, 0)),  # zero width (keys unused)
        (P.dense_indexer_score_recompute, ind(3, 0), thd([0, 3], [0, 0], max_seqlen_k=6), (-np.inf, 0)),
        (P.dense_attn_score_recompute, att(3, 0), thd([0, 2], [0, 0]), (0, 0)),
        (P.dense_attn_score_recompute, att(0, 4), thd([0, 0], [0, 4], max_seqlen_q=0, max_seqlen_k=4), (0, 0)),
        (P.indexer_topk, (f32(rng, [0, 5]), 3), {}, (-1,)),
        (P.indexer_topk, (f32(rng, [2, 3, 0]), 3), {}, (-1,)),
        (P.sparse_indexer_score_recompute, (bf16(rng, [1, 2, 16, 64]), bf16(rng, [1, 3, 64]), f32(rng, [1, 2, 16]),
                                            idx((1, 2), 0)), {}, (-np.inf, 0)),
        (P.sparse_indexer_score_recompute, ind(3, 0) + (idx((3,), 4),), thd([0, 3], [0, 0]), (-np.inf, 0)),
        (P.sparse_attn_score_recompute, attn_inputs(rng, (1, 2), (1, 3)) + (idx((1, 2), 0),), {}, (0, 0)),
        (P.sparse_attn_score_recompute, att(2, 0) + (idx((2,), 4),), thd([0, 2], [0, 0]), (0, 0)),
        (P.sparse_attention, attn_inputs(rng, (1, 2), (1, 3))[:2] + (idx((1, 2), 0),),
         dict(return_softmax_lse=True), (0, -np.inf)),                                  # no top-k slot
        (P.sparse_attention, att(2, 3)[:2] + (idx((2,), 0),), thd([0, 2], [0, 3], return_softmax_lse=True),
         (0, -np.inf)),
        (P.sparse_attention, att(2, 0)[:2] + (idx((2,), 4),), thd([0, 2], [0, 0], return_softmax_lse=True),
         (0, -np.inf)),                                                                  # no key
        # the sparse indexer backward: zero gradients in the inputs' dtypes (no row, no key, no slot)
        (P.sparse_indexer_backward, ind(0, 5) + (idx((0,), 3),) + stats((0,), 3) + (1.0,), thd([0, 0], [0, 5]),
         (0, 0, 0)),
        (P.sparse_indexer_backward, ind(3, 0) + (idx((3,), 4),) + stats((3,), 4) + (f32(rng, [1]),),
         thd([0, 3], [0, 0]), (0, 0, 0)),
        (P.sparse_indexer_backward, (bf16(rng, [1, 2, 16, 64]), bf16(rng, [1, 3, 64]), bf16(rng, [1, 2, 16]),
                                     idx((1, 2), 0)) + stats((1, 2), 0) + (1.0,), {}, (0, 0, 0)),
    ]


def test_empty_problems_never_reach_a_kernel(rng, fake, monkeypatch):
    """An empty axis gets the documented result from Paddle on a GPU place: no launch, no warning, and the values
    of the CPU reference path."""
    for fn, args, kw, fills in _empty_cases(rng):
        with no_warnings():
            got = fn(*args, **kw)
        got = got if isinstance(got, tuple) else (got,)
        assert fake.calls == [], fn.__name__
        for g, fill in zip(got, fills):
            assert (g.numpy() == fill).all(), (fn.__name__, g.numpy())
        monkeypatch.setattr(PORT, "is_gpu", lambda t: False)
        want = fn(*args, **kw)
        monkeypatch.setattr(PORT, "is_gpu", lambda t: True)
        for g, r in zip(got, want if isinstance(want, tuple) else (want,)):
            same(g, r)


def test_empty_sparse_kl_loss_launches_nothing(rng, fake, monkeypatch):
    """The sparse KL loss with no slot (K = 0), no key or no query row (THD) on a GPU place, and on CPU: loss 0 and
    zero gradients built in Paddle (the reference path's values; its arithmetic on zero-size tensors failed on Paddle
    2.6 and 3.0); no seam is called and no warning is given."""
    cases = [((bf16(rng, [1, 2, 16, 64]), bf16(rng, [1, 3, 64]), f32(rng, [1, 2, 16])), attn_inputs(rng, (1, 2), (1, 3)),
              i32(np.zeros([1, 2, 0])), {}),
             ((bf16(rng, [3, 16, 64]), bf16(rng, [0, 64]), f32(rng, [3, 16])), attn_inputs(rng, (3,), (0,)),
              i32(np.zeros([3, 4])), dict(cu_seqlens_q=i32([0, 3]), cu_seqlens_k=i32([0, 0]))),
             ((bf16(rng, [0, 16, 64]), bf16(rng, [4, 64]), f32(rng, [0, 16])), attn_inputs(rng, (0,), (4,)),
              i32(np.zeros([0, 4])), dict(cu_seqlens_q=i32([0, 0]), cu_seqlens_k=i32([0, 4])))]
    for gpu_place in (True, False):
        monkeypatch.setattr(PORT, "is_gpu", lambda t: gpu_place)
        for ind, att, idx, kw in cases:
            for t in ind:
                t.stop_gradient = False
            with no_warnings():
                loss = P.indexer_kl_loss(*ind, *att, topk_indices=idx, **kw)
                loss.backward()
            assert loss.dtype == paddle.float32 and list(loss.shape) == [] and float(loss) == 0
            for t in ind:   # Paddle 2.6 leaves the gradient of a zero-size input unset
                assert (t.grad is None and 0 in t.shape) or (t.grad.astype("float32").numpy() == 0).all()
                assert t.grad is None or (t.grad.dtype == t.dtype and t.grad.shape == t.shape)
                t.clear_gradient()
    assert fake.calls == []


def _guarded(method):
    """A Paddle tensor read (numpy, item, bool, ...) that raises unless a fake seam (standing for a kernel) makes it."""
    def read(*args, **kw):
        if not in_fake():
            raise AssertionError(f"a host read on the kernel path (Tensor.{method.__name__})")
        return method(*args, **kw)
    return read


def test_thd_kernel_path_reads_nothing_on_the_host(rng, fake, monkeypatch):
    """max_seqlen_q / max_seqlen_k given and check_cu_seqlens_values off: no host read of cu_seqlens (nor of
    q_offsets, top-k indices or lengths) on the kernel path, so the call is CUDA-graph capturable; the results equal
    the reference path's. sparse_attention: its forward and, with its seam routed (as here), its backward (gradients
    into out and softmax_lse; the unrouted backward's reference path reads cu_seqlens). sparse_indexer_backward
    (grad_loss a tensor or a number: grad_scale and N computed on the device), dense_indexer_backward (THD width
    from the scores, q_offsets; BSHD with a number), indexer_kl_loss's sparse stage and its BSHD dense stage, forward
    and backward, with their seams routed (as here). Besides the package's host-read helpers, every Paddle
    tensor read (numpy, item, tolist, bool, float, int, index) raises outside the fake seams."""
    cu_q, cu_k, off = i32([0, 3, 3, 9]), i32([0, 7, 10, 16]), i32([2, 0, 5])
    iq, ik, w = bf16(rng, [11, 32, 64]), bf16(rng, [17, 64]), f32(rng, [11, 32])
    q, kv, lse = attn_inputs(rng, (11,), (17,))
    idx, tl = i32(rng.integers(-1, 9, (11, 8))), i32(rng.integers(0, 9, (11,)))
    biq, bik, bw = bf16(rng, [2, 5, 16, 64]), bf16(rng, [2, 6, 64]), f32(rng, [2, 5, 16])
    sink = f32(rng, [64])
    bq, bkv, blse = attn_inputs(rng, (2, 3), (2, 7), 128, 512)
    bidx = i32(rng.integers(-1, 9, (2, 3, 8)))
    bind = (bf16(rng, [2, 3, 64, 128]), bf16(rng, [2, 7, 128]), bf16(rng, [2, 3, 64]))
    thd = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    mx = dict(thd, max_seqlen_q=6, max_seqlen_k=8)
    stats = _sparse_stats((iq, ik, w), (q, kv, lse), idx, dict(thd, topk_length=tl))
    dstats = (P.dense_indexer_score_recompute(iq, ik, w, **mx, q_offsets=off)
              + P.dense_attn_score_recompute(q, kv, lse, **mx, q_offsets=off))
    ba = attn_inputs(rng, (2, 5), (2, 6))
    bdstats = P.dense_indexer_score_recompute(biq, bik, bw, ratio=2) + P.dense_attn_score_recompute(*ba, ratio=2)
    fake.calls.clear()
    for t in (q, kv, sink, bq, bkv):
        t.stop_gradient = False
    up, bup = _upstream(rng, q, thd), _upstream(rng, bq, {})
    calls = [(P.indexer_score, (iq, ik, w), dict(mx, ratio=2, q_offsets=off)),
             (P.dense_indexer_score_recompute, (iq, ik, w), dict(mx, causal=False)),
             (P.dense_attn_score_recompute, (q, kv, lse), dict(mx, q_offsets=off)),
             (P.sparse_indexer_score_recompute, (iq, ik, w, idx), dict(thd, topk_length=tl)),
             (P.sparse_attn_score_recompute, (q, kv, lse, idx), dict(thd, topk_length=tl)),
             (P.indexer_score, (biq, bik, bw), dict(ratio=3, q_offsets=i32([1, 4]))),
             (_sparse_attention_run, (q, kv, idx) + up, dict(thd, topk_length=tl, attn_sink=sink)),
             (_sparse_attention_run, (q, kv, idx) + up + ("out",), thd),
             (_sparse_attention_run, (bq, bkv, bidx) + bup,
              dict(topk_length=i32(rng.integers(0, 9, (2, 3))), v_head_dim=512)),
             (P.sparse_indexer_backward, (iq, ik, w, idx) + stats + (f32(rng, [1]),),
              dict(thd, topk_length=tl, loss_coeff=0.5)),
             (P.sparse_indexer_backward, (iq, ik, w, idx) + stats + (2.0,), thd),
             (_kl_run, ((iq, ik, w), (q, kv, lse), idx), dict(thd, topk_length=tl)),
             (_kl_run, (bind, (bq, bkv, blse), bidx), {}),
             (P.dense_indexer_backward, (iq, ik, w) + dstats + (f32(rng, [1]),), dict(thd, q_offsets=off)),
             (P.dense_indexer_backward, (biq, bik, bw) + bdstats + (1.5,), dict(ratio=2, loss_coeff=0.5)),
             (_kl_dense_run, (bind, (bq, bkv, blse)), dict(ratio=2, q_offsets=i32([1, 4])))]

    def host_read(*_):
        raise AssertionError("a host read on the kernel path")
    reads = {n: getattr(paddle.Tensor, n) for n in ("numpy", "item", "tolist", "__bool__", "__float__", "__int__",
                                                    "__index__", "__array__")}
    saved = PORT.to_numpy, _dsa_inputs.host_ints
    monkeypatch.setattr(config, "check_cu_seqlens_values", False)
    monkeypatch.setattr(PORT, "to_numpy", host_read)
    monkeypatch.setattr(_dsa_inputs, "host_ints", host_read)
    try:
        for name in reads:
            setattr(paddle.Tensor, name, _guarded(reads[name]))
        with no_warnings():
            got = [fn(*a, **kw) for fn, a, kw in calls]
    finally:
        for name, method in reads.items():
            setattr(paddle.Tensor, name, method)
    assert [c[0] for c in fake.calls] == (["indexer", "indexer", "attn_score", "sparse_indexer", "sparse_attn_score",
                                           "indexer"] + ["sparse_attention", "sparse_attention_bwd"] * 3
                                          + ["sparse_indexer_bwd"] * 2
                                          + (["sparse_indexer", "sparse_attn_score"] * 2 + ["sparse_indexer_bwd"]) * 2
                                          + ["dense_indexer_bwd"] * 2
                                          + ["indexer", "attn_score"] * 2 + ["dense_indexer_bwd"])
    assert list(got[0].shape) == [11, 8] and list(got[2][0].shape) == [11, 8]      # width: max_seqlen_k
    monkeypatch.setattr(PORT, "to_numpy", saved[0])
    monkeypatch.setattr(_dsa_inputs, "host_ints", saved[1])
    for g, (fn, a, kw) in zip(got, calls):
        want = reference(monkeypatch, fn, *a, **kw)
        if fn is _sparse_attention_run:
            _same_grads(g, want)
            continue
        if fn is _kl_dense_run:         # the loss summed in other row chunks: float32 re-association
            _close(g, want)
            continue
        seqs = (tuple, list)
        for x, y in zip(g if isinstance(g, seqs) else (g,), want if isinstance(want, seqs) else (want,)):
            same(x, y)


def test_max_seqlen_validation(rng, fake, monkeypatch):
    iq, ik, w = bf16(rng, [9, 16, 64]), bf16(rng, [10, 64]), f32(rng, [9, 16])
    thd = dict(cu_seqlens_q=i32([0, 3, 9]), cu_seqlens_k=i32([0, 7, 10]))
    f = P.dense_indexer_score_recompute
    with pytest.raises(ValueError, match="max_seqlen_k` = 5 is smaller than the longest segment of `cu_seqlens_k"):
        f(iq, ik, w, max_seqlen_k=5, **thd)                     # values checked (config default)
    with pytest.raises(ValueError, match="max_seqlen_q` = 4 is smaller"):
        f(iq, ik, w, max_seqlen_q=4, **thd)
    with pytest.raises(TypeError, match="max_seqlen_k` must be an int"):
        P.indexer_score(iq, ik, w, max_seqlen_k=7.0, **thd)
    with pytest.raises(ValueError, match="max_seqlen_q` must be >= 0"):
        P.indexer_score(iq, ik, w, max_seqlen_q=-1, **thd)
    with pytest.raises(ValueError, match="max_seqlen_q` / `max_seqlen_k` describe THD inputs"):
        P.dense_attn_score_recompute(*attn_inputs(rng, (1, 2), (1, 3)), max_seqlen_k=3)
    assert fake.calls == []
    # check_cu_seqlens_values off: the reference path still reads (and so checks) the values it needs
    monkeypatch.setattr(config, "check_cu_seqlens_values", False)
    monkeypatch.setattr(seam, "_MODULES", {name: None for name in seam._NAMES})
    with pytest.raises(ValueError, match="max_seqlen_k` = 5 is smaller"), pytest.warns(UserWarning):
        f(iq, ik, w, max_seqlen_q=6, max_seqlen_k=5, **thd)


def test_dense_indexer_backward_takes_wider_thd_scores(rng):
    """Scores from recomputes given max_seqlen_k (wider than the longest key run) feed the backward as they are."""
    cu = dict(cu_seqlens_q=i32([0, 4, 9]), cu_seqlens_k=i32([0, 6, 9]))
    iq, ik, w = f32(rng, [9, 4, 8]), f32(rng, [9, 8]), f32(rng, [9, 4])
    q, kv = f32(rng, [9, 2, 8]), f32(rng, [9, 8])
    lse = f32(rng, [2, 9]) + 3.0
    grads = []
    for extra in ({}, dict(max_seqlen_q=5, max_seqlen_k=11)):
        s, ilse = P.dense_indexer_score_recompute(iq, ik, w, **cu, **extra)
        a, l1 = P.dense_attn_score_recompute(q, kv, lse, **cu, **extra)
        assert s.shape[1] == a.shape[1] == extra.get("max_seqlen_k", 6)
        grads.append(P.dense_indexer_backward(iq, ik, w, s, ilse, a, l1, 1.0, **cu))
    for g0, g1 in zip(*grads):
        same(g1, g0)


def _dense_index_case(rng, thd, w_dtype, causal=True, ratio=1, offsets=False):
    """((index_q, index_k, weights), (query, kv, softmax_lse), kwargs) of the dense indexer backward within the GPU
    table. THD: an empty query segment, rows past cu_seqlens_q[-1], keys past cu_seqlens_k[-1], Hi 32, Di 64; BSHD:
    Hi 64, Di 128."""
    wt = bf16 if w_dtype == "bfloat16" else f32
    if thd:
        ind = (bf16(rng, [13, 32, 64]), bf16(rng, [21, 64]), wt(rng, [13, 32]))
        att = attn_inputs(rng, (13,), (21,))
        kw = dict(cu_seqlens_q=i32([0, 4, 4, 11]), cu_seqlens_k=i32([0, 6, 9, 20]))
        nb = 3
    else:
        ind = (bf16(rng, [2, 5, 64, 128]), bf16(rng, [2, 30, 128]), wt(rng, [2, 5, 64]))
        att = attn_inputs(rng, (2, 5), (2, 30), 128, 512)
        kw, nb = {}, 2
    kw.update(causal=causal, ratio=ratio)
    if offsets:
        kw["q_offsets"] = i32(rng.integers(0, 8, nb))
    return ind, att, kw


@pytest.mark.parametrize("thd", [False, True])
@pytest.mark.parametrize("w_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("mask", ["causal", "ratio2-offsets", "full"])
def test_dense_indexer_backward(rng, fake, monkeypatch, thd, w_dtype, mask):
    """dense_indexer_backward on the kernel route (its seam routed, as install() does): the statistics from the dense
    recomputes (THD: max_seqlen_k wider than the longest key sequence), d_index_q, d_index_k, d_weights equal the
    reference path's bit for bit; the seam gets causal / ratio / q_offsets as given."""
    causal, ratio, offsets = {"causal": (True, 1, False), "ratio2-offsets": (True, 2, True),
                              "full": (False, 1, False)}[mask]
    ind, att, kw = _dense_index_case(rng, thd, w_dtype, causal, ratio, offsets)
    wide = dict(max_seqlen_q=8, max_seqlen_k=12) if thd else {}
    stats = (P.dense_indexer_score_recompute(*ind, **kw, **wide)
             + P.dense_attn_score_recompute(*att, **kw, **wide))
    fake.calls.clear()
    gl = f32(rng, [1])
    got = P.dense_indexer_backward(*ind, *stats, gl, loss_coeff=0.7, **kw)
    assert fake.calls == [("dense_indexer_bwd", STREAM, w_dtype == "float32")]
    want = reference(monkeypatch, P.dense_indexer_backward, *ind, *stats, gl, loss_coeff=0.7, **kw)
    _same_index_grads(got, want, ind)
    assert all((g.astype("float32").numpy() != 0).any() for g in got)


def test_dense_indexer_backward_kernel_route_checks(rng, fake, monkeypatch):
    """THD scores narrower than the longest key sequence: ValueError before any launch (config check on); an empty
    problem (no query row): zero gradients, no launch; unrouted (as shipped until its H200 run): the reference path
    with a one-time warning naming the seam."""
    ind, att, kw = _dense_index_case(rng, True, "float32")
    s, ilse = P.dense_indexer_score_recompute(*ind, **kw)
    a, l1 = P.dense_attn_score_recompute(*att, **kw)
    fake.calls.clear()
    with pytest.raises(ValueError, match="index_score` has 10 columns, fewer than the longest key sequence"):
        P.dense_indexer_backward(*ind, s[:, :10], ilse, a[:, :10], l1, 1.0, **kw)
    assert fake.calls == []
    q0, w0 = ind[0][:0], ind[2][:0]
    kw0 = dict(kw, cu_seqlens_q=i32([0, 0, 0, 0]))
    got = P.dense_indexer_backward(q0, ind[1], w0, s[:0], ilse[:0], a[:0], l1[:0], 1.0, **kw0)
    assert fake.calls == [] and [list(g.shape) for g in got] == [[0, 32, 64], [21, 64], [0, 32]]
    assert (got[1].astype("float32").numpy() == 0).all()
    monkeypatch.setattr(seam, "ROUTED", seam.ROUTED - {"dense_indexer_bwd"})
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="dense_indexer_backward: the paddle_dsa.ops.dsa.indexer.dense_bwd kernel is "
                                         "not routed yet.*reference path on the GPU"):
        P.dense_indexer_backward(*ind, s, ilse, a, l1, 1.0, **kw)
    assert fake.calls == []


def test_missing_kernel_module_falls_back_with_warning(rng, fake, monkeypatch):
    """A seam module that does not import (not written yet, or no DSL): the reference path, one warning naming it."""
    monkeypatch.setitem(seam._NAMES, "indexer", "indexer.not_written_yet")
    monkeypatch.setattr(seam, "_MODULES", {k: v for k, v in seam._MODULES.items() if k != "indexer"})
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    q, k, w = bf16(rng, [1, 6, 16, 64]), bf16(rng, [1, 7, 64]), f32(rng, [1, 6, 16])
    with pytest.warns(UserWarning, match="paddle_dsa.indexer_score: the paddle_dsa.ops.dsa.indexer.not_written_yet "
                                         "kernel cannot be imported.*reference path on the GPU"):
        s = P.indexer_score(q, k, w)
    assert seam._MODULES["indexer"] is None and not seam.available("indexer") and seam.available("topk")
    with no_warnings():                 # once per op and reason
        same(P.indexer_score(q, k, w), s)
    assert fake.calls == []
    monkeypatch.setattr(PORT, "is_gpu", lambda t: False)
    same(s, P.indexer_score(q, k, w))


def test_unrouted_and_kernelless_ops_stay_on_reference(rng, monkeypatch):
    """A seam left out of kernels/dsa.py ROUTED (here sparse_attention's and the attention-score recomputes', taken
    out) and the ops with no kernel run the reference path with a warning saying why, even with every module present;
    as shipped every seam is routed (the backward seams' fallbacks: test_indexer_kl_loss_dense_stage_unrouted_stays_on_
    reference, test_sparse_attention_backward_unrouted_stays_on_
    reference, test_sparse_indexer_backward_unrouted_stays_on_reference, test_indexer_kl_loss_sparse_stage_unrouted_
    stays_on_reference). An unrouted sparse_attention gives the CPU reference path's results, and its backward stays on the
    reference path even with the backward seam routed (the backward seam serves only a kernel-route forward).
    indexer_kl_loss (either stage) names the first of its three seams that is not routed."""
    assert seam.ROUTED == set(seam._NAMES)
    kernels = install(monkeypatch, routed=False)
    monkeypatch.setattr(seam, "ROUTED", frozenset(seam._NAMES) - {"sparse_attention"})
    q, kv, lse = attn_inputs(rng, (1, 4), (1, 5))
    idx = i32(rng.integers(-1, 5, (1, 4, 3)))
    sink = f32(rng, [64])
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    q.stop_gradient = False
    with pytest.warns(UserWarning, match="sparse_attention: the paddle_dsa.ops.dsa.sparse_attn.fwd kernel is not "
                                         "routed yet.*reference path on the GPU"):
        out, slse = P.sparse_attention(q, kv, idx, attn_sink=sink, return_softmax_lse=True)
    with no_warnings():
        (out.astype("float32").sum() + slse.sum()).backward()
    assert kernels.calls == [] and q.grad is not None
    q.stop_gradient = True
    monkeypatch.setattr(PORT, "is_gpu", lambda t: False)
    want = P.sparse_attention(q, kv, idx, attn_sink=sink, return_softmax_lse=True)
    monkeypatch.setattr(PORT, "is_gpu", lambda t: True)
    same(out, want[0])
    np.testing.assert_array_equal(slse.numpy(), want[1].numpy())     # -inf for the rows with no valid slot
    monkeypatch.setattr(seam, "ROUTED", frozenset({"indexer", "topk", "sparse_indexer"}))
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    with pytest.warns(UserWarning, match="ops.dsa.attn_score.dense kernel is not routed yet.*reference path"):
        a, _ = P.dense_attn_score_recompute(q, kv, lse)
    with pytest.warns(UserWarning, match="ops.dsa.attn_score.sparse kernel is not routed yet"):
        P.sparse_attn_score_recompute(q, kv, lse, idx)
    iq, ik, w = bf16(rng, [1, 4, 16, 64]), bf16(rng, [1, 5, 64]), f32(rng, [1, 4, 16])
    with pytest.warns(UserWarning, match="indexer_kl_loss: the paddle_dsa.ops.dsa.attn_score.sparse kernel is not "
                                         "routed yet.*reference path"):
        P.indexer_kl_loss(iq, ik, w, q, kv, lse, topk_indices=idx)
    with pytest.warns(UserWarning, match="indexer_kl_loss: the paddle_dsa.ops.dsa.attn_score.dense kernel is not "
                                         "routed yet"):
        P.indexer_kl_loss(iq, ik, w, q, kv, lse)        # the dense stage: its first unrouted seam
    assert kernels.calls == [] and list(a.shape) == [1, 4, 5]
