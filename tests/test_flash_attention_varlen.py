"""flash_attention_varlen (packed THD) on the reference path vs float64, per segment."""
import math

import numpy as np
import paddle
import pytest

import attention_ref as R
from paddle_dsa.nn import functional as F

from flash_helpers import assert_close, assert_grads, assert_lse, make, to64

# (q segment lengths, k segment lengths, extra q rows past cu_seqlens_q[-1], extra k rows)
CASES = [
    ([5, 0, 1, 17, 40], [7, 3, 1, 17, 20], 0, 0),     # empty q segment, length-1 segment, Sq > Sk
    ([3, 9, 1], [0, 13, 4], 4, 2),                    # a segment with no keys, padding rows past the end
    ([130, 1], [255, 129], 0, 0),                     # off the 128-key block grid
]


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _reference(q64, k64, v64, dout64, dlse64, cu_q, cu_k, scale, causal, window, stored_out64=None):
    """Exact float64 results; with stored_out64 (the op's output) the gradients are the floor of its backward."""
    tq, h, d = q64.shape
    out = np.zeros((tq, h, v64.shape[-1]))
    lse = np.full((h, tq), -np.inf)
    dq, dk, dv = np.zeros_like(q64), np.zeros_like(k64), np.zeros_like(v64)
    for i in range(len(cu_q) - 1):
        qa, qb, ka, kb = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if qb == qa:
            continue
        o, l = R.forward(q64[qa:qb], k64[ka:kb], v64[ka:kb], scale, causal, window)
        out[qa:qb], lse[:, qa:qb] = o, l
        floor = stored_out64 is not None
        gq, gk, gv = R.backward(q64[qa:qb], k64[ka:kb], v64[ka:kb], dout64[qa:qb], dlse64[:, qa:qb], scale, causal,
                                window, stored_out=stored_out64[qa:qb] if floor else None, fp32=floor)
        dq[qa:qb], dk[ka:kb], dv[ka:kb] = gq, gk, gv
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (4, 0)), (False, (2, 3))])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_varlen_matches_float64(rng, case, causal, window, dtype):
    lq, lk, pad_q, pad_k = CASES[case]
    h, hkv, d = 4, 2, 32
    cu_q, cu_k = _cu(lq), _cu(lk)
    tq, tk = int(cu_q[-1]) + pad_q, int(cu_k[-1]) + pad_k
    q, q64 = make(rng, [tq, h, d], dtype)
    k, k64 = make(rng, [tk, hkv, d], dtype)
    v, v64 = make(rng, [tk, hkv, d], dtype)
    out, lse = F.flash_attention_varlen(q, k, v, paddle.to_tensor(cu_q), paddle.to_tensor(cu_k), max(lq), max(lk),
                                        causal=causal, window_size=window, return_softmax_lse=True)
    assert list(out.shape) == [tq, h, d] and list(lse.shape) == [h, tq]
    dout, dout64 = make(rng, [tq, h, d], dtype, requires_grad=False)
    gl = np.where(np.isfinite(lse.numpy()), rng.standard_normal([h, tq]), 0.0)
    loss = (out.astype("float32") * dout.astype("float32")).sum()
    loss = loss + paddle.where(paddle.isfinite(lse), lse * paddle.to_tensor(gl.astype(np.float32)), paddle.zeros_like(lse)).sum()
    loss.backward()
    scale = 1 / math.sqrt(d)
    exact = _reference(q64, k64, v64, dout64, gl, cu_q, cu_k, scale, causal, window)
    floor = _reference(q64, k64, v64, dout64, gl, cu_q, cu_k, scale, causal, window, stored_out64=to64(out))
    assert_close("out", to64(out), exact[0], dtype)
    assert_lse(lse.numpy(), exact[1])
    assert_grads((q.grad, k.grad, v.grad), exact[2:], floor[2:], dtype)
    # rows past cu_seqlens_q[-1]: out 0, lse -inf, no gradient
    end = int(cu_q[-1])
    assert (to64(out)[end:] == 0).all() and np.isneginf(lse.numpy()[:, end:]).all()
    assert (to64(q.grad)[end:] == 0).all()
    assert (to64(k.grad)[int(cu_k[-1]):] == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_value_head_dim_differs(rng, causal):
    """Dv != D on packed segments (empty and tail rows included): out [Tq, H, Dv] and the gradients vs float64."""
    lq, lk, pad_q, pad_k = CASES[0]
    h, hkv, d, dv = 4, 2, 48, 32
    cu_q, cu_k = _cu(lq), _cu(lk)
    tq, tk = int(cu_q[-1]) + pad_q, int(cu_k[-1]) + pad_k
    q, q64 = make(rng, [tq, h, d], "float32")
    k, k64 = make(rng, [tk, hkv, d], "float32")
    v, v64 = make(rng, [tk, hkv, dv], "float32")
    out, lse = F.flash_attention_varlen(q, k, v, paddle.to_tensor(cu_q), paddle.to_tensor(cu_k), max(lq), max(lk),
                                        causal=causal, return_softmax_lse=True)
    assert list(out.shape) == [tq, h, dv]
    dout, dout64 = make(rng, [tq, h, dv], "float32", requires_grad=False)
    (out * dout).sum().backward()
    gl = np.zeros([h, tq])
    scale = 1 / math.sqrt(d)
    exact = _reference(q64, k64, v64, dout64, gl, cu_q, cu_k, scale, causal, (-1, -1))
    floor = _reference(q64, k64, v64, dout64, gl, cu_q, cu_k, scale, causal, (-1, -1), stored_out64=to64(out))
    assert_close("out", to64(out), exact[0], "float32")
    assert_lse(lse.numpy(), exact[1])
    assert_grads((q.grad, k.grad, v.grad), exact[2:], floor[2:], "float32")


def test_varlen_equals_dense_for_one_segment(rng):
    s, h, d = 37, 2, 16
    q, _ = make(rng, [1, s, h, d], "float32", requires_grad=False)
    k, _ = make(rng, [1, s, h, d], "float32", requires_grad=False)
    v, _ = make(rng, [1, s, h, d], "float32", requires_grad=False)
    dense, lse_d = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    cu = paddle.to_tensor(np.array([0, s], np.int32))
    packed, lse_p = F.flash_attention_varlen(q[0], k[0], v[0], cu, cu, s, s, causal=True, return_softmax_lse=True)
    np.testing.assert_allclose(packed.numpy(), dense.numpy()[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse_p.numpy(), lse_d.numpy()[0], rtol=1e-6)
