"""Seam of the sparse MLA attention backward kernel: validate, zero the dkv accumulator, launch.

``sparse_attn_bwd(query, kv, topk_indices, out, dout, softmax_lse, dq, dkv, *, softmax_scale, attn_sink=None,
d_sink_rows=None, dlse=None, topk_length=None, cu_seqlens_q=None, cu_seqlens_k=None, deterministic=False,
workspace=None, workspace_bytes=1 << 30, stream=0) -> None``

  dense : query bf16 [B,Sq,H,Dqk], kv bf16 [B,Skv,Dqk], topk_indices int32 [B,Sq,K], out / dout bf16 [B,Sq,H,Dv],
          softmax_lse fp32 [B,H,Sq] (the forward's, sink not included), dq bf16 like query (written),
          dkv fp32 [B,Skv,Dqk] (zeroed here, then accumulated), attn_sink fp32 [H] with d_sink_rows fp32 [B,Sq,H]
          (written; d_attn_sink = its sum over rows), dlse fp32 like softmax_lse, topk_length int32 [B,Sq]
  THD   : [Tq,H,Dqk], [Tkv,Dqk], [Tq,K], [Tq,H,Dv], [H,Tq], [Tq,H,Dqk], [Tkv,Dqk], [H], [Tq,H], [H,Tq], [Tq],
          cu_seqlens_q/k int32 [batch+1]
Semantics: bwd_sm90.py. Variants: (Dqk, Dv, H, varlen, with topk_length, with sink, with dlse, deterministic).
Every check raises ValueError naming the argument before any compile or launch.

dkv: by default fp32 atomics (red.v4), not bitwise deterministic. deterministic=True: bitwise reproducible, by
ops/common/deterministic_rows.py (its docstring has the contract of `workspace` and the memory): the kernel's
deterministic variant stages each valid slot's dkv rows (one per 64-head group) with the slot's global kv row
(b Skv + idx, or the THD row) as its key, chunk after chunk of query rows within `workspace_bytes`.
"""
import math
import os

from .. import supported

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def variant_key(head_dim, v_head_dim, heads, varlen, has_length, has_sink, has_dlse, deterministic=False):
    return (int(head_dim), int(v_head_dim), int(heads), bool(varlen), bool(has_length), bool(has_sink),
            bool(has_dlse), bool(deterministic))


def all_variant_keys():
    return [variant_key(d, dv, h, vl, tl, sk, dl, det) for d, dv in supported.QK_V_HEAD_DIMS
            for h in supported.QUERY_HEADS for vl in (False, True) for tl in (False, True) for sk in (False, True)
            for dl in (False, True) for det in (False, True)]


