"""The Paddle side of the GPU seam, on CPU: a fake ops module stands in for the CuTe kernels.

With PORT.is_gpu patched to True and the fake module installed, flash_attention takes the kernel path:
paddle_dsa/kernels/flash_attention.py exports the tensors through the port, allocates outputs and
workspaces, and calls ops.flash_attention.{fwd,bwd} with the seam's keyword signature. The fake kernels
read their inputs back through DLPack, compute with the reference path and write the outputs through
DLPack, so any mix-up of argument order, shapes, lse layout or output aliasing shows up as a wrong number.
"""
import importlib
import inspect
import math
import types

import numpy as np
import paddle
import pytest

from paddle_dsa._port import PORT
from paddle_dsa.kernels import flash_attention as seam
from paddle_dsa.nn import functional as F
from paddle_dsa.reference import flash_attention as ref

from dlpack_io import read, write
from flash_helpers import assert_close, check_dense, make, to64

fa = importlib.import_module("paddle_dsa.nn.functional.flash_attention")


_in, _write = read, write


class FakeKernels:
    def __init__(self):
        self.calls = []

    def flash_attn_fwd(self, q, k, v, out, lse, *, softmax_scale, causal, window, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, stream=0):
        self.calls.append(("fwd", stream))
        q, k, v = _in(q), _in(k), _in(v)
        if cu_seqlens_q is None:
            o, l = ref.flash_attention_fwd(q, k, v, softmax_scale, causal, window)
        else:
            cq, ck = _in(cu_seqlens_q).numpy(), _in(cu_seqlens_k).numpy()
            assert max_seqlen_q >= np.diff(cq).max() and max_seqlen_k >= np.diff(ck).max()
            o, l = ref.flash_attention_varlen_fwd(q, k, v, cq, ck, softmax_scale, causal, window)
        _write(out, o)
        _write(lse, l)

    def flash_attn_bwd(self, q, k, v, out, dout, lse, dq, dk, dv, *, dlse=None, softmax_scale, causal, window,
                       cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, deterministic=False,
                       alloc, stream=0):
        self.calls.append(("bwd", stream, deterministic))
        ws = alloc((3, 5), "float32")  # a workspace must come back as a DLPack export of that shape
        _write(ws, paddle.zeros([3, 5]))
        args = [_in(x) for x in (q, k, v, out, dout, lse)]
        if cu_seqlens_q is None:
            g = ref.flash_attention_bwd(*args, _in(dlse), softmax_scale, causal, window)
        else:
            g = ref.flash_attention_varlen_bwd(*args, _in(dlse), _in(cu_seqlens_q).numpy(), _in(cu_seqlens_k).numpy(),
                                               softmax_scale, causal, window)
        for dst, src in zip((dq, dk, dv), g):
            _write(dst, src)


@pytest.fixture
def fake(monkeypatch):
    kernels = FakeKernels()
    mod = types.SimpleNamespace(flash_attn_fwd=kernels.flash_attn_fwd, flash_attn_bwd=kernels.flash_attn_bwd)
    monkeypatch.setattr(seam, "_MODULES", {"fwd": mod, "bwd": mod})
    monkeypatch.setattr(PORT, "is_gpu", lambda t: True)
    monkeypatch.setattr(PORT, "stream_handle", lambda t: 1234)
    # outputs and workspaces NaN-poisoned: an element the kernel did not write, or a buffer the seam did not
    # hand to the kernel (a copy), shows up as NaN in the results
    monkeypatch.setattr(seam, "_empty", lambda shape, dtype: paddle.full(list(shape), float("nan"), dtype=dtype))
    return kernels


