"""flash_attention / flash_attention_varlen: public API, validation, PyLayer autograd, dispatch.

Semantics (docs/numerics.md): softmax_scale defaults to 1/sqrt(D); causal is aligned bottom-right
(query i of a segment sees key j iff j <= i + Sk - Sq); window (left, right) keeps key j iff
i + Sk - Sq - left <= j <= i + Sk - Sq + right, -1 unbounded, intersected with causal; a row that sees
no key gets out = 0, softmax_lse = -inf and zero gradient.
"""
import math
import warnings

import numpy as np
import paddle

from ... import config
from ... import validation as V
from ..._port import PORT
from ...kernels import flash_attention as gpu
from ...ops.flash_attention import supported as SUPPORTED
from ...reference import flash_attention as ref
from . import _saved as S
from ._empty import empty_attention

_REF_DTYPES = ("bfloat16", "float16", "float32", "float64")
_warned_fallback = set()


def _check_gpu_table(op, dtype, head_dim, v_head_dim):
    """Tensors on a CUDA place go to the kernels: only their supported table is accepted."""
    if dtype not in SUPPORTED.DTYPES:
        V.fail(op, f"dtype {dtype} is not supported on a GPU place; supported: {', '.join(SUPPORTED.DTYPES)}", TypeError)
    if (head_dim, v_head_dim) not in SUPPORTED.FWD_HEAD_DIMS:
        pairs = ", ".join(f"({d}, {dv})" for d, dv in SUPPORTED.FWD_HEAD_DIMS)
        V.fail(op, f"(head_dim, value head_dim) ({head_dim}, {v_head_dim}) is not supported on a GPU place; "
                   f"supported: {pairs} (the CPU reference path accepts any)")


def _bwd_on_kernel(head_dim, v_head_dim):
    """The backward kernels run only the pairs of SUPPORTED.BWD_HEAD_DIMS; the other forward pairs take the
    blockwise reference backward on the same GPU (warned once per op and pair)."""
    return (head_dim, v_head_dim) in SUPPORTED.BWD_HEAD_DIMS


def _use_kernel(op, which, kernel_shape):
    """kernel_shape: a CUDA place and a problem the kernels can describe (no empty token axis)."""
    if not kernel_shape:
        return False
    if gpu.available(which):
        return True
    if (op, which) not in _warned_fallback:
        _warned_fallback.add((op, which))
        warnings.warn(f"paddle_dsa.{op}: the GPU {which} kernel is not available (is nvidia-cutlass-dsl "
                      "installed?); running the pure-Paddle reference path on the GPU instead")
    return False


class _Config:
    """Static configuration of one call (plain Python values, no grad slots)."""

    __slots__ = ("op", "scale", "causal", "window", "kernel_shape", "bwd_kernel", "cu_q_host", "cu_k_host", "max_q",
                 "max_k", "dims")

    def __init__(self, **kw):
        for key in self.__slots__:
            setattr(self, key, kw.get(key))


def _forward(cfg, q, k, v, cu_q, cu_k):
    if _use_kernel(cfg.op, "fwd", cfg.kernel_shape):
        return gpu.forward(q, k, v, cfg.scale, cfg.causal, cfg.window, cu_q, cu_k, cfg.max_q, cfg.max_k)
    if cu_q is None:
        return ref.flash_attention_fwd(q, k, v, cfg.scale, cfg.causal, cfg.window)
    return ref.flash_attention_varlen_fwd(q, k, v, cfg.cu_q_host, cfg.cu_k_host, cfg.scale, cfg.causal, cfg.window)


def _backward(cfg, q, k, v, out, dout, lse, dlse, cu_q, cu_k):
    if cfg.kernel_shape and not cfg.bwd_kernel and (cfg.op, cfg.dims) not in _warned_fallback:
        _warned_fallback.add((cfg.op, cfg.dims))
        warnings.warn(f"paddle_dsa.{cfg.op}: no backward kernel for (head_dim, value head_dim) {cfg.dims} yet "
                      f"(kernels: {SUPPORTED.BWD_HEAD_DIMS}); running the blockwise pure-Paddle reference backward "
                      "on the GPU")
    if _use_kernel(cfg.op, "bwd", cfg.kernel_shape and cfg.bwd_kernel):
        return gpu.backward(q, k, v, out, dout, lse, dlse, cfg.scale, cfg.causal, cfg.window, cu_q, cu_k,
                            cfg.max_q, cfg.max_k, deterministic=config.deterministic_backward)
    if cu_q is None:
        return ref.flash_attention_bwd(q, k, v, out, dout, lse, dlse, cfg.scale, cfg.causal, cfg.window)
    return ref.flash_attention_varlen_bwd(q, k, v, out, dout, lse, dlse, cfg.cu_q_host, cfg.cu_k_host,
                                          cfg.scale, cfg.causal, cfg.window)


