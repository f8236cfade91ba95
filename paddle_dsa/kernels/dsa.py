"""Paddle -> ops.dsa seams (GPU only): export through the port, allocate outputs, call the kernel seam.

One thin function per ops.dsa seam: indexer_scores (ops.dsa.indexer.fwd: indexer_score, dense_indexer_score_
recompute), topk (ops.dsa.topk.fwd), sparse_indexer_scores (ops.dsa.indexer.sparse), dense_attn_scores
(ops.dsa.attn_score.dense), sparse_attn_scores (ops.dsa.attn_score.sparse), sparse_attention
(ops.dsa.sparse_attn.fwd: the sparse MLA attention forward), sparse_attention_bwd (ops.dsa.sparse_attn.bwd: its
backward) and sparse_indexer_bwd (ops.dsa.indexer.sparse_bwd: the sparse indexer backward). Contract:
- every output buffer comes from ``_empty`` uninitialised, is exported writable (never a copy) and is returned as
  it is: the kernel writes every element (tests/test_dsa_kernel_seam.py NaN-poisons ``_empty`` to prove it);
- the stream is Paddle's current one (PORT.stream_handle); no host sync and no device read here;
- the callers (nn/functional/dsa.py) hand over only problems the kernels can describe: no empty axis (they build
  those results in Paddle) and THD extents as host ints.
``missing(which)`` says why a seam does not serve the Paddle ops (None when it does): its module does not import
(the DSL or the kernel is not installed), or it is not routed yet (ROUTED).
"""
import paddle

from .. import config
from .._port import PORT
from . import import_kernel

_MODULES = {}
_NAMES = {"indexer": "indexer.fwd", "topk": "topk.fwd", "sparse_indexer": "indexer.sparse",
          "attn_score": "attn_score.dense", "sparse_attn_score": "attn_score.sparse",
          "sparse_attention": "sparse_attn.fwd", "sparse_attention_bwd": "sparse_attn.bwd",
          "sparse_indexer_bwd": "indexer.sparse_bwd", "dense_indexer_bwd": "indexer.dense_bwd"}

# The seams the Paddle ops call: a kernel is routed once its tests/gpu suite passes on the H200 (the attention-score
# recomputes since their wgmma sums are promoted to fp32 every 64 products: ops/dsa/attn_score/dense_sm90.py; the
# sparse attention forward since 2026-12-03; the sparse attention backward and the sparse indexer backward since their
# suites, tests/gpu/test_dsa_sparse_attn_bwd.py and test_dsa_indexer_bwd.py, passed on 2026-12-03; the dense indexer
# backward since tests/gpu/test_dsa_indexer_dense_bwd.py passed on 2026-12-03, 16:51 UTC). Routing = naming the seam
# here; a seam left out (tests monkeypatch ROUTED) runs the reference path with a one-time warning.
ROUTED = frozenset(_NAMES)


def _module(which):
    """The ops.dsa seam module if the DSL and that kernel are installed, else None."""
    return import_kernel(_MODULES, which, f"paddle_dsa.ops.dsa.{_NAMES[which]}")


def missing(which):
    """None when the `which` seam serves the Paddle ops, else the reason it does not (for the fallback warning)."""
    name = f"paddle_dsa.ops.dsa.{_NAMES[which]}"
    if which not in ROUTED:
        return f"the {name} kernel is not routed yet (docs/dsa.md, GPU place)"
    if _module(which) is None:
        return f"the {name} kernel cannot be imported (is nvidia-cutlass-dsl installed?)"
    return None


def available(which):
    return missing(which) is None


def _empty(shape, dtype):
    """Every buffer the DSA kernels fill comes from here (see the module docstring)."""
    return paddle.empty(list(shape), dtype=dtype)


def _out(t):
    """Export of an output buffer: never a copy (the port refuses one), so the kernel's writes land in t."""
    return PORT.export(t, writable=True)


def _opt(t):
    return None if t is None else PORT.export(t)


