"""Seam of the flash-attention forward: validate, pick/compile a cached kernel variant, launch (no host sync).

``flash_attn_fwd(q, k, v, out, lse, *, softmax_scale, causal, window, cu_seqlens_q=None, cu_seqlens_k=None,
max_seqlen_q=0, max_seqlen_k=0, stream=0) -> None``

Tensors are any DLPack objects (``__dlpack__``/``__dlpack_device__``) on a CUDA device; ``out``/``lse`` are
preallocated by the caller and fully written here.
  dense : q [B,Sq,H,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv], out [B,Sq,H,Dv], lse float32 [B,H,Sq]
  varlen: q [Tq,H,D], k [Tk,Hkv,D], v [Tk,Hkv,Dv], out [Tq,H,Dv], lse float32 [H,Tq], cu_seqlens_q/k int32
          [batch+1], max_seqlen_q/k host ints (no device read on the host).
  (D, Dv) one of supported.FWD_HEAD_DIMS.
Kernel variants are compiled once per (dtype, D, Dv, bounded mask, varlen) from stand-in tensors
(``fake_args``) and cached; shapes and strides are dynamic, so a new B/S/H does not recompile. Arguments are
wrapped once as tvm_ffi tensors (ops.common.tensors), validated from that metadata, and the compiled TVM-FFI
entry is called with them: no cute.Tensor is built per call.
"""
import math
import os

from . import supported

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_CACHE = {}
_LOG2E = math.log2(math.e)
BLOCK_M = supported.FWD_BLOCK_M_DEFAULT  # query rows per CTA but for supported.FWD_BLOCK_M's pairs (fwd_block_m)


def _lazy():
    import cuda.bindings.driver as cuda  # noqa: F401
    import cutlass  # noqa: F401
    import cutlass.cute as cute  # noqa: F401
    from . import forward_sm90  # noqa: F401
    return cuda, cutlass, cute, forward_sm90


def _dtype_of(name):
    import cutlass
    return {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}[name]


# Read once at import (like PADDLE_DSA_BWD_FAST), not per call:
#   PADDLE_DSA_FWD_OVERLAP=0 selects the plain (non-overlapped) mainloop, a debugging fallback;
#   PADDLE_DSA_FWD_PINGPONG=1 makes the consumer warpgroups take turns issuing wgmmas (passed the GPU tests on the
#   H200; mixed speed, so off by default).
OVERLAP = os.environ.get("PADDLE_DSA_FWD_OVERLAP", "1") != "0"
PINGPONG = os.environ.get("PADDLE_DSA_FWD_PINGPONG", "0") == "1"


def variant_key(dtype_name, head_dim, bounded, varlen, v_head_dim=None):
    v_head_dim = head_dim if v_head_dim is None else v_head_dim
    return (dtype_name, int(head_dim), int(v_head_dim), bool(bounded), bool(varlen))


def all_variant_keys():
    """Every kernel variant the seam can choose (used by the CPU compile tests)."""
    return [variant_key(dt, d, b, vl, dv) for dt in supported.DTYPES for d, dv in supported.FWD_HEAD_DIMS
            for b in (False, True) for vl in (False, True)]


def _compile(key, args):
    _, cutlass, cute, fwd_mod = _lazy()
    from ..common import kernel_cache
    dtype_name, head_dim, v_head_dim, bounded, varlen = key
    kern = fwd_mod.FlashFwdSm90(_dtype_of(dtype_name), head_dim, bounded, varlen, overlap=OVERLAP,
                                pingpong=PINGPONG, v_head_dim=v_head_dim)
    return kernel_cache.compile(kern, *args, variant=(__name__, "compile_variant", [key]))


# Stride divisibility (elements) the compiled code may assume for q/k/v/out; the seam checks 8 (16 bytes) for every
# launch. Measured on the H200 (2026-12-02, B2 S8k H16 bf16, TFLOP/s, 8 vs 1): D128 658 vs 641, D128 causal 600 vs
# 576, D64 causal 382 vs 370, but D64 non-causal 370 vs 421 (different code scheduling), so that variant is told 1
# (all with 128-row tiles: the 192-row D 64 tile has not been measured either way).
_STRIDE_DIVISIBILITY = {(64, False): 1}


