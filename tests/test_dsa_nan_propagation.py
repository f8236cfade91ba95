"""NaN propagation in the DSA ops (docs/dsa.md, "NaN"): a NaN in an input reaches every output it influences, the
loss and the gradients included, and nothing else (every other element equals the clean run's bit for bit).
Each op runs once on clean inputs and once with one NaN planted; the expected NaN pattern is the op's dependency
structure (causal rows / key columns / top-k slots). Parametrised by place: the reference path on CPU now, the
kernels where a CUDA Paddle is present (same tests).
"""
import numpy as np
import paddle
import pytest

import paddle_dsa as P

NAN = float("nan")
PLACES = ["cpu"] + (["gpu"] if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else [])
B, S, HI, DI, H, DQK = 1, 7, 16, 64, 64, 576      # shapes in ops/dsa/supported.py, so the GPU runs them too
K = 4


@pytest.fixture(params=PLACES)
def place(request):
    paddle.set_device(request.param)
    yield request.param
    paddle.set_device("cpu")


def tensor(a, dtype, grad=False):
    x = paddle.to_tensor(np.asarray(a, np.float32)).astype(dtype)
    x.stop_gradient = not grad
    return x


def inputs(rng):
    """bf16 indexer and attention inputs (the GPU dtypes), float32 weights / lse, int32 top-k slots."""
    iq = rng.standard_normal((B, S, HI, DI)).astype(np.float32)
    ik = rng.standard_normal((B, S, DI)).astype(np.float32)
    w = rng.standard_normal((B, S, HI)).astype(np.float32) / 4
    q = rng.standard_normal((B, S, H, DQK)).astype(np.float32) / 2
    kv = rng.standard_normal((B, S, DQK)).astype(np.float32) / 2
    lse = (rng.standard_normal((B, H, S)) + 8.0).astype(np.float32)
    idx = np.stack([rng.permutation(S)[:K] for _ in range(S)]).astype(np.int32)[None]
    idx[0, :, 0] = np.minimum(np.arange(S), S - 1)        # slot 0 of row t: key t
    return dict(iq=iq, ik=ik, w=w, q=q, kv=kv, lse=lse, idx=idx)


def np_of(x):
    return x.astype("float32").numpy()


def same_elsewhere(got, clean, nan_mask):
    """NaN exactly at nan_mask; everywhere else bitwise the clean value."""
    got, clean = np.asarray(got), np.asarray(clean)
    assert np.array_equal(np.isnan(got), nan_mask), f"NaN at {np.argwhere(np.isnan(got) != nan_mask)[:5].tolist()}"
    keep = ~nan_mask
    assert np.array_equal(got[keep], clean[keep])


def visible():
    """[S, S] causal visibility (ratio 1, no offsets)."""
    return np.tril(np.ones((S, S), bool))


# ---------------------------------------------------------------------------------------------------- indexer
def run_indexer(a, op):
    args = (tensor(a["iq"], "bfloat16"), tensor(a["ik"], "bfloat16"), tensor(a["w"], "float32"))
    if op == "score":
        return (np_of(P.indexer_score(*args)),)
    return tuple(np_of(x) for x in P.dense_indexer_score_recompute(*args))


@pytest.mark.parametrize("op", ["score", "recompute"])
@pytest.mark.parametrize("where", ["index_q", "index_k", "weights"])
def test_dense_indexer(rng, place, op, where):
    a = inputs(rng)
    clean = run_indexer(a, op)
    t, j = 4, 2
    if where == "index_q":
        a["iq"][0, t, 3, 5] = NAN
    elif where == "index_k":
        a["ik"][0, j, 7] = NAN
    else:
        a["w"][0, t, 9] = NAN
    got = run_indexer(a, op)
    vis = visible()
    m = np.zeros((S, S), bool)
    if where == "index_k":
        m[:, j] = vis[:, j]
    else:
        m[t] = vis[t]
    same_elsewhere(got[0][0], clean[0][0], m)
    if op == "recompute":          # the row lse of every row holding a NaN score
        same_elsewhere(got[1][0], clean[1][0], m.any(axis=1))


def run_sparse_indexer(a):
    s, lse = P.sparse_indexer_score_recompute(tensor(a["iq"], "bfloat16"), tensor(a["ik"], "bfloat16"),
                                              tensor(a["w"], "float32"), paddle.to_tensor(a["idx"]))
    return np_of(s), np_of(lse)


