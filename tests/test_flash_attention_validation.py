"""Every validation error of flash_attention / flash_attention_varlen: type, message, raised before work."""
import numpy as np
import paddle
import pytest

import importlib

import paddle_dsa
from paddle_dsa.nn import functional as F


fa_module = importlib.import_module("paddle_dsa.nn.functional.flash_attention")


def t(shape, dtype="bfloat16"):
    return paddle.zeros(shape, dtype=dtype)


Q, K = [2, 8, 4, 32], [2, 8, 2, 32]


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((np.zeros(Q), t(K), t(K)), {}, TypeError, "`query` must be a paddle.Tensor"),
    ((t(Q), None, t(K)), {}, TypeError, "`key` must be a paddle.Tensor"),
    ((t([8, 4, 32]), t(K), t(K)), {}, ValueError, r"`query` must have rank 4"),
    ((t(Q), t(K), t([2, 8, 2, 32], "float16")), {}, TypeError, "must share one dtype"),
    ((t(Q, "int32"), t(K, "int32"), t(K, "int32")), {}, TypeError, "dtype int32 is not supported"),
    ((t(Q), t([3, 8, 2, 32]), t([3, 8, 2, 32])), {}, ValueError, "batch"),
    ((t(Q), t(K), t([2, 9, 2, 32])), {}, ValueError, "`key` and `value` must have the same shape"),
    ((t(Q), t([2, 8, 2, 16]), t([2, 8, 2, 16])), {}, ValueError, "head_dim 32 != `key` head_dim 16"),
    ((t(Q), t(K), t([2, 8, 1, 16])), {}, ValueError, "must have the same shape \\(but for the value head_dim\\)"),
    ((t(Q), t([2, 8, 3, 32]), t([2, 8, 3, 32])), {}, ValueError, r"multiple of the key/value head count \(3\)"),
    ((t([2, 8, 0, 32]), t(K), t(K)), {}, ValueError, "empty axis"),      # no heads (B, Sq, Sk may be 0)
    ((t(Q), t(K), t(K)), {"causal": 1}, TypeError, "`causal` must be a bool"),
    ((t(Q), t(K), t(K)), {"softmax_scale": "x"}, TypeError, "`softmax_scale` must be a real number"),
    ((t(Q), t(K), t(K)), {"softmax_scale": float("nan")}, ValueError, "`softmax_scale` must be finite"),
    ((t(Q), t(K), t(K)), {"window_size": 3}, TypeError, "`window_size` must be a pair"),
    ((t(Q), t(K), t(K)), {"window_size": (-2, 0)}, ValueError, "`window_size` left must be >= 0, or -1"),
    ((t(Q), t(K), t(K)), {"window_size": (0, 1.5)}, TypeError, "`window_size` right must be an int"),
    ((t(Q), t(K), t(K)), {"return_softmax_lse": None}, TypeError, "`return_softmax_lse` must be a bool"),
])
def test_dense_validation(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        F.flash_attention(*args, **kwargs)


def cu(vals):
    return paddle.to_tensor(np.array(vals, np.int32))


VQ, VK = [10, 4, 32], [12, 2, 32]


@pytest.mark.parametrize("args,exc,match", [
    ((t(VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 6, 12]), 6, 6), None, None),
    ((t([1] + VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 6, 12]), 6, 6), ValueError, r"`query` must have rank 3"),
    ((t(VQ), t(VK), t(VK), [0, 4, 10], cu([0, 6, 12]), 6, 6), TypeError, "`cu_seqlens_q` must be a paddle.Tensor"),
    ((t(VQ), t(VK), t(VK), paddle.to_tensor(np.array([0, 4, 10], np.int64)), cu([0, 6, 12]), 6, 6), TypeError,
     "`cu_seqlens_q` dtype int64 is not supported; supported: int32"),
    ((t(VQ), t(VK), t(VK), cu([[0, 4, 10]]), cu([0, 6, 12]), 6, 6), ValueError, "`cu_seqlens_q` must have rank 1"),
    ((t(VQ), t(VK), t(VK), cu([0]), cu([0, 6, 12]), 6, 6), ValueError, "at least 2 entries"),
    ((t(VQ), t(VK), t(VK), cu([1, 4, 10]), cu([0, 6, 12]), 6, 6), ValueError, "must start at 0"),
    ((t(VQ), t(VK), t(VK), cu([0, 5, 4]), cu([0, 6, 12]), 6, 6), ValueError, "non-decreasing"),
    ((t(VQ), t(VK), t(VK), cu([0, 4, 11]), cu([0, 6, 12]), 7, 6), ValueError, "exceeds the 10 tokens"),
    ((t(VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 6, 12]), 5, 6), ValueError, "`max_seqlen_q` = 5 is smaller"),
    ((t(VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 6, 12]), 6, 5), ValueError, "`max_seqlen_k` = 5 is smaller"),
    ((t(VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 12]), 6, 12), ValueError, "same batch"),
    ((t(VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 6, 12]), 6.0, 6), TypeError, "`max_seqlen_q` must be an int"),
    ((t(VQ), t(VK), t(VK), cu([0, 4, 10]), cu([0, 6, 12]), -1, 6), ValueError, "`max_seqlen_q` must be >= 0"),
])
def test_varlen_validation(args, exc, match):
    if exc is None:
        F.flash_attention_varlen(*args)  # the valid baseline of this table
        return
    with pytest.raises(exc, match=match):
        F.flash_attention_varlen(*args)


