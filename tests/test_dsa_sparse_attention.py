"""sparse_attention forward, softmax_lse and PyLayer gradients against the float64 numpy reference."""
import numpy as np
import paddle
import pytest

import dsa_reference as R
import paddle_dsa as P
from dsa_helpers import pd, tiles  # noqa: F401  (tiles: autouse fixture)


def f32_exact(rng, shape):
    """Random float64 values that are exact in float32 (incoming gradients of float32 outputs)."""
    return rng.standard_normal(shape).astype(np.float32).astype(np.float64)


def run_case(rng, layout, h, dqk, dv, kk, sink=True, topk_length=True, dtype="float64", idx_fn=None):
    """Build a case, run forward + backward, return everything needed to compare."""
    if layout == "bshd":
        b, sq, skv = 2, 3, 9
        q = rng.standard_normal((b, sq, h, dqk))
        kv = rng.standard_normal((b, skv, dqk))
        idx = rng.integers(-2, skv + 3, (b, sq, kk)).astype(np.int32)
        tl = rng.integers(0, kk + 2, (b, sq)).astype(np.int32)
        seqs, tq, kw = R.sequences(b, sq=sq, sk=skv), b * sq, {}
    else:
        lq, lk = np.array([2, 0, 3]), np.array([5, 3, 7])
        cu_q, cu_k = R.random_cu(rng, lq), R.random_cu(rng, lk)
        tq, tk = int(cu_q[-1]) + 2, int(cu_k[-1]) + 1
        q = rng.standard_normal((tq, h, dqk))
        kv = rng.standard_normal((tk, dqk))
        q[int(cu_q[-1]):] = np.nan     # padding rows past cu_seqlens_q[-1]: never read
        kv[int(cu_k[-1]):] = np.nan
        idx = rng.integers(-2, 9, (tq, kk)).astype(np.int32)
        tl = rng.integers(0, kk + 2, (tq,)).astype(np.int32)
        seqs = R.sequences(cu_q, cu_k)
        kw = dict(cu_seqlens_q=pd(cu_q, "int32"), cu_seqlens_k=pd(cu_k, "int32"))
    if idx_fn is not None:
        idx_fn(idx.reshape(tq, kk), tl.reshape(-1))
    s = rng.standard_normal(h) if sink else None
    qt, kvt = pd(q, dtype, True), pd(kv, dtype, True)
    st = pd(s, "float64" if dtype == "float64" else "float32", True) if sink else None
    out, lse = P.sparse_attention(qt, kvt, pd(idx, "int32"), v_head_dim=dv, attn_sink=st,
                                  topk_length=pd(tl, "int32") if topk_length else None, return_softmax_lse=True, **kw)
    do = f32_exact(rng, out.shape)
    dl = f32_exact(rng, lse.shape)
    fin = paddle.isfinite(lse)
    loss = (out.astype("float64") * pd(do)).sum() + (paddle.where(fin, lse, paddle.zeros_like(lse)).astype("float64") * pd(dl)).sum()
    loss.backward()
    gidx, valid = R.slots(idx.reshape(tq, kk).astype(np.int64), seqs, tq, tl.reshape(-1) if topk_length else None)
    qf, kvf = q.reshape(tq, h, dqk), kv.reshape(-1, dqk)
    qin = np.where(np.isnan(qf), 0.0, qf)
    kvin = np.where(np.isnan(kvf), 0.0, kvf)
    if dtype != "float64":
        qin = qt.astype("float64").numpy().reshape(tq, h, dqk)
        qin = np.where(np.isnan(qin), 0.0, qin)
        kvin = np.nan_to_num(kvt.astype("float64").numpy().reshape(-1, dqk))
        s = None if s is None else st.astype("float64").numpy()
    scale = dqk ** -0.5
    eo, el = R.sparse_attention(qin, kvin, gidx, valid, scale, dv, s)
    if layout == "bshd":
        out_r, lse_r = out.astype("float64").numpy().reshape(tq, h, dv), lse.numpy().transpose(0, 2, 1).reshape(tq, h)
        dl_r = dl.transpose(0, 2, 1).reshape(tq, h)
    else:
        out_r, lse_r, dl_r = out.astype("float64").numpy(), lse.numpy().T, dl.T
    dl_r = np.where(np.isfinite(el), dl_r, 0.0)
    gq, gkv, gs = R.sparse_attention_grads(qin, kvin, gidx, valid, scale, dv, s, do.reshape(tq, h, dv), dl_r)
    g64 = lambda t: t.grad.astype("float64").numpy()  # noqa: E731
    return dict(out=out_r, lse=lse_r, eo=eo, el=el, dq=g64(qt).reshape(tq, h, dqk), dkv=g64(kvt).reshape(-1, dqk),
                ds=None if st is None else g64(st), gq=gq, gkv=gkv, gs=gs, valid=valid, out_t=out, lse_t=lse)