def fake_args(key):
    """Stand-in arguments for compiling a variant (on a GPU machine or not): dynamic shapes and strides, the
    layout constraints the seam checks before every launch (and that the compiled TVM-FFI entry re-checks):
    q/k/v/out innermost stride 1, other strides multiples of 8 elements (16 bytes), bases 16-byte aligned;
    lse/cu_seqlens innermost stride 1, 4-byte aligned."""
    cuda, cutlass, cute, _ = _lazy()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor
    dtype_name, head_dim, v_head_dim, bounded, varlen = key
    dt = _dtype_of(dtype_name)

    def t(dtype, ndim, last=None, divisibility=8, align=16):
        shape = tuple(cute.sym_int() for _ in range(ndim - 1)) + ((last if last is not None else cute.sym_int()),)
        stride = tuple(cute.sym_int64(divisibility=divisibility) for _ in range(ndim - 1)) + (1,)
        return make_fake_tensor(dtype, shape, stride, assumed_align=align)

    nd = 3 if varlen else 4
    div = _STRIDE_DIVISIBILITY.get((int(head_dim), bool(bounded)), 8)
    q, k = (t(dt, nd, head_dim, divisibility=div) for _ in range(2))
    v, o = (t(dt, nd, v_head_dim, divisibility=div) for _ in range(2))
    lse = t(cutlass.Float32, 2 if varlen else 3, divisibility=1, align=4)
    cu_q = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4) if varlen else None
    cu_k = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=4) if varlen else None
    return (q, k, v, o, lse, cu_q, cu_k, cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0),
            cutlass.Int32(1), make_fake_stream())


def set_trial_knobs(knobs):
    """Apply knobs on trial (a dict, as ops.common.switches.knob_specs parses "NAME=VALUE,..."): FlashFwdSm90 class
    attributes (FOLD, ...); BM64="<unmasked>/<masked>", the D 64 row tiles of supported.py's table (what
    PADDLE_DSA_FWD_BM64 sets at import); PINGPONG=0/1 (what PADDLE_DSA_FWD_PINGPONG sets at import). Read while
    tracing, so set them before the first compile of a process (or give each setting its own _CACHE, as
    bench/ab_flash_fwd.py does). Returns the values replaced: pass them back to restore. Tests, sanitizers, benches
    and the store's prebuild use this one function."""
    global PINGPONG
    fwd_mod = _lazy()[3]
    old = {}
    for name, value in knobs.items():
        if name == "PINGPONG":                                  # the module switch PADDLE_DSA_FWD_PINGPONG sets
            old[name] = int(PINGPONG)
            PINGPONG = bool(int(value))
        elif name == "BM64":
            supported.fwd_block_m(64, 64, False)                 # the table parsed once
            old[name] = "%d/%d" % (supported.FWD_BLOCK_M[(64, 64, False)], supported.FWD_BLOCK_M[(64, 64, True)])
            supported.FWD_BLOCK_M = supported._bm64_table(str(value))
        elif name.isupper() and hasattr(fwd_mod.FlashFwdSm90, name):
            old[name] = getattr(fwd_mod.FlashFwdSm90, name)
            setattr(fwd_mod.FlashFwdSm90, name, value)
        else:
            raise ValueError(f"knobs: FlashFwdSm90 has no knob {name!r} (nor is it BM64 or PINGPONG)")
    return old


def compile_variant(key):
    """Compile one variant from stand-in tensors (cached): the function every launch calls, and what the CPU
    compile tests build."""
    ck = (key, OVERLAP, PINGPONG, supported.fwd_block_m(key[1], key[2], key[3]))
    fn = _CACHE.get(ck)
    if fn is None:
        fn = _compile(key, fake_args(key))
        _CACHE[ck] = fn
    return fn


