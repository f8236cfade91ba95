"""Seam of the sparse indexer score recompute kernel: validate, pick/compile a cached variant, launch.

``sparse_indexer_fwd(index_q, index_k, weights, topk_indices, scores, lse, *, topk_length=None, cu_seqlens_q=None,
cu_seqlens_k=None, stream=0) -> None``

  dense : index_q bf16 [B,Sq,H,D], index_k bf16 [B,Sk,D], weights bf16|fp32 [B,Sq,H], topk_indices int32 [B,Sq,K],
          scores fp32 [B,Sq,K], lse fp32 [B,Sq], topk_length int32 [B,Sq]
  THD   : [Tq,H,D], [Tk,D], [Tq,H], [Tq,K] (indices local to the row's sequence), [Tq,K], [Tq], [Tq],
          cu_seqlens_q/k int32 [batch+1] (read on the device only)
scores = sum_h w * relu(index_q . index_k[idx]) at valid slots (0 <= idx < the sequence's keys, slot <
topk_length), -inf elsewhere and on THD rows at or past cu_seqlens_q[-1]; lse over the valid slots, 0 for none.
Variants: (D, H, weight dtype, varlen, with topk_length). Kernel: sparse_sm90.py.
"""
import os

from .. import supported
from . import check_indexer_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def variant_key(head_dim, heads, w_dtype, varlen, has_length):
    return (int(head_dim), int(heads), str(w_dtype), bool(varlen), bool(has_length))


def all_variant_keys():
    return [variant_key(d, h, w, vl, tl) for d in supported.INDEX_HEAD_DIMS for h in supported.INDEX_HEADS
            for w in supported.WEIGHT_DTYPES for vl in (False, True) for tl in (False, True)]


def fake_args(key):
    import cutlass
    from ...common.head_sum_host import sparse_fake_args
    D, H, w_name, varlen, has_len = key
    wdt = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}[w_name]
    return sparse_fake_args(D, H, varlen, wdt, ((None,) if varlen else (None, None)) + (H,), has_len)


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .sparse_sm90 import SparseIndexerScoreSm90
        D, H, _, varlen, has_len = key
        fn = kernel_cache.compile(SparseIndexerScoreSm90(D, H, varlen, has_len), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def sparse_indexer_fwd(index_q, index_k, weights, topk_indices, scores, lse, *, topk_length=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, stream=0):
    from ...common.head_sum_host import SparseHeadSumCall

    call = SparseHeadSumCall(("index_q", "index_k", "scores", "lse"), index_q, index_k, topk_indices, topk_length,
                             scores, lse, cu_seqlens_q, cu_seqlens_k)
    H, D = call.heads, call.head_dim
    w = check_indexer_side(call, weights)
    if call.empty:
        return
    w.require_inner_contiguous(w.bits // 8)
    fn = compile_variant(variant_key(D, H, w.dtype, call.varlen, topk_length is not None))
    call.launch(fn, w, 1.0, stream)
