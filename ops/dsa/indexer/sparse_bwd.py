"""Seam of the sparse indexer backward kernel: validate, zero d_index_k, launch.

``sparse_indexer_bwd(index_q, index_k, weights, topk_indices, index_score, index_lse, attn_score, attn_l1norm,
grad_scale, d_index_q, d_index_k, d_weights, *, topk_length=None, cu_seqlens_q=None, cu_seqlens_k=None,
deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0)``

  dense : index_q bf16 [B,Sq,Hi,Di], index_k bf16 [B,Sk,Di], weights bf16|fp32 [B,Sq,Hi], topk_indices int32
          [B,Sq,K], index_score / attn_score fp32 [B,Sq,K], index_lse / attn_l1norm fp32 [B,Sq], grad_scale fp32
          [1] (loss_coeff * grad_loss / N on the device: no host read), d_index_q bf16 like index_q (written),
          d_index_k fp32 like index_k, contiguous (zeroed here, then accumulated), d_weights fp32 [B,Sq,Hi]
          (written), topk_length int32 [B,Sq]
  THD   : the same without B; cu_seqlens_q/k int32 [batch+1]
Semantics: sparse_bwd_sm90.py. Variants: (Di, Hi, weights dtype, varlen, with topk_length, deterministic).
d_index_k is not deterministic (fp32 atomics) unless deterministic=True (ops/common/deterministic_rows.py: staged,
sorted by key through `workspace`, summed in a fixed order). Every check raises ValueError naming the argument before
any compile or launch.
"""
import math
import os

from .. import supported
from . import check_indexer_side

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def variant_key(head_dim, heads, w_dtype, varlen, has_length, deterministic=False):
    return (int(head_dim), int(heads), str(w_dtype), bool(varlen), bool(has_length), bool(deterministic))


def all_variant_keys():
    return [variant_key(d, h, w, vl, tl, det) for d in supported.INDEX_HEAD_DIMS for h in supported.INDEX_HEADS
            for w in supported.WEIGHT_DTYPES for vl in (False, True) for tl in (False, True) for det in (False, True)]


