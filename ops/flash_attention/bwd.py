"""Seam of the sm90 flash-attention backward: ``flash_attn_bwd`` (see backward_sm90.py for the kernels).

Inputs reach here as DLPack objects (torch tensors in the GPU tests, a Paddle export from paddle_dsa), wrapped
once as tvm_ffi tensors (ops.common.tensors) that both the checks and the compiled TVM-FFI entry use; dq/dk/dv are
preallocated by the caller with the shapes/dtypes of q/k/v and are fully written. Workspaces (fp32 log2-LSE,
Delta and the dQ accumulator, and in the ordered deterministic mode one int32 turn counter per dQ tile; all
initialised by the kernels) come from the caller's ``alloc``.
No host synchronisation, no device reads on the host: graph-capturable.
"""
import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass.cute.runtime import make_fake_tensor, make_fake_stream  # noqa: E402

from . import supported  # noqa: E402
from ..common.mask import effective_window  # noqa: E402
from ..common import kernel_cache  # noqa: E402
from ..common.tensors import arg_tensor, check_grid_yz, cu_seqlens_pair, stream_handle  # noqa: E402
from ..common.switches import choice, env_choice  # noqa: E402
from .backward_sm90 import FlashBwdSm90, BLOCK_M, BLOCK_N  # noqa: E402
from .backward_fast_sm90 import FlashBwdSm90Fast, BLOCK_N_FAST  # noqa: E402

_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
_CACHE = {}

# PADDLE_DSA_BWD_FAST selects the kernel of the non-deterministic path; read once at import:
#   0: the simple kernels (backward_sm90.py: one warpgroup, fp32 dQ atomics)
#   1: the pipelined kernel (backward_fast_sm90.py), each consumer warpgroup bulk-reduces its own dQ partial
#   2 (default): as 1, and for D = 128 the two warpgroups split dQ by columns over all 128 keys (half the
#      reduce traffic); D = 64 (modes 1 and 2 alike) runs 128-row query tiles with dQ split by rows since
#      2026-12-07 (backward_fast_sm90.BM128_DIMS, "mode 3"), D = 96 mode 1.
# All three pass the GPU suite, racecheck and memcheck on the H200 (2026-12-02); mode 2 is the fastest there
# (B2 H16 S8192 D128: 416 / 394 TFLOP/s non-causal / causal, against 140 / 124 for mode 0).
# Tests switch it through ``FAST`` (module attribute) or the ``fast=`` argument of flash_attn_bwd.
def _fast_mode(v):
    v = int(v) if v not in (None, "") else 0
    if v not in (0, 1, 2):
        raise ValueError(f"PADDLE_DSA_BWD_FAST / fast must be 0, 1 or 2, got {v}")
    return v


FAST = _fast_mode(os.environ.get("PADDLE_DSA_BWD_FAST", "2").strip())

# PADDLE_DSA_BWD_DET selects the kernel of the deterministic path (D = 64, 96, 128; the wide pairs have their own
# split form); read once at import:
#   "recompute": the simple kernels, dQ recomputed by a second kernel in a fixed order (_dq of backward_sm90.py)
#   "ordered": the pipelined kernel (mode 2 for D = 64 and 128 since 2026-12-07, mode 1 at D = 96) with each dQ
#      tile's bulk reduces taken in a fixed order of the key blocks (ops/common/tile_order.py)
#   "auto" (default): the faster of the two per head_dim (AUTO_ORDERED_DIMS). H100 2026-12-07 07:40
#      (bench/flash_attention.py --bwd --quick --det, B2 H16 S8K bf16, TFLOP/s non-causal / causal,
#      perf/device_2026-12-07T0735_h100.txt): D 128 ordered 358 / 333 against recompute 301 / 280; D 64 ordered
#      244 / 234 against 235 / 214 (the ordered form's column-split dQ at D 64 since that day; on the H200 of
#      2026-12-05 mode 1 gave 171 / 198); D 96 ordered (mode 1) 225 / 271 against 279 / 263. So ordered at D 64 and
#      128, recompute at D 96. Both kernels pass the GPU suite and the sanitizers there. Since the ordered form runs
#      a tile's dQ epilogue and turn wait under the next tile's S^T / dP^T (ORDERED_EARLY_SDP_DIMS, H100 2026-12-07
#      10:24, perf/flash_early_2026-12-07T1022_h100.txt): ordered D 128 403 / 370, D 64 253 / 241, D 96 251 / 279
#      (recompute at D 96 279 / 263 at 07:40, not rerun in that call), so D 96 stays on recompute. With the 128-row
#      query tiles at D 64 (H100 2026-12-07 14:32): ordered 303 / 321 against the default form's 413 / 377.
# Tests switch it through ``DET`` (module attribute) or the ``det=`` argument of flash_attn_bwd.
DET_KERNELS = ("auto", "recompute", "ordered")
AUTO_ORDERED_DIMS = (64, 128)
DET = env_choice("PADDLE_DSA_BWD_DET", DET_KERNELS)