def test_seam_signatures_match_ops_modules():
    """The keyword signatures the seam calls are the ones ops.flash_attention declares (read from source)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "ops" / "flash_attention"
    for mod, fn, fake_fn in (("fwd", "flash_attn_fwd", FakeKernels.flash_attn_fwd),
                             ("bwd", "flash_attn_bwd", FakeKernels.flash_attn_bwd)):
        tree = ast.parse((root / f"{mod}.py").read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        pos = [a.arg for a in node.args.args]
        kw = {a.arg for a in node.args.kwonlyargs}
        required = {a.arg for a, default in zip(node.args.kwonlyargs, node.args.kw_defaults) if default is None}
        fake_params = inspect.signature(fake_fn).parameters
        fake_pos = [p for p, v in fake_params.items() if v.kind == v.POSITIONAL_OR_KEYWORD and p != "self"]
        fake_kw = {p for p, v in fake_params.items() if v.kind == v.KEYWORD_ONLY}
        assert pos == fake_pos, (mod, pos)
        # the seam passes only keywords the kernel declares, and every one it requires
        assert fake_kw <= kw, (mod, fake_kw - kw)
        assert required <= fake_kw, (mod, required - fake_kw)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (5, 0))])
def test_dense_through_seam(rng, fake, causal, window):
    b, sq, sk, h, hkv, d = 2, 33, 47, 4, 2, 64
    dtype = "bfloat16"
    q, q64 = make(rng, [b, sq, h, d], dtype)
    k, k64 = make(rng, [b, sk, hkv, d], dtype)
    v, v64 = make(rng, [b, sk, hkv, d], dtype)
    out, lse = F.flash_attention(q, k, v, causal=causal, window_size=window, return_softmax_lse=True)
    dout, dout64 = make(rng, [b, sq, h, d], dtype, requires_grad=False)
    (out.astype("float32") * dout.astype("float32")).sum().backward()
    assert [c[0] for c in fake.calls] == ["fwd", "bwd"] and fake.calls[0][1] == 1234
    check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, None, 1 / math.sqrt(d), causal, window)


def test_varlen_through_seam(rng, fake):
    cu_q = np.array([0, 3, 3, 20], np.int32)
    cu_k = np.array([0, 5, 9, 30], np.int32)
    h, d = 2, 64
    q, _ = make(rng, [22, h, d], "float16")
    k, _ = make(rng, [31, h, d], "float16")
    v, _ = make(rng, [31, h, d], "float16")
    args = (paddle.to_tensor(cu_q), paddle.to_tensor(cu_k), 17, 21)
    out, lse = F.flash_attention_varlen(q, k, v, *args, causal=True, return_softmax_lse=True)
    out.astype("float32").sum().backward()
    assert [c[0] for c in fake.calls] == ["fwd", "bwd"]
    q2, k2, v2 = (paddle.to_tensor(to64(x).astype(np.float32)).astype("float16") for x in (q, k, v))
    for t in (q2, k2, v2):
        t.stop_gradient = False
    fake.calls.clear()
    seam._MODULES.clear()  # reference path on the same host: no kernels available
    seam._MODULES.update({"fwd": None, "bwd": None})
    with pytest.warns(UserWarning, match="reference path"):
        fa._warned_fallback.clear()
        out2, lse2 = F.flash_attention_varlen(q2, k2, v2, *args, causal=True, return_softmax_lse=True)
    out2.astype("float32").sum().backward()
    assert fake.calls == []
    np.testing.assert_array_equal(to64(out), to64(out2))
    np.testing.assert_array_equal(lse.numpy(), lse2.numpy())
    for g1, g2 in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        np.testing.assert_array_equal(to64(g1), to64(g2))


def test_deterministic_flag_reaches_kernel(rng, fake, monkeypatch):
    import paddle_dsa

    monkeypatch.setattr(paddle_dsa.config, "deterministic_backward", True)
    q, _ = make(rng, [1, 8, 2, 64], "bfloat16")
    F.flash_attention(q, q.detach(), q.detach()).astype("float32").sum().backward()
    assert fake.calls[-1] == ("bwd", 1234, True)


def test_empty_token_axis_takes_reference_path(rng, fake):
    """Tk = 0 (no keys at all) cannot be described by TMA: the call stays off the kernels, out 0, lse -inf."""
    q, _ = make(rng, [5, 2, 64], "bfloat16")
    k = paddle.zeros([0, 2, 64], dtype="bfloat16")
    cu_q = paddle.to_tensor(np.array([0, 2, 5], np.int32))
    cu_k = paddle.to_tensor(np.array([0, 0, 0], np.int32))
    out, lse = F.flash_attention_varlen(q, k, k, cu_q, cu_k, 3, 0, return_softmax_lse=True)
    assert fake.calls == []
    assert (to64(out) == 0).all() and np.isneginf(lse.numpy()).all()
    out.astype("float32").sum().backward()
    assert (to64(q.grad) == 0).all()



def drop_bwd_kernel(monkeypatch, *pairs):
    """Every forward pair has a backward kernel today; the fallback (a forward pair without one) is kept for a pair
    added to the forward table first, and tested by taking pairs out of the backward table."""
    monkeypatch.setattr(fa.SUPPORTED, "BWD_HEAD_DIMS", tuple(p for p in fa.SUPPORTED.BWD_HEAD_DIMS if p not in pairs))


@pytest.mark.parametrize("d,dv", [(192, 128), (256, 256)])
def test_forward_kernel_reference_backward(rng, fake, monkeypatch, d, dv):
    """A (D, Dv) pair with a forward kernel and no backward kernel: the forward runs on the kernel (out shaped
    [.., Dv]), the backward on the blockwise reference path with a one-time warning, and the gradients are the
    reference's."""
    drop_bwd_kernel(monkeypatch, (d, dv))
    b, sq, sk, h, hkv = 1, 19, 23, 2, 1
    dtype = "bfloat16"
    q, q64 = make(rng, [b, sq, h, d], dtype)
    k, k64 = make(rng, [b, sk, hkv, d], dtype)
    v, v64 = make(rng, [b, sk, hkv, dv], dtype)
    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    assert list(out.shape) == [b, sq, h, dv]
    dout, dout64 = make(rng, [b, sq, h, dv], dtype, requires_grad=False)
    fa._warned_fallback.clear()
    with pytest.warns(UserWarning, match=r"no backward kernel for \(head_dim, value head_dim\)"):
        (out.astype("float32") * dout.astype("float32")).sum().backward()
    assert [c[0] for c in fake.calls] == ["fwd"]
    check_dense(dtype, q, k, v, out, lse, q64, k64, v64, dout64, None, 1 / math.sqrt(d), True, (-1, -1))