def test_sparse_indexer_recompute(rng, place):
    a = inputs(rng)
    clean = run_sparse_indexer(a)
    j = 3
    a["ik"][0, j, 0] = NAN
    s, lse = run_sparse_indexer(a)
    m = a["idx"][0] == j                                  # exactly the slots that gather key j
    same_elsewhere(s[0], clean[0][0], m)
    same_elsewhere(lse[0], clean[1][0], m.any(axis=1))


def test_topk_never_selects_nan(rng, place):
    s = rng.standard_normal((2, 40)).astype(np.float32)
    s[0, 7] = NAN
    s[1, :] = NAN
    got = P.indexer_topk(paddle.to_tensor(s), 5).numpy()
    s0 = s[0].copy()
    s0[7] = -np.inf
    assert got[0].tolist() == np.argsort(-s0, kind="stable")[:5].tolist()
    assert (got[1] == -1).all()


# ---------------------------------------------------------------------------------------------------- attention scores
def run_attn(a, sparse):
    args = (tensor(a["q"], "bfloat16"), tensor(a["kv"], "bfloat16"), tensor(a["lse"], "float32"))
    if sparse:
        out = P.sparse_attn_score_recompute(*args, paddle.to_tensor(a["idx"]))
    else:
        out = P.dense_attn_score_recompute(*args)
    return tuple(np_of(x) for x in out)


@pytest.mark.parametrize("where", ["query", "kv", "softmax_lse"])
def test_dense_attn_score_recompute(rng, place, where):
    a = inputs(rng)
    clean = run_attn(a, False)
    t, j = 5, 1
    if where == "query":
        a["q"][0, t, 2, 100] = NAN
    elif where == "kv":
        a["kv"][0, j, 300] = NAN
    else:
        a["lse"][0, 7, t] = NAN
    got = run_attn(a, False)
    vis = visible()
    m = np.zeros((S, S), bool)
    if where == "kv":
        m[:, j] = vis[:, j]
    else:
        m[t] = vis[t]
    same_elsewhere(got[0][0], clean[0][0], m)
    same_elsewhere(got[1][0], clean[1][0], m.any(axis=1))


def test_sparse_attn_score_recompute(rng, place):
    a = inputs(rng)
    clean = run_attn(a, True)
    j = 2
    a["kv"][0, j, 10] = NAN
    got = run_attn(a, True)
    m = a["idx"][0] == j
    same_elsewhere(got[0][0], clean[0][0], m)
    same_elsewhere(got[1][0], clean[1][0], m.any(axis=1))


# ---------------------------------------------------------------------------------------------------- sparse attention
def test_sparse_attention(rng, place):
    a = inputs(rng)

    def run(a):
        q = tensor(a["q"], "bfloat16", grad=True)
        kv = tensor(a["kv"], "bfloat16", grad=True)
        out, lse = P.sparse_attention(q, kv, paddle.to_tensor(a["idx"]), v_head_dim=512, return_softmax_lse=True)
        out.astype("float32").sum().backward()
        return np_of(out), np_of(lse), np_of(q.grad), np_of(kv.grad)

    clean = run(a)
    j = 4
    a["kv"][0, j, 600 - 100] = NAN                        # a key dim (< Dqk): every row selecting key j
    got = run(a)
    rows = (a["idx"][0] == j).any(axis=1)
    same_elsewhere(got[0][0], clean[0][0], np.broadcast_to(rows[:, None, None], got[0][0].shape))
    same_elsewhere(got[1][0], clean[1][0], np.broadcast_to(rows[None, :], got[1][0].shape))
    same_elsewhere(got[2][0], clean[2][0], np.broadcast_to(rows[:, None, None], got[2][0].shape))
    assert np.isnan(got[3][0, j]).all()                   # its own gradient row


