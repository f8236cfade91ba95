"""Paddle -> ops.dsa seams (GPU only): export through the port, allocate outputs, call the kernel seam.

Routed to kernels (their H200 tests pass): indexer_score and dense_indexer_score_recompute (ops.dsa.indexer.fwd),
indexer_topk (ops.dsa.topk.fwd), sparse_indexer_score_recompute (ops.dsa.indexer.sparse). Every output buffer
comes from ``_empty`` uninitialised and is handed to the kernel, which writes every element (tests/test_dsa_kernel_
seam.py NaN-poisons ``_empty`` to prove the seam returns those very buffers). No host sync here; the callers'
validation may read cu_seqlens on the host (docs/dsa.md).
"""
import paddle

from .._port import PORT
from . import import_kernel

_MODULES = {}
_NAMES = {"indexer": "indexer.fwd", "topk": "topk.fwd", "sparse_indexer": "indexer.sparse"}


def _module(which):
    """The ops.dsa seam module if the DSL and that kernel are installed, else None."""
    return import_kernel(_MODULES, which, f"paddle_dsa.ops.dsa.{_NAMES[which]}")


def available(which):
    return _module(which) is not None


def _empty(shape, dtype):
    """Every buffer the DSA kernels fill comes from here (see the module docstring)."""
    return paddle.empty(list(shape), dtype=dtype)


def _opt(t):
    return None if t is None else PORT.export(t)


def indexer_scores(index_q, index_k, weights, *, causal, ratio, q_offsets, cu_q, cu_k, max_q, width, with_lse):
    """(scores float32 [B,Sq,Sk] / [Tq,width], lse float32 [B,Sq] / [Tq] or None)."""
    shp = PORT.shape(index_q)
    thd = cu_q is not None
    rows = shp[:1] if thd else shp[:2]
    cols = width if thd else PORT.shape(index_k)[1]
    scores = _empty(list(rows) + [cols], paddle.float32)
    lse = _empty(rows, paddle.float32) if with_lse else None
    ex = PORT.export
    _module("indexer").indexer_fwd(
        ex(index_q), ex(index_k), ex(weights), ex(scores, writable=True),
        None if lse is None else ex(lse, writable=True), causal=causal, ratio=ratio, q_offsets=_opt(q_offsets),
        cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k), max_seqlen_q=max_q, stream=PORT.stream_handle(index_q))
    return scores, lse


def topk(scores, k, lengths):
    """int32 [..., k] (the leading shape of scores)."""
    out = _empty(list(PORT.shape(scores)[:-1]) + [k], paddle.int32)
    _module("topk").topk_fwd(PORT.export(scores), PORT.export(out, writable=True), lengths=_opt(lengths),
                             stream=PORT.stream_handle(scores))
    return out


def sparse_indexer_scores(index_q, index_k, weights, topk_indices, topk_length, cu_q, cu_k):
    """(scores float32 shaped like topk_indices, lse float32 of its leading shape)."""
    idx_shape = PORT.shape(topk_indices)
    scores = _empty(idx_shape, paddle.float32)
    lse = _empty(idx_shape[:-1], paddle.float32)
    ex = PORT.export
    _module("sparse_indexer").sparse_indexer_fwd(
        ex(index_q), ex(index_k), ex(weights), ex(topk_indices), ex(scores, writable=True), ex(lse, writable=True),
        topk_length=_opt(topk_length), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k),
        stream=PORT.stream_handle(index_q))
    return scores, lse
