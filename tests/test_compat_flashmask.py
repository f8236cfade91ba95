"""paddle_dsa.compat.flashmask_attention with document masks, against the documented math of Paddle's
startend_row_indices (a dense mask built from its columns, float64 softmax): PaddleNLP's causal one-column form and
PaddleFleet's four-column block-diagonal form, outputs, softmax_lse and gradients; other masks raise
NotImplementedError. (Paddle's own flashmask_attention has no CPU kernel.)"""
import numpy as np
import paddle
import pytest

from paddle_dsa import compat, config

DOCS = [[3, 5, 2], [6, 1, 3]]          # two batch rows of S = 10 tokens
S = 10


def startend(docs, four):
    cols = []
    for lens in docs:
        rows, st = [], 0
        for n in lens:
            for _ in range(n):
                rows.append([st + n, S, 0, st] if four else [st + n])
            st += n
        cols.append(rows)
    return paddle.to_tensor(np.array(cols, np.int32)[:, None])          # [B, 1, S, C]


def dense_mask(sri, causal):
    """True where attention is allowed, from the documented meaning of the columns."""
    a = sri.numpy()[:, 0]
    i = np.arange(S)[:, None]
    allowed = np.ones((a.shape[0], S, S), bool)
    for b in range(a.shape[0]):
        lts = a[b, :, 0][None, :]
        m = i >= lts if a.shape[-1] == 1 else (i >= lts) & (i < a[b, :, 1][None, :])
        if a.shape[-1] == 4:
            m |= (i >= a[b, :, 2][None, :]) & (i < a[b, :, 3][None, :])
        if causal:
            m |= np.arange(S)[None, :] > i
        allowed[b] = ~m
    return allowed


def oracle(q, k, v, allowed):
    q, k, v = (np.asarray(x.numpy(), np.float64) for x in (q, k, v))
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(allowed[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = np.log(p.sum(-1)) + m[..., 0]
    return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), v), lse


def t(rng, shape):
    x = paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))
    x.stop_gradient = False
    return x


@pytest.mark.parametrize("causal,four", [(True, False), (False, True)])
def test_document_masks(rng, causal, four):
    q, k, v = t(rng, [2, S, 2, 16]), t(rng, [2, S, 2, 16]), t(rng, [2, S, 2, 16])
    sri = startend(DOCS, four)
    out, lse = compat.flashmask_attention(q, k, v, sri, causal=causal, return_softmax_lse=True)
    want, want_lse = oracle(q, k, v, dense_mask(sri, causal))
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-5)
    # gradients: against the same math through Paddle autograd on a dense mask
    g = paddle.to_tensor(rng.standard_normal(out.shape).astype(np.float32))
    (out * g).sum().backward()
    q2, k2, v2 = (paddle.to_tensor(x.numpy(), stop_gradient=False) for x in (q, k, v))
    sc = paddle.einsum("bihd,bjhd->bhij", q2, k2) / 4.0
    sc = paddle.where(paddle.to_tensor(dense_mask(sri, causal))[:, None], sc, paddle.full_like(sc, -1e30))
    ref = paddle.einsum("bhij,bjhd->bihd", paddle.nn.functional.softmax(sc, -1), v2)
    (ref * g).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("check", [True, False])
def test_other_masks_raise(rng, monkeypatch, check):
    monkeypatch.setattr(config, "check_cu_seqlens_values", check)
    q, k, v = t(rng, [2, S, 2, 16]), t(rng, [2, S, 2, 16]), t(rng, [2, S, 2, 16])
    with pytest.raises(NotImplementedError, match="shape"):          # a two-column form
        compat.flashmask_attention(q, k, v, paddle.zeros([2, 1, S, 2], "int32"), causal=True)
    with pytest.raises(NotImplementedError, match="block_mask"):
        compat.flashmask_attention(q, k, v, startend(DOCS, False), causal=True, block_mask=paddle.ones([1]))
    if check:                                                         # a sliding-window-like column: not documents
        bad = paddle.to_tensor(np.minimum(np.arange(S) + 3, S).astype(np.int32).reshape(1, 1, S, 1).repeat(2, 0))
        with pytest.raises(NotImplementedError, match="document masks"):
            compat.flashmask_attention(q, k, v, bad, causal=True)