def check(c, rtol, gtol):
    scale_o = max(1.0, np.abs(c["eo"]).max())
    R.assert_close(c["out"], c["eo"], rtol, rtol * scale_o, "out")
    R.assert_close(c["lse"], c["el"], rtol, rtol, "softmax_lse")
    for name, got, exp in (("d_query", c["dq"], c["gq"]), ("d_kv", c["dkv"], c["gkv"]), ("d_attn_sink", c["ds"], c["gs"])):
        if exp is None:
            continue
        sc = max(1e-3, np.abs(exp).max())
        R.assert_close(got, exp, gtol, gtol * sc, name)


@pytest.mark.parametrize("layout", ["bshd", "thd"])
@pytest.mark.parametrize("h,dqk,dv", [(16, 64, 32), (64, 64, 32), (16, 576, 512)])
def test_sparse_attention_float64(layout, h, dqk, dv):
    c = run_case(np.random.default_rng([h, dqk, len(layout)]), layout, h, dqk, dv, kk=6)
    check(c, 1e-6, 1e-9)
    assert c["valid"].any(-1).any() and (~c["valid"]).any()


def test_sparse_attention_h64_576_no_sink():
    c = run_case(np.random.default_rng(64), "bshd", 64, 576, 512, kk=5, sink=False, topk_length=False)
    check(c, 1e-6, 1e-9)
    assert c["ds"] is None


@pytest.mark.parametrize("dtype,rtol,gtol", [("float32", 2e-5, 5e-5), ("bfloat16", 3e-2, 6e-2)])
def test_sparse_attention_low_precision(dtype, rtol, gtol):
    c = run_case(np.random.default_rng(9), "bshd", 16, 64, 32, kk=6, dtype=dtype)
    assert c["out_t"].dtype == getattr(paddle, dtype) and c["lse_t"].dtype == paddle.float32
    check(c, rtol, gtol)


def test_numpy_reference_gradients_match_finite_differences():
    """The numpy analytic gradients (used as the oracle above) against central differences."""
    rng = np.random.default_rng(2)
    t, h, d, dv, kk, tk = 3, 2, 5, 3, 4, 6
    q, kv, s = rng.standard_normal((t, h, d)), rng.standard_normal((tk, d)), rng.standard_normal(h)
    idx = np.array([[0, 2, 2, -1], [5, 1, 7, 3], [-1, -1, -1, -1]])
    gidx, valid = R.slots(idx, [(0, t, 0, tk)], t)
    do, dl = rng.standard_normal((t, h, dv)), rng.standard_normal((t, h))
    dl[2] = 0.0

    def f():
        o, l = R.sparse_attention(q, kv, gidx, valid, 0.7, dv, s)
        return (o * do).sum() + (np.where(np.isfinite(l), l, 0) * dl).sum()

    gq, gkv, gs = R.sparse_attention_grads(q, kv, gidx, valid, 0.7, dv, s, do, dl)
    for x, g in ((q, gq), (kv, gkv), (s, gs)):
        for i, v in R.finite_diff(f, x).items():
            assert abs(v - g.reshape(-1)[i]) < 1e-7 * max(1, abs(v))


def test_all_invalid_and_topk_length_zero_rows():
    def edit(idx, tl):
        idx[0, :] = -1                 # all invalid
        idx[1, :] = 100                # all >= Skv
        tl[2] = 0                      # topk_length 0
        idx[3, :] = 4                  # all duplicates of one key
        tl[3] = idx.shape[1]
    c = run_case(np.random.default_rng(4), "bshd", 16, 64, 32, kk=4, idx_fn=edit)
    check(c, 1e-6, 1e-9)
    for r in (0, 1, 2):
        assert (c["out"][r] == 0).all() and np.isneginf(c["lse"][r]).all() and (c["dq"][r] == 0).all()
    # K duplicates of one key: softmax over identical logits -> out = that key's V row (with the sink weight)
    assert np.isfinite(c["lse"][3]).all()


def test_k_larger_than_skv_and_duplicates_count_per_slot():
    rng = np.random.default_rng(8)
    b, sq, skv, h, d, dv, kk = 1, 2, 3, 16, 64, 32, 7
    q, kv = rng.standard_normal((b, sq, h, d)), rng.standard_normal((b, skv, d))
    idx = np.array([[[0, 1, 2, -1, -1, -1, -1], [0, 0, 1, 2, -1, 5, -1]]], np.int32)
    out, lse = P.sparse_attention(pd(q), pd(kv), pd(idx, "int32"), v_head_dim=dv, return_softmax_lse=True)
    s = np.einsum("hd,kd->hk", q[0, 1], kv[0]) * d ** -0.5
    # row 1 lists key 0 twice: its weight doubles (logit + log 2)
    w = np.exp(s) * np.array([2.0, 1.0, 1.0])
    np.testing.assert_allclose(lse.numpy()[0, :, 1], np.log(w.sum(-1)), rtol=1e-6)
    np.testing.assert_allclose(out.numpy()[0, 1], (w / w.sum(-1, keepdims=True)) @ kv[0, :, :dv], rtol=1e-9, atol=1e-12)


