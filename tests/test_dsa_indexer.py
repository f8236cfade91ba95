"""indexer_score, dense/sparse indexer score recompute and indexer_topk against the float64 numpy reference."""
import numpy as np
import paddle
import pytest

import dsa_reference as R
import paddle_dsa as P
from dsa_helpers import tiles  # noqa: F401  (autouse fixture)

F64 = "float64"


def pd(a, dtype=F64):
    return paddle.to_tensor(np.asarray(a), dtype=dtype)


def make_index(rng, rows, hi, di, keys, scale=1.0):
    q = rng.standard_normal(rows + (hi, di)) * scale
    k = rng.standard_normal(keys + (di,)) * scale
    w = rng.standard_normal(rows + (hi,))
    return q, k, w


@pytest.mark.parametrize("hi,di", [(16, 64), (64, 128)])
@pytest.mark.parametrize("causal,ratio,offsets", [(True, 1, None), (True, 3, [4, 0]), (False, 1, None), (True, 2, [-3, 9])])
def test_indexer_score_bshd(hi, di, causal, ratio, offsets):
    rng = np.random.default_rng([hi, di, ratio, int(causal)])
    b, sq, sk = 2, 5, 9
    q, k, w = make_index(rng, (b, sq), hi, di, (b, sk))
    qo = None if offsets is None else pd(offsets, "int32")
    got = P.indexer_score(pd(q), pd(k), pd(w), causal=causal, ratio=ratio, q_offsets=qo)
    assert got.dtype == paddle.float32 and list(got.shape) == [b, sq, sk]
    exp, lse, mask = R.dense_index(q.reshape(-1, hi, di), k.reshape(-1, di), w.reshape(-1, hi),
                                   R.sequences(b, sq=sq, sk=sk), sk, offsets, causal, ratio)
    R.assert_close(got.numpy().reshape(-1, sk), exp, 2e-6, 2e-6 * np.abs(exp[mask]).max(), "scores")
    assert (~mask).any() or not causal
    s2, l2 = P.dense_indexer_score_recompute(pd(q), pd(k), pd(w), causal=causal, ratio=ratio, q_offsets=qo)
    np.testing.assert_array_equal(s2.numpy(), got.numpy())
    assert l2.dtype == paddle.float32 and list(l2.shape) == [b, sq]
    R.assert_close(l2.numpy().reshape(-1), lse, 1e-6, 1e-5, "index_lse")
    # rows that see no key (ratio > 1 or a negative offset): lse 0, so exp(score - lse) is 0, not NaN
    dead = ~mask.any(-1)
    if dead.any():
        assert (l2.numpy().reshape(-1)[dead] == 0).all()
        assert np.isneginf(got.numpy().reshape(-1, sk)[dead]).all()


def thd_case(rng, hi, di, pad_rows=2):
    lq = np.array([3, 0, 5, 1])
    lk = np.array([4, 2, 6, 3])
    cu_q, cu_k = R.random_cu(rng, lq), R.random_cu(rng, lk)
    tq, tk = int(cu_q[-1]) + pad_rows, int(cu_k[-1]) + 1
    q, k, w = make_index(rng, (tq,), hi, di, (tk,))
    q[int(cu_q[-1]):] = np.nan          # poisoned rows past cu_seqlens_q[-1] must never be read
    w[int(cu_q[-1]):] = np.nan
    k[int(cu_k[-1]):] = np.nan          # and keys past cu_seqlens_k[-1]
    return q, k, w, cu_q, cu_k, R.sequences(cu_q, cu_k)