def _rows(x, thd):
    """The row prefix of a [B, Sq, ...] / [Tq, ...] tensor."""
    shp = list(PORT.shape(x))
    return shp[:1] if thd else shp[:2]


def indexer_scores(index_q, index_k, weights, *, causal, ratio, q_offsets, cu_q, cu_k, max_q, width, with_lse):
    """(scores float32 [B,Sq,Sk] / [Tq,width], lse float32 [B,Sq] / [Tq] or None)."""
    thd = cu_q is not None
    rows = _rows(index_q, thd)
    scores = _empty(rows + [width if thd else PORT.shape(index_k)[1]], paddle.float32)
    lse = _empty(rows, paddle.float32) if with_lse else None
    ex = PORT.export
    _module("indexer").indexer_fwd(
        ex(index_q), ex(index_k), ex(weights), _out(scores), None if lse is None else _out(lse), causal=causal,
        ratio=ratio, q_offsets=_opt(q_offsets), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k), max_seqlen_q=max_q,
        stream=PORT.stream_handle(index_q))
    return scores, lse


def topk(scores, k, lengths, order="score"):
    """int32 [..., k] (the leading shape of scores); order "score" (descending score) or "column" (ascending
    column), -1 last."""
    out = _empty(list(PORT.shape(scores)[:-1]) + [k], paddle.int32)
    _module("topk").topk_fwd(PORT.export(scores), _out(out), lengths=_opt(lengths), order=order,
                             stream=PORT.stream_handle(scores))
    return out


def sparse_indexer_scores(index_q, index_k, weights, topk_indices, topk_length, cu_q, cu_k):
    """(scores float32 shaped like topk_indices, lse float32 of its leading shape)."""
    idx_shape = PORT.shape(topk_indices)
    scores = _empty(idx_shape, paddle.float32)
    lse = _empty(idx_shape[:-1], paddle.float32)
    ex = PORT.export
    _module("sparse_indexer").sparse_indexer_fwd(
        ex(index_q), ex(index_k), ex(weights), ex(topk_indices), _out(scores), _out(lse),
        topk_length=_opt(topk_length), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k),
        stream=PORT.stream_handle(index_q))
    return scores, lse


def dense_attn_scores(query, kv, softmax_lse, *, scale, causal, ratio, q_offsets, cu_q, cu_k, max_q, width):
    """(attn_score float32 [B,Sq,Sk] / [Tq,width], attn_l1norm float32 [B,Sq] / [Tq]); softmax_lse float32
    [B,H,Sq] / [H,Tq] as the public API takes it."""
    thd = cu_q is not None
    rows = _rows(query, thd)
    scores = _empty(rows + [width if thd else PORT.shape(kv)[1]], paddle.float32)
    l1norm = _empty(rows, paddle.float32)
    ex = PORT.export
    _module("attn_score").dense_attn_score_fwd(
        ex(query), ex(kv), ex(softmax_lse), _out(scores), _out(l1norm), softmax_scale=scale, causal=causal,
        ratio=ratio, q_offsets=_opt(q_offsets), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k), max_seqlen_q=max_q,
        stream=PORT.stream_handle(query))
    return scores, l1norm


def sparse_attn_scores(query, kv, softmax_lse, topk_indices, *, scale, topk_length, cu_q, cu_k):
    """(attn_score float32 shaped like topk_indices, attn_l1norm float32 of its leading shape)."""
    idx_shape = PORT.shape(topk_indices)
    scores = _empty(idx_shape, paddle.float32)
    l1norm = _empty(idx_shape[:-1], paddle.float32)
    ex = PORT.export
    _module("sparse_attn_score").sparse_attn_score_fwd(
        ex(query), ex(kv), ex(softmax_lse), ex(topk_indices), _out(scores), _out(l1norm), softmax_scale=scale,
        topk_length=_opt(topk_length), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k),
        stream=PORT.stream_handle(query))
    return scores, l1norm