def test_cu_seqlens_value_checks_can_be_turned_off(monkeypatch):
    """With the value checks off, validation reads nothing on the host for cu_seqlens on a GPU place (documented
    trade-off); on a CPU place the values are on the host already and are always checked."""
    from paddle_dsa import validation
    from paddle_dsa._port import PORT
    monkeypatch.setattr(paddle_dsa.config, "check_cu_seqlens_values", False)
    monkeypatch.setattr(PORT, "is_gpu", lambda t: True)

    def no_host_read(_):
        raise AssertionError("cu_seqlens read on the host")
    monkeypatch.setattr(PORT, "to_numpy", no_host_read)
    assert validation.check_cu_seqlens("op", "cu_seqlens_q", cu([0, 4, 10]), 10, "max_seqlen_q", 1) == 2


@pytest.mark.parametrize("dtype,dims,match", [
    ("float32", (64, 64), "dtype float32 is not supported on a GPU place"),
    ("bfloat16", (80, 80), "\\(80, 80\\) is not supported on a GPU place"),
    ("float16", (17, 17), "\\(17, 17\\) is not supported on a GPU place"),
    ("bfloat16", (128, 64), "\\(128, 64\\) is not supported on a GPU place"),
    ("bfloat16", (128, 192), "\\(128, 192\\) is not supported on a GPU place"),
    ("bfloat16", (320, 320), "\\(320, 320\\) is not supported on a GPU place"),
])
def test_gpu_table_rejects_untuned_shapes(dtype, dims, match):
    """The one table (ops/flash_attention/supported.py) guards CUDA places; this host has none, so call the check."""
    with pytest.raises((ValueError, TypeError), match=match):
        fa_module._check_gpu_table("flash_attention", dtype, *dims)


@pytest.mark.parametrize("dims", [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)])
def test_gpu_table_accepts_the_forward_pairs(dims):
    fa_module._check_gpu_table("flash_attention", "bfloat16", *dims)
    fa_module._check_gpu_table("flash_attention", "float16", *dims)
    assert fa_module._bwd_on_kernel(*dims)     # every forward pair has a backward kernel (H200 2026-12-04)


def test_static_mode_raises_not_implemented():
    paddle.enable_static()
    try:
        q = paddle.static.data("q", [2, 8, 4, 32], "float32")
        with pytest.raises(NotImplementedError, match="static graph mode is not supported"):
            F.flash_attention(q, q, q)
    finally:
        paddle.disable_static()


def test_reference_accepts_any_head_dim_and_heads():
    out = F.flash_attention(t([1, 3, 5, 17], "float32"), t([1, 4, 5, 17], "float32"), t([1, 4, 5, 17], "float32"))
    assert list(out.shape) == [1, 3, 5, 17]