def test_nan_in_unselected_kv_rows_does_not_leak():
    rng = np.random.default_rng(12)
    q, kv = rng.standard_normal((1, 2, 16, 64)), rng.standard_normal((1, 6, 64))
    kv[0, 0] = np.nan                  # row 0: where invalid slots would be clamped to
    kv[0, 5] = np.nan                  # row 5: selected only past topk_length
    idx = np.array([[[1, 2, 5, -1], [3, -7, 4, 5]]], np.int32)
    qt, kvt = pd(q, grad=True), pd(kv, grad=True)
    out = P.sparse_attention(qt, kvt, pd(idx, "int32"), v_head_dim=32, topk_length=pd([[2, 2]], "int32"))
    out.sum().backward()
    for x in (out.numpy(), qt.grad.numpy(), kvt.grad.numpy()[0, 1:5]):
        assert np.isfinite(x).all()
    assert (kvt.grad.numpy()[0, [0, 5]] == 0).all()


def test_mixed_stop_gradient_and_lse_only_loss():
    rng = np.random.default_rng(13)
    q, kv = rng.standard_normal((1, 3, 16, 64)), rng.standard_normal((1, 5, 64))
    idx = rng.integers(0, 5, (1, 3, 4)).astype(np.int32)
    qt, kvt, st = pd(q, grad=True), pd(kv, grad=False), pd(np.zeros(16), grad=False)
    out, lse = P.sparse_attention(qt, kvt, pd(idx, "int32"), v_head_dim=32, attn_sink=st, return_softmax_lse=True)
    lse.sum().backward()               # only the lse is used: d_kv would have no V part
    assert kvt.grad is None and st.grad is None
    assert np.isfinite(qt.grad.numpy()).all() and np.abs(qt.grad.numpy()).max() > 0
    qt2, kvt2 = pd(q, grad=False), pd(kv, grad=True)
    P.sparse_attention(qt2, kvt2, pd(idx, "int32"), v_head_dim=32).sum().backward()
    assert qt2.grad is None and np.abs(kvt2.grad.numpy()).max() > 0


def test_default_scale_and_sink_semantics():
    rng = np.random.default_rng(14)
    q, kv = rng.standard_normal((1, 1, 16, 64)), rng.standard_normal((1, 4, 64))
    idx = np.array([[[0, 1, 2, 3]]], np.int32)
    sink = rng.standard_normal(16)
    o0, l0 = P.sparse_attention(pd(q), pd(kv), pd(idx, "int32"), v_head_dim=32, return_softmax_lse=True)
    o1, l1 = P.sparse_attention(pd(q), pd(kv), pd(idx, "int32"), v_head_dim=32, attn_sink=pd(sink), return_softmax_lse=True)
    s = np.einsum("hd,kd->hk", q[0, 0], kv[0]) / 8.0
    lse = np.log(np.exp(s).sum(-1))
    np.testing.assert_allclose(l0.numpy()[0, :, 0], lse, rtol=1e-6)
    np.testing.assert_array_equal(l0.numpy(), l1.numpy())          # the sink never enters softmax_lse
    factor = np.exp(lse) / (np.exp(lse) + np.exp(sink))
    np.testing.assert_allclose(o1.numpy()[0, 0], o0.numpy()[0, 0] * factor[:, None], rtol=1e-9, atol=1e-12)


def test_paddle_gradients_match_finite_differences_of_paddle_forward():
    """No numpy in the loop: the PyLayer's gradients against central differences of its own float64 forward."""
    rng = np.random.default_rng(17)
    q, kv, sink = rng.standard_normal((1, 3, 4, 8)), rng.standard_normal((1, 5, 8)), rng.standard_normal(4)
    idx = np.array([[[0, 4, 4, -1], [1, 2, 3, 9], [-1, -1, -1, -1]]], np.int32)
    do = rng.standard_normal((1, 3, 4, 6))

    def f():
        out = P.sparse_attention(pd(q), pd(kv), pd(idx, "int32"), v_head_dim=6, attn_sink=pd(sink),
                                 topk_length=pd([[4, 3, 4]], "int32"))
        return float((out.numpy() * do).sum())

    qt, kvt, st = pd(q, grad=True), pd(kv, grad=True), pd(sink, grad=True)
    out = P.sparse_attention(qt, kvt, pd(idx, "int32"), v_head_dim=6, attn_sink=st, topk_length=pd([[4, 3, 4]], "int32"))
    (out * pd(do)).sum().backward()
    for x, g in ((q, qt.grad), (kv, kvt.grad), (sink, st.grad)):
        g = g.numpy().reshape(-1)
        for i, v in R.finite_diff(f, x, eps=1e-5).items():
            assert abs(v - g[i]) < 1e-7 * max(1.0, abs(v)), (i, v, g[i])
    assert (kvt.grad.numpy()[0, [0, 4], :] != 0).any() and (qt.grad.numpy()[0, 2] == 0).all()
