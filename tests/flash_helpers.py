"""Helpers of the CPU flash-attention tests: inputs, float64 references, the rounding-floor gate."""
import numpy as np
import paddle

import attention_ref as R

# Absolute slack added to the 2x floor gate: fp32 accumulation inside the reference path.
# float32 inputs: the floor has no rounding of its own, so the slack carries the fp32 cancellation in
# dP - Delta (up to ~1e-5 relative on rows whose softmax is a single key).
EPS = {"bfloat16": 2e-6, "float16": 2e-6, "float32": 1e-4, "float64": 1e-12}


def make(rng, shape, dtype, scale=1.0, requires_grad=True):
    """A Paddle tensor of `dtype` and the exact float64 values it holds."""
    x = paddle.to_tensor((rng.standard_normal(shape) * scale).astype(np.float32 if dtype != "float64" else np.float64))
    x = x.astype(dtype)
    x.stop_gradient = not requires_grad
    return x, to64(x)


def to64(x):
    if x.dtype == paddle.float64:
        return x.numpy()
    return x.astype("float32").numpy().astype(np.float64)


def round_to(x64, dtype):
    if dtype == "float64":
        return x64
    return to64(paddle.to_tensor(x64.astype(np.float32)).astype(dtype))


def assert_close(name, got, exact, dtype, floor_value=None):
    """relRMS(got - exact) <= 2 x relRMS(floor - exact) + eps, and no NaN/Inf.

    floor_value: what a correct implementation must produce given the roundings the contract forces
    (default: exact rounded to dtype, the floor of storing the result)."""
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all(), f"{name}: {np.count_nonzero(~np.isfinite(got))} non-finite elements"
    if not np.any(exact):
        # Exactly zero in exact math (e.g. dq with a single visible key): fp32 cancellation leaves
        # residues of order 1e-7 x |inputs|^3; unit-scale inputs keep them far below 1e-5.
        assert np.sqrt(np.mean(got * got)) <= 1e-5, f"{name}: exact is 0, RMS of ours {np.sqrt(np.mean(got * got)):.3e}"
        return
    err = R.rel_rms(got, exact)
    floor = R.rel_rms(round_to(exact if floor_value is None else floor_value, dtype), exact)
    assert err <= 2 * floor + EPS[dtype], f"{name}: relRMS {err:.3e} > 2 x floor {floor:.3e} + {EPS[dtype]:g} ({dtype})"


def assert_lse(got, exact):
    got = np.asarray(got, np.float64)
    dead = np.isneginf(exact)
    assert np.array_equal(np.isneginf(got), dead), "softmax_lse: -inf rows differ from the reference"
    assert np.isfinite(got[~dead]).all(), "softmax_lse: non-finite value on a live row"
    tol = 1e-5 * np.maximum(1.0, np.abs(exact[~dead]))
    assert (np.abs(got[~dead] - exact[~dead]) <= tol).all(), f"softmax_lse: max err {np.abs(got[~dead] - exact[~dead]).max():.3e}"


def dense_reference(q64, k64, v64, dout64, dlse64, scale, causal, window, stored_out64=None):
    """Batched float64 reference in the public layout: out [B,Sq,H,D], lse [B,H,Sq], grads.

    With stored_out64 (the output the op under test stored), the gradients are the floor of its backward:
    an fp32 backward (attention_ref.backward, fp32=True) given that stored output. The forward is gated
    on its own (out vs exact), so the backward is judged on the inputs it actually receives."""
    outs, lses, dqs, dks, dvs = [], [], [], [], []
    for b in range(q64.shape[0]):
        o, l = R.forward(q64[b], k64[b], v64[b], scale, causal, window)
        outs.append(o)
        lses.append(l)
        if dout64 is not None:
            floor = stored_out64 is not None
            dq, dk, dv = R.backward(q64[b], k64[b], v64[b], dout64[b], None if dlse64 is None else dlse64[b],
                                    scale, causal, window, stored_out=stored_out64[b] if floor else None, fp32=floor)
            dqs.append(dq)
            dks.append(dk)
            dvs.append(dv)
    res = [np.stack(outs), np.stack(lses)]
    if dout64 is not None:
        res += [np.stack(dqs), np.stack(dks), np.stack(dvs)]
    return res


def assert_grads(grads, exact, floor, dtype):
    """dq, dk, dv against the exact float64 gradients, gated by the stored-output floor."""
    for name, g, e, f in zip(("dq", "dk", "dv"), grads, exact, floor):
        assert_close(name, to64(g), e, dtype, floor_value=f)


def check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, dlse64, scale, causal, window, grads=True):
    """out and softmax_lse vs float64; with grads, q.grad/k.grad/v.grad vs float64 under the stored-output floor."""
    exact = dense_reference(q64, k64, v64, dout64 if grads else None, dlse64, scale, causal, window)
    assert_close("out", to64(out), exact[0], dtype)
    assert_lse(lse.numpy(), exact[1])
    if grads:
        floor = dense_reference(q64, k64, v64, dout64, dlse64, scale, causal, window, stored_out64=to64(out))
        assert_grads((q.grad, k.grad, v.grad), exact[2:], floor[2:], dtype)
