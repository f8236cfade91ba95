"""Drop-in functions for code written against Paddle's own attention API (Paddle 3.3 signatures, argument order,
defaults and return values), so a model switches by changing one import:

    from paddle.nn.functional.flash_attention import flash_attention, flash_attn_unpadded
    from paddle.nn.functional import scaled_dot_product_attention
becomes
    from paddle_dsa.compat import flash_attention, flash_attn_unpadded, scaled_dot_product_attention

Semantics follow Paddle's where they differ from paddle_dsa.nn.functional:
- causal masks align top-left (query row i sees keys j <= i), as Paddle's flash_attention and
  scaled_dot_product_attention do; paddle_dsa aligns bottom-right. Equal for Sq == Sk; Sq > Sk maps onto a window
  (left unbounded, right Sq - Sk); Sk > Sq (a top-left mask that hides the last keys) raises NotImplementedError.
- flash_attention / flash_attn_unpadded return the pair (out, None) (Paddle's (out, softmax) with
  return_softmax=False); scaled_dot_product_attention returns out; [S, H, D] inputs are taken as one batch.
- cu_seqlens may be int32 or int64 (converted on the device).
What cannot be honoured raises NotImplementedError naming it, never ignored silently: dropout > 0 while training,
return_softmax=True, fixed_seed_offset, an attn_mask, enable_gqa=False with fewer key heads than query heads,
backend.
flashmask_attention takes the document masks real trainers pass (PaddleNLP's causal one-column form, PaddleFleet's
four-column block-diagonal form) and runs them as packed sequences (flash_attention_varlen): the segment offsets
are computed on the device, no host sync unless config.check_cu_seqlens_values asks for the check that the mask is
such a document mask; any other mask raises NotImplementedError.
"""
import numpy as np
import paddle

from . import config
from . import validation as V
from ._port import PORT
from .nn import functional as F


def _unsupported(op, what):
    raise NotImplementedError(f"paddle_dsa.compat.{op}: {what} is not supported")


def _no_dropout(op, dropout, training):
    if training and dropout:
        _unsupported(op, f"dropout = {dropout} in training (paddle_dsa's kernels have no dropout)")


def _fa_only_supported(op, dropout, training, return_softmax, fixed_seed_offset):
    """Paddle flash-attention arguments paddle_dsa cannot honour: NotImplementedError naming the first one."""
    _no_dropout(op, dropout, training)
    if return_softmax:
        _unsupported(op, "return_softmax=True")
    if fixed_seed_offset is not None:
        _unsupported(op, "fixed_seed_offset")


def _causal_window(op, causal, sq, sk):
    """(causal, window_size) of paddle_dsa for Paddle's top-left causal mask over sq queries and sk keys."""
    if not causal or sq == sk:
        return bool(causal), (-1, -1)
    if sq > sk:                    # top-left: row i sees j <= i, i.e. the bottom-right diagonal shifted by sq - sk
        return False, (-1, sq - sk)
    _unsupported(op, f"a causal mask with more keys ({sk}) than queries ({sq}) (Paddle aligns it top-left, which "
                     "hides the last keys; paddle_dsa aligns bottom-right: call paddle_dsa.nn.functional directly)")


def flash_attention(query, key, value, dropout=0.0, causal=False, return_softmax=False, *, fixed_seed_offset=None,
                    rng_name="", training=True, name=None, softmax_scale=None):
    """Paddle's paddle.nn.functional.flash_attention.flash_attention: [B, S, H, D] -> (out, None)."""
    op = "flash_attention"
    _fa_only_supported(op, dropout, training, return_softmax, fixed_seed_offset)
    V.check_tensor(op, "query", query)
    V.check_tensor(op, "key", key)
    causal, window = _causal_window(op, causal, PORT.shape(query)[1], PORT.shape(key)[1])
    out = F.flash_attention(query, key, value, causal=causal, softmax_scale=softmax_scale, window_size=window)
    return out, None


