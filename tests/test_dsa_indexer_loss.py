"""Attention-score recompute, the indexer backward pieces and indexer_kl_loss against float64 numpy."""
import numpy as np
import paddle
import pytest

import dsa_reference as R
import paddle_dsa as P
from dsa_helpers import pd, tiles  # noqa: F401  (tiles: autouse fixture)


class Case:
    """A random indexer + attention problem in BSHD or THD, with the rows' true softmax_lse."""

    def __init__(self, rng, layout, hi, di, h, dqk, sparse, kk=5, causal=True, ratio=1, offsets=None):
        self.layout, self.hi, self.di, self.h, self.dqk = layout, hi, di, h, dqk
        self.causal, self.ratio, self.offsets = causal, ratio, offsets
        if layout == "bshd":
            b, sq, sk = 2, 4, 6
            self.seqs, self.tq, self.tk, self.width = R.sequences(b, sq=sq, sk=sk), b * sq, b * sk, sk
            self.rows, self.keys = (b, sq), (b, sk)
            self.kw = {}
        else:
            lq, lk = np.array([3, 0, 4, 2]), np.array([4, 2, 5, 3])
            cu_q, cu_k = R.random_cu(rng, lq), R.random_cu(rng, lk)
            self.seqs = R.sequences(cu_q, cu_k)
            self.tq, self.tk, self.width = int(cu_q[-1]) + 2, int(cu_k[-1]) + 1, int(lk.max())
            self.rows, self.keys = (self.tq,), (self.tk,)
            self.kw = dict(cu_seqlens_q=pd(cu_q, "int32"), cu_seqlens_k=pd(cu_k, "int32"))
            self.n_valid = int(cu_q[-1])
        self.n = self.tq if layout == "bshd" else self.n_valid
        self.q = rng.standard_normal((self.tq, hi, di))
        self.k = rng.standard_normal((self.tk, di))
        self.w = rng.standard_normal((self.tq, hi))
        self.Q = rng.standard_normal((self.tq, h, dqk))
        self.KV = rng.standard_normal((self.tk, dqk))
        self.scale = dqk ** -0.5
        if sparse:
            self.idx = rng.integers(-1, self.width + 1, (self.tq, kk)).astype(np.int64)
            self.idx[0, :2] = 0                                      # a duplicate
            self.tl = rng.integers(0, kk + 1, (self.tq,)).astype(np.int32)
            self.tl[0] = kk
            self.gidx, self.valid = R.slots(self.idx, self.seqs, self.tq, self.tl)
            self.mask = self.valid
            a = np.einsum("rhd,rnd->rhn", self.Q, self.KV[self.gidx]) * self.scale
            self.sparse_kw = dict(topk_indices=self.pub(self.idx, "int32"), topk_length=self.pub(self.tl, "int32"))
        else:
            self.sparse_kw = {}
            self.mask = np.zeros((self.tq, self.width), bool)
            a = np.full((self.tq, h, self.width), -np.inf)
            for b, (qa, ql, ka, kl) in enumerate(self.seqs):
                off = 0 if offsets is None else offsets[b]
                self.mask[qa:qa + ql, :kl] = R.visible(ql, kl, off, causal, ratio)
                a[qa:qa + ql, :, :kl] = np.einsum("rhd,nd->rhn", self.Q[qa:qa + ql], self.KV[ka:ka + kl]) * self.scale
        a = np.where(self.mask[:, None, :], a, -np.inf)
        with np.errstate(invalid="ignore", divide="ignore"):
            mx = a.max(-1)
            self.lse = np.where(np.isfinite(mx), mx + np.log(np.exp(a - np.where(np.isfinite(mx), mx, 0)[..., None]).sum(-1)), -np.inf)
        self.lse = self.lse.astype(np.float32).astype(np.float64)
        self.ckw = {} if sparse else dict(causal=causal, ratio=ratio,
                                          q_offsets=None if offsets is None else pd(offsets, "int32"))

    def pub(self, x, dtype="float64", grad=False):
        """Token-major numpy -> public layout tensor."""
        lead = self.rows if x.shape[0] == self.tq else self.keys
        return pd(x.reshape(lead + x.shape[1:]), dtype, grad)

    def pub_lse(self, lse):
        if self.layout == "bshd":
            return pd(lse.reshape(self.rows + (self.h,)).transpose(0, 2, 1), "float32")
        return pd(lse.T, "float32")

    def numpy_stats(self, lse=None):
        lse = self.lse if lse is None else lse
        if self.sparse_kw:
            s, l = R.sparse_index(self.q, self.k, self.w, self.gidx, self.valid)
            a, n = R.sparse_attn(self.Q, self.KV, lse, self.scale, self.gidx, self.valid)
        else:
            s, l, _ = R.dense_index(self.q, self.k, self.w, self.seqs, self.width, self.offsets, self.causal, self.ratio)
            a, n = R.dense_attn(self.Q, self.KV, lse, self.scale, self.seqs, self.width, self.offsets, self.causal, self.ratio)
        return s, l, a, n

    def numpy_grads(self, s, l, a, n, c):
        g = R.grad_signal(s, l, a, n, self.mask, c)
        if self.sparse_kw:
            return R.sparse_index_grads(self.q, self.k, self.w, g, self.gidx, self.valid)
        return R.dense_index_grads(self.q, self.k, self.w, g, self.seqs)


