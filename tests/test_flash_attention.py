"""flash_attention (dense BSHD) on the reference path: forward, softmax_lse and gradients vs float64."""
import math

import numpy as np
import paddle
import pytest

import paddle_dsa
from paddle_dsa.nn import functional as F

import attention_ref as R
from flash_helpers import assert_close, check_dense, dense_reference, make, to64

# (B, Sq, Sk, H, Hkv, D)
SHAPES = [
    (1, 1, 1, 1, 1, 16),
    (2, 17, 17, 4, 4, 32),
    (1, 255, 255, 2, 1, 64),   # GQA 2:1, off the 128-key block grid
    (2, 17, 40, 8, 1, 32),     # MQA 8:1, Sq < Sk
    (1, 40, 17, 4, 2, 32),     # GQA 4:2, Sq > Sk (dead causal rows)
]
WINDOWS = [(-1, -1), (8, 0), (3, 5), (0, -1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_forward_and_grads_match_float64(rng, shape, causal, dtype):
    b, sq, sk, h, hkv, d = shape
    q, q64 = make(rng, [b, sq, h, d], dtype)
    k, k64 = make(rng, [b, sk, hkv, d], dtype)
    v, v64 = make(rng, [b, sk, hkv, d], dtype)
    out, lse = F.flash_attention(q, k, v, causal=causal, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, sq, h, d], dtype, requires_grad=False)
    gl = rng.standard_normal([b, h, sq])
    # The lse gradient only flows through live rows (dead rows are -inf, masked out of the loss).
    gl_t = paddle.to_tensor(gl.astype(np.float32))
    live = paddle.isfinite(lse)
    loss = (out.astype("float32") * dout.astype("float32")).sum() + paddle.where(live, lse * gl_t, paddle.zeros_like(lse)).sum()
    loss.backward()
    assert out.dtype == q.dtype and lse.dtype == paddle.float32
    assert list(lse.shape) == [b, h, sq]
    gl = np.where(np.isfinite(lse.numpy()), gl, 0.0)
    check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, gl, 1 / math.sqrt(d), causal, (-1, -1))


@pytest.mark.parametrize("shape", [(1, 20, 20, 2, 2, 192, 128), (2, 17, 40, 4, 2, 24, 40), (1, 40, 17, 4, 1, 32, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (5, 0))])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_value_head_dim_differs(rng, shape, causal, window, dtype):
    """value head_dim Dv != D (MLA in MHA form: D 192 = 128 + 64 rope, Dv 128; Dv > D; GQA / MQA, Sq > Sk): out
    [B, Sq, H, Dv], softmax_lse and the gradients (dv [B, Sk, Hkv, Dv]) against float64; scale 1/sqrt(D)."""
    b, sq, sk, h, hkv, d, dv = shape
    q, q64 = make(rng, [b, sq, h, d], dtype)
    k, k64 = make(rng, [b, sk, hkv, d], dtype)
    v, v64 = make(rng, [b, sk, hkv, dv], dtype)
    out, lse = F.flash_attention(q, k, v, causal=causal, window_size=window, return_softmax_lse=True)
    assert list(out.shape) == [b, sq, h, dv] and list(lse.shape) == [b, h, sq]
    dout, dout64 = make(rng, [b, sq, h, dv], dtype, requires_grad=False)
    (out.astype("float32") * dout.astype("float32")).sum().backward()
    assert list(v.grad.shape) == [b, sk, hkv, dv] and list(k.grad.shape) == [b, sk, hkv, d]
    check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, None, 1 / math.sqrt(d), causal, window)


