"""Seam of the sm90 flash-attention backward: ``flash_attn_bwd`` (see backward_sm90.py for the kernels).

Inputs reach here as DLPack objects (torch tensors in the GPU tests, a Paddle export later); dq/dk/dv are
preallocated by the caller with the shapes/dtypes of q/k/v and are fully written. Workspaces (fp32 log2-LSE,
Delta and the dQ accumulator, all initialised by the kernels) come from the caller's ``alloc``.
No host synchronisation, no device reads on the host: graph-capturable.
"""
import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import from_dlpack, make_fake_tensor, make_fake_stream  # noqa: E402

from . import supported  # noqa: E402
from ..common.mask import effective_window  # noqa: E402
from .backward_sm90 import FlashBwdSm90, BLOCK_M, BLOCK_N  # noqa: E402
from .backward_fast_sm90 import FlashBwdSm90Fast, BLOCK_N_FAST  # noqa: E402

_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
_CACHE = {}

# PADDLE_DSA_BWD_FAST selects the kernel of the non-deterministic path; read once at import:
#   0: the simple kernels (backward_sm90.py: one warpgroup, fp32 dQ atomics)
#   1: the pipelined kernel (backward_fast_sm90.py), each consumer warpgroup bulk-reduces its own dQ partial
#   2 (default): as 1, and for D = 128 the two warpgroups split dQ by columns over all 128 keys (half the
#      reduce traffic); D = 64 runs mode 1.
# All three pass the GPU suite, racecheck and memcheck on the H200 (2026-12-02); mode 2 is the fastest there
# (B2 H16 S8192 D128: 416 / 394 TFLOP/s non-causal / causal, against 140 / 124 for mode 0).
# Tests switch it through ``FAST`` (module attribute) or the ``fast=`` argument of flash_attn_bwd.
def _fast_mode(v):
    v = int(v) if v not in (None, "") else 0
    if v not in (0, 1, 2):
        raise ValueError(f"PADDLE_DSA_BWD_FAST / fast must be 0, 1 or 2, got {v}")
    return v


FAST = _fast_mode(os.environ.get("PADDLE_DSA_BWD_FAST", "2").strip())


def _fake(dtype, rank, align=16):
    shape = tuple(cute.sym_int() for _ in range(rank))
    stride = tuple(cute.sym_int64() for _ in range(rank - 1)) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align)


def compile_variant(dtype_name: str, head_dim: int, varlen: bool, deterministic: bool, fast=0):
    """Compile (once, cached) the whole backward for one static configuration; works without a GPU.

    fast: 0/False simple kernels, 1/True pipelined kernel, 2 pipelined with column-split dQ (D = 128; same as 1
    otherwise). Deterministic always uses the simple kernels."""
    fast = 0 if deterministic else _fast_mode(int(fast))
    if fast == 2 and head_dim != 128:
        fast = 1
    key = (dtype_name, head_dim, varlen, deterministic, fast)
    fn = _CACHE.get(key)
    if fn is not None:
        return fn
    dt = _DTYPES[dtype_name]
    r = 3 if varlen else 4
    rl = 2 if varlen else 3
    F32 = cutlass.Float32
    cu = _fake(cutlass.Int32, 1, 4) if varlen else None
    cu2 = _fake(cutlass.Int32, 1, 4) if varlen else None
    if fast:
        launcher = FlashBwdSm90Fast(dt, head_dim, varlen, dq_cols=(fast == 2))
    else:
        launcher = FlashBwdSm90(dt, head_dim, varlen, deterministic)
    fn = cute.compile(
        launcher,
        _fake(dt, r), _fake(dt, r), _fake(dt, r), _fake(dt, r), _fake(dt, r),  # q k v out dout
        _fake(F32, rl, 4), _fake(F32, rl, 4),  # lse dlse
        _fake(dt, r), _fake(dt, r), _fake(dt, r),  # dq dk dv
        _fake(F32, rl, 4), _fake(F32, rl, 4), _fake(F32, r, 16),  # lse2 delta dqacc
        cu, cu2,
        cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0),
        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), make_fake_stream())
    _CACHE[key] = fn
    return fn


def _shape(x):
    return tuple(int(s) for s in x.shape)


def _conv(x, name, align=16):
    try:
        t = from_dlpack(x, assumed_align=align)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{name}: not a DLPack tensor usable here ({e})") from e
    return t


def _check_tma(t, name, elem_bytes):
    st = tuple(int(s) for s in t.stride)
    if st[-1] != 1:
        raise ValueError(f"{name}: innermost stride must be 1, got strides {st}")
    for s, n in zip(st[:-1], t.shape[:-1]):
        if int(n) > 1 and (s * elem_bytes) % 16 != 0:
            raise ValueError(f"{name}: strides {st} must be multiples of 16 bytes (TMA)")
    ptr = getattr(t.iterator, "_pointer", None)  # from_dlpack(assumed_align=16) checks it too
    if isinstance(ptr, int) and ptr % 16 != 0:
        raise ValueError(f"{name}: base address must be 16-byte aligned")


def flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, *, dlse=None, softmax_scale, causal, window,
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                   deterministic=False, alloc, stream=0, fast=None):
    """fast: None -> module default ``FAST`` (env PADDLE_DSA_BWD_FAST: 0, 1, 2; default 2); ignored when deterministic."""
    fast = 0 if deterministic else _fast_mode(FAST if fast is None else int(fast))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    names = ("q", "k", "v", "out", "dout", "dq", "dk", "dv")
    tens = {n: _conv(x, n) for n, x in zip(names, (q, k, v, out, dout, dq, dk, dv))}
    shapes = {n: tuple(int(s) for s in tens[n].shape) for n in names}
    rank = 3 if varlen else 4
    for n in names:
        if len(shapes[n]) != rank:
            raise ValueError(f"{n}: expected a {rank}-D tensor, got shape {shapes[n]}")
    dtn = str(tens["q"].element_type)
    dt_name = {"BFloat16": "bfloat16", "Float16": "float16"}.get(dtn)
    if dt_name is None or dt_name not in supported.DTYPES:
        raise ValueError(f"q: dtype {dtn} not supported (supported: {supported.DTYPES})")
    for n in names:
        if str(tens[n].element_type) != dtn:
            raise ValueError(f"{n}: dtype {tens[n].element_type} differs from q's {dtn}")
    D = shapes["q"][-1]
    if D not in supported.HEAD_DIMS or D not in (64, 128):
        raise ValueError(f"q: head_dim {D} not supported (supported: {supported.HEAD_DIMS})")
    for n in names:
        if shapes[n][-1] != D:
            raise ValueError(f"{n}: head_dim {shapes[n][-1]} differs from q's {D}")
    for n in ("out", "dout", "dq"):
        if shapes[n] != shapes["q"]:
            raise ValueError(f"{n}: shape {shapes[n]} must equal q's {shapes['q']}")
    for n in ("v", "dk", "dv"):
        if shapes[n] != shapes["k"]:
            raise ValueError(f"{n}: shape {shapes[n]} must equal k's {shapes['k']}")
    H, Hkv = shapes["q"][-2], shapes["k"][-2]
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"k: {Hkv} kv heads do not divide {H} query heads")
    if not varlen and shapes["q"][0] != shapes["k"][0]:
        raise ValueError(f"k: batch {shapes['k'][0]} differs from q's {shapes['q'][0]}")
    for n in names:
        _check_tma(tens[n], n, 2)

    lse_t = _conv(lse, "lse", 4)
    lse_shape = tuple(shapes["q"][i] for i in ((1, 0) if varlen else (0, 2, 1)))
    if tuple(int(s) for s in lse_t.shape) != lse_shape or str(lse_t.element_type) != "Float32":
        raise ValueError(f"lse: expected float32 {lse_shape}, got {lse_t.element_type} "
                         f"{tuple(int(s) for s in lse_t.shape)}")
    if dlse is not None:
        dlse_t = _conv(dlse, "dlse", 4)
        if tuple(int(s) for s in dlse_t.shape) != lse_shape or str(dlse_t.element_type) != "Float32":
            raise ValueError(f"dlse: expected float32 {lse_shape}")
    else:
        dlse_t = lse_t

    _, left, right = effective_window(causal, window)
    Sq, Sk = shapes["q"][-3], shapes["k"][-3]
    if varlen:
        cu_q = _conv(cu_seqlens_q, "cu_seqlens_q", 4)
        cu_k = _conv(cu_seqlens_k, "cu_seqlens_k", 4)
        if str(cu_q.element_type) != "Int32" or str(cu_k.element_type) != "Int32":
            raise ValueError("cu_seqlens_q/k must be int32")
        nb_q, nb_k = int(cu_q.shape[0]) - 1, int(cu_k.shape[0]) - 1
        if nb_q != nb_k or nb_q < 0:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length >= 1")
        nbatch = nb_q
        mq, mk = int(max_seqlen_q), int(max_seqlen_k)
    else:
        cu_q = cu_k = None
        nbatch = shapes["q"][0]
        mq, mk = Sq, Sk
    grid_m = max(1, (mq + BLOCK_M - 1) // BLOCK_M)
    bn = BLOCK_N_FAST if fast else BLOCK_N
    grid_n = max(1, (mk + bn - 1) // bn)

    # workspaces (uninitialised; the kernels write every element they read)
    lse2 = alloc(lse_shape, "float32")
    delta = alloc(lse_shape, "float32")
    dqacc = alloc(shapes["q"], "float32")
    ws = [_conv(x, n, 16 if n == "dqacc" else 4) for x, n in ((lse2, "lse2"), (delta, "delta"), (dqacc, "dqacc"))]

    fn = compile_variant(dt_name, D, varlen, bool(deterministic), fast)
    if nbatch == 0 or Sq == 0 or H == 0:
        # nothing to launch over the query side; dk/dv still need zeros
        pass

    def dyn(t, rank_):
        return t.mark_layout_dynamic(leading_dim=rank_ - 1)

    args = [dyn(tens[n], rank) for n in ("q", "k", "v", "out", "dout")]
    args += [dyn(lse_t, rank - 1), dyn(dlse_t, rank - 1)]
    args += [dyn(tens[n], rank) for n in ("dq", "dk", "dv")]
    args += [dyn(ws[0], rank - 1), dyn(ws[1], rank - 1), dyn(ws[2], rank)]
    args += [dyn(cu_q, 1) if varlen else None, dyn(cu_k, 1) if varlen else None]
    fn(*args, cutlass.Float32(float(softmax_scale)), cutlass.Int32(1 if dlse is not None else 0),
       cutlass.Int32(left), cutlass.Int32(right), cutlass.Int32(nbatch), cutlass.Int32(grid_m),
       cutlass.Int32(grid_n), cuda.CUstream(int(stream)))