CASES = [
    ("bshd", 16, 64, 16, 64, False),
    ("thd", 64, 128, 64, 576, False),
    ("bshd", 64, 128, 16, 64, True),
    ("thd", 16, 64, 64, 576, True),
]


@pytest.mark.parametrize("layout,hi,di,h,dqk,sparse", CASES)
def test_indexer_kl_loss_value_and_grads(layout, hi, di, h, dqk, sparse):
    c = Case(np.random.default_rng([hi, di, h, dqk, int(sparse)]), layout, hi, di, h, dqk, sparse)
    qt, kt, wt = c.pub(c.q, grad=True), c.pub(c.k, grad=True), c.pub(c.w, grad=True)
    Qt, KVt, lset = c.pub(c.Q, grad=True), c.pub(c.KV, grad=True), c.pub_lse(c.lse)
    lset.stop_gradient = False
    loss = P.indexer_kl_loss(qt, kt, wt, Qt, KVt, lset, loss_coeff=0.37, **c.sparse_kw, **c.ckw, **c.kw)
    assert loss.dtype == paddle.float32 and loss.shape == []
    s, l, a, n = c.numpy_stats()
    exp = R.kl_loss(s, l, a, n, c.mask, 0.37, c.n)
    assert exp > 1e-3
    np.testing.assert_allclose(float(loss), exp, rtol=2e-6)
    (loss * 3.0).backward()                                      # grad_loss = 3 reaches the pieces
    dq, dk, dw = c.numpy_grads(s, l, a, n, 3.0 * 0.37 / c.n)
    for name, t, e in (("d_index_q", qt, dq), ("d_index_k", kt, dk), ("d_weights", wt, dw)):
        got = t.grad.numpy().reshape(e.shape)
        assert np.abs(e).max() > 1e-4
        np.testing.assert_allclose(got, e, rtol=1e-8, atol=1e-9 * np.abs(e).max(), err_msg=name)
    assert Qt.grad is None and KVt.grad is None and lset.grad is None     # the attention side is a constant


def test_numpy_loss_gradient_matches_finite_differences():
    """The numpy oracle's analytic indexer gradient against central differences of its loss."""
    for sparse in (False, True):
        c = Case(np.random.default_rng(21 + sparse), "thd", 4, 6, 3, 8, sparse)
        s, l, a, n = c.numpy_stats()
        dq, dk, dw = c.numpy_grads(s, l, a, n, 0.5 / c.n)

        def f():
            if sparse:
                s2, l2 = R.sparse_index(c.q, c.k, c.w, c.gidx, c.valid)
            else:
                s2, l2, _ = R.dense_index(c.q, c.k, c.w, c.seqs, c.width)
            return R.kl_loss(s2, l2, a, n, c.mask, 0.5, c.n)

        rng = np.random.default_rng(0)
        for x, g in ((c.q, dq), (c.k, dk), (c.w, dw)):
            for i, v in R.finite_diff(f, x, entries=12, rng=rng).items():
                assert abs(v - g.reshape(-1)[i]) < 1e-7 * max(1.0, abs(v)), (sparse, i, v, g.reshape(-1)[i])