def sparse_attention(query, kv, topk_indices, *, scale, v_dim, attn_sink, topk_length, cu_q, cu_k):
    """(out [B,Sq,H,v_dim] / [Tq,H,v_dim] in query's dtype, softmax_lse float32 [B,H,Sq] / [H,Tq]: the public
    layout). attn_sink float32 [H] or None; cu_q / cu_k device tensors (THD) or None: the kernel finds each row's
    sequence on the device, nothing is read on the host here."""
    shp = list(PORT.shape(query))
    rows, heads = shp[:-2], shp[-2]
    out = _empty(rows + [heads, v_dim], query.dtype)
    lse = _empty([heads] + rows if cu_q is not None else [rows[0], heads, rows[1]], paddle.float32)
    ex = PORT.export
    _module("sparse_attention").sparse_attn_fwd(
        ex(query), ex(kv), ex(topk_indices), _out(out), _out(lse), softmax_scale=scale, attn_sink=_opt(attn_sink),
        topk_length=_opt(topk_length), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k),
        stream=PORT.stream_handle(query))
    return out, lse


def sparse_attention_bwd(query, kv, topk_indices, out, dout, softmax_lse, *, scale, attn_sink, dlse, topk_length, cu_q,
                         cu_k):
    """(dq in query's dtype and shape, dkv float32 shaped like kv, d_sink float32 [H] or None) of sparse_attention.

    out / dout [B,Sq,H,Dv] / [Tq,H,Dv] in query's dtype; softmax_lse float32 [B,H,Sq] / [H,Tq] as the forward returned
    it (the public layout), dlse float32 in that layout or None; attn_sink float32 [H] or None; cu_q / cu_k device
    tensors (THD) or None. dkv comes from _empty like every output: the seam zeroes it, then accumulates (fp32
    atomics; with config.deterministic_backward: staged rows summed per key in a fixed order, _deterministic()).
    d_sink is the per-row d_sink_rows the kernel writes, summed over the rows here (a Paddle reduction on the same
    stream): nothing is read on the host."""
    thd = cu_q is not None
    heads = PORT.shape(query)[-2]
    dq = _empty(PORT.shape(query), query.dtype)
    dkv = _empty(PORT.shape(kv), paddle.float32)
    d_sink_rows = None if attn_sink is None else _empty(_rows(query, thd) + [heads], paddle.float32)
    ex = PORT.export
    _module("sparse_attention_bwd").sparse_attn_bwd(
        ex(query), ex(kv), ex(topk_indices), ex(out), ex(dout), ex(softmax_lse), _out(dq), _out(dkv),
        softmax_scale=scale, attn_sink=_opt(attn_sink), d_sink_rows=None if d_sink_rows is None else _out(d_sink_rows),
        dlse=_opt(dlse), topk_length=_opt(topk_length), cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k),
        stream=PORT.stream_handle(query), **_deterministic())
    d_sink = None if d_sink_rows is None else d_sink_rows.reshape([-1, heads]).sum(axis=0)
    return dq, dkv, d_sink


def _deterministic():
    """The backward seams' determinism keywords from paddle_dsa.config (read at each call): with
    deterministic_backward, dkv / d_index_k are summed per key in a fixed order from staging buffers of at most
    deterministic_workspace_bytes (ops/common/deterministic_rows.py), the sort done by DeterministicWorkspace."""
    if not config.deterministic_backward:
        return {}
    return dict(deterministic=True, workspace=DeterministicWorkspace(),
                workspace_bytes=int(config.deterministic_workspace_bytes))