def fake_tensors(D, H, w_name, varlen, deterministic=False):
    """The compile stand-ins both indexer backward seams share: dict of q, k, w, s, lse, a, l1, c, dq, dk (the
    staging buffer [E, Di] when deterministic), dw, keys (int32 [E] or None), cu (a factory: None for BSHD)."""
    import cutlass
    from ...common.head_sum_host import fake_tensor
    bf, f32, i32 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32
    wdt = {"bfloat16": bf, "float32": f32}[w_name]
    lead = (None,) if varlen else (None, None)
    return dict(q=fake_tensor(bf, lead + (H, D), 8, 16), k=fake_tensor(bf, lead + (D,), 8, 16),
                w=fake_tensor(wdt, lead + (H,), 1, wdt.width // 8),
                s=fake_tensor(f32, lead + (None,), 1, 4), a=fake_tensor(f32, lead + (None,), 1, 4),
                lse=fake_tensor(f32, lead, 1, 4), l1=fake_tensor(f32, lead, 1, 4), c=fake_tensor(f32, (1,), 1, 4),
                dq=fake_tensor(bf, lead + (H, D), 1, 2),
                dk=fake_tensor(f32, (None, D) if deterministic else lead + (D,), 4, 16),   # contiguous, 16-byte aligned
                keys=fake_tensor(i32, (None,), 1, 4) if deterministic else None,
                dw=fake_tensor(f32, lead + (H,), 1, 4), lead=lead,
                cu=(lambda: fake_tensor(i32, (None,), 1, 4)) if varlen else (lambda: None))


def fake_args(key):
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    from ...common.head_sum_host import fake_tensor
    D, H, w_name, varlen, has_len, det = key
    t = fake_tensors(D, H, w_name, varlen, det)
    i32 = cutlass.Int32
    idx = fake_tensor(i32, t["lead"] + (None,), 1, 4)
    length = fake_tensor(i32, t["lead"], 1, 4) if has_len else None
    return (t["q"], t["k"], t["w"], idx, length, t["s"], t["lse"], t["a"], t["l1"], t["c"], t["dq"], t["dk"], t["dw"],
            t["cu"](), t["cu"](), t["keys"], i32(0), make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .sparse_bwd_sm90 import SparseIndexerBwdSm90
        fn = kernel_cache.compile(SparseIndexerBwdSm90(*key), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def sparse_indexer_bwd(index_q, index_k, weights, topk_indices, index_score, index_lse, attn_score, attn_l1norm,
                       grad_scale, d_index_q, d_index_k, d_weights, *, topk_length=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0):
    from ...common.deterministic_rows import check_row, check_workspace
    from ...common.head_sum_host import SparseHeadSumCall
    if deterministic:
        check_workspace(workspace, workspace_bytes)
    call = SparseHeadSumCall(("index_q", "index_k", "index_score", "index_lse"), index_q, index_k, topk_indices,
                             topk_length, index_score, index_lse, cu_seqlens_q, cu_seqlens_k)
    w = check_indexer_side(call, weights)
    w.require_inner_contiguous(w.bits // 8)
    if deterministic:
        check_row(1 if call.varlen else call.rows[0], call.at["topk_indices"].shape[-1], 1, call.head_dim)
    extra, c, dk, s = gradient_buffers(call, attn_score, attn_l1norm, grad_scale, d_index_q, d_index_k, d_weights,
                                       stream)
    at, qa, ka, sa = call.at, call.at["index_q"], call.at["index_k"], call.at["index_score"]
    if call.empty:
        return
    if ka.shape[0] == 0 or (not call.varlen and ka.shape[1] == 0):
        raise ValueError("index_k: zero keys (the caller writes the empty-key result: zero gradients)")
    n_slots = at["topk_indices"].shape[-1]
    deterministic = bool(deterministic) and n_slots > 0
    fn = compile_variant(variant_key(call.head_dim, call.heads, w.dtype, call.varlen, topk_length is not None,
                                     deterministic))
    opt = lambda n: at[n].ffi if n in at else None  # noqa: E731
    head = (qa.ffi, ka.ffi, w.ffi, at["topk_indices"].ffi, opt("topk_length"), sa.ffi, at["index_lse"].ffi,
            extra["attn_score"].ffi, extra["attn_l1norm"].ffi, c.ffi, extra["d_index_q"].ffi)
    tail = (extra["d_weights"].ffi, opt("cu_seqlens_q"), opt("cu_seqlens_k"))
    launch_rows(fn, head, tail, (), call, dk, n_slots, deterministic, workspace, workspace_bytes, s)


def launch_rows(fn, head, tail, scalars, call, dk, n_slots, deterministic, workspace, workspace_bytes, s):
    """One launch (d_index_k by atomics), or the deterministic form (ops/common/deterministic_rows.py): staged
    chunks of query rows, keys = the global key rows (b Sk + key, or the THD row). Both indexer backward seams."""
    from ...common.deterministic_rows import run_in_chunks
    if not deterministic:
        fn(*head, dk.ffi, *tail, *scalars, None, 0, s)
        return
    n_out = int(math.prod(dk.shape[:-1]))
    run_in_chunks(lambda stage, keys, row0: fn(*head, stage, *tail, *scalars, keys, row0, s),
                  n_rows=call.rows[-1], n_batch=1 if call.varlen else call.rows[0], n_slots=n_slots, groups=1,
                  width=call.head_dim, out=dk.ffi, out_rank=len(dk.shape), n_out=n_out, workspace=workspace,
                  workspace_bytes=workspace_bytes, stream=s)


def gradient_buffers(call, attn_score, attn_l1norm, grad_scale, d_index_q, d_index_k, d_weights, stream):
    """The checks both indexer backward seams make on the attention target and the gradient buffers (shapes from
    `call`'s index_q / index_k / index_score), then d_index_k zeroed on the stream (it accumulates). Returns (extra
    name -> ArgTensor, grad_scale ArgTensor, d_index_k ArgTensor, stream handle)."""
    from ...common.fill_sm90 import fill_f32
    from ...common.tensors import arg_tensor, stream_handle
    at, rows, H = call.at, call.rows, call.heads
    extra = {}
    for name, x, dtype, shape in (("attn_score", attn_score, "float32", at["index_score"].shape),
                                  ("attn_l1norm", attn_l1norm, "float32", rows),
                                  ("d_index_q", d_index_q, "bfloat16", at["index_q"].shape),
                                  ("d_index_k", d_index_k, "float32", at["index_k"].shape),
                                  ("d_weights", d_weights, "float32", rows + (H,))):
        t = extra[name] = arg_tensor(x, name).require_dtype(dtype)
        if t.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {t.shape}")
        t.require_inner_contiguous(t.bits // 8)
    c = arg_tensor(grad_scale, "grad_scale").require_dtype("float32")
    if c.shape not in ((1,), ()):
        raise ValueError(f"grad_scale: expected a one-element float32 tensor [1], got shape {c.shape}")
    dk = extra["d_index_k"]
    n_k = int(math.prod(dk.shape))
    want = tuple(int(math.prod(dk.shape[i + 1:])) for i in range(len(dk.shape)))
    if n_k and (dk.strides != want or dk.ptr % 16):
        raise ValueError(f"d_index_k: must be contiguous and 16-byte aligned (strides {want}), got {dk.strides}")
    s = stream_handle(stream)
    if n_k:
        fill_f32(dk.ffi, len(dk.shape), 0.0, n_k, s)          # d_index_k accumulates: every element starts at 0
    return extra, c, dk, s