def flash_attn_fwd(q, k, v, out, lse, *, softmax_scale, causal, window, cu_seqlens_q=None, cu_seqlens_k=None,
                   max_seqlen_q=0, max_seqlen_k=0, stream=0):
    from ..common.mask import effective_window
    from ..common.tensors import arg_tensor, check_grid_yz, cu_seqlens_pair, stream_handle

    varlen = cu_seqlens_q is not None
    if varlen != (cu_seqlens_k is not None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    named = {"q": q, "k": k, "v": v, "out": out, "lse": lse}
    at = {name: arg_tensor(x, name) for name, x in named.items()}

    dtype_name = at["q"].dtype
    if dtype_name not in supported.DTYPES:
        raise ValueError(f"q: dtype {dtype_name} not supported (supported: {supported.DTYPES})")
    for name in ("k", "v", "out"):
        if at[name].dtype != dtype_name:
            raise ValueError(f"{name}: dtype {at[name].dtype} differs from q's {dtype_name}")
    if at["lse"].dtype != "float32":
        raise ValueError(f"lse: must be float32, got {at['lse'].dtype}")

    qs, ks, vs, os_, ls = (at[n].shape for n in ("q", "k", "v", "out", "lse"))
    nd = 3 if varlen else 4
    for name, s in (("q", qs), ("k", ks), ("v", vs), ("out", os_)):
        if len(s) != nd:
            raise ValueError(f"{name}: expected {nd} dims ({'THD' if varlen else 'BSHD'}), got shape {s}")
    D, Dv = qs[-1], vs[-1]
    if ks[-1] != D:
        raise ValueError(f"k: head_dim must equal q's {D}, got k {ks}")
    if (D, Dv) not in supported.FWD_HEAD_DIMS:
        raise ValueError(f"q/v: (head_dim, v_head_dim) ({D}, {Dv}) not supported (supported: "
                         f"{supported.FWD_HEAD_DIMS})")
    if ks[:-1] != vs[:-1]:
        raise ValueError(f"k and v shapes differ (but for the head_dim): {ks} vs {vs}")
    if os_ != qs[:-1] + (Dv,):
        raise ValueError(f"out: shape {os_} must be q's with v's head_dim, {qs[:-1] + (Dv,)}")
    H, Hkv = qs[-2], ks[-2]
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"q heads ({H}) must be a multiple of k/v heads ({Hkv})")
    if varlen:
        Tq, Tk = qs[0], ks[0]
        if ls != (H, Tq):
            raise ValueError(f"lse: expected shape {(H, Tq)}, got {ls}")
        at["cu_seqlens_q"], at["cu_seqlens_k"], nseq = cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k)
        check_grid_yz(nseq + 1, "cu_seqlens_q", "sequences + 1 (grid slices)")
        if Tq == 0 or H == 0:
            return
        if Tk == 0:
            raise ValueError("k/v: zero total keys is not supported by the TMA path")
        rows_q = max(1, int(max_seqlen_q))
    else:
        B, Sq = qs[0], qs[1]
        if ks[0] != B:
            raise ValueError(f"k: batch {ks[0]} differs from q's {B}")
        check_grid_yz(B, "q", "batch rows")
        if ls != (B, H, Sq):
            raise ValueError(f"lse: expected shape {(B, H, Sq)}, got {ls}")
        if B == 0 or Sq == 0 or H == 0:
            return
        if ks[1] == 0:
            raise ValueError("k/v: Sk == 0 is not supported by the TMA path")
        rows_q = Sq
    for name in ("q", "k", "v", "out"):
        at[name].require_tma()
    at["lse"].require_inner_contiguous(4)
    bounded, left, right = effective_window(causal, window)
    grid_m = -(-rows_q // supported.fwd_block_m(D, Dv, bounded))     # query blocks of the variant's row tile

    scale = float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")

    fn = compile_variant(variant_key(dtype_name, D, bounded, varlen, Dv))
    cu_q = at["cu_seqlens_q"].ffi if varlen else None
    cu_k = at["cu_seqlens_k"].ffi if varlen else None
    fn(at["q"].ffi, at["k"].ffi, at["v"].ffi, at["out"].ffi, at["lse"].ffi, cu_q, cu_k,
       scale * _LOG2E, int(left), int(right), int(grid_m), stream_handle(stream))
