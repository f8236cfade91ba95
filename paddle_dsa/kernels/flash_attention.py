"""Paddle -> ops.flash_attention seam (GPU only)."""
import importlib

import paddle

from .._port import PORT

_MODULES = {}


def _module(which):
    """ops.flash_attention.fwd / .bwd if the DSL and that kernel are installed, else None."""
    if which not in _MODULES:
        try:
            _MODULES[which] = importlib.import_module(f"paddle_dsa.ops.flash_attention.{which}")
        except ImportError:
            _MODULES[which] = None
    return _MODULES[which]


def available(which):
    return _module(which) is not None


def _alloc(shape, dtype):
    """Workspace allocator handed to the kernels: they initialise everything they read."""
    return PORT.export(paddle.empty(list(shape), dtype=PORT.dtype_from_name(dtype)), writable=True)


def _out(t):
    """Export of an output buffer: never a copy (the kernel's writes must land in t)."""
    return PORT.export(t, writable=True)


def forward(q, k, v, scale, causal, window, cu_q=None, cu_k=None, max_q=0, max_k=0):
    """out (q's shape and dtype) and lse (float32 [B,H,Sq] or [H,Tq]); every element written by the kernel."""
    varlen = cu_q is not None
    shp = PORT.shape(q)
    lse_shape = [shp[1], shp[0]] if varlen else [shp[0], shp[2], shp[1]]
    out = paddle.empty(list(shp), dtype=q.dtype)
    lse = paddle.empty(lse_shape, dtype=paddle.float32)
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
    dq = paddle.empty(PORT.shape(q), dtype=q.dtype)
    dk = paddle.empty(PORT.shape(k), dtype=k.dtype)
    dv = paddle.empty(PORT.shape(v), dtype=v.dtype)
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
