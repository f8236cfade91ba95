"""Seam of the dense indexer backward kernel: validate, zero d_index_k, launch.

``dense_indexer_bwd(index_q, index_k, weights, index_score, index_lse, attn_score, attn_l1norm, grad_scale,
d_index_q, d_index_k, d_weights, *, causal=True, ratio=1, q_offsets=None, cu_seqlens_q=None, cu_seqlens_k=None,
deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0)``

  dense : index_q bf16 [B,Sq,Hi,Di], index_k bf16 [B,Sk,Di], weights bf16|fp32 [B,Sq,Hi], index_score / attn_score
          fp32 [B,Sq,Sk] (the dense recomputes' outputs), index_lse / attn_l1norm fp32 [B,Sq], grad_scale fp32 [1]
          (loss_coeff * grad_loss / N on the device: no host read), d_index_q bf16 like index_q (written), d_index_k
          fp32 like index_k, contiguous (zeroed here, then accumulated), d_weights fp32 [B,Sq,Hi] (written),
          q_offsets int32 [B]
  THD   : the same without B; scores [Tq, W] with W >= every sequence's key count (columns local to the row's
          sequence, as the recomputes write them; the caller guarantees W: the kernel never reads past W), q_offsets
          int32 [batch], cu_seqlens_q/k int32 [batch+1]
Each query row's entries are the keys of its ratio-causal mask (causal, ratio, q_offsets as in indexer_fwd).
Semantics: dense_bwd_sm90.py. Variants: (Di, Hi, weights dtype, varlen, with q_offsets, deterministic); causal and
ratio are runtime values. d_index_k is not deterministic (fp32 atomics) unless deterministic=True (as
sparse_indexer_bwd; W entries a query row). Every check raises ValueError naming the argument
before any compile or launch. An empty problem (no query row, or a zero-width score matrix) zeroes d_index_k and
launches nothing: the caller builds the zero d_index_q / d_weights (paddle_dsa does, without calling the seam).
"""
import os

from .. import supported
from . import check_indexer_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def variant_key(head_dim, heads, w_dtype, varlen, has_offsets, deterministic=False):
    return (int(head_dim), int(heads), str(w_dtype), bool(varlen), bool(has_offsets), bool(deterministic))


def all_variant_keys():
    return [variant_key(d, h, w, vl, off, det) for d in supported.INDEX_HEAD_DIMS for h in supported.INDEX_HEADS
            for w in supported.WEIGHT_DTYPES for vl in (False, True) for off in (False, True)
            for det in (False, True)]


def fake_args(key):
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    from ...common.head_sum_host import fake_tensor
    from .sparse_bwd import fake_tensors
    D, H, w_name, varlen, has_off, det = key
    t = fake_tensors(D, H, w_name, varlen, det)
    i32 = cutlass.Int32
    off = fake_tensor(i32, (None,), 1, 4) if has_off else None
    return (t["q"], t["k"], t["w"], off, t["s"], t["lse"], t["a"], t["l1"], t["c"], t["dq"], t["dk"], t["dw"],
            t["cu"](), t["cu"](), i32(1), i32(1), t["keys"], i32(0), make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .dense_bwd_sm90 import DenseIndexerBwdSm90
        fn = kernel_cache.compile(DenseIndexerBwdSm90(*key), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def dense_indexer_bwd(index_q, index_k, weights, index_score, index_lse, attn_score, attn_l1norm, grad_scale,
                      d_index_q, d_index_k, d_weights, *, causal=True, ratio=1, q_offsets=None, cu_seqlens_q=None,
                      cu_seqlens_k=None, deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0):
    from ...common.deterministic_rows import check_row, check_workspace
    from ...common.head_sum_host import HeadSumCall
    from .sparse_bwd import gradient_buffers, launch_rows
    if deterministic:
        check_workspace(workspace, workspace_bytes)
    if index_lse is None:
        raise ValueError("index_lse: required (the recompute's row lse)")
    call = HeadSumCall(("index_q", "index_k", "index_score", "index_lse"), index_q, index_k, index_score, index_lse,
                       q_offsets, cu_seqlens_q, cu_seqlens_k, 0, ratio, thd_slices=False)
    w = check_indexer_side(call, weights)
    w.require_inner_contiguous(w.bits // 8)
    if deterministic:
        check_row(1 if call.varlen else call.rows[0], call.at["index_score"].shape[-1], 1, call.head_dim)
    extra, c, dk, s = gradient_buffers(call, attn_score, attn_l1norm, grad_scale, d_index_q, d_index_k, d_weights,
                                       stream)
    at = call.at
    if call.empty:
        return
    n_slots = at["index_score"].shape[-1]        # entries a row: one per score column (slot j = key j)
    fn = compile_variant(variant_key(call.head_dim, call.heads, w.dtype, call.varlen, q_offsets is not None,
                                     bool(deterministic)))
    opt = lambda n: at[n].ffi if n in at else None  # noqa: E731
    head = (at["index_q"].ffi, at["index_k"].ffi, w.ffi, opt("q_offsets"), at["index_score"].ffi,
            at["index_lse"].ffi, extra["attn_score"].ffi, extra["attn_l1norm"].ffi, c.ffi, extra["d_index_q"].ffi)
    tail = (extra["d_weights"].ffi, opt("cu_seqlens_q"), opt("cu_seqlens_k"))
    launch_rows(fn, head, tail, (int(bool(causal)), int(ratio)), call, dk, n_slots, bool(deterministic), workspace,
                workspace_bytes, s)