# ---------------------------------------------------------------------------------------------------- the KL loss
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("where", ["index_q", "index_k", "weights", "query", "kv", "softmax_lse"])
def test_indexer_kl_loss_is_nan(rng, place, sparse, where):
    """One NaN anywhere in the loss's inputs: the loss is NaN (so a 'skip the step on a non-finite loss' guard
    fires), and the gradients of the index side are NaN in the rows the NaN reaches."""
    a = inputs(rng)
    t, j = 5, 3
    if where == "index_q":
        a["iq"][0, t, 0, 0] = NAN
    elif where == "index_k":
        a["ik"][0, j, 0] = NAN
    elif where == "weights":
        a["w"][0, t, 0] = NAN
    elif where == "query":
        a["q"][0, t, 0, 0] = NAN
    elif where == "kv":
        a["kv"][0, j, 0] = NAN
    else:
        a["lse"][0, 0, t] = NAN
    iq, ik, w = (tensor(a["iq"], "bfloat16", True), tensor(a["ik"], "bfloat16", True),
                 tensor(a["w"], "float32", True))
    kw = {"topk_indices": paddle.to_tensor(a["idx"])} if sparse else {}
    loss = P.indexer_kl_loss(iq, ik, w, tensor(a["q"], "bfloat16"), tensor(a["kv"], "bfloat16"),
                             tensor(a["lse"], "float32"), **kw)
    assert np.isnan(float(loss)), f"loss {float(loss)} with a NaN in {where}"
    loss.backward()
    row = j if where in ("index_k", "kv") else t
    if where in ("index_k", "kv"):   # the rows that see key j (dense: causal; sparse: the slots)
        rows = (a["idx"][0] == j).any(axis=1) if sparse else visible()[:, j]
    else:
        rows = np.arange(S) == row
    assert np.isnan(np_of(iq.grad)[0][rows]).any(axis=(1, 2)).all()
    if where not in ("index_k", "kv"):
        # a NaN confined to one row stays in it; a NaN key row may also reach, through 0 * NaN in d_index_q = dA @ K,
        # rows that do not see it (docs/dsa.md: gradients may over-propagate, never under-propagate)
        assert not np.isnan(np_of(iq.grad)[0][~rows]).any()


@pytest.mark.parametrize("sparse", [False, True])
def test_indexer_backward_pieces(rng, place, sparse):
    """dense/sparse_indexer_backward from their recompute pieces: a NaN in index_q row t gives NaN gradients in
    row t (d_index_q, d_weights) and leaves the other rows' d_index_q and d_weights clean."""
    a = inputs(rng)
    t = 5

    def run(a):
        iq, ik, w = tensor(a["iq"], "bfloat16"), tensor(a["ik"], "bfloat16"), tensor(a["w"], "float32")
        q, kv, lse = tensor(a["q"], "bfloat16"), tensor(a["kv"], "bfloat16"), tensor(a["lse"], "float32")
        if sparse:
            idx = paddle.to_tensor(a["idx"])
            s, sl = P.sparse_indexer_score_recompute(iq, ik, w, idx)
            at, l1 = P.sparse_attn_score_recompute(q, kv, lse, idx)
            g = P.sparse_indexer_backward(iq, ik, w, idx, s, sl, at, l1, 1.0)
        else:
            s, sl = P.dense_indexer_score_recompute(iq, ik, w)
            at, l1 = P.dense_attn_score_recompute(q, kv, lse)
            g = P.dense_indexer_backward(iq, ik, w, s, sl, at, l1, 1.0)
        return [np_of(x) for x in g]

    clean = run(a)
    a["iq"][0, t, 2, 2] = NAN
    dq, _, dw = run(a)
    rows = np.arange(S) == t
    assert np.isnan(dq[0][rows]).all() and np.isnan(dw[0][rows]).all()
    same_elsewhere(dq[0][~rows], clean[0][0][~rows], np.zeros_like(dq[0][~rows], bool))
    same_elsewhere(dw[0][~rows], clean[2][0][~rows], np.zeros_like(dw[0][~rows], bool))


def test_sparse_attention_sink(rng, place):
    """A NaN attention sink of head h reaches head h's output in every row with a valid slot (the sink enters each
    row's normaliser), and no other head; a row with no valid slot stays out 0."""
    a = inputs(rng)
    idx = a["idx"].copy()
    idx[0, 2] = -1                                          # row 2: no valid slot
    sink = np.zeros(H, np.float32)

    def run(sink):
        out = P.sparse_attention(tensor(a["q"], "bfloat16"), tensor(a["kv"], "bfloat16"), paddle.to_tensor(idx),
                                 v_head_dim=512, attn_sink=tensor(sink, "float32"))
        return np_of(out)

    clean = run(sink)
    sink[5] = NAN
    got = run(sink)
    m = np.zeros(got[0].shape, bool)
    m[:, 5, :] = True
    m[2] = False
    same_elsewhere(got[0], clean[0], m)
