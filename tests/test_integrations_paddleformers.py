"""paddle_dsa.integrations.paddleformers: register() adds our attention to PaddleFormers' AttentionInterface (a stub
with GeneralInterface's class-wide register when paddleformers is not installed: its install pulls transformers,
datasets, librosa...; the real registry when it is), and the registered function follows PaddleFormers'
convention: [b, h, s, d] in, ([b, s, h * d], None) out, is_causal inference, 1- / 4-column startend_row_indices;
outputs against a float64 oracle of PaddleFormers' sdpa forward."""
import importlib
import sys
import types

import numpy as np
import paddle
import pytest

from paddle_dsa.integrations import paddleformers as pf


class _StubInterface:
    _global_mapping = {"sdpa": None}

    @classmethod
    def register(cls, key, value):
        cls._global_mapping.update({key: value})


@pytest.fixture
def registry(monkeypatch):
    try:
        return importlib.import_module("paddleformers.nn.attention.interface").AttentionInterface
    except Exception:  # noqa: BLE001  (not installed, or its heavy dependencies are not)
        mod = types.ModuleType("paddleformers.nn.attention.interface")
        mod.AttentionInterface = _StubInterface
        for name in ("paddleformers", "paddleformers.nn", "paddleformers.nn.attention"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "paddleformers.nn.attention.interface", mod)
        return _StubInterface


def test_import_does_not_import_paddleformers():
    import subprocess
    code = ("import sys, paddle_dsa, paddle_dsa.integrations.paddleformers; "
            "assert 'paddleformers' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_matches_paddleformers_sdpa(rng):
    """Against PaddleFormers' own sdpa forward where paddleformers (and its dependencies) are installed."""
    try:
        sdpa = importlib.import_module("paddleformers.nn.attention.sdpa_attention").sdpa_attention_forward
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"paddleformers not importable here: {type(e).__name__}")
    q, k, v = t(rng, [2, 4, 9, 32]), t(rng, [2, 2, 9, 32]), t(rng, [2, 2, 9, 32])
    ours, _ = pf.attention_forward(Module(), q, k, v)
    theirs, _ = sdpa(Module(), q, k, v)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-6)


def test_register(registry):
    assert pf.register() == "paddle_dsa" and registry._global_mapping["paddle_dsa"] is pf.attention_forward
    assert pf.register("dsa2") == "dsa2" and registry._global_mapping["dsa2"] is pf.attention_forward


def oracle(q, k, v, allowed):
    """[b, h, s, d] float64 attention with a [b, s, s] allowed mask -> [b, s, h * d]."""
    q, k, v = (np.asarray(x.numpy(), np.float64) for x in (q, k, v))
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    s = np.where(allowed[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("bhij,bhjd->bihd", p / p.sum(-1, keepdims=True), v)
    return o.reshape(o.shape[0], o.shape[1], -1)


class Module:
    training = False
    is_causal = True


def t(rng, shape):
    return paddle.to_tensor(rng.standard_normal(shape).astype(np.float32))


def test_causal_inference_and_layout(rng, registry):
    pf.register()
    fn = registry._global_mapping["paddle_dsa"]
    q, k, v = t(rng, [2, 3, 7, 16]), t(rng, [2, 3, 7, 16]), t(rng, [2, 3, 7, 16])
    out, extra = fn(Module(), q, k, v)
    assert extra is None and list(out.shape) == [2, 7, 48]
    np.testing.assert_allclose(out.numpy(), oracle(q, k, v, np.tril(np.ones((2, 7, 7), bool))), rtol=2e-5, atol=2e-6)
    m = Module()
    m.is_causal = False
    out, _ = fn(m, q, k, v)
    np.testing.assert_allclose(out.numpy(), oracle(q, k, v, np.ones((2, 7, 7), bool)), rtol=2e-5, atol=2e-6)


def test_document_mask_three_dims(rng):
    """A [b, 1, s] startend (3 dims) is one column: causal documents."""
    q, k, v = t(rng, [1, 2, 6, 16]), t(rng, [1, 2, 6, 16]), t(rng, [1, 2, 6, 16])
    sri = paddle.to_tensor(np.array([[[2, 2, 6, 6, 6, 6]]], np.int32))
    out, _ = pf.attention_forward(Module(), q, k, v, attn_mask_startend_row_indices=sri)
    allowed = np.zeros((1, 6, 6), bool)
    allowed[0, :2, :2] = np.tril(np.ones((2, 2), bool))
    allowed[0, 2:, 2:] = np.tril(np.ones((4, 4), bool))
    np.testing.assert_allclose(out.numpy(), oracle(q, k, v, allowed), rtol=2e-5, atol=2e-6)


def test_what_cannot_be_honoured(rng):
    q = t(rng, [1, 2, 4, 16])
    with pytest.raises(NotImplementedError, match="attention_mask"):
        pf.attention_forward(Module(), q, q, q, attention_mask=paddle.ones([1, 1, 4, 4]))
    with pytest.raises(NotImplementedError, match="sink"):
        pf.attention_forward(Module(), q, q, q, sink=paddle.zeros([2]))
    m = Module()
    m.training = True
    with pytest.raises(NotImplementedError, match="dropout"):
        pf.attention_forward(m, q, q, q, dropout=0.1)