class _FlashAttention(paddle.autograd.PyLayer):
    """Dense: apply(q, k, v, cfg). Varlen: apply(q, k, v, cu_q, cu_k, cfg). Returns (out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, *rest):
        cu_q, cu_k, cfg = rest if len(rest) == 3 else (None, None, rest[0])
        out, lse = _forward(cfg, q, k, v, cu_q, cu_k)
        ctx.cfg = cfg
        ctx.varlen = cu_q is not None
        ctx.want = tuple(PORT.needs_grad(t) for t in (q, k, v))
        ctx.set_materialize_grads(False)
        names = ("query", "key", "value", "out", "softmax_lse")
        if ctx.varlen:
            S.save(ctx, "flash_attention_varlen", names + ("cu_seqlens_q", "cu_seqlens_k"), (q, k, v, out, lse, cu_q,
                                                                                              cu_k))
        else:
            S.save(ctx, "flash_attention", names, (q, k, v, out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        saved = S.load(ctx)
        q, k, v, out, lse = saved[:5]
        cu_q, cu_k = saved[5:] if ctx.varlen else (None, None)
        if dout is None:
            dout = paddle.zeros_like(out)
        dq, dk, dv = _backward(ctx.cfg, q, k, v, out, dout, lse, dlse, cu_q, cu_k)
        grads = tuple(g if want else None for g, want in zip((dq, dk, dv), ctx.want))
        return grads + ((None, None) if ctx.varlen else ())


def _check_qkv(op, query, key, value, rank, layout):
    for name, t in (("query", query), ("key", key), ("value", value)):
        V.check_tensor(op, name, t)
    shapes = [V.check_rank(op, n, t, rank, layout) for n, t in (("query", query), ("key", key), ("value", value))]
    dtype = V.check_same_dtype(op, ("query", "key", "value"), (query, key, value))
    V.check_dtype(op, "query", query, _REF_DTYPES)
    V.check_same_place(op, ("query", "key", "value"), (query, key, value))
    return shapes, dtype


def _check_heads(op, qs, ks, vs, h_axis):
    """Head counts and head dims: H % Hkv == 0, key and value agree but for their head_dim, key's head_dim is
    query's; value's (Dv) may differ (out and dv follow it)."""
    if ks[:-1] != vs[:-1]:
        V.fail(op, f"`key` and `value` must have the same shape (but for the value head_dim), got {list(ks)} and "
                   f"{list(vs)}")
    if qs[-1] != ks[-1]:
        V.fail(op, f"`query` head_dim {qs[-1]} != `key` head_dim {ks[-1]}; query and key must share head_dim")
    h, hkv = qs[h_axis], ks[h_axis]
    if h % hkv != 0:
        V.fail(op, f"the query head count ({h}) must be a multiple of the key/value head count ({hkv}) (GQA/MQA)")


def _options(op, causal, softmax_scale, window_size, return_softmax_lse, head_dim):
    V.check_bool(op, "causal", causal)
    V.check_bool(op, "return_softmax_lse", return_softmax_lse)
    window = V.check_window(op, window_size)
    scale = V.check_scale(op, "softmax_scale", softmax_scale, 1.0 / math.sqrt(head_dim))
    return bool(causal), scale, window


def flash_attention(query, key, value, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                    return_softmax_lse=False, name=None):
    """Attention over [B, S, H, D] tensors.

    Args:
        query: [B, Sq, H, D]; key: [B, Sk, Hkv, D], value: [B, Sk, Hkv, Dv] with H % Hkv == 0 (query head h
            reads key/value head h // (H / Hkv)); on a GPU place (D, Dv) is one of
            ops/flash_attention/supported.FWD_HEAD_DIMS ((64, 64), (96, 96), (128, 128), (192, 128) as MLA in MHA
            form uses, (192, 192), (256, 256)); the CPU reference path accepts any. bfloat16 or float16 (float32
            and float64 on the CPU reference path).
        causal: bottom-right aligned causal mask.
        softmax_scale: defaults to 1/sqrt(D).
        window_size: (left, right) sliding window, -1 unbounded.
        return_softmax_lse: also return softmax_lse, float32 [B, H, Sq], natural log (-inf for rows that
            see no key); its gradient is honoured.
    Returns:
        out [B, Sq, H, Dv] in query's dtype, or (out, softmax_lse).
    """
    op = "flash_attention"
    V.require_dynamic_mode(op)
    (qs, ks, vs), dtype = _check_qkv(op, query, key, value, 4, "[batch, seq, heads, head_dim]")
    for n, s in (("query", qs), ("key", ks)):
        V.check_positive_dims(op, n, s, (2, 3))      # batch and sequence may be 0: an empty problem
    if qs[0] != ks[0]:
        V.fail(op, f"`query` batch {qs[0]} != `key` batch {ks[0]}")
    _check_heads(op, qs, ks, vs, 2)
    causal, scale, window = _options(op, causal, softmax_scale, window_size, return_softmax_lse, qs[3])
    on_gpu = PORT.is_gpu(query)
    if on_gpu:
        _check_gpu_table(op, dtype, qs[3], vs[3])
    if 0 in (qs[0], qs[1], ks[1]):      # no batch, no query row or no key: out 0, lse -inf, zero gradients
        out, lse = empty_attention((query, key, value), qs[:3] + vs[3:], (qs[0], qs[2], qs[1]))
        return (out, lse) if return_softmax_lse else out
    cfg = _Config(op=op, scale=scale, causal=causal, window=window, kernel_shape=on_gpu, max_q=qs[1], max_k=ks[1],
                  bwd_kernel=_bwd_on_kernel(qs[3], vs[3]), dims=(qs[3], vs[3]))
    out, lse = _FlashAttention.apply(query, key, value, cfg)
    return (out, lse) if return_softmax_lse else out


def flash_attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                           causal=False, softmax_scale=None, window_size=(-1, -1), return_softmax_lse=False,
                           name=None):
    """Attention over packed sequences.

    Args:
        query: [Tq, H, D]; key: [Tk, Hkv, D], value: [Tk, Hkv, Dv] (Dv as in flash_attention);
            cu_seqlens_q / cu_seqlens_k: int32 [batch + 1]
            segment offsets (first 0, non-decreasing); max_seqlen_q / max_seqlen_k: ints >= the longest
            segment. Masks apply within each segment (bottom-right aligned per segment).
    Returns:
        out [Tq, H, Dv], or (out, softmax_lse float32 [H, Tq]). Rows at or past cu_seqlens_q[-1], and
        rows of segments with no keys, get out 0 and softmax_lse -inf.
    """
    op = "flash_attention_varlen"
    V.require_dynamic_mode(op)
    (qs, ks, vs), dtype = _check_qkv(op, query, key, value, 3, "[total_tokens, heads, head_dim]")
    for n, s in (("query", qs), ("key", ks)):
        V.check_positive_dims(op, n, s, (1, 2))
    _check_heads(op, qs, ks, vs, 1)
    max_q = V.check_int(op, "max_seqlen_q", max_seqlen_q, minimum=0)
    max_k = V.check_int(op, "max_seqlen_k", max_seqlen_k, minimum=0)
    bq = V.check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, qs[0], "max_seqlen_q", max_q)
    bk = V.check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, ks[0], "max_seqlen_k", max_k)
    if bq != bk:
        V.fail(op, f"`cu_seqlens_q` and `cu_seqlens_k` must describe the same batch, got {bq} and {bk} segments")
    causal, scale, window = _options(op, causal, softmax_scale, window_size, return_softmax_lse, qs[2])
    on_gpu = PORT.is_gpu(query)
    V.check_same_place(op, ("query", "cu_seqlens_q", "cu_seqlens_k"), (query, cu_seqlens_q, cu_seqlens_k))
    if on_gpu:
        _check_gpu_table(op, dtype, qs[2], vs[2])
    if qs[0] == 0 or ks[0] == 0:        # no query token, or no key token (every row sees no key): no launch
        out, lse = empty_attention((query, key, value), qs[:2] + vs[2:], (qs[1], qs[0]))
        return (out, lse) if return_softmax_lse else out
    kernel_shape = on_gpu
    bwd_kernel = _bwd_on_kernel(qs[2], vs[2])
    cu_q_host = cu_k_host = None
    # the reference path reads the segment offsets on the host: the forward's, or a backward that will run there
    ref_fwd = not (kernel_shape and gpu.available("fwd"))
    ref_bwd = not (kernel_shape and gpu.available("bwd") and bwd_kernel) and \
        any(PORT.needs_grad(t) for t in (query, key, value))
    if ref_fwd or ref_bwd:
        cu_q_host = np.asarray(PORT.to_numpy(cu_seqlens_q), dtype=np.int64)
        cu_k_host = np.asarray(PORT.to_numpy(cu_seqlens_k), dtype=np.int64)
    cfg = _Config(op=op, scale=scale, causal=causal, window=window, kernel_shape=kernel_shape,
                  cu_q_host=cu_q_host, cu_k_host=cu_k_host, max_q=max_q, max_k=max_k, bwd_kernel=bwd_kernel,
                  dims=(qs[2], vs[2]))
    out, lse = _FlashAttention.apply(query, key, value, cu_seqlens_q, cu_seqlens_k, cfg)
    return (out, lse) if return_softmax_lse else out
