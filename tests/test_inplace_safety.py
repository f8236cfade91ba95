"""In-place safety of the package's PyLayers: a tensor saved for the backward pass and modified in place after the
forward makes backward raise (naming the op and the argument), as Paddle's own ops do, instead of returning
gradients of the modified values. One test per op family, plus the controls (no change, or a change to a tensor
the backward does not use, runs through)."""
import numpy as np
import paddle
import pytest

import paddle_dsa.nn.functional as F

MSG = "was modified by an inplace operation"
# Paddle re-raises an error from a PyLayer backward wrapped (OSError "(External) ... RuntimeError: ..." on 3.3)
RAISED = (RuntimeError, OSError)


def t(rng, shape, grad=True, scale=1.0, dtype="float32"):
    x = paddle.to_tensor((rng.standard_normal(shape) * scale).astype(np.float32)).astype(dtype)
    x.stop_gradient = not grad
    return x


def flash_inputs(rng):
    x = t(rng, [2, 9, 2, 16])
    return x, x * 1.0, t(rng, [2, 11, 1, 16]), t(rng, [2, 11, 1, 16])


def test_flash_attention_query_scaled_in_place_raises(rng):
    """The issue's case: q = x * 1.0; out = flash_attention(q, k, v); q.scale_(3.0); backward."""
    x, q, k, v = flash_inputs(rng)
    out = F.flash_attention(q, k, v, causal=True)
    q.scale_(3.0)
    with pytest.raises(RAISED, match=rf"flash_attention: `query`, saved for the backward pass, {MSG}"):
        out.sum().backward()


@pytest.mark.parametrize("which", ["key", "value", "out", "softmax_lse"])
def test_flash_attention_other_saved_tensors(rng, which):
    x, q, k0, v0 = flash_inputs(rng)
    k, v = k0 * 1.0, v0 * 1.0
    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    loss = (out * 1.0).sum() + (lse * 1.0).sum()     # the loss reads copies: the in-place change hits only saved
    {"key": k, "value": v, "out": out, "softmax_lse": lse}[which].scale_(0.5)
    with pytest.raises(RAISED, match=rf"flash_attention: `{which}`, saved for the backward pass, {MSG}"):
        loss.backward()


def test_flash_attention_varlen_raises(rng):
    q0, k, v = t(rng, [12, 2, 16]), t(rng, [14, 2, 16]), t(rng, [14, 2, 16])
    q = q0 * 1.0
    cu_q = paddle.to_tensor(np.array([0, 5, 12], np.int32))
    cu_k = paddle.to_tensor(np.array([0, 6, 14], np.int32))
    out = F.flash_attention_varlen(q, k, v, cu_q, cu_k, 7, 8, causal=True)
    q.add_(paddle.ones_like(q))
    with pytest.raises(RAISED, match=rf"flash_attention_varlen: `query`, saved for the backward pass, {MSG}"):
        out.sum().backward()


def test_flash_attention_untouched_or_unsaved_changes_run(rng):
    """Controls: no in-place change; an in-place change to a tensor the backward does not keep (a copy of the
    output) — gradients equal a clean run's."""
    x, q, k, v = flash_inputs(rng)
    out = F.flash_attention(q, k, v, causal=True)
    out.sum().backward()
    g_clean = x.grad.numpy().copy()
    x.clear_gradient()
    out = F.flash_attention(x * 1.0, k, v, causal=True)
    c = out * 1.0
    c.scale_(2.0)
    (c * 0.5).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), g_clean, rtol=1e-6, atol=1e-7)


def sparse_inputs(rng):
    q0, kv0 = t(rng, [1, 6, 4, 24]), t(rng, [1, 9, 24])
    idx = paddle.to_tensor(rng.integers(-1, 9, (1, 6, 5)).astype(np.int32))
    return q0 * 1.0, kv0 * 1.0, idx


@pytest.mark.parametrize("which", ["query", "kv", "out"])
def test_sparse_attention_raises(rng, which):
    q, kv, idx = sparse_inputs(rng)
    out = F.sparse_attention(q, kv, idx, v_head_dim=16)
    loss = (out * 1.0).sum()
    {"query": q, "kv": kv, "out": out}[which].scale_(2.0)
    with pytest.raises(RAISED, match=rf"sparse_attention: `{which}`, saved for the backward pass, {MSG}"):
        loss.backward()


def test_sparse_attention_sink_raises(rng):
    q, kv, idx = sparse_inputs(rng)
    sink = t(rng, [4]) * 1.0
    out = F.sparse_attention(q, kv, idx, v_head_dim=16, attn_sink=sink)
    sink.scale_(2.0)
    with pytest.raises(RAISED, match=rf"sparse_attention: `attn_sink`, saved for the backward pass, {MSG}"):
        out.sum().backward()


@pytest.mark.parametrize("which", ["index_q", "weights", "softmax_lse"])
def test_indexer_kl_loss_raises(rng, which):
    iq, ik, w = t(rng, [1, 6, 4, 16]) * 1.0, t(rng, [1, 6, 16]) * 1.0, t(rng, [1, 6, 4]) * 1.0
    q, kv = t(rng, [1, 6, 2, 24], grad=False), t(rng, [1, 6, 24], grad=False)
    lse = t(rng, [1, 2, 6], grad=False) + 3.0
    loss = F.indexer_kl_loss(iq, ik, w, q, kv, lse)
    {"index_q": iq, "weights": w, "softmax_lse": lse}[which].scale_(2.0)
    with pytest.raises(RAISED, match=rf"indexer_kl_loss: `{which}`, saved for the backward pass, {MSG}"):
        loss.backward()