def _fake(dtype, rank, align=16):
    """Stand-in tensor: dynamic shape and strides, innermost stride 1, base ``align``-byte aligned (the seam
    checks all of it before a launch; the compiled TVM-FFI entry re-checks)."""
    shape = tuple(cute.sym_int() for _ in range(rank))
    stride = tuple(cute.sym_int64() for _ in range(rank - 1)) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align)


def all_variant_args():
    """compile_variant's arguments for every kernel the seam can choose (the CPU compile tests, prebuild_kernels.py):
    the simple kernels of the narrow pairs in both modes, the pipelined ones (modes 1 and 2, the ordered
    deterministic form), the wide pairs' split form."""
    narrow = [d for d, dv in supported.BWD_HEAD_DIMS if (d, dv) not in supported.BWD_WIDE_HEAD_DIMS]
    out = []
    for dt in supported.DTYPES:
        for vl in (False, True):
            out += [(dt, d, vl, det, 0, None, False) for d in narrow for det in (False, True)]
            out += [(dt, d, vl, False, 1, None, False) for d in narrow]
            out += [(dt, 128, vl, False, 2, None, False)] if (128, 128) in supported.BWD_HEAD_DIMS else []
            out += [(dt, d, vl, True, 0, None, True) for d in narrow]
            out += [(dt, d, vl, True, 0, dv, False) for d, dv in supported.BWD_WIDE_HEAD_DIMS]
    return out


def compile_variant(dtype_name: str, head_dim: int, varlen: bool, deterministic: bool, fast=0, v_head_dim=None,
                    ordered=False):
    """Compile (once, cached) the whole backward for one static configuration; works without a GPU.

    fast: 0/False simple kernels, 1/True pipelined kernel, 2 pipelined with column-split dQ (D = 128; same as 1
    otherwise). Deterministic uses the simple kernels (dQ recomputed), or with ordered=True the pipelined kernel
    with ordered dQ reduces (mode 2 for D = 128, mode 1 otherwise); the wide pairs (supported.BWD_WIDE_HEAD_DIMS)
    always run the simple kernels in their split form, deterministic by construction."""
    v_head_dim = head_dim if v_head_dim is None else int(v_head_dim)
    wide = (head_dim, v_head_dim) in supported.BWD_WIDE_HEAD_DIMS
    deterministic = bool(deterministic) or wide
    ordered = bool(ordered) and deterministic and not wide
    if ordered:
        fast = 2
    fast = 0 if deterministic and not ordered else _fast_mode(int(fast))
    if fast == 2 and head_dim not in FlashBwdSm90Fast.dq_cols_dims(ordered):
        fast = 1
    key = (dtype_name, head_dim, varlen, deterministic, fast, ordered) + \
        ((v_head_dim,) if v_head_dim != head_dim else ())
    fn = _CACHE.get(key)
    if fn is not None:
        return fn
    dt = _DTYPES[dtype_name]
    r = 3 if varlen else 4
    rl = 2 if varlen else 3
    F32 = cutlass.Float32
    cu = _fake(cutlass.Int32, 1, 4) if varlen else None
    cu2 = _fake(cutlass.Int32, 1, 4) if varlen else None
    sem = _fake(cutlass.Int32, 1, 4) if ordered else None
    if fast:
        launcher = FlashBwdSm90Fast(dt, head_dim, varlen, dq_cols=(fast == 2), ordered=ordered)
    else:
        launcher = FlashBwdSm90(dt, head_dim, varlen, deterministic, v_head_dim=v_head_dim)
    fn = kernel_cache.compile(
        launcher,
        _fake(dt, r), _fake(dt, r), _fake(dt, r), _fake(dt, r), _fake(dt, r),  # q k v out dout
        _fake(F32, rl, 4), _fake(F32, rl, 4),  # lse dlse
        _fake(dt, r), _fake(dt, r), _fake(dt, r),  # dq dk dv
        _fake(F32, rl, 4), _fake(F32, rl, 4), _fake(F32, r, 16),  # lse2 delta dqacc
        cu, cu2, sem,
        cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0),
        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), make_fake_stream(),
        variant=(__name__, "compile_variant", [dtype_name, head_dim, varlen, deterministic, fast, v_head_dim, ordered]))
    _CACHE[key] = fn
    return fn


def flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, *, dlse=None, softmax_scale, causal, window,
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                   deterministic=False, alloc, stream=0, fast=None, det=None):
    """fast: None -> module default ``FAST`` (env PADDLE_DSA_BWD_FAST: 0, 1, 2; default 2); ignored when deterministic.
    det: None -> module default ``DET`` (env PADDLE_DSA_BWD_DET: "auto", "recompute" or "ordered"); used when
    deterministic."""
    det_kind = choice(DET if det is None else det, "PADDLE_DSA_BWD_DET / det", DET_KERNELS)
    fast = 0 if deterministic else _fast_mode(FAST if fast is None else int(fast))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    names = ("q", "k", "v", "out", "dout", "dq", "dk", "dv")
    at = {n: arg_tensor(x, n) for n, x in zip(names, (q, k, v, out, dout, dq, dk, dv))}
    shapes = {n: at[n].shape for n in names}
    rank = 3 if varlen else 4
    for n in names:
        if len(shapes[n]) != rank:
            raise ValueError(f"{n}: expected a {rank}-D tensor, got shape {shapes[n]}")
    dt_name = at["q"].dtype
    if dt_name not in supported.DTYPES:
        raise ValueError(f"q: dtype {dt_name} not supported (supported: {supported.DTYPES})")
    for n in names:
        if at[n].dtype != dt_name:
            raise ValueError(f"{n}: dtype {at[n].dtype} differs from q's {dt_name}")
    D, Dv = shapes["q"][-1], shapes["v"][-1]
    kernels = supported.BWD_HEAD_DIMS
    if (D, Dv) not in kernels:
        raise ValueError(f"q/v: (head_dim, v_head_dim) ({D}, {Dv}) has no backward kernel (supported: {kernels})")
    for n in ("k", "dq", "dk"):
        if shapes[n][-1] != D:
            raise ValueError(f"{n}: head_dim {shapes[n][-1]} differs from q's {D}")
    q_dv = shapes["q"][:-1] + (Dv,)
    for n, want in (("out", q_dv), ("dout", q_dv), ("dq", shapes["q"]), ("dk", shapes["k"]), ("dv", shapes["v"])):
        if shapes[n] != want:
            raise ValueError(f"{n}: shape {shapes[n]} must be {want} (q / k / v and the value head_dim {Dv})")
    if shapes["v"][:-1] != shapes["k"][:-1]:
        raise ValueError(f"v: shape {shapes['v']} must equal k's {shapes['k']} but for the head_dim")
    ordered = bool(deterministic) and (det_kind == "ordered" or (det_kind == "auto" and D in AUTO_ORDERED_DIMS))
    if (D, Dv) in supported.BWD_WIDE_HEAD_DIMS:
        deterministic, fast, ordered = True, 0, False   # the split simple kernels: no pipelined form, no atomics
    if ordered:
        fast = 2 if D in FlashBwdSm90Fast.dq_cols_dims(True) else 1   # mode 1 at D 96
    H, Hkv = shapes["q"][-2], shapes["k"][-2]
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"k: {Hkv} kv heads do not divide {H} query heads")
    if not varlen and shapes["q"][0] != shapes["k"][0]:
        raise ValueError(f"k: batch {shapes['k'][0]} differs from q's {shapes['q'][0]}")
    if not varlen:
        check_grid_yz(shapes["q"][0], "q", "batch rows")
    Sq, Sk = shapes["q"][-3], shapes["k"][-3]
    if not varlen and shapes["q"][0] == 0:
        return  # batch 0: every tensor is empty, nothing to write
    if Sq == 0 or Sk == 0 or H == 0:
        # dk/dv (or dq) would have to be zero-filled without a query row, key or head: not done by the TMA path
        what = "query rows" if Sq == 0 else ("key rows" if Sk == 0 else "query heads")
        raise ValueError(f"q/k: zero {what} are not supported by the TMA path (q {shapes['q']}, k {shapes['k']})")
    for n in names:
        at[n].require_tma()

    lse_t = arg_tensor(lse, "lse")
    lse_shape = tuple(shapes["q"][i] for i in ((1, 0) if varlen else (0, 2, 1)))
    if lse_t.shape != lse_shape or lse_t.dtype != "float32":
        raise ValueError(f"lse: expected float32 {lse_shape}, got {lse_t.dtype} {lse_t.shape}")
    lse_t.require_inner_contiguous(4)
    if dlse is not None:
        dlse_t = arg_tensor(dlse, "dlse")
        if dlse_t.shape != lse_shape or dlse_t.dtype != "float32":
            raise ValueError(f"dlse: expected float32 {lse_shape}, got {dlse_t.dtype} {dlse_t.shape}")
        dlse_t.require_inner_contiguous(4)
    else:
        dlse_t = lse_t

    _, left, right = effective_window(causal, window)
    if varlen:
        cu_q, cu_k, nbatch = cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k)
        if nbatch < 1:
            raise ValueError("cu_seqlens_q/k: the backward needs at least one segment (batch + 1 >= 2 entries)")
        check_grid_yz(nbatch, "cu_seqlens_q", "sequences")
        mq, mk = int(max_seqlen_q), int(max_seqlen_k)
    else:
        cu_q = cu_k = None
        nbatch = shapes["q"][0]
        mq, mk = Sq, Sk
    grid_m = max(1, (mq + BLOCK_M - 1) // BLOCK_M)
    bn = BLOCK_N_FAST if fast else BLOCK_N
    grid_n = max(1, (mk + bn - 1) // bn)

    # workspaces (uninitialised; the kernels write every element they read)
    lse2 = arg_tensor(alloc(lse_shape, "float32"), "lse2 workspace").require_inner_contiguous(4)
    delta = arg_tensor(alloc(lse_shape, "float32"), "delta workspace").require_inner_contiguous(4)
    dqacc = arg_tensor(alloc(shapes["q"], "float32"), "dq_accum workspace").require_tma()
    # ordered mode: one turn counter per dQ tile, [query head, segment + first row of the 64-row block // 64] over
    # all rows end to end (backward_fast_sm90._turn_slot0; not sized by max_seqlen_q), zeroed by the kernel
    rows = Sq if varlen else nbatch * Sq
    sem = arg_tensor(alloc((H * (nbatch + (rows + BLOCK_M - 1) // BLOCK_M),), "int32"), "turn workspace") \
        if ordered else None

    fn = compile_variant(dt_name, D, varlen, bool(deterministic), fast, v_head_dim=Dv, ordered=ordered)
    fn(*(at[n].ffi for n in ("q", "k", "v", "out", "dout")), lse_t.ffi, dlse_t.ffi,
       *(at[n].ffi for n in ("dq", "dk", "dv")), lse2.ffi, delta.ffi, dqacc.ffi,
       cu_q.ffi if varlen else None, cu_k.ffi if varlen else None, sem.ffi if ordered else None,
       float(softmax_scale), 1 if dlse is not None else 0, int(left), int(right), int(nbatch), int(grid_m),
       int(grid_n), stream_handle(stream))