@pytest.mark.parametrize("layout,hi,di,h,dqk,sparse", CASES)
def test_pieces_recompute_and_backward(layout, hi, di, h, dqk, sparse):
    """The public recompute + backward pieces (float32 statistics) against numpy, and the loss's grads."""
    c = Case(np.random.default_rng([3, hi, h, int(sparse)]), layout, hi, di, h, dqk, sparse)
    iq, ik, iw = c.pub(c.q, "float32"), c.pub(c.k, "float32"), c.pub(c.w, "float32")
    if sparse:
        idx, tl = c.sparse_kw["topk_indices"], c.sparse_kw["topk_length"]
        s, l = P.sparse_indexer_score_recompute(iq, ik, iw, idx, topk_length=tl, **c.kw)
        a, n = P.sparse_attn_score_recompute(c.pub(c.Q, "float32"), c.pub(c.KV, "float32"), c.pub_lse(c.lse), idx,
                                             topk_length=tl, **c.kw)
    else:
        s, l = P.dense_indexer_score_recompute(iq, ik, iw, **c.ckw, **c.kw)
        a, n = P.dense_attn_score_recompute(c.pub(c.Q, "float32"), c.pub(c.KV, "float32"), c.pub_lse(c.lse), **c.ckw, **c.kw)
    for t in (s, l, a, n):
        assert t.dtype == paddle.float32
    es, el, ea, en = c.numpy_stats()
    width = es.shape[1]
    R.assert_close(s.numpy().reshape(-1, width), es, 1e-5, 1e-4, "index_score")
    R.assert_close(l.numpy().reshape(-1), el, 1e-5, 1e-5, "index_lse")
    R.assert_close(a.numpy().reshape(-1, width), ea, 1e-5, 1e-6, "attn_score")
    R.assert_close(n.numpy().reshape(-1), en, 1e-5, 1e-6, "attn_l1norm")
    assert (a.numpy().reshape(-1, width)[~c.mask] == 0).all()
    if layout == "thd":        # rows past cu_seqlens_q[-1]: score -inf, lse 0, attn 0, l1norm 0
        pad = slice(c.n_valid, None)
        assert np.isneginf(s.numpy()[pad]).all() and (l.numpy()[pad] == 0).all()
        assert (a.numpy()[pad] == 0).all() and (n.numpy()[pad] == 0).all()
    gl = pd([2.0], "float32")
    if sparse:
        grads = P.sparse_indexer_backward(iq, ik, iw, idx, s, l, a, n, gl, loss_coeff=0.5, topk_length=tl, **c.kw)
    else:
        grads = P.dense_indexer_backward(iq, ik, iw, s, l, a, n, gl, loss_coeff=0.5, **c.ckw, **c.kw)
    f64 = lambda t: t.numpy().reshape(-1, width).astype(np.float64)  # noqa: E731
    exp = c.numpy_grads(f64(s), l.numpy().reshape(-1).astype(np.float64), f64(a), n.numpy().reshape(-1).astype(np.float64),
                        2.0 * 0.5 / c.n)
    for name, g, e, src in zip(("d_index_q", "d_index_k", "d_weights"), grads, exp, (iq, ik, iw)):
        assert g.dtype == src.dtype and g.shape == src.shape
        np.testing.assert_allclose(g.numpy().reshape(e.shape), e, rtol=2e-4, atol=2e-5 * np.abs(e).max(), err_msg=name)
    # indexer_kl_loss's PyLayer calls the same pieces: same gradients (float32 inputs)
    qt, kt, wt = c.pub(c.q, "float32", True), c.pub(c.k, "float32", True), c.pub(c.w, "float32", True)
    loss = P.indexer_kl_loss(qt, kt, wt, c.pub(c.Q, "float32"), c.pub(c.KV, "float32"), c.pub_lse(c.lse),
                             loss_coeff=0.5, **c.sparse_kw, **c.ckw, **c.kw)
    (loss * 2.0).backward()
    for g, t in zip(grads, (qt, kt, wt)):
        np.testing.assert_allclose(t.grad.numpy(), g.numpy(), rtol=1e-4, atol=1e-6 * np.abs(g.numpy()).max())


def test_dense_ratio_and_offsets():
    c = Case(np.random.default_rng(31), "bshd", 16, 64, 16, 64, False, ratio=2, offsets=[3, -1])
    qt, kt, wt = c.pub(c.q, grad=True), c.pub(c.k, grad=True), c.pub(c.w, grad=True)
    loss = P.indexer_kl_loss(qt, kt, wt, c.pub(c.Q), c.pub(c.KV), c.pub_lse(c.lse), **c.ckw)
    s, l, a, n = c.numpy_stats()
    np.testing.assert_allclose(float(loss), R.kl_loss(s, l, a, n, c.mask, 1.0, c.n), rtol=2e-6)
    loss.backward()
    dq, dk, dw = c.numpy_grads(s, l, a, n, 1.0 / c.n)
    np.testing.assert_allclose(kt.grad.numpy().reshape(dk.shape), dk, rtol=1e-8, atol=1e-12)
    assert (~c.mask.any(-1)).any()       # some rows see no key; they add nothing