@pytest.mark.parametrize("hi,di", [(16, 64), (64, 128)])
@pytest.mark.parametrize("causal,ratio,offsets", [(True, 1, None), (True, 2, [1, 0, 3, 2]), (False, 1, None)])
def test_indexer_score_thd(hi, di, causal, ratio, offsets):
    rng = np.random.default_rng([7, hi, di, ratio])
    q, k, w, cu_q, cu_k, seqs = thd_case(rng, hi, di)
    width = int(np.diff(cu_k).max())
    qo = None if offsets is None else pd(offsets, "int32")
    kw = dict(causal=causal, ratio=ratio, q_offsets=qo, cu_seqlens_q=pd(cu_q, "int32"), cu_seqlens_k=pd(cu_k, "int32"))
    got = P.indexer_score(pd(q), pd(k), pd(w), **kw).numpy()
    assert got.shape == (q.shape[0], width)
    exp, lse, mask = R.dense_index(q, k, w, seqs, width, offsets, causal, ratio)
    R.assert_close(got, exp, 2e-6, 2e-6 * np.abs(exp[mask]).max(), "thd scores")
    s2, l2 = P.dense_indexer_score_recompute(pd(q), pd(k), pd(w), **kw)
    np.testing.assert_array_equal(s2.numpy(), got)
    R.assert_close(l2.numpy(), lse, 1e-6, 1e-5, "thd index_lse")
    pad = slice(int(cu_q[-1]), None)
    assert np.isneginf(got[pad]).all() and (l2.numpy()[pad] == 0).all()


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_sparse_indexer_score_recompute(layout):
    rng = np.random.default_rng(11)
    hi, di, kk = 16, 64, 6
    if layout == "bshd":
        b, sq, sk = 2, 4, 7
        q, k, w = make_index(rng, (b, sq), hi, di, (b, sk))
        seqs, tq, kw = R.sequences(b, sq=sq, sk=sk), b * sq, {}
        idx = rng.integers(-2, sk + 2, (b, sq, kk)).astype(np.int32)
        tl = rng.integers(0, kk + 2, (b, sq)).astype(np.int32)
        qf, kf, wf = q.reshape(-1, hi, di), k.reshape(-1, di), w.reshape(-1, hi)
    else:
        q, k, w, cu_q, cu_k, seqs = thd_case(rng, hi, di)
        tq = q.shape[0]
        kw = dict(cu_seqlens_q=pd(cu_q, "int32"), cu_seqlens_k=pd(cu_k, "int32"))
        idx = rng.integers(-1, 7, (tq, kk)).astype(np.int32)
        tl = rng.integers(0, kk + 1, (tq,)).astype(np.int32)
        qf, kf, wf = q, k, w
    idx.reshape(-1, kk)[0, :3] = 1                      # duplicates: scored once per slot
    tl.reshape(-1)[0] = kk
    s, lse = P.sparse_indexer_score_recompute(pd(q), pd(k), pd(w), pd(idx, "int32"), topk_length=pd(tl, "int32"), **kw)
    gidx, valid = R.slots(idx.reshape(tq, kk).astype(np.int64), seqs, tq, tl.reshape(-1))
    es, el = R.sparse_index(qf, kf, wf, gidx, valid)
    R.assert_close(s.numpy().reshape(tq, kk), es, 2e-6, 1e-4, "sparse scores")
    R.assert_close(lse.numpy().reshape(-1), el, 1e-6, 1e-5, "sparse lse")
    row0 = s.numpy().reshape(tq, kk)[0]
    assert row0[0] == row0[1] == row0[2] and np.isfinite(row0[0])
    assert (lse.numpy().reshape(-1)[~valid.any(-1)] == 0).all() and (~valid.any(-1)).any()