def test_varlen_forward_kernel_reference_backward(rng, fake, monkeypatch):
    """Varlen (192, 128): the reference backward needs the segment offsets on the host; they are read once, at the
    call (the forward still runs on the kernel)."""
    drop_bwd_kernel(monkeypatch, (192, 128))
    cu_q = np.array([0, 3, 3, 20], np.int32)
    cu_k = np.array([0, 5, 9, 30], np.int32)
    q, _ = make(rng, [22, 2, 192], "bfloat16")
    k, _ = make(rng, [31, 1, 192], "bfloat16")
    v, _ = make(rng, [31, 1, 128], "bfloat16")
    args = (paddle.to_tensor(cu_q), paddle.to_tensor(cu_k), 17, 21)
    out, lse = F.flash_attention_varlen(q, k, v, *args, causal=True, return_softmax_lse=True)
    assert list(out.shape) == [22, 2, 128]
    fa._warned_fallback.clear()
    with pytest.warns(UserWarning, match="reference backward"):
        out.astype("float32").sum().backward()
    assert [c[0] for c in fake.calls] == ["fwd"]
    q2, k2, v2 = (paddle.to_tensor(to64(x).astype(np.float32)) for x in (q, k, v))
    for t in (q2, k2, v2):
        t.stop_gradient = False
    o2, l2 = ref.flash_attention_varlen_fwd(q2, k2, v2, cu_q, cu_k, 1 / math.sqrt(192), True, (-1, -1))
    o2.sum().backward()
    for g1, g2 in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        np.testing.assert_allclose(to64(g1), to64(g2), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("d,dv", [(96, 96), (192, 128), (192, 192), (256, 256)])
def test_backward_on_kernel(rng, fake, d, dv):
    """These pairs have both kernels: forward and backward go through the seam, no fallback warning."""
    import warnings as w
    q, _ = make(rng, [1, 9, 2, d], "bfloat16")
    v, _ = make(rng, [1, 9, 2, dv], "bfloat16")
    fa._warned_fallback.clear()
    with w.catch_warnings():
        w.simplefilter("error")
        F.flash_attention(q, q.detach(), v, causal=True).astype("float32").sum().backward()
    assert [c[0] for c in fake.calls] == ["fwd", "bwd"]


def test_varlen_forward_only_reads_nothing_on_host(rng, fake, monkeypatch):
    """A (192, 128) varlen forward without gradients runs on the kernel and never needs the offsets on the host (the
    host copy is taken only for a backward that will run on the reference path)."""
    q, _ = make(rng, [22, 2, 192], "bfloat16", requires_grad=False)
    k, _ = make(rng, [31, 1, 192], "bfloat16", requires_grad=False)
    v, _ = make(rng, [31, 1, 128], "bfloat16", requires_grad=False)
    cu_q = paddle.to_tensor(np.array([0, 3, 3, 20], np.int32))
    cu_k = paddle.to_tensor(np.array([0, 5, 9, 30], np.int32))

    import paddle_dsa

    def no_host_read(_):
        raise AssertionError("cu_seqlens read on the host")
    monkeypatch.setattr(paddle_dsa.config, "check_cu_seqlens_values", False)   # the value checks read them too
    monkeypatch.setattr(PORT, "to_numpy", no_host_read)
    out = F.flash_attention_varlen(q, k, v, cu_q, cu_k, 17, 21, causal=True)
    assert list(out.shape) == [22, 2, 128] and [c[0] for c in fake.calls] == ["fwd"]
