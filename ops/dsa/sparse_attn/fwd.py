"""Seam of the sparse MLA attention forward kernel: validate, pick/compile a cached variant, launch.

``sparse_attn_fwd(query, kv, topk_indices, out, softmax_lse, *, softmax_scale, attn_sink=None, topk_length=None,
cu_seqlens_q=None, cu_seqlens_k=None, stream=0) -> None``

  dense : query bf16 [B,Sq,H,Dqk], kv bf16 [B,Skv,Dqk], topk_indices int32 [B,Sq,K], out bf16 [B,Sq,H,Dv],
          softmax_lse fp32 [B,H,Sq], attn_sink fp32 [H], topk_length int32 [B,Sq]
  THD   : [Tq,H,Dqk], [Tkv,Dqk], [Tq,K] (indices local to the row's sequence), [Tq,H,Dv], [H,Tq], [H], [Tq],
          cu_seqlens_q/k int32 [batch+1] (read on the device only)
Semantics: docs/dsa.md (sparse_attention) and fwd_sm90.py. Every element of out and softmax_lse is written (rows
with no valid slot, and THD rows at or past cu_seqlens_q[-1]: out 0, lse -inf). Variants: (Dqk, Dv, H, varlen,
with topk_length, with sink); (Dqk, Dv) and H from ops/dsa/supported.py. Every check raises ValueError naming the
argument before any compile or launch.
"""
import math
import os

from .. import supported

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def variant_key(head_dim, v_head_dim, heads, varlen, has_length, has_sink):
    return (int(head_dim), int(v_head_dim), int(heads), bool(varlen), bool(has_length), bool(has_sink))


def all_variant_keys():
    return [variant_key(d, dv, h, vl, tl, sk) for d, dv in supported.QK_V_HEAD_DIMS for h in supported.QUERY_HEADS
            for vl in (False, True) for tl in (False, True) for sk in (False, True)]


