"""Paddle -> ops.flash_attention seam (GPU only)."""
import paddle

from .._port import PORT
from . import import_kernel

_MODULES = {}


def _module(which):
    """ops.flash_attention.fwd / .bwd if the DSL and that kernel are installed, else None."""
    return import_kernel(_MODULES, which, f"paddle_dsa.ops.flash_attention.{which}")


def available(which):
    return _module(which) is not None


def _empty(shape, dtype):
    """Every buffer the kernels fill (outputs, workspaces) comes from here, uninitialised: the kernels write every
    element of out/lse/dq/dk/dv (the H200 tests poison them with NaN first) and initialise every workspace element
    they read. tests/test_kernel_seam.py replaces it with a NaN fill to show the seam hands these very buffers to
    the kernels and returns them."""
    return paddle.empty(list(shape), dtype=dtype)


def _alloc(shape, dtype):
    """Workspace allocator handed to the kernels."""
    return PORT.export(_empty(shape, PORT.dtype_from_name(dtype)), writable=True)


def _out(t):
    """Export of an output buffer: never a copy (the kernel's writes must land in t)."""
    return PORT.export(t, writable=True)


def forward(q, k, v, scale, causal, window, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """out (q's shape with v's head_dim, q's dtype) and lse (float32 [B,H,Sq] or [H,Tq]); every element written by
    the kernel."""
    varlen = cu_q is not None
    shp = PORT.shape(q)
    lse_shape = [shp[1], shp[0]] if varlen else [shp[0], shp[2], shp[1]]
    out = _empty(list(shp[:-1]) + [PORT.shape(v)[-1]], q.dtype)
    lse = _empty(lse_shape, paddle.float32)
    ex = PORT.export
    _module("fwd").flash_attn_fwd(
        ex(q), ex(k), ex(v), _out(out), _out(lse),
        softmax_scale=scale, causal=causal, window=window,
        cu_seqlens_q=None if cu_q is None else ex(cu_q), cu_seqlens_k=None if cu_k is None else ex(cu_k),
        max_seqlen_q=max_q, max_seqlen_k=max_k, stream=PORT.stream_handle(q),
    )
    return out, lse


def backward(q, k, v, out, dout, lse, dlse, scale, causal, window, cu_q=None, cu_k=None, max_q=0, max_k=0,
             deterministic=False):
    dq = _empty(PORT.shape(q), q.dtype)
    dk = _empty(PORT.shape(k), k.dtype)
    dv = _empty(PORT.shape(v), v.dtype)
    ex = PORT.export
    _module("bwd").flash_attn_bwd(
        ex(q), ex(k), ex(v), ex(out), ex(dout), ex(lse), _out(dq), _out(dk), _out(dv),
        dlse=None if dlse is None else ex(dlse),
        softmax_scale=scale, causal=causal, window=window,
        cu_seqlens_q=None if cu_q is None else ex(cu_q), cu_seqlens_k=None if cu_k is None else ex(cu_k),
        max_seqlen_q=max_q, max_seqlen_k=max_k, deterministic=deterministic,
        alloc=_alloc, stream=PORT.stream_handle(q),
    )
    return dq, dk, dv