def flash_attn_unpadded(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                        dropout=0.0, causal=False, return_softmax=False, fixed_seed_offset=None, rng_name="",
                        training=True, name=None):
    """Paddle's flash_attn_unpadded: packed [T, H, D] with cu_seqlens -> (out, None). With causal, every segment
    must have as many keys as queries (Paddle's top-left mask equals paddle_dsa's bottom-right one then); this is
    checked on the host where cu_seqlens_q and cu_seqlens_k are different tensors."""
    op = "flash_attn_unpadded"
    _fa_only_supported(op, dropout, training, return_softmax, fixed_seed_offset)
    cu = []
    for nm, c in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        V.check_tensor(op, nm, c)
        dt = PORT.dtype_name(c.dtype)
        if dt not in ("int32", "int64"):
            V.fail(op, f"`{nm}` must be int32 or int64, got {dt}", TypeError)
        cu.append(c if dt == "int32" else c.astype("int32"))
    if causal and cu_seqlens_k is not cu_seqlens_q:
        lq, lk = (PORT.to_numpy(c) for c in cu)
        if lq.shape != lk.shape or ((lq[1:] - lq[:-1]) != (lk[1:] - lk[:-1])).any():
            _unsupported(op, "a causal mask over segments whose key and query lengths differ (Paddle aligns it "
                             "top-left, paddle_dsa bottom-right: call paddle_dsa.nn.functional directly)")
    out = F.flash_attention_varlen(query, key, value, cu[0], cu[1], max_seqlen_q, max_seqlen_k, causal=bool(causal),
                                   softmax_scale=scale)
    return out, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, training=True,
                                 backend=None, scale=None, enable_gqa=True, name=None):
    """Paddle's paddle.nn.functional.scaled_dot_product_attention ([B, S, H, D] or [S, H, D]) -> out."""
    op = "scaled_dot_product_attention"
    if attn_mask is not None:
        _unsupported(op, "attn_mask (an arbitrary mask; use is_causal, or paddle_dsa's window_size)")
    if backend is not None:
        _unsupported(op, f"backend={backend!r}")
    _no_dropout(op, dropout_p, training)
    V.check_tensor(op, "query", query)
    V.check_tensor(op, "key", key)
    three = len(PORT.shape(query)) == 3
    q, k, v = (x.unsqueeze(0) if three else x for x in (query, key, value))
    qs, ks = PORT.shape(q), PORT.shape(k)
    if not enable_gqa and len(qs) == 4 and len(ks) == 4 and qs[2] != ks[2]:
        _unsupported(op, f"enable_gqa=False with {qs[2]} query heads and {ks[2]} key heads")
    causal, window = _causal_window(op, is_causal, qs[1], ks[1])
    out = F.flash_attention(q, k, v, causal=causal, softmax_scale=scale, window_size=window)
    return out.squeeze(0) if three else out


def _doc_offsets(doc_end):
    """doc_end int32 [B, S]: the end row of each key's document -> cu_seqlens int32 [B * S + 1] of the packed batch
    (one segment a document, zero-length segments padding each batch row to S + 1 offsets), on the device."""
    b, s = PORT.shape(doc_end)
    e = doc_end.astype("int64")
    start = paddle.concat([paddle.ones([b, 1], "bool"), e[:, 1:] != e[:, :-1]], axis=1)      # a document begins
    seg = paddle.cumsum(start.astype("int64"), axis=1) - 1                                  # its ordinal
    slot = paddle.where(start, seg, paddle.full_like(seg, s + 1))                           # others: a dummy slot
    rows = paddle.arange(b, dtype="int64").unsqueeze(1) * (s + 2)
    cols = paddle.arange(s, dtype="int64").unsqueeze(0).expand([b, s])
    buf = paddle.full([b * (s + 2)], s, dtype="int64")
    buf = paddle.scatter(buf, (slot + rows).reshape([-1]), cols.reshape([-1]).astype("int64"), overwrite=True)
    per_batch = buf.reshape([b, s + 2])[:, :s] + paddle.arange(b, dtype="int64").unsqueeze(1) * s
    return paddle.concat([per_batch.reshape([-1]), paddle.full([1], b * s, dtype="int64")]).astype("int32")


