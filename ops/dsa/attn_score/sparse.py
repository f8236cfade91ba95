"""Seam of the sparse attention-score recompute kernel: validate, pick/compile a cached variant, launch.

``sparse_attn_score_fwd(query, kv, softmax_lse, topk_indices, scores, l1norm, *, softmax_scale, topk_length=None,
cu_seqlens_q=None, cu_seqlens_k=None, stream=0) -> None``

  dense : query bf16 [B,Sq,H,Dqk], kv bf16 [B,Skv,Dqk], softmax_lse fp32 [B,H,Sq], topk_indices int32 [B,Sq,K],
          scores fp32 [B,Sq,K], l1norm fp32 [B,Sq], topk_length int32 [B,Sq]
  THD   : [Tq,H,Dqk], [Tkv,Dqk], [H,Tq], [Tq,K] (local indices), [Tq,K], [Tq], [Tq], cu_seqlens_q/k int32 [batch+1]
scores = sum_h exp(min(softmax_scale * query . kv[idx] - lse, 120 ln 2)) at valid slots, 0 elsewhere (and on THD
rows at or past cu_seqlens_q[-1]); l1norm = row sums (saturating at FLT_MAX). Variants: (Dqk, H, varlen, with
topk_length). Kernel: sparse_sm90.py.
"""
import os

from .. import supported
from . import check_attention_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def variant_key(head_dim, heads, varlen, has_length):
    return (int(head_dim), int(heads), bool(varlen), bool(has_length))


def all_variant_keys():
    dims = sorted({d for d, _ in supported.QK_V_HEAD_DIMS})
    return [variant_key(d, h, vl, tl) for d in dims for h in supported.QUERY_HEADS for vl in (False, True)
            for tl in (False, True)]


def fake_args(key):
    import cutlass
    from ...common.head_sum_host import sparse_fake_args
    D, H, varlen, has_len = key
    return sparse_fake_args(D, H, varlen, cutlass.Float32, (H, None) if varlen else (None, H, None), has_len)


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .sparse_sm90 import SparseAttnScoreSm90
        fn = kernel_cache.compile(SparseAttnScoreSm90(*key), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def sparse_attn_score_fwd(query, kv, softmax_lse, topk_indices, scores, l1norm, *, softmax_scale, topk_length=None,
                          cu_seqlens_q=None, cu_seqlens_k=None, stream=0):
    from ...common.head_sum_host import SparseHeadSumCall

    call = SparseHeadSumCall(("query", "kv", "scores", "l1norm"), query, kv, topk_indices, topk_length, scores, l1norm,
                             cu_seqlens_q, cu_seqlens_k)
    H, D = call.heads, call.head_dim
    lse, scale = check_attention_side(call, softmax_lse, softmax_scale)
    if call.empty:
        return
    lse.require_inner_contiguous(4)
    fn = compile_variant(variant_key(D, H, call.varlen, topk_length is not None))
    call.launch(fn, lse, scale, stream)   # natural-log scale (dense_sm90.element)
