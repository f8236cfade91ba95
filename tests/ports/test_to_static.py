"""paddle.jit.to_static on each release: full_graph=True (AST, a static program) is refused with
NotImplementedError, never traced into a program whose backward skips the PyLayer; full_graph=False
(SOT) breaks the graph at the PyLayer and gives the eager result and gradients."""
import numpy as np
import pytest

import paddle_dsa  # noqa: F401
from paddle_dsa.nn import functional as F

import paddle


def _inputs():
    rng = np.random.default_rng(0)
    q = paddle.to_tensor(rng.standard_normal((1, 5, 2, 8)).astype(np.float32))
    k = paddle.to_tensor(rng.standard_normal((1, 7, 1, 8)).astype(np.float32))
    v = paddle.to_tensor(rng.standard_normal((1, 7, 1, 8)).astype(np.float32))
    for t in (q, k, v):
        t.stop_gradient = False
    return q, k, v


def _loss(q, k, v):
    out = F.flash_attention(q, k, v, causal=True)
    return (out * out).sum()


def test_full_graph_is_refused():
    fn = paddle.jit.to_static(_loss, full_graph=True)
    with pytest.raises(NotImplementedError, match="static graph mode is not supported"):
        fn(*_inputs())


def test_sot_matches_eager():
    q, k, v = _inputs()
    loss = _loss(q, k, v)
    loss.backward()
    eager = [loss.numpy()] + [t.grad.numpy() for t in (q, k, v)]

    q, k, v = _inputs()
    fn = paddle.jit.to_static(_loss, full_graph=False)
    loss = fn(q, k, v)
    loss.backward()
    sot = [loss.numpy()] + [t.grad.numpy() for t in (q, k, v)]
    for a, b in zip(eager, sot):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