def _check_document_mask(op, sri, causal):
    """Host check (config.check_cu_seqlens_values) that startend_row_indices is a document mask: key j's first
    column is the end of its document (runs of equal values ending at their value), and with four columns the
    others are (S, 0, its document's start)."""
    a = np.asarray(PORT.to_numpy(sri), np.int64)[:, 0]          # [B, S, C]
    s = a.shape[1]
    j = np.arange(s)
    end = a[..., 0]
    begins = np.concatenate([np.ones((end.shape[0], 1), bool), end[:, 1:] != end[:, :-1]], axis=1)
    start = np.maximum.accumulate(np.where(begins, j[None, :], 0), axis=1)      # each key's run start
    nxt = np.concatenate([end[:, 1:], np.full((end.shape[0], 1), -1)], axis=1)
    ok = (end > j) & (end <= s) & ((end == nxt) == (end != j + 1))
    if not causal:
        ok &= (a[..., 1] == s) & (a[..., 2] == 0) & (a[..., 3] == start)
    if not ok.all():
        _unsupported(op, "this startend_row_indices (only document masks are: PaddleNLP's causal one-column form and "
                         "PaddleFleet's four-column block-diagonal form)")


def flashmask_attention(query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False, window_size=None,
                        return_softmax_lse=False, return_seed_offset=False, fixed_seed_offset=None, rng_name="",
                        training=True, name=None, softmax_scale=None, block_mask=None):
    """Paddle's flashmask_attention for document masks: [B, S, H, D] -> out, or (out, softmax_lse [B, H, S])."""
    op = "flashmask_attention"
    _no_dropout(op, dropout, training)
    for arg, what in ((window_size, "window_size"), (fixed_seed_offset, "fixed_seed_offset"),
                      (block_mask, "block_mask")):
        if arg is not None:
            _unsupported(op, what)
    if return_seed_offset:
        _unsupported(op, "return_seed_offset=True")
    if startend_row_indices is None:
        V.check_tensor(op, "query", query)
        V.check_tensor(op, "key", key)
        c, window = _causal_window(op, causal, PORT.shape(query)[1], PORT.shape(key)[1])
        out, lse = F.flash_attention(query, key, value, causal=c, softmax_scale=softmax_scale, window_size=window,
                                     return_softmax_lse=True)
        return (out, lse) if return_softmax_lse else out
    V.check_tensor(op, "query", query)
    V.check_tensor(op, "startend_row_indices", startend_row_indices)
    qs, ks, shp = PORT.shape(query), PORT.shape(key), PORT.shape(startend_row_indices)
    if PORT.dtype_name(startend_row_indices.dtype) != "int32":
        V.fail(op, "`startend_row_indices` must be int32", TypeError)
    forms = {True: (1,), False: (4,)}[bool(causal)]
    if len(shp) != 4 or shp[0] != qs[0] or shp[1] != 1 or shp[2] != ks[1] or shp[3] not in forms:
        _unsupported(op, f"startend_row_indices of shape {list(shp)} with causal={bool(causal)} (supported: "
                         f"[B, 1, S, 1] with causal=True, [B, 1, S, 4] with causal=False: document masks)")
    if qs[1] != ks[1]:
        _unsupported(op, f"a document mask with {qs[1]} queries and {ks[1]} keys (they must be equal)")
    if config.check_cu_seqlens_values:
        _check_document_mask(op, startend_row_indices, bool(causal))
    b, s = qs[0], qs[1]
    cu = _doc_offsets(startend_row_indices[:, 0, :, 0])
    flat = [x.reshape([b * s] + list(PORT.shape(x))[2:]) for x in (query, key, value)]
    out, lse = F.flash_attention_varlen(*flat, cu, cu, s, s, causal=bool(causal), softmax_scale=softmax_scale,
                                        return_softmax_lse=True)
    out = out.reshape(list(qs[:3]) + [PORT.shape(value)[-1]])
    if not return_softmax_lse:
        return out
    return out, lse.reshape([qs[2], b, s]).transpose([1, 0, 2])