@pytest.mark.parametrize("sparse", [False, True])
def test_degenerate_softmax_lse_gives_no_inf_or_nan(sparse):
    """softmax_lse of -1e30, +inf, -inf on some rows: every output and gradient finite."""
    c = Case(np.random.default_rng(41 + sparse), "bshd", 16, 64, 64, 64, sparse, kk=6)
    lse = c.lse.copy()
    lse[1, :] = -1e30
    lse[2, :] = np.inf
    lse[3, :5] = -np.inf
    lse[5, 7] = 1e30
    lse[4, :] += 30.0                     # l1norm ~ e^-30 < 1e-10: the L1 clamp decides the target scale
    lse[6, :] += 100.0                    # every exp argument < -126 ln 2: flushed to exactly 0
    lse32 = c.pub_lse(lse)
    Q32, KV32 = c.pub(c.Q, "float32"), c.pub(c.KV, "float32")
    if sparse:
        a, n = P.sparse_attn_score_recompute(Q32, KV32, lse32, c.sparse_kw["topk_indices"],
                                             topk_length=c.sparse_kw["topk_length"])
    else:
        a, n = P.dense_attn_score_recompute(Q32, KV32, lse32)
    a, n = a.numpy().reshape(c.tq, -1), n.numpy().reshape(-1)
    assert np.isfinite(a).all() and np.isfinite(n).all()
    ea, en = c.numpy_stats(lse.astype(np.float32).astype(np.float64))[2:]
    np.testing.assert_allclose(a, ea, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(n, en, rtol=1e-5)
    assert (a[2] == 0).all() and n[2] == 0                      # lse +inf: an all-zero target row
    assert (a[6] == 0).all() and n[6] == 0                      # flush to zero, no denormals
    if c.mask[1].any():
        assert a[1][c.mask[1]].min() > 1e35                     # -1e30 saturates at the clamp, finitely
    qt, kt, wt = c.pub(c.q, "float32", True), c.pub(c.k, "float32", True), c.pub(c.w, "float32", True)
    loss = P.indexer_kl_loss(qt, kt, wt, Q32, KV32, lse32, **c.sparse_kw)
    loss.backward()
    assert np.isfinite(float(loss))
    for t in (qt, kt, wt):
        assert np.isfinite(t.grad.numpy()).all()
    s, l, a64, n64 = c.numpy_stats(lse.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(float(loss), R.kl_loss(s, l, a64, n64, c.mask, 1.0, c.n), rtol=1e-4)


def test_index_lse_plus_inf_row_has_zero_gradient_and_grad_loss_number():
    c = Case(np.random.default_rng(51), "bshd", 16, 64, 16, 64, False)
    iq, ik, iw = c.pub(c.q, "float32"), c.pub(c.k, "float32"), c.pub(c.w, "float32")
    s, l = P.dense_indexer_score_recompute(iq, ik, iw)
    a, n = P.dense_attn_score_recompute(c.pub(c.Q, "float32"), c.pub(c.KV, "float32"), c.pub_lse(c.lse))
    l_np = l.numpy().copy()
    l_np[0, 3] = np.inf
    dq, dk, dw = P.dense_indexer_backward(iq, ik, iw, s, pd(l_np, "float32"), a, n, 1.5)
    assert (dq.numpy()[0, 3] == 0).all() and (dw.numpy()[0, 3] == 0).all()
    assert np.abs(dq.numpy()[0, 2]).max() > 0
    dq2 = P.dense_indexer_backward(iq, ik, iw, s, l, a, n, pd(1.5, "float32"))[0]
    dq3 = P.dense_indexer_backward(iq, ik, iw, s, l, a, n, 1.0, loss_coeff=1.5)[0]
    np.testing.assert_allclose(dq2.numpy(), dq3.numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("sparse", [False, True])
def test_log_clip_at_minus_100(sparse):
    """Sharp indexer scores put some log softmax(I) below -100: those entries get no gradient."""
    c = Case(np.random.default_rng(61 + sparse), "bshd", 16, 64, 16, 64, sparse, kk=6)
    w0 = c.w.copy()
    for factor in (2, 3, 4, 6, 8, 12, 16, 24, 32):   # sharpen until part (not all) of the entries is clipped
        c.w = w0 * factor
        s, l, a, n = c.numpy_stats()
        clipped = (np.where(c.mask, s - l[:, None], 0) < -100).sum() / c.mask.sum()
        if 0.1 < clipped < 0.6:
            break
    assert 0.1 < clipped < 0.6, clipped
    qt, kt, wt = c.pub(c.q, grad=True), c.pub(c.k, grad=True), c.pub(c.w, grad=True)
    loss = P.indexer_kl_loss(qt, kt, wt, c.pub(c.Q), c.pub(c.KV), c.pub_lse(c.lse), **c.sparse_kw)
    np.testing.assert_allclose(float(loss), R.kl_loss(s, l, a, n, c.mask, 1.0, c.n), rtol=2e-6)
    loss.backward()
    for t, e in zip((qt, kt, wt), c.numpy_grads(s, l, a, n, 1.0 / c.n)):
        np.testing.assert_allclose(t.grad.numpy().reshape(e.shape), e, rtol=1e-7, atol=1e-9 * np.abs(e).max())


def test_zero_target_row_gets_the_prob_min_clamp():
    """A row whose target is all 0 (l1norm 0) still sees T = e^-100 at its entries: tiny, not zero, gradient."""
    c = Case(np.random.default_rng(71), "bshd", 16, 64, 16, 64, False)
    s, l, a, n = c.numpy_stats()
    a[3] = 0.0
    n[3] = 0.0
    stats = [pd(x.reshape(c.rows + x.shape[1:])) for x in (s, l, a, n)]
    dq, dk, dw = P.dense_indexer_backward(c.pub(c.q), c.pub(c.k), c.pub(c.w), *stats, 1.0)
    eq, ek, ew = c.numpy_grads(s, l, a, n, 1.0 / c.n)
    row = dw.numpy().reshape(c.tq, -1)[3]
    assert 0 < np.abs(row).max() < 1e-40
    np.testing.assert_allclose(row, ew[3], rtol=1e-6, atol=0)
    np.testing.assert_allclose(dq.numpy().reshape(eq.shape), eq, rtol=1e-8, atol=1e-12 * np.abs(eq).max())


def test_indexer_kl_loss_gradients_match_finite_differences_of_the_loss():
    """No numpy in the loop: gradients of the float64 path against central differences of the (float32)
    loss value itself, with a step large enough for the float32 rounding of the returned scalar."""
    c = Case(np.random.default_rng(81), "bshd", 16, 64, 16, 64, False)
    c.w *= 3.0

    def f():
        return float(P.indexer_kl_loss(c.pub(c.q), c.pub(c.k), c.pub(c.w), c.pub(c.Q), c.pub(c.KV), c.pub_lse(c.lse)))

    qt, kt, wt = c.pub(c.q, grad=True), c.pub(c.k, grad=True), c.pub(c.w, grad=True)
    P.indexer_kl_loss(qt, kt, wt, c.pub(c.Q), c.pub(c.KV), c.pub_lse(c.lse)).backward()
    for x, t in ((c.q, qt), (c.k, kt), (c.w, wt)):
        g = t.grad.numpy().reshape(-1)
        big = np.argsort(-np.abs(g))[:6]            # the largest entries: well above the float32 noise
        for i in big:
            flat = x.reshape(-1)
            old = flat[i]
            flat[i] = old + 3e-3
            hi = f()
            flat[i] = old - 3e-3
            lo = f()
            flat[i] = old
            fd = (hi - lo) / 6e-3
            assert abs(fd - g[i]) < 2e-2 * abs(g[i]) + 2e-5, (i, fd, g[i])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_indexer_kl_loss_low_precision_inputs(dtype):
    """bf16/fp16 inputs compute in float32: loss and grads match float64 on the same rounded inputs."""
    c = Case(np.random.default_rng(91), "bshd", 64, 128, 64, 576, True, kk=6)
    rounded = {}
    for name in ("q", "k", "w", "Q", "KV"):
        t = c.pub(getattr(c, name), dtype)
        rounded[name] = t
        setattr(c, name, t.astype("float64").numpy().reshape(getattr(c, name).shape))
    for t in (rounded["q"], rounded["k"], rounded["w"]):
        t.stop_gradient = False
    loss = P.indexer_kl_loss(rounded["q"], rounded["k"], rounded["w"], rounded["Q"], rounded["KV"], c.pub_lse(c.lse),
                             **c.sparse_kw)
    s, l, a, n = c.numpy_stats()
    np.testing.assert_allclose(float(loss), R.kl_loss(s, l, a, n, c.mask, 1.0, c.n), rtol=1e-4)
    loss.backward()
    for t, e in zip((rounded["q"], rounded["k"], rounded["w"]), c.numpy_grads(s, l, a, n, 1.0 / c.n)):
        assert t.grad.dtype == getattr(paddle, dtype)
        got = t.grad.astype("float64").numpy().reshape(e.shape)
        rel = np.sqrt(((got - e) ** 2).mean() / (e ** 2).mean())
        assert rel < 1e-2, rel
