"""Seam of the dense attention-score recompute kernel: validate, pick/compile a cached variant, launch.

``dense_attn_score_fwd(query, kv, softmax_lse, scores, l1norm, *, softmax_scale, causal=True, ratio=1,
q_offsets=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0) -> None``

  dense : query bf16 [B,Sq,H,Dqk], kv bf16 [B,Sk,Dqk], softmax_lse fp32 [B,H,Sq], scores fp32 [B,Sq,Sk],
          l1norm fp32 [B,Sq], q_offsets int32 [B]
  THD   : query [Tq,H,Dqk], kv [Tk,Dqk], softmax_lse [H,Tq], scores [Tq,W], l1norm [Tq], cu_seqlens_q/k int32
          [batch+1], max_seqlen_q host int (grid; no device read)
scores[t, j] = sum_h exp(min(softmax_scale * query[t,h] . kv[j] - softmax_lse[h,t], 120 ln 2)) over the keys the
indexer sees (same causal / ratio / q_offsets rule), 0 elsewhere (and on THD rows at or past cu_seqlens_q[-1]);
l1norm = row sums, saturating at FLT_MAX. Every element of scores and l1norm is written. Dqk and H from
ops/dsa/supported.py (Dqk 576 or 512, H 64 or 128). Variants: (Dqk, H, varlen, with q_offsets).
"""
import os

from .. import supported
from . import check_attention_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}
N_COLS = 128        # dense_sm90.N_COLS


def variant_key(head_dim, heads, varlen, has_offsets):
    return (int(head_dim), int(heads), bool(varlen), bool(has_offsets))


def all_variant_keys():
    dims = sorted({d for d, _ in supported.QK_V_HEAD_DIMS})
    return [variant_key(d, h, vl, off) for d in dims for h in supported.QUERY_HEADS for vl in (False, True)
            for off in (False, True)]


def fake_args(key):
    import cutlass
    from ...common.head_sum_host import fake_args as head_sum_fake_args
    D, H, varlen, has_off = key
    lse_shape = (H, None) if varlen else (None, H, None)
    return head_sum_fake_args(D, H, varlen, cutlass.Float32, lse_shape, True, has_off)


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .dense_sm90 import DenseAttnScoreSm90
        fn = kernel_cache.compile(DenseAttnScoreSm90(*key), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def dense_attn_score_fwd(query, kv, softmax_lse, scores, l1norm, *, softmax_scale, causal=True, ratio=1,
                         q_offsets=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0):
    from ...common.head_sum_host import HeadSumCall

    call = HeadSumCall(("query", "kv", "scores", "l1norm"), query, kv, scores, l1norm, q_offsets, cu_seqlens_q,
                       cu_seqlens_k, max_seqlen_q, ratio)
    H, D = call.heads, call.head_dim
    lse, scale = check_attention_side(call, softmax_lse, softmax_scale)
    if call.empty:
        return
    lse.require_inner_contiguous(4)
    fn = compile_variant(variant_key(D, H, call.varlen, q_offsets is not None))
    call.launch(fn, lse, N_COLS, scale, causal, ratio, stream)   # natural-log scale (dense_sm90.element)
