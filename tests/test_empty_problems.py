"""Empty problems (issue 13.3): B = 0, Sq = 0 or Sk = 0 in the dense forms (and Tq = 0 / Tk = 0 in the packed ones)
return the documented result instead of raising: empty outputs for an empty axis; for Sk = 0 with rows present,
out 0 and softmax_lse -inf (the rule of rows that see no key), index scores -inf with lse 0, attention scores 0
with l1norm 0; zero gradients. On a GPU place nothing is exported or launched (PORT.export patched to raise)."""
import numpy as np
import paddle
import pytest

import paddle_dsa as P
import paddle_dsa.nn.functional as F
from paddle_dsa._port import PORT


def t(shape, dtype="float32", grad=True, seed=0):
    x = paddle.to_tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).astype(dtype)
    x.stop_gradient = not grad
    return x


@pytest.fixture(params=["cpu", "gpu-place"])
def place(request, monkeypatch):
    """cpu: the reference path's dispatch; gpu-place: PORT says GPU, and any export (a kernel call) raises."""
    if request.param == "gpu-place":
        monkeypatch.setattr(PORT, "is_gpu", lambda x: True)

        def no_export(*a, **k):
            raise AssertionError("an empty problem reached a kernel seam")
        monkeypatch.setattr(PORT, "export", no_export)
    return request.param


def backward_sum(*outs):
    """d(sum of outs)/d inputs, also for zero-size outputs (Paddle 2.6 cannot reduce an empty tensor)."""
    paddle.autograd.backward(list(outs), [paddle.ones_like(o) for o in outs])


def zero_grad(x):
    """x's gradient is zeros of its shape; for a zero-size x, None is accepted too (Paddle 2.6 leaves the gradient of
    an empty tensor unset)."""
    if x.grad is None:
        assert 0 in list(x.shape), f"no gradient for a non-empty input of shape {list(x.shape)}"
        return
    assert list(x.grad.shape) == list(x.shape) and (x.grad.astype("float32").numpy() == 0).all()


def dt(place):
    return "bfloat16" if place == "gpu-place" else "float32"


@pytest.mark.parametrize("b,sq,sk", [(0, 5, 6), (2, 0, 6), (2, 5, 0)])
def test_flash_attention(place, b, sq, sk):
    q, k, v = t([b, sq, 4, 64], dt(place)), t([b, sk, 2, 64], dt(place)), t([b, sk, 2, 64], dt(place))
    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    assert list(out.shape) == [b, sq, 4, 64] and list(lse.shape) == [b, 4, sq]
    assert (out.astype("float32").numpy() == 0).all() and np.isneginf(lse.numpy()).all()
    backward_sum(out)
    for x in (q, k, v):
        zero_grad(x)


@pytest.mark.parametrize("tq,tk", [(0, 6), (5, 0)])
def test_flash_attention_varlen(place, tq, tk):
    q, k, v = t([tq, 4, 64], dt(place)), t([tk, 2, 64], dt(place)), t([tk, 2, 64], dt(place))
    cu_q = paddle.to_tensor(np.array([0, tq], np.int32))
    cu_k = paddle.to_tensor(np.array([0, tk], np.int32))
    out, lse = F.flash_attention_varlen(q, k, v, cu_q, cu_k, tq, tk, causal=True, return_softmax_lse=True)
    assert list(out.shape) == [tq, 4, 64] and list(lse.shape) == [4, tq]
    assert (out.astype("float32").numpy() == 0).all() and np.isneginf(lse.numpy()).all()
    backward_sum(out)
    for x in (q, k, v):
        zero_grad(x)


@pytest.mark.parametrize("b,sq,skv", [(0, 3, 5), (1, 0, 5), (1, 3, 0)])
def test_sparse_attention(place, b, sq, skv):
    q, kv = t([b, sq, 64, 576], dt(place)), t([b, skv, 576], dt(place))
    idx = paddle.to_tensor(np.zeros((b, sq, 4), np.int32))
    sink = t([64])
    out, lse = P.sparse_attention(q, kv, idx, v_head_dim=512, attn_sink=sink, return_softmax_lse=True)
    assert list(out.shape) == [b, sq, 64, 512] and list(lse.shape) == [b, 64, sq]
    assert (out.astype("float32").numpy() == 0).all() and np.isneginf(lse.numpy()).all()
    backward_sum(out)
    for x in (q, kv, sink):
        zero_grad(x)


@pytest.mark.parametrize("b,sq,sk", [(0, 3, 5), (1, 0, 5), (1, 3, 0)])
def test_dense_score_ops(place, b, sq, sk):
    iq, ik, w = t([b, sq, 16, 64], dt(place), False), t([b, sk, 64], dt(place), False), t([b, sq, 16], grad=False)
    s = P.indexer_score(iq, ik, w)
    assert list(s.shape) == [b, sq, sk] and np.isneginf(s.numpy()).all()
    s, lse = P.dense_indexer_score_recompute(iq, ik, w)
    assert list(lse.shape) == [b, sq] and (lse.numpy() == 0).all() and np.isneginf(s.numpy()).all()
    q, kv = t([b, sq, 64, 576], dt(place), False), t([b, sk, 576], dt(place), False)
    a, l1 = P.dense_attn_score_recompute(q, kv, t([b, 64, sq], grad=False))
    assert list(a.shape) == [b, sq, sk] and (a.numpy() == 0).all() and (l1.numpy() == 0).all()


@pytest.mark.parametrize("b,sq,sk", [(0, 3, 5), (1, 0, 5), (1, 3, 0)])
def test_sparse_score_ops(place, b, sq, sk):
    iq, ik, w = t([b, sq, 16, 64], dt(place), False), t([b, sk, 64], dt(place), False), t([b, sq, 16], grad=False)
    idx = paddle.to_tensor(np.zeros((b, sq, 4), np.int32))
    s, lse = P.sparse_indexer_score_recompute(iq, ik, w, idx)
    assert list(s.shape) == [b, sq, 4] and np.isneginf(s.numpy()).all() and (lse.numpy() == 0).all()
    q, kv = t([b, sq, 64, 576], dt(place), False), t([b, sk, 576], dt(place), False)
    a, l1 = P.sparse_attn_score_recompute(q, kv, t([b, 64, sq], grad=False), idx)
    assert list(a.shape) == [b, sq, 4] and (a.numpy() == 0).all() and (l1.numpy() == 0).all()