@pytest.mark.parametrize("k", [1, 4, 13, 40])
def test_indexer_topk(k):
    rng = np.random.default_rng(k)
    b, sq, sk = 2, 6, 13
    s = rng.standard_normal((b, sq, sk)).astype(np.float32)
    s[rng.random(s.shape) < 0.3] = -np.inf
    s[0, 0, :] = -np.inf                                # no finite score: all -1
    s[0, 1, 2] = s[0, 1, 5] = s[0, 1, 9] = 7.0          # ties: lower column first
    s[1, 2, 3], s[1, 2, 4] = np.inf, np.nan             # never selected
    lengths = rng.integers(0, sk + 3, (b, sq)).astype(np.int32)
    got = P.indexer_topk(pd(s, "float32"), k)
    assert got.dtype == paddle.int32 and list(got.shape) == [b, sq, k]
    exp = R.topk(s.reshape(-1, sk), k).reshape(b, sq, k)
    np.testing.assert_array_equal(got.numpy(), exp)
    assert (got.numpy()[0, 0] == -1).all()
    if k >= 3:
        assert list(got.numpy()[0, 1, :3]) == [2, 5, 9]
    assert not np.isin([3, 4], got.numpy()[1, 2]).any()
    got_l = P.indexer_topk(pd(s, "float32"), k, lengths=pd(lengths, "int32"))
    np.testing.assert_array_equal(got_l.numpy(), R.topk(s.reshape(-1, sk), k, lengths.reshape(-1)).reshape(b, sq, k))
    # THD scores [Tq, W]
    got_t = P.indexer_topk(pd(s.reshape(-1, sk), "float32"), k, lengths=pd(lengths.reshape(-1), "int32"))
    np.testing.assert_array_equal(got_t.numpy(), got_l.numpy().reshape(-1, k))


def test_indexer_topk_large_k_sorted():
    rng = np.random.default_rng(5)
    s = rng.standard_normal((3, 3000)).astype(np.float32)
    s[1] = np.round(s[1] * 2) / 2                       # many ties: lower column first, deterministically
    got = P.indexer_topk(pd(s, "float32"), 2048).numpy()
    np.testing.assert_array_equal(got, R.topk(s, 2048))
    vals = np.take_along_axis(s, got, -1)
    assert (np.diff(vals, axis=-1) <= 0).all()


@pytest.mark.parametrize("k", [1, 5, 13, 40])
def test_indexer_topk_unsorted_is_column_order(k):
    """sorted=False: exactly the columns of the sorted call, in ascending column order, -1 padding last."""
    rng = np.random.default_rng(10 + k)
    b, sq, sk = 2, 5, 17
    s = rng.standard_normal((b, sq, sk)).astype(np.float32)
    s[rng.random(s.shape) < 0.3] = -np.inf
    s[1, 0, :] = 3.0                                    # one key for the whole row: the lowest k columns
    s[0, 4, :] = -np.inf                                # nothing selectable
    lengths = rng.integers(0, sk + 2, (b, sq)).astype(np.int32)
    for ln in (None, pd(lengths, "int32")):
        by_score = P.indexer_topk(pd(s, "float32"), k, lengths=ln).numpy()
        got = P.indexer_topk(pd(s, "float32"), k, lengths=ln, sorted=False)
        assert got.dtype == paddle.int32 and list(got.shape) == [b, sq, k]
        got = got.numpy()
        for row_s, row_g in zip(by_score.reshape(-1, k), got.reshape(-1, k)):
            n = int((row_s >= 0).sum())
            assert (row_g[n:] == -1).all() and (row_g[:n] >= 0).all()
            np.testing.assert_array_equal(row_g[:n], np.sort(row_s[:n]))
        assert (got[0, 4] == -1).all()
        if ln is None:
            np.testing.assert_array_equal(got[1, 0, :min(k, sk)], np.arange(min(k, sk)))
    thd = P.indexer_topk(pd(s.reshape(-1, sk), "float32"), k, sorted=False).numpy()
    np.testing.assert_array_equal(thd, P.indexer_topk(pd(s, "float32"), k, sorted=False).numpy().reshape(-1, k))


def test_topk_feeds_sparse_attention_consistently():
    """indexer_score -> indexer_topk gives, per row, exactly the causally visible keys when k >= Sk."""
    rng = np.random.default_rng(3)
    q, k, w = make_index(rng, (1, 6), 16, 64, (1, 6))
    idx = P.indexer_topk(P.indexer_score(pd(q), pd(k), pd(w)), 8).numpy()[0]
    for i in range(6):
        assert sorted(x for x in idx[i] if x >= 0) == list(range(i + 1))
        assert (idx[i, i + 1:] == -1).all()
