"""Small contract items of docs/api.md: window sides beyond int32 are clamped (no overflow), cu_seqlens on a CPU place
are checked even with config.check_cu_seqlens_values off, and paddle.grad with retain_graph differentiates twice."""
import numpy as np
import paddle
import pytest

import paddle_dsa.nn.functional as F
from paddle_dsa import config


def t(rng, shape, grad=True):
    x = paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))
    x.stop_gradient = not grad
    return x


def test_huge_window_is_unbounded(rng):
    q, k, v = t(rng, [1, 9, 2, 16]), t(rng, [1, 9, 2, 16]), t(rng, [1, 9, 2, 16])
    a = F.flash_attention(q, k, v, window_size=(2**70, 0))
    b = F.flash_attention(q, k, v, window_size=(-1, 0))
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_cpu_cu_seqlens_checked_with_value_checks_off(rng, monkeypatch):
    monkeypatch.setattr(config, "check_cu_seqlens_values", False)
    q, k, v = t(rng, [10, 2, 16]), t(rng, [10, 2, 16]), t(rng, [10, 2, 16])
    bad = paddle.to_tensor(np.array([0, 7, 4, 10], np.int32))
    with pytest.raises(ValueError, match="non-decreasing"):
        F.flash_attention_varlen(q, k, v, bad, bad, 7, 7)


def test_paddle_grad_with_retain_graph_twice(rng):
    q, k, v = t(rng, [1, 6, 2, 16]), t(rng, [1, 6, 2, 16]), t(rng, [1, 6, 2, 16])
    loss = F.flash_attention(q, k, v, causal=True).sum()
    g1 = paddle.grad(loss, [q, k, v], retain_graph=True)
    g2 = paddle.grad(loss, [q, k, v], retain_graph=True)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
