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
import math
import os

from .. import supported
from ...common.switches import choice, env_choice
from . import check_indexer_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}

# PADDLE_DSA_IDX_DET: the deterministic form of this kernel (read at import; ``det=`` overrides it per call):
#   "staged" (default for now): the sparse kernels' form (ops/common/deterministic_rows.py: staged rows, a sort,
#      segment sums): CTAs never wait for each other;
#   "ordered": every query row's CTA adds its d_index_k tiles in turn, key block by key block (dense_bwd_sm90.py,
#      ops/common/tile_order.py): no staging buffer, no sort, far less traffic, but CTAs wait for the rows launched
#      before them (deadlock-free only if CTAs are dispatched in block order, as FlashAttention-3 also assumes).
# Both written 2026-12-04/05 and compiled for sm_90a on the CPU; neither has run on a GPU yet. The default becomes
# "ordered" once the H200 suite (tests/gpu/check_deterministic.sh 2) has passed it.
DET_FORMS = ("staged", "ordered")
DET = env_choice("PADDLE_DSA_IDX_DET", DET_FORMS)


def variant_key(head_dim, heads, w_dtype, varlen, has_offsets, deterministic=False, ordered=False):
    return (int(head_dim), int(heads), str(w_dtype), bool(varlen), bool(has_offsets), bool(deterministic),
            bool(ordered) and bool(deterministic))


def all_variant_keys():
    return [variant_key(d, h, w, vl, off, det, ordered) for d in supported.INDEX_HEAD_DIMS
            for h in supported.INDEX_HEADS for w in supported.WEIGHT_DTYPES for vl in (False, True)
            for off in (False, True) for det, ordered in ((False, False), (True, False), (True, True))]


def fake_args(key):
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    from ...common.head_sum_host import fake_tensor
    from .sparse_bwd import fake_tensors
    D, H, w_name, varlen, has_off, det, ordered = key
    t = fake_tensors(D, H, w_name, varlen, det and not ordered)
    i32 = cutlass.Int32
    off = fake_tensor(i32, (None,), 1, 4) if has_off else None
    turns = fake_tensor(i32, (None,), 1, 4) if ordered else None
    return (t["q"], t["k"], t["w"], off, t["s"], t["lse"], t["a"], t["l1"], t["c"], t["dq"], t["dk"], t["dw"],
            t["cu"](), t["cu"](), i32(1), i32(1), t["keys"], i32(0), turns, make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        import cutlass.cute as cute
        from ...common.tensors import COMPILE_OPTIONS
        from .dense_bwd_sm90 import DenseIndexerBwdSm90
        fn = cute.compile(DenseIndexerBwdSm90(*key), *fake_args(key), options=COMPILE_OPTIONS)
        _CACHE[key] = fn
    return fn


def dense_indexer_bwd(index_q, index_k, weights, index_score, index_lse, attn_score, attn_l1norm, grad_scale,
                      d_index_q, d_index_k, d_weights, *, causal=True, ratio=1, q_offsets=None, cu_seqlens_q=None,
                      cu_seqlens_k=None, deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0,
                      det=None):
    from ...common.deterministic_rows import check_row, check_workspace
    from ...common.head_sum_host import HeadSumCall
    from .sparse_bwd import gradient_buffers, launch_rows
    ordered = bool(deterministic) and choice(DET if det is None else det, "PADDLE_DSA_IDX_DET / det",
                                             DET_FORMS) == "ordered"
    if deterministic:
        check_workspace(workspace, workspace_bytes)
    if index_lse is None:
        raise ValueError("index_lse: required (the recompute's row lse)")
    call = HeadSumCall(("index_q", "index_k", "index_score", "index_lse"), index_q, index_k, index_score, index_lse,
                       q_offsets, cu_seqlens_q, cu_seqlens_k, 0, ratio)
    w = check_indexer_side(call, weights)
    w.require_inner_contiguous(w.bits // 8)
    if deterministic and not ordered:
        check_row(1 if call.varlen else call.rows[0], call.at["index_score"].shape[-1], 1, call.head_dim)
    extra, c, dk, s = gradient_buffers(call, attn_score, attn_l1norm, grad_scale, d_index_q, d_index_k, d_weights,
                                       stream)
    at = call.at
    if call.empty:
        return
    n_slots = at["index_score"].shape[-1]        # entries a row: one per score column (slot j = key j)
    fn = compile_variant(variant_key(call.head_dim, call.heads, w.dtype, call.varlen, q_offsets is not None,
                                     bool(deterministic), ordered))
    opt = lambda n: at[n].ffi if n in at else None  # noqa: E731
    head = (at["index_q"].ffi, at["index_k"].ffi, w.ffi, opt("q_offsets"), at["index_score"].ffi,
            at["index_lse"].ffi, extra["attn_score"].ffi, extra["attn_l1norm"].ffi, c.ffi, extra["d_index_q"].ffi)
    tail = (extra["d_weights"].ffi, opt("cu_seqlens_q"), opt("cu_seqlens_k"))
    scalars = (int(bool(causal)), int(ratio))
    if ordered:
        # one turn counter per key block of 64: batch / sequence + ceil(key rows / 64) over all of them
        from ...common.tensors import arg_tensor
        n_seq = call.rows[0] if not call.varlen else at["cu_seqlens_q"].shape[0] - 1
        key_rows = int(math.prod(dk.shape[:-1]))
        turns = arg_tensor(workspace.export(workspace.alloc((n_seq + (key_rows + 63) // 64,), "int32")),
                           "turn workspace")
        fn(*head, dk.ffi, *tail, *scalars, None, 0, turns.ffi, s)
        return
    launch_rows(fn, head, tail, scalars, call, dk, n_slots, bool(deterministic), workspace, workspace_bytes, s,
                extra=(None,))