def fake_args(key):
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    from ...common.head_sum_host import fake_tensor
    D, Dv, H, varlen, has_len, has_sink, has_dlse, det = key
    bf, f32, i32 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32
    lead = (None,) if varlen else (None, None)
    lse_shape = (H, None) if varlen else (None, H, None)
    q = fake_tensor(bf, lead + (H, D), 8, 16)
    kv = fake_tensor(bf, lead + (D,), 8, 16)
    idx = fake_tensor(i32, lead + (None,), 1, 4)
    length = fake_tensor(i32, lead, 1, 4) if has_len else None
    sink = fake_tensor(f32, (H,), 1, 4) if has_sink else None
    out = fake_tensor(bf, lead + (H, Dv), 8, 16)     # TMA-compatible (SparseAttnCall): 16-byte loads of out
    dout = fake_tensor(bf, lead + (H, Dv), 8, 16)
    lse = fake_tensor(f32, lse_shape, 1, 4)
    dlse = fake_tensor(f32, lse_shape, 1, 4) if has_dlse else None
    dq = fake_tensor(bf, lead + (H, D), 1, 2)
    dkv = fake_tensor(f32, lead + (D,), 4, 16)      # contiguous, 16-byte aligned (red.v4)
    if det:                                          # the staging buffer [E G, D] and the entries' keys [E]
        dkv = fake_tensor(f32, (None, D), 4, 16)
    keys = fake_tensor(i32, (None,), 1, 4) if det else None
    dsink = fake_tensor(f32, lead + (H,), 1, 4) if has_sink else None
    cu = (lambda: fake_tensor(i32, (None,), 1, 4)) if varlen else (lambda: None)
    return (q, kv, idx, length, sink, out, dout, lse, dlse, dq, dkv, dsink, cu(), cu(), keys, i32(0), f32(1.0),
            make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .bwd_sm90 import SparseAttnBwdSm90
        fn = kernel_cache.compile(SparseAttnBwdSm90(*key), *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def sparse_attn_bwd(query, kv, topk_indices, out, dout, softmax_lse, dq, dkv, *, softmax_scale, attn_sink=None,
                    d_sink_rows=None, dlse=None, topk_length=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0):
    from ...common.deterministic_rows import check_row, check_workspace, run_in_chunks
    from ...common.fill_sm90 import fill_f32
    from ...common.tensors import arg_tensor, stream_handle
    from .fwd import SparseAttnCall, checked_scale
    call = SparseAttnCall(query, kv, topk_indices, out, softmax_lse, attn_sink, topk_length, cu_seqlens_q,
                          cu_seqlens_k)
    at, rows, H = call.at, call.rows, call.heads
    oa, qa, kva = at["out"], at["query"], at["kv"]
    at["dout"] = doa = arg_tensor(dout, "dout").require_dtype("bfloat16")
    at["dq"] = dqa = arg_tensor(dq, "dq").require_dtype("bfloat16")
    at["dkv"] = dkva = arg_tensor(dkv, "dkv").require_dtype("float32")
    if doa.shape != oa.shape:
        raise ValueError(f"dout: expected shape {oa.shape} (as out), got {doa.shape}")
    if dqa.shape != qa.shape:
        raise ValueError(f"dq: expected shape {qa.shape} (as query), got {dqa.shape}")
    if dkva.shape != kva.shape:
        raise ValueError(f"dkv: expected shape {kva.shape} (as kv), got {dkva.shape}")
    if (attn_sink is None) != (d_sink_rows is None):
        raise ValueError("attn_sink and d_sink_rows must be given together")
    if d_sink_rows is not None:
        at["d_sink_rows"] = dsa = arg_tensor(d_sink_rows, "d_sink_rows").require_dtype("float32")
        if dsa.shape != rows + (H,):
            raise ValueError(f"d_sink_rows: expected shape {rows + (H,)}, got {dsa.shape}")
        dsa.require_inner_contiguous(4)
    if dlse is not None:
        at["dlse"] = dla = arg_tensor(dlse, "dlse").require_dtype("float32")
        if dla.shape != at["softmax_lse"].shape:
            raise ValueError(f"dlse: expected shape {at['softmax_lse'].shape} (as softmax_lse), got {dla.shape}")
        dla.require_inner_contiguous(4)
    scale = checked_scale(softmax_scale)
    deterministic = bool(deterministic)
    if deterministic:
        check_workspace(workspace, workspace_bytes)
        check_row(1 if call.varlen else rows[0], at["topk_indices"].shape[-1], H // 64, call.head_dim)
    n_kv = 1
    for d in dkva.shape:
        n_kv *= d
    want = tuple(int(math.prod(dkva.shape[i + 1:])) for i in range(len(dkva.shape)))
    if n_kv and dkva.strides != want:
        raise ValueError(f"dkv: must be contiguous (strides {want}), got strides {dkva.strides}")
    if n_kv and dkva.ptr % 16:
        raise ValueError("dkv: base address must be 16-byte aligned")
    s = stream_handle(stream)
    if n_kv:
        fill_f32(dkva.ffi, len(dkva.shape), 0.0, n_kv, s)       # dkv accumulates: every element starts at 0
    if call.empty:
        return
    doa.require_tma()
    if doa.strides[-3] != H * doa.strides[-2]:
        raise ValueError(f"dout: the (row, head) axes must be mergeable, got strides {doa.strides}")
    dqa.require_inner_contiguous(2)
    n_slots = at["topk_indices"].shape[-1]
    deterministic = deterministic and n_slots > 0     # no slot: no dkv term, the plain kernel is exact
    fn = compile_variant(variant_key(call.head_dim, call.v_head_dim, H, call.varlen, topk_length is not None,
                                     attn_sink is not None, dlse is not None, deterministic))
    opt = lambda n: at[n].ffi if n in at else None  # noqa: E731
    args = (qa.ffi, kva.ffi, at["topk_indices"].ffi, opt("topk_length"), opt("attn_sink"), oa.ffi, doa.ffi,
            at["softmax_lse"].ffi, opt("dlse"), dqa.ffi)
    tail = (opt("d_sink_rows"), opt("cu_seqlens_q"), opt("cu_seqlens_k"))
    if not deterministic:
        fn(*args, dkva.ffi, *tail, None, 0, scale, s)
        return
    run_in_chunks(lambda stage, keys, row0: fn(*args, stage, *tail, keys, row0, scale, s),
                  n_rows=rows[-1], n_batch=1 if call.varlen else rows[0], n_slots=n_slots, groups=H // 64,
                  width=call.head_dim, out=dkva.ffi, out_rank=len(dkva.shape), n_out=n_kv // call.head_dim,
                  workspace=workspace, workspace_bytes=workspace_bytes, stream=s)
