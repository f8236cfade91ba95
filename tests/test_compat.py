"""paddle_dsa.compat against Paddle's own functions on CPU (float32: Paddle's scaled_dot_product_attention runs its
math path there): same signatures' behaviour, top-left causal masks, GQA, [S, H, D] inputs, int64 cu_seqlens,
gradients; and the arguments we cannot honour raise NotImplementedError."""
import inspect

import numpy as np
import paddle
import paddle.nn.functional as PF
import pytest

from paddle_dsa import compat

TOL = dict(rtol=2e-5, atol=2e-6)
# Paddle's own CPU scaled_dot_product_attention takes causal / scale / GQA from 3.3 on; older lines check against
# the float64 oracle below only (the compat layer keeps Paddle 3.3's API on every line).
PADDLE_33 = tuple(int(x) for x in paddle.__version__.split(".")[:2]) >= (3, 3)
needs_33 = pytest.mark.skipif(not PADDLE_33, reason="Paddle's CPU SDPA with causal/scale/GQA is 3.3+")


def oracle(q, k, v, causal, scale=None):
    """float64 softmax(q k^T * scale) v over [B, S, H, D] with GQA and Paddle's top-left causal mask (j <= i)."""
    q, k, v = (np.asarray(x.numpy(), np.float64) for x in (q, k, v))
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    k, v = np.repeat(k, h // hkv, axis=2), np.repeat(v, h // hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (d ** -0.5 if scale is None else scale)
    if causal:
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p, v)


def t(rng, shape, grad=True):
    x = paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))
    x.stop_gradient = not grad
    return x


def paddle_sdpa(q, k, v, causal):
    """Paddle's CPU SDPA with GQA spelled out (its math path repeats key/value heads itself too)."""
    return PF.scaled_dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize("sq,sk,h,hkv,causal", [(9, 9, 4, 2, True), (12, 7, 2, 2, True), (5, 11, 4, 1, False),
                                                 (8, 8, 2, 2, False)])
def test_sdpa_matches_paddle(rng, sq, sk, h, hkv, causal):
    q, k, v = t(rng, [2, sq, h, 32]), t(rng, [2, sk, hkv, 32]), t(rng, [2, sk, hkv, 32])
    q2, k2, v2 = (paddle.to_tensor(x.numpy(), stop_gradient=False) for x in (q, k, v))
    ours = compat.scaled_dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(ours.numpy(), oracle(q, k, v, causal), **TOL)
    if not PADDLE_33:
        return
    ref = paddle_sdpa(q2, k2, v2, causal)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), **TOL)
    g = t(rng, list(ours.shape), grad=False)
    (ours * g).sum().backward()
    (ref * g).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_sdpa_three_d_and_scale(rng):
    q, k, v = t(rng, [6, 2, 16]), t(rng, [6, 2, 16]), t(rng, [6, 2, 16])
    ours = compat.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    assert list(ours.shape) == [6, 2, 16]
    np.testing.assert_allclose(ours.numpy(), oracle(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), True, 0.3)[0],
                               **TOL)


def test_flash_attention_pair_and_batch_two(rng):
    """Paddle's flash_attention returns (out, softmax): `out, _ = flash_attention(...)` must give out, not unpack the
    batch axis of a B = 2 tensor (the trap of porting to paddle_dsa.nn.functional.flash_attention)."""
    q, k, v = t(rng, [2, 9, 2, 32]), t(rng, [2, 9, 2, 32]), t(rng, [2, 9, 2, 32])
    out, softmax = compat.flash_attention(q, k, v, causal=True, training=False, dropout=0.3)
    assert softmax is None and list(out.shape) == [2, 9, 2, 32]
    np.testing.assert_allclose(out.numpy(), oracle(q, k, v, True), **TOL)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_flash_attn_unpadded(rng, dtype):
    lens = [5, 3, 7]
    cu = paddle.to_tensor(np.concatenate([[0], np.cumsum(lens)]).astype(dtype))
    T = sum(lens)
    q, k, v = t(rng, [T, 2, 16]), t(rng, [T, 2, 16]), t(rng, [T, 2, 16])
    out, softmax = compat.flash_attn_unpadded(q, k, v, cu, cu, max(lens), max(lens), 0.25, causal=True)
    assert softmax is None
    c = cu.numpy().tolist()
    for a, b in zip(c[:-1], c[1:]):
        ref = oracle(q[a:b].unsqueeze(0), k[a:b].unsqueeze(0), v[a:b].unsqueeze(0), True, 0.25)[0]
        np.testing.assert_allclose(out[a:b].numpy(), ref, **TOL)


@needs_33
def test_signatures_match_paddle():
    import paddle.nn.functional.flash_attention as FM
    for ours, theirs in ((compat.flash_attention, FM.flash_attention),
                         (compat.flash_attn_unpadded, FM.flash_attn_unpadded),
                         (compat.scaled_dot_product_attention, PF.scaled_dot_product_attention)):
        a, b = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
        assert list(a) == list(b), ours.__name__
        for n in a:
            assert a[n].kind == b[n].kind and a[n].default == b[n].default, (ours.__name__, n)


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v: compat.scaled_dot_product_attention(q, k, v, attn_mask=paddle.ones([1])), "attn_mask"),
    (lambda q, k, v: compat.scaled_dot_product_attention(q, k, v, dropout_p=0.1), "dropout"),
    (lambda q, k, v: compat.flash_attention(q, k, v, return_softmax=True), "return_softmax"),
    (lambda q, k, v: compat.flash_attention(q, k, v, fixed_seed_offset=paddle.zeros([2], "int64")),
     "fixed_seed_offset"),
    (lambda q, k, v: compat.flash_attention(q, k[:, :4], v[:, :4], dropout=0.1), "dropout"),
    (lambda q, k, v: compat.scaled_dot_product_attention(q[:, :3], k, v, is_causal=True), "more keys"),
    (lambda q, k, v: compat.scaled_dot_product_attention(q, k[:, :, :1], v[:, :, :1], enable_gqa=False),
     "enable_gqa"),
])
def test_what_cannot_be_honoured_raises(rng, call, match):
    q, k, v = t(rng, [1, 6, 2, 16]), t(rng, [1, 6, 2, 16]), t(rng, [1, 6, 2, 16])
    with pytest.raises(NotImplementedError, match=match):
        call(q, k, v)