def test_value_head_dim_differs_empty_problem():
    """No key: out [B, Sq, H, Dv] of zeros, lse -inf, zero gradients shaped like the inputs."""
    q = paddle.ones([1, 3, 2, 24], dtype="float32")
    k, v = paddle.ones([1, 0, 2, 24], dtype="float32"), paddle.ones([1, 0, 2, 8], dtype="float32")
    q.stop_gradient = False
    out, lse = F.flash_attention(q, k, v, return_softmax_lse=True)
    assert list(out.shape) == [1, 3, 2, 8] and (out.numpy() == 0).all() and np.isneginf(lse.numpy()).all()
    out.sum().backward()
    assert list(q.grad.shape) == [1, 3, 2, 24] and (q.grad.numpy() == 0).all()


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [SHAPES[3], SHAPES[4], (1, 130, 300, 2, 2, 16)], ids=lambda s: "x".join(map(str, s)))
def test_windows(rng, shape, causal, window):
    b, sq, sk, h, hkv, d = shape
    dtype = "bfloat16"
    q, q64 = make(rng, [b, sq, h, d], dtype)
    k, k64 = make(rng, [b, sk, hkv, d], dtype)
    v, v64 = make(rng, [b, sk, hkv, d], dtype)
    out, lse = F.flash_attention(q, k, v, causal=causal, window_size=window, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, sq, h, d], dtype, requires_grad=False)
    (out.astype("float32") * dout.astype("float32")).sum().backward()
    check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, None, 1 / math.sqrt(d), causal, window)


def test_float64_inputs_exact(rng):
    """float64 on the reference path computes in float64: out to 1e-10; the gradients recompute from the
    float32 softmax_lse of the contract, so they agree to fp32 resolution (1e-6)."""
    shape = (2, 33, 47, 4, 2, 24)
    b, sq, sk, h, hkv, d = shape
    q, q64 = make(rng, [b, sq, h, d], "float64")
    k, k64 = make(rng, [b, sk, hkv, d], "float64")
    v, v64 = make(rng, [b, sk, hkv, d], "float64")
    out, lse = F.flash_attention(q, k, v, causal=True, window_size=(5, -1), softmax_scale=0.3, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, sq, h, d], "float64", requires_grad=False)
    (out * dout).sum().backward()
    ro, rl, rdq, rdk, rdv = dense_reference(q64, k64, v64, dout64, None, 0.3, True, (5, -1))
    np.testing.assert_allclose(out.numpy(), ro, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lse.numpy(), rl.astype(np.float32), rtol=1e-6)
    for g, r in ((q.grad, rdq), (k.grad, rdk), (v.grad, rdv)):
        assert R.rel_rms(g.numpy(), r) < 1e-6


@pytest.mark.parametrize("k_scale", [8, 32, 64, 5000])
def test_wide_score_range_no_nan(rng, k_scale):
    """K scaled up to 5000 (logit std ~ k_scale): no NaN/Inf, error within the bf16 floor."""
    b, sq, sk, h, hkv, d = 1, 129, 257, 2, 1, 64
    dtype = "bfloat16"
    q, q64 = make(rng, [b, sq, h, d], dtype)
    k, k64 = make(rng, [b, sk, hkv, d], dtype, scale=k_scale)
    v, v64 = make(rng, [b, sk, hkv, d], dtype)
    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, sq, h, d], dtype, requires_grad=False)
    (out.astype("float32") * dout.astype("float32")).sum().backward()
    check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, None, 1 / 8, True, (-1, -1))


@pytest.mark.parametrize("window,causal", [((-1, -1), True), ((2, 0), True), ((0, 0), False)])
def test_fully_masked_rows(rng, window, causal):
    """Sq > Sk: the first Sq - Sk rows see no key: out exactly 0, lse -inf, their dq exactly 0."""
    b, sq, sk, h, d = 2, 50, 20, 3, 16
    q, _ = make(rng, [b, sq, h, d], "bfloat16")
    k, _ = make(rng, [b, sk, h, d], "bfloat16")
    v, _ = make(rng, [b, sk, h, d], "bfloat16")
    out, lse = F.flash_attention(q, k, v, causal=causal, window_size=window, return_softmax_lse=True)
    dead = sq - sk
    (out.astype("float32").sum() + paddle.where(paddle.isfinite(lse), lse, paddle.zeros_like(lse)).sum()).backward()
    o = to64(out)
    assert (o[:, :dead] == 0).all()
    assert np.isneginf(lse.numpy()[:, :, :dead]).all()
    assert np.isfinite(lse.numpy()[:, :, dead:]).all()
    assert (to64(q.grad)[:, :dead] == 0).all()
    for g in (q.grad, k.grad, v.grad):
        assert np.isfinite(to64(g)).all()