class DeterministicWorkspace:
    """The Paddle side of the deterministic DSA backwards (`workspace` of ops/common/deterministic_rows.py): buffers
    from _empty (the kernels write every element they read), exported writable, and the sort of the staged entries by
    key, all on Paddle's current stream, nothing read on the host."""

    @staticmethod
    def alloc(shape, dtype):
        return _empty(shape, PORT.dtype_from_name(dtype))

    @staticmethod
    def export(t):
        return PORT.export(t, writable=True)

    @staticmethod
    def sort_keys(keys, n_kv):
        """(sorted_keys, order), int32 [E]: the entries' keys ascending (a key < 0, no contribution, becomes n_kv and
        sorts last), order[i] the entry at position i, equal keys by increasing entry: one sort of the unique int64
        values key * E + entry, so the result does not depend on how the sort orders ties."""
        n = int(PORT.shape(keys)[0])
        k = paddle.where(keys < 0, paddle.full_like(keys, n_kv), keys).astype(paddle.int64)
        s = paddle.sort(k * n + paddle.arange(n, dtype=paddle.int64))
        return (s // n).astype(paddle.int32), (s % n).astype(paddle.int32)


def _index_grads(index_q, index_k, weights):
    """The indexer backward seams' outputs: d_index_q bfloat16, d_index_k and d_weights float32, from _empty (every
    element written by the seam; d_index_k zeroed there before the kernel accumulates)."""
    return (_empty(PORT.shape(index_q), paddle.bfloat16), _empty(PORT.shape(index_k), paddle.float32),
            _empty(PORT.shape(weights), paddle.float32))


def dense_indexer_bwd(index_q, index_k, weights, index_score, index_lse, attn_score, attn_l1norm, grad_scale, *,
                      causal, ratio, q_offsets, cu_q, cu_k):
    """(d_index_q bfloat16, d_index_k float32, d_weights float32, shaped like their inputs) of the dense indexer KL
    loss: sparse_indexer_bwd's contract with the row's entries the keys of its ratio-causal mask; the statistics
    float32 [B,Sq,Sk] / [Tq,W] (W >= the longest key sequence) and [B,Sq] / [Tq]. Nothing is read on the host."""
    dq, dk, dw = _index_grads(index_q, index_k, weights)
    ex = PORT.export
    _module("dense_indexer_bwd").dense_indexer_bwd(
        ex(index_q), ex(index_k), ex(weights), ex(index_score), ex(index_lse), ex(attn_score), ex(attn_l1norm),
        ex(grad_scale), _out(dq), _out(dk), _out(dw), causal=causal, ratio=ratio, q_offsets=_opt(q_offsets),
        cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k), stream=PORT.stream_handle(index_q), **_deterministic())
    return dq, dk, dw


def sparse_indexer_bwd(index_q, index_k, weights, topk_indices, index_score, index_lse, attn_score, attn_l1norm,
                       grad_scale, *, topk_length, cu_q, cu_k):
    """(d_index_q bfloat16 shaped like index_q, d_index_k float32 shaped like index_k, d_weights float32 shaped like
    weights) of the sparse indexer KL loss.

    index_q / index_k bfloat16, weights bfloat16 or float32, topk_indices int32 [B,Sq,K] / [Tq,K]; the statistics
    float32 in the public layout (index_score / attn_score shaped like topk_indices, index_lse / attn_l1norm its
    leading shape); grad_scale float32 [1] on the device (loss_coeff * grad_loss / N, computed there by the caller);
    topk_length int32 or None; cu_q / cu_k device tensors (THD) or None. d_index_k comes from _empty like every
    output: the seam zeroes it, then accumulates (fp32 atomics; with config.deterministic_backward in a fixed order,
    _deterministic()). Nothing is read on the host."""
    dq, dk, dw = _index_grads(index_q, index_k, weights)
    ex = PORT.export
    _module("sparse_indexer_bwd").sparse_indexer_bwd(
        ex(index_q), ex(index_k), ex(weights), ex(topk_indices), ex(index_score), ex(index_lse), ex(attn_score),
        ex(attn_l1norm), ex(grad_scale), _out(dq), _out(dk), _out(dw), topk_length=_opt(topk_length),
        cu_seqlens_q=_opt(cu_q), cu_seqlens_k=_opt(cu_k), stream=PORT.stream_handle(index_q), **_deterministic())
    return dq, dk, dw
