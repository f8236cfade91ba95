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
backend. flashmask_attention is not provided yet (issue 13).
"""
from . import validation as V
from ._port import PORT
from .nn import functional as F


def _unsupported(op, what):
    raise NotImplementedError(f"paddle_dsa.compat.{op}: {what} is not supported")


def _no_dropout(op, dropout, training):
    if training and dropout:
        _unsupported(op, f"dropout = {dropout} in training (paddle_dsa's kernels have no dropout)")


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
    _no_dropout(op, dropout, training)
    if return_softmax:
        _unsupported(op, "return_softmax=True")
    if fixed_seed_offset is not None:
        _unsupported(op, "fixed_seed_offset")
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
    _no_dropout(op, dropout, training)
    if return_softmax:
        _unsupported(op, "return_softmax=True")
    if fixed_seed_offset is not None:
        _unsupported(op, "fixed_seed_offset")
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
