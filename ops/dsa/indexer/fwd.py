"""Seam of the lightning-indexer score kernel: validate, pick/compile a cached variant, launch (no host sync).

``indexer_fwd(index_q, index_k, weights, scores, lse=None, *, causal=True, ratio=1, q_offsets=None,
cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0) -> None``

Tensors are DLPack objects on a CUDA device; ``scores`` (and ``lse``) are preallocated by the caller and every
element is written here (docs/dsa.md: -inf where a key is not visible, lse 0 for a row that sees no key).
  dense : index_q bf16 [B,Sq,H,D], index_k bf16 [B,Sk,D], weights bf16|fp32 [B,Sq,H], scores fp32 [B,Sq,Sk],
          lse fp32 [B,Sq], q_offsets int32 [B]
  THD   : index_q [Tq,H,D], index_k [Tk,D], weights [Tq,H], scores fp32 [Tq,W] (W >= the longest key
          sequence; columns are local to each row's sequence), lse fp32 [Tq], cu_seqlens_q/k int32 [batch+1],
          max_seqlen_q: host int >= the longest query sequence (sizes the grid; no device read)
Heads H and head_dim D come from ops/dsa/supported.py. index_q's (row, head) axes must be mergeable (the head
axis dense, as in any contiguous tensor): the kernel loads 256 (query, head) rows as one TMA tile.
Variants are compiled once per (D, H, weight dtype, varlen, with lse, with q_offsets); shapes, strides, causal and
ratio are runtime values. Kernel: score_sm90.py on ops/common/head_sum_sm90.py; checks: ops/common/head_sum_host.py.
"""
import os

from .. import supported
from . import check_indexer_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}
N_COLS = 256        # score_sm90.N_COLS


def variant_key(head_dim, heads, w_dtype, varlen, with_lse, has_offsets):
    return (int(head_dim), int(heads), str(w_dtype), bool(varlen), bool(with_lse), bool(has_offsets))


def all_variant_keys():
    return [variant_key(d, h, w, vl, wl, off) for d in supported.INDEX_HEAD_DIMS for h in supported.INDEX_HEADS
            for w in supported.WEIGHT_DTYPES for vl in (False, True) for wl in (False, True) for off in (False, True)]


def fake_args(key):
    import cutlass
    from ...common.head_sum_host import fake_args as head_sum_fake_args
    D, H, w_name, varlen, with_lse, has_off = key
    wdt = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}[w_name]
    w_shape = ((None,) if varlen else (None, None)) + (H,)
    return head_sum_fake_args(D, H, varlen, wdt, w_shape, with_lse, has_off)


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .score_sm90 import IndexerScoreSm90
        D, H, _, varlen, with_lse, has_off = key
        fn = kernel_cache.compile(IndexerScoreSm90(D, H, varlen, with_lse, has_off), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def indexer_fwd(index_q, index_k, weights, scores, lse=None, *, causal=True, ratio=1, q_offsets=None,
                cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0):
    from ...common.head_sum_host import HeadSumCall

    call = HeadSumCall(("index_q", "index_k", "scores", "lse"), index_q, index_k, scores, lse, q_offsets,
                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, ratio)
    H, D = call.heads, call.head_dim
    w = check_indexer_side(call, weights)
    if call.empty:
        return
    w.require_inner_contiguous(w.bits // 8)
    fn = compile_variant(variant_key(D, H, w.dtype, call.varlen, lse is not None, q_offsets is not None))
    call.launch(fn, w, N_COLS, 1.0, causal, ratio, stream)