def test_seed_000_causal_bf16_dv_finite(rng):
    """Seed 000: B=1 H=1 S=256 D=64 causal bf16 - dV finite and within tolerance."""
    b, s, h, d = 1, 256, 1, 64
    q, q64 = make(rng, [b, s, h, d], "bfloat16")
    k, k64 = make(rng, [b, s, h, d], "bfloat16")
    v, v64 = make(rng, [b, s, h, d], "bfloat16")
    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, s, h, d], "bfloat16", requires_grad=False)
    (out.astype("float32") * dout.astype("float32")).sum().backward()
    assert np.isfinite(to64(v.grad)).all()
    check_dense("bfloat16", q, k, v, out, lse, q64, k64, v64, dout64, None, 1 / 8, True, (-1, -1))


def test_long_sequence_4097(rng):
    """S = 4097 (one past a power of two) forward and backward, memory O(S x block)."""
    b, s, h, d = 1, 4097, 1, 16
    q, q64 = make(rng, [b, s, h, d], "bfloat16")
    k, k64 = make(rng, [b, s, h, d], "bfloat16")
    v, v64 = make(rng, [b, s, h, d], "bfloat16")
    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, s, h, d], "bfloat16", requires_grad=False)
    (out.astype("float32") * dout.astype("float32")).sum().backward()
    check_dense("bfloat16", q, k, v, out, lse, q64, k64, v64, dout64, None, 0.25, True, (-1, -1))


def test_zero_and_negative_scale(rng):
    """softmax_scale = 0 gives uniform attention and dq = dk = 0 exactly; negative scales work."""
    b, s, h, d = 1, 19, 2, 16
    q, q64 = make(rng, [b, s, h, d], "float32")
    k, k64 = make(rng, [b, s, h, d], "float32")
    v, v64 = make(rng, [b, s, h, d], "float32")
    out = F.flash_attention(q, k, v, softmax_scale=0.0)
    out.sum().backward()
    assert (q.grad.numpy() == 0).all() and (k.grad.numpy() == 0).all()
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(v64.mean(axis=1, keepdims=True), out.shape), rtol=1e-5, atol=1e-6)
    for scale in (-1 / 8, -1.2):
        out = F.flash_attention(q, k, v, softmax_scale=scale, causal=True)
        ro, _ = dense_reference(q64, k64, v64, None, None, scale, True, (-1, -1))
        assert_close("out", out.numpy(), ro, "float32")


def test_lse_only_loss_gives_zero_dv(rng):
    q, _ = make(rng, [1, 33, 2, 16], "bfloat16")
    k, _ = make(rng, [1, 33, 2, 16], "bfloat16")
    v, _ = make(rng, [1, 33, 2, 16], "bfloat16")
    _, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    lse.sum().backward()
    assert (to64(v.grad) == 0).all()
    assert np.abs(to64(q.grad)).max() > 0


@pytest.mark.parametrize("grads", [(True, False, False), (False, True, True), (False, False, True), (True, True, False)])
def test_mixed_stop_gradient(rng, grads):
    ts = []
    for want in grads:
        t, _ = make(rng, [1, 9, 2, 16], "float32", requires_grad=want)
        ts.append(t)
    out = F.flash_attention(*ts, causal=True)
    out.sum().backward()
    for t, want in zip(ts, grads):
        assert (t.grad is not None) == want


def test_toplevel_reexport_and_signature():
    import inspect

    assert paddle_dsa.flash_attention is F.flash_attention
    assert paddle_dsa.flash_attention_varlen is F.flash_attention_varlen
    sig = inspect.signature(F.flash_attention)
    assert list(sig.parameters) == ["query", "key", "value", "causal", "softmax_scale", "window_size",
                                    "return_softmax_lse", "name"]
    sig = inspect.signature(F.flash_attention_varlen)
    assert list(sig.parameters)[:7] == ["query", "key", "value", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                        "max_seqlen_k"]