def fake_args(key):
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    from ...common.head_sum_host import fake_tensor
    D, Dv, H, varlen, has_len, has_sink = key
    bf, f32, i32 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32
    lead = (None,) if varlen else (None, None)
    q = fake_tensor(bf, lead + (H, D), 8, 16)
    kv = fake_tensor(bf, lead + (D,), 8, 16)
    idx = fake_tensor(i32, lead + (None,), 1, 4)
    length = fake_tensor(i32, lead, 1, 4) if has_len else None
    sink = fake_tensor(f32, (H,), 1, 4) if has_sink else None
    out = fake_tensor(bf, lead + (H, Dv), 1, 2)
    lse = fake_tensor(f32, (H, None) if varlen else (None, H, None), 1, 4)
    cu = (lambda: fake_tensor(i32, (None,), 1, 4)) if varlen else (lambda: None)
    return (q, kv, idx, length, sink, out, lse, cu(), cu(), f32(1.0), make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .fwd_sm90 import SparseAttnFwdSm90
        fn = kernel_cache.compile(SparseAttnFwdSm90(*key), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


class SparseAttnCall:
    """Checked arguments of one launch: ``at`` (name -> ArgTensor), ``varlen``, ``heads``, ``head_dim``,
    ``v_head_dim``, ``rows`` (query's leading shape), ``empty`` (no query row: nothing to write)."""

    def __init__(self, query, kv, topk_indices, out, softmax_lse, attn_sink, topk_length, cu_seqlens_q, cu_seqlens_k):
        from ...common.tensors import arg_tensor, check_grid_yz, cu_seqlens_pair
        self.varlen = cu_seqlens_q is not None
        if self.varlen != (cu_seqlens_k is not None):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
        at = {"query": arg_tensor(query, "query"), "kv": arg_tensor(kv, "kv"),
              "topk_indices": arg_tensor(topk_indices, "topk_indices"), "out": arg_tensor(out, "out"),
              "softmax_lse": arg_tensor(softmax_lse, "softmax_lse")}
        if attn_sink is not None:
            at["attn_sink"] = arg_tensor(attn_sink, "attn_sink")
        if topk_length is not None:
            at["topk_length"] = arg_tensor(topk_length, "topk_length")
        self.at = at
        q, kva, ia, oa, la = at["query"], at["kv"], at["topk_indices"], at["out"], at["softmax_lse"]
        for t in (q, kva, oa):
            t.require_dtype("bfloat16")
        ia.require_dtype("int32")
        la.require_dtype("float32")
        nd = 3 if self.varlen else 4
        if len(q.shape) != nd or len(kva.shape) != nd - 1:
            raise ValueError(f"query/kv: expected ranks {nd}/{nd - 1} ({'THD' if self.varlen else 'BSHD'}), got "
                             f"shapes {q.shape} and {kva.shape}")
        self.heads, self.head_dim = H, D = q.shape[-2], q.shape[-1]
        self.rows = rows = q.shape[:-2]
        pairs = supported.QK_V_HEAD_DIMS
        if D not in {d for d, _ in pairs}:
            raise ValueError(f"query: head_dim {D} not supported (supported (Dqk, Dv): {pairs})")
        if H not in supported.QUERY_HEADS:
            raise ValueError(f"query: {H} heads not supported (supported: {supported.QUERY_HEADS})")
        if kva.shape[-1] != D:
            raise ValueError(f"kv: head_dim {kva.shape[-1]} differs from query's {D}")
        if self.varlen:
            at["cu_seqlens_q"], at["cu_seqlens_k"], _ = cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k)
            lse_shape = (H, rows[0])
        else:
            if kva.shape[0] != rows[0]:
                raise ValueError(f"kv: batch {kva.shape[0]} differs from query's {rows[0]}")
            check_grid_yz(rows[0], "query", "batch rows")
            lse_shape = (rows[0], H, rows[1])
        if len(ia.shape) != len(rows) + 1 or ia.shape[:-1] != rows:
            raise ValueError(f"topk_indices: expected shape {rows} + (K,), got {ia.shape}")
        if len(oa.shape) != nd or oa.shape[:-1] != rows + (H,):
            raise ValueError(f"out: expected shape {rows + (H,)} + (Dv,), got {oa.shape}")
        self.v_head_dim = Dv = oa.shape[-1]
        if (D, Dv) not in pairs:
            raise ValueError(f"out: (Dqk, Dv) = {(D, Dv)} not supported (supported: {pairs})")
        if la.shape != lse_shape:
            raise ValueError(f"softmax_lse: expected shape {lse_shape}, got {la.shape}")
        if attn_sink is not None:
            sa = at["attn_sink"].require_dtype("float32")
            if sa.shape != (H,):
                raise ValueError(f"attn_sink: expected shape ({H},), got {sa.shape}")
            sa.require_inner_contiguous(4)
        if topk_length is not None:
            tl = at["topk_length"]
            if tl.dtype != "int32" or tl.shape != rows:
                raise ValueError(f"topk_length: expected int32 {rows}, got {tl.dtype} {tl.shape}")
            tl.require_inner_contiguous(4)
        self.empty = 0 in rows
        if self.empty:
            return
        q.require_tma()
        if q.strides[-3] != H * q.strides[-2]:
            raise ValueError(f"query: the (row, head) axes must be mergeable (row stride == heads x head stride), "
                             f"got strides {q.strides}")
        if kva.strides[-1] != 1 or any((s * 2) % 16 for s in kva.strides[:-1]) or kva.ptr % 16:
            raise ValueError(f"kv: rows must be 16-byte aligned with a unit inner stride (16-byte cp.async gathers), "
                             f"got strides {kva.strides}")
        ia.require_inner_contiguous(4)
        oa.require_tma()                # the forward stores out by TMA, 64 heads x 256 columns a store
        if oa.strides[-3] != H * oa.strides[-2]:
            raise ValueError(f"out: the (row, head) axes must be mergeable (row stride == heads x head stride), "
                             f"got strides {oa.strides}")
        la.require_inner_contiguous(4)


def checked_scale(softmax_scale):
    """softmax_scale as a float; a non-finite one is a ValueError (both sparse attention seams)."""
    scale = float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return scale


def sparse_attn_fwd(query, kv, topk_indices, out, softmax_lse, *, softmax_scale, attn_sink=None, topk_length=None,
                    cu_seqlens_q=None, cu_seqlens_k=None, stream=0):
    from ...common.tensors import stream_handle
    call = SparseAttnCall(query, kv, topk_indices, out, softmax_lse, attn_sink, topk_length, cu_seqlens_q,
                          cu_seqlens_k)
    scale = checked_scale(softmax_scale)
    if call.empty:
        return
    fn = compile_variant(variant_key(call.head_dim, call.v_head_dim, call.heads, call.varlen,
                                     topk_length is not None, attn_sink is not None))
    opt = lambda n: call.at[n].ffi if n in call.at else None  # noqa: E731
    fn(call.at["query"].ffi, call.at["kv"].ffi, call.at["topk_indices"].ffi, opt("topk_length"), opt("attn_sink"),
       call.at["out"].ffi, call.at["softmax_lse"].ffi, opt("cu_seqlens_q"), opt("cu_seqlens_k"),
       float(scale * math.log2(math.e)), stream_handle(stream))
