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
ratio are runtime values.
"""
import os

from .. import supported

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}


def _lazy():
    import cutlass
    import cutlass.cute as cute
    from . import score_sm90
    return cutlass, cute, score_sm90


def variant_key(head_dim, heads, w_dtype, varlen, with_lse, has_offsets):
    return (int(head_dim), int(heads), str(w_dtype), bool(varlen), bool(with_lse), bool(has_offsets))


def all_variant_keys():
    return [variant_key(d, h, w, vl, wl, off) for d in supported.INDEX_HEAD_DIMS for h in supported.INDEX_HEADS
            for w in supported.WEIGHT_DTYPES for vl in (False, True) for wl in (False, True) for off in (False, True)]


def fake_args(key):
    """Stand-in arguments (dynamic shapes and strides) under the layout rules the seam checks before a launch."""
    cutlass, cute, _ = _lazy()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
    D, H, w_name, varlen, with_lse, has_off = key
    bf16, f32, i32 = cutlass.BFloat16, cutlass.Float32, cutlass.Int32
    wdt = {"bfloat16": bf16, "float32": f32}[w_name]

    def t(dtype, shape, divisibility, align):
        shape = tuple(cute.sym_int() if s is None else s for s in shape)
        stride = tuple(cute.sym_int64(divisibility=divisibility) for _ in shape[:-1]) + (1,)
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    lead = (None,) if varlen else (None, None)
    q = t(bf16, lead + (H, D), 8, 16)
    k = t(bf16, lead + (D,), 8, 16)
    w = t(wdt, lead + (H,), 1, 4 if w_name == "float32" else 2)
    s = t(f32, lead + (None,), 1, 4)
    lse = t(f32, lead, 1, 4) if with_lse else None
    off = make_fake_tensor(i32, (cute.sym_int(),), (1,), assumed_align=4) if has_off else None
    cu = (lambda: make_fake_tensor(i32, (cute.sym_int(),), (1,), assumed_align=4)) if varlen else (lambda: None)
    return (q, k, w, s, lse, off, cu(), cu(), i32(1), i32(1), i32(1), make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        cutlass, cute, mod = _lazy()
        from ...common.tensors import COMPILE_OPTIONS
        D, H, w_name, varlen, with_lse, has_off = key
        wdt = {"bfloat16": cutlass.BFloat16, "float32": cutlass.Float32}[w_name]
        kern = mod.IndexerScoreSm90(D, H, wdt, varlen, with_lse, has_off)
        fn = cute.compile(kern, *fake_args(key), options=COMPILE_OPTIONS)
        _CACHE[key] = fn
    return fn


def indexer_fwd(index_q, index_k, weights, scores, lse=None, *, causal=True, ratio=1, q_offsets=None,
                cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0):
    from ...common.tensors import arg_tensor, cu_seqlens_pair, stream_handle

    varlen = cu_seqlens_q is not None
    if varlen != (cu_seqlens_k is not None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    at = {n: arg_tensor(x, n) for n, x in (("index_q", index_q), ("index_k", index_k), ("weights", weights),
                                           ("scores", scores))}
    if lse is not None:
        at["lse"] = arg_tensor(lse, "lse")
    if q_offsets is not None:
        at["q_offsets"] = arg_tensor(q_offsets, "q_offsets")
    q, k, w, s = at["index_q"], at["index_k"], at["weights"], at["scores"]
    q.require_dtype(*supported.INDEX_DTYPES)
    k.require_dtype(q.dtype)
    w.require_dtype(*supported.WEIGHT_DTYPES)
    s.require_dtype("float32")
    nd = 3 if varlen else 4
    if len(q.shape) != nd or len(k.shape) != nd - 1:
        raise ValueError(f"index_q/index_k: expected ranks {nd}/{nd - 1} ({'THD' if varlen else 'BSHD'}), got shapes "
                         f"{q.shape} and {k.shape}")
    H, D = q.shape[-2], q.shape[-1]
    if D not in supported.INDEX_HEAD_DIMS:
        raise ValueError(f"index_q: head_dim {D} not supported (supported: {supported.INDEX_HEAD_DIMS})")
    if H not in supported.INDEX_HEADS:
        raise ValueError(f"index_q: {H} index heads not supported (supported: {supported.INDEX_HEADS})")
    if k.shape[-1] != D:
        raise ValueError(f"index_k: head_dim {k.shape[-1]} differs from index_q's {D}")
    rows = q.shape[:-2]
    if w.shape != rows + (H,):
        raise ValueError(f"weights: expected shape {rows + (H,)}, got {w.shape}")
    if varlen:
        at["cu_seqlens_q"], at["cu_seqlens_k"], batch = cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k)
        if len(s.shape) != 2 or s.shape[0] != rows[0]:
            raise ValueError(f"scores: expected shape ({rows[0]}, W), got {s.shape}")
        stat_shape = rows
        grid_rows = int(max_seqlen_q)
        if grid_rows < 0:
            raise ValueError(f"max_seqlen_q must be >= 0, got {max_seqlen_q}")
    else:
        batch, Sq, Sk = rows[0], rows[1], k.shape[1]
        if k.shape[0] != batch:
            raise ValueError(f"index_k: batch {k.shape[0]} differs from index_q's {batch}")
        if s.shape != (batch, Sq, Sk):
            raise ValueError(f"scores: expected shape {(batch, Sq, Sk)}, got {s.shape}")
        stat_shape = (batch, Sq)
        grid_rows = Sq
    if lse is not None and at["lse"].shape != stat_shape:
        raise ValueError(f"lse: expected shape {stat_shape}, got {at['lse'].shape}")
    if q_offsets is not None:
        off = at["q_offsets"]
        if off.dtype != "int32" or off.shape != (batch,):
            raise ValueError(f"q_offsets: expected int32 [{batch}], got {off.dtype} {off.shape}")
        off.require_inner_contiguous(4)
    ratio = int(ratio)
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1, got {ratio}")
    if rows[0] == 0 or (not varlen and rows[1] == 0) or s.shape[-1] == 0:
        return                                   # nothing to write
    if k.shape[0] == 0 or (not varlen and k.shape[1] == 0):
        raise ValueError("index_k: zero keys cannot be loaded by TMA (the caller writes the empty-key result)")
    q.require_tma()
    k.require_tma()
    if q.strides[-3] != H * q.strides[-2]:
        raise ValueError(f"index_q: the (row, head) axes must be mergeable (row stride == heads x head stride), got "
                         f"strides {q.strides}")
    w.require_inner_contiguous(w.bits // 8)
    s.require_inner_contiguous(4)
    if lse is not None:
        at["lse"].require_inner_contiguous(4)

    key = variant_key(D, H, w.dtype, varlen, lse is not None, q_offsets is not None)
    fn = compile_variant(key)
    qt = 256 // H
    grid_x = max(1, -(-grid_rows // qt))
    opt = lambda n: at[n].ffi if n in at else None  # noqa: E731
    fn(q.ffi, k.ffi, w.ffi, s.ffi, opt("lse"), opt("q_offsets"), opt("cu_seqlens_q"), opt("cu_seqlens_k"),
       1 if causal else 0, ratio, grid_x, stream_handle(stream))
