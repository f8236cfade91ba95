"""Seam of the top-k kernel: validate, pick/compile a cached variant, launch (no host sync).

``topk_fwd(scores, out, *, lengths=None, order="score", stream=0) -> None``

  scores  fp32 [R, W] or [B, Sq, W] (inner stride 1; any other strides, see below)
  out     int32 [..., k] with the same leading shape, 1 <= k <= 2048 (MAX_K); every element written
  lengths int32 of the leading shape, or None: row r considers columns [0, min(lengths[r], W)) (<= 0: none)
out[r] = the columns of the k largest finite scores of row r, descending, ties lower column first, -1 past the
row's selectable count (docs/dsa.md). order="column": the same set of columns in ascending column order (the
selection does not depend on the order; sort_sm90.SelectionSort.columns_by_bitmap). Variants: (k padded to a power
of two >= 32, with lengths, rank 3, stream, by column).
stream: scores' rows are 16-byte aligned (data pointer % 16 == 0, every stride but the inner one % 4 == 0), read
with 16-byte loads by stream_sm90.TopkStreamSm90; otherwise topk_sm90.TopkSm90 (4-byte reads). Both give the same
output bits. Any strides work: rank-3 tensors are read per (batch, query row), no axis merge.
"""
import os

from .. import supported

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}
MAX_K = supported.TOPK_MAX_K


# PADDLE_DSA_TOPK_STREAM=0 keeps every call on TopkSm90 (a diagnostic switch; read once at import)
STREAM = os.environ.get("PADDLE_DSA_TOPK_STREAM", "1") != "0"


ORDERS = ("score", "column")


def variant_key(p, has_lengths, rank3, stream=False, by_column=False):
    return (int(p), bool(has_lengths), bool(rank3), bool(stream), bool(by_column))


def all_variant_keys():
    ps = [32 << i for i in range(7)]          # 32 .. 2048
    return [variant_key(p, hl, r3, sm, bc) for p in ps for hl in (False, True) for r3 in (False, True)
            for sm in (False, True) for bc in (False, True)]


def streamable(s):
    """The scores' rows are 16-byte aligned (the streaming kernel's vector loads)."""
    return s.ptr % 16 == 0 and all(st % 4 == 0 for st in s.strides[:-1])


def fake_args(key):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
    p, has_len, rank3, stream, _ = key
    nd = 3 if rank3 else 2

    def t(dtype, rank, div=1, align=4):
        shape = tuple(cute.sym_int() for _ in range(rank))
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(rank - 1)) + (1,)
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    lens = t(cutlass.Int32, nd - 1) if has_len else None
    scores = t(cutlass.Float32, nd, 4, 16) if stream else t(cutlass.Float32, nd)
    return (scores, t(cutlass.Int32, nd), lens, cutlass.Int32(1), make_fake_stream())


def compile_variant(key):
    fn = _CACHE.get(key)
    if fn is None:
        from ...common import kernel_cache
        from .stream_sm90 import TopkStreamSm90
        from .topk_sm90 import TopkSm90
        kernel = (TopkStreamSm90 if key[3] else TopkSm90)(*key[:3], by_column=key[4])
        fn = kernel_cache.compile(kernel, *fake_args(key),
                                  variant=(__name__, "compile_variant", [key]))
        _CACHE[key] = fn
    return fn


def topk_fwd(scores, out, *, lengths=None, order="score", stream=0):
    from ...common.tensors import arg_tensor, stream_handle
    from .topk_sm90 import pad_k

    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    s = arg_tensor(scores, "scores").require_dtype("float32")
    o = arg_tensor(out, "out").require_dtype("int32")
    if len(s.shape) not in (2, 3):
        raise ValueError(f"scores: expected [rows, W] or [batch, seq_q, W], got shape {s.shape}")
    lead = s.shape[:-1]
    if len(o.shape) != len(s.shape) or o.shape[:-1] != lead:
        raise ValueError(f"out: expected shape {lead} + (k,), got {o.shape}")
    k = o.shape[-1]
    if not 1 <= k <= MAX_K:
        raise ValueError(f"out: k = {k} not supported (1 <= k <= {MAX_K})")
    ln = None
    if lengths is not None:
        ln = arg_tensor(lengths, "lengths")
        if ln.dtype != "int32" or ln.shape != lead:
            raise ValueError(f"lengths: expected int32 {lead}, got {ln.dtype} {ln.shape}")
    if 0 in lead:
        return
    if s.shape[-1] == 0:
        raise ValueError("scores: zero columns (the caller writes -1 everywhere; nothing to launch)")
    s.require_inner_contiguous(4)
    o.require_inner_contiguous(4)
    rank3 = len(s.shape) == 3
    if ln is not None:
        ln.require_inner_contiguous(4)
    fn = compile_variant(variant_key(pad_k(k), ln is not None, rank3, STREAM and streamable(s), order == "column"))
    fn(s.ffi, o.ffi, None if ln is None else ln.ffi, k, stream_handle(stream))
