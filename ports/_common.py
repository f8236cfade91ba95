"""Pieces every port shares (the same on every supported release); each port re-exports what it uses.

Nothing here is selected by version: what differs between lines lives in the port packages.
"""
import ctypes
import math

import paddle
import paddle.utils.dlpack as _dlpack

# Base-address alignment (bytes) every export guarantees; kernels may pass it as from_dlpack's
# assumed_align. Paddle's own allocations are aligned far beyond it; only views at an offset can miss.
ALIGN = 16

# dtype name -> attribute of the paddle module, in the order dtype_name() tries them. Names absent from
# a release (float8_* on 2.6) are skipped when a port builds its table.
DTYPE_ATTRS = (
    "bfloat16", "float16", "float32", "float64",
    "float8_e4m3fn", "float8_e5m2",
    "int8", "uint8", "int16", "int32", "int64", "bool",
)

# dtype name -> the cutlass Numeric class name the DSL uses for it (for tests and fp8 re-typing).
CUTE_TYPE_NAMES = {
    "bfloat16": "BFloat16", "float16": "Float16", "float32": "Float32", "float64": "Float64",
    "float8_e4m3fn": "Float8E4M3FN", "float8_e5m2": "Float8E5M2",
    "int8": "Int8", "uint8": "Uint8", "int16": "Int16", "int32": "Int32", "int64": "Int64",
}


def dtype_table():
    """((paddle dtype object, name), ...) for the dtypes this release has."""
    return tuple((getattr(paddle, n), n) for n in DTYPE_ATTRS if hasattr(paddle, n))


class DtypeMap:
    """dtype object <-> name, comparing with the paddle.* dtype objects (never strings or enums)."""

    def __init__(self, release):
        self.release = release
        self.table = dtype_table()
        self.by_name = {n: dt for dt, n in self.table}

    def name(self, dtype):
        for dt, n in self.table:
            if dtype == dt:
                return n
        return str(dtype)

    def from_name(self, name):
        try:
            return self.by_name[name]
        except KeyError:
            raise TypeError(
                f"paddle_dsa: dtype {name!r} is not available on Paddle {self.release}; this release has: "
                f"{', '.join(self.by_name)}"
            ) from None


class _DLTensor(ctypes.Structure):
    """The head of a DLManagedTensor (dlpack.h): the DLTensor it starts with."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _unit_axis_strides(capsule):
    """Give every size-1 axis of an exported tensor the stride a compact layout would have.

    Paddle 3.0-3.2 export stride 1 for size-1 axes (a [1, S, H, D] tensor arrives as (1, H*D, D, 1)).
    Such a stride addresses nothing, but TMA descriptors need every stride to be a multiple of 16
    bytes, so B = 1, Sq = 1 or an MQA key/value head (Hkv = 1) would be refused at launch. The
    strides array belongs to this capsule's own DLManagedTensor, so rewriting it changes no tensor.
    """
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if not t.strides:
        return
    inner = 1  # the extent, in elements, of the axes to the right
    for i in reversed(range(t.ndim)):
        n = t.shape[i]
        if n == 1:
            t.strides[i] = inner
        inner = max(inner, t.strides[i] * n)


class Export:
    """DLPack view of a Paddle tensor for the DSL: no grad check, no stream synchronisation.

    Attributes a consumer may read:
      t                  the Paddle tensor actually exported (the input, or a copy, or a uint8 view)
      align              guaranteed alignment in bytes of the data pointer (ALIGN)
      element_type_name  None, or the cutlass Numeric class name (e.g. "Float8E4M3FN") to set as the
                         DSL tensor's element_type: the DLPack capsule then carries the raw bytes
                         (uint8) of a dtype DLPack/CuTe cannot describe on this release.
      copied             True when the export is a copy (only ever for inputs; see export()).
    """

    __slots__ = ("t", "align", "element_type_name", "copied")

    def __init__(self, t, element_type_name=None, copied=False):
        self.t = t
        self.align = ALIGN
        self.element_type_name = element_type_name
        self.copied = copied

    def __dlpack__(self, stream=None, **_):
        # Paddle's to_dlpack: no stop_gradient check (3.0+ __dlpack__ refuses grad-requiring tensors)
        # and no stream handling (3.0-3.2 __dlpack__(stream=...) syncs the host on GPU).
        capsule = _dlpack.to_dlpack(self.t)
        _unit_axis_strides(capsule)
        return capsule

    def __dlpack_device__(self):
        place = self.t.place
        if place.is_gpu_place():
            return (2, place.gpu_device_id())
        return (1, 0)

    def __repr__(self):
        return (f"Export(shape={list(self.t.shape)}, dtype={self.t.dtype}, strides={list(self.t.strides)}, "
                f"element_type_name={self.element_type_name}, copied={self.copied})")


def aligned(t, align=ALIGN):
    # Not t.numel(): a 0-D Tensor (a host sync on GPU when compared), and it has no fp8 CPU kernel.
    return math.prod(int(s) for s in t.shape) == 0 or int(t.data_ptr()) % align == 0


def refuse_copy(t, what, writable):
    """Refuse a copy of a tensor the kernel writes into (writes would land in the copy)."""
    if writable:
        raise ValueError(
            f"paddle_dsa: cannot export this output tensor without a copy ({what}); allocate outputs "
            f"with paddle.empty (contiguous, aligned). Shape {list(t.shape)}, strides {list(t.strides)}"
        )


def fresh_copy(t):
    """A contiguous copy in a fresh (aligned) allocation; t itself is left as it is.

    Never t.contiguous(): on 2.6 and 3.0 it converts the tensor in place (new storage, new strides), and
    a detached tensor shares that state with the caller's tensor, so the caller's view would silently
    stop being a view of its base.
    """
    c = t.clone()
    return c if c.is_contiguous() else c.contiguous()  # c is ours: converting it in place is fine


def to_cute(export, assumed_align=None, dynamic=False):
    """cutlass.cute.runtime.from_dlpack of an export, honouring element_type_name (imports cutlass)."""
    import cutlass
    from cutlass.cute.runtime import from_dlpack

    ct = from_dlpack(export, assumed_align=export.align if assumed_align is None else assumed_align)
    if export.element_type_name is not None:
        ct.element_type = getattr(cutlass, export.element_type_name)
    if dynamic:
        ct = ct.mark_layout_dynamic()
    return ct


# ---- PyLayer helpers (the rules of Paddle's PyLayer node are the same on 2.6-3.3) -------------------

def is_tensor(x):
    return isinstance(x, paddle.Tensor)


def shape(t):
    """The shape as a tuple of ints (2.6-3.2 give a list, 3.3 a paddle.Size: neither is a good cache key)."""
    return tuple(int(s) for s in t.shape)


def is_gpu(t):
    return t.place.is_gpu_place()


def needs_grad(t):
    return not t.stop_gradient


def in_dynamic_mode():
    return paddle.in_dynamic_mode()


def to_numpy(t):
    return t.numpy()


def grad_wanted(tensors):
    """Per tensor input, whether it needs a gradient: record it in forward (ctx has no needs_input_grad)."""
    return tuple(not t.stop_gradient for t in tensors)


def input_grads(wanted, grads):
    """backward's return value: exactly one entry per tensor input, None where no gradient is wanted.

    `wanted` is what grad_wanted() recorded in forward (one bool per tensor argument of apply, positional
    then keyword; non-tensor arguments own no slot); `grads` holds the computed gradients in the same
    order. Returning a tensor for a stop_gradient input, or one entry too many, is a Paddle error.
    """
    grads = tuple(grads)
    if len(grads) != len(wanted):
        raise ValueError(f"paddle_dsa: {len(grads)} gradients for {len(wanted)} tensor inputs; PyLayer "
                         "backward must return exactly one per tensor input")
    return tuple(g if w else None for g, w in zip(grads, wanted))


def inplace_version(t):
    """The tensor's inplace version counter (bumped by every in-place op on it or on a view sharing its storage)."""
    return int(t._inplace_version())


def saved_tensors(ctx):
    """The tensors of ctx.save_for_backward as a tuple (Paddle's ctx.saved_tensor(); no saved_tensors)."""
    return tuple(ctx.saved_tensor())


def stream_handle(t):
    """Raw handle (int) of Paddle's current CUDA stream on t's device: the kernels' launch stream."""
    place = t.place
    if not place.is_gpu_place():
        raise ValueError(f"paddle_dsa: a CUDA stream handle needs a tensor on a CUDA place, got {place}; "
                         "the kernels run on GPU tensors only")
    dev = place.gpu_device_id()
    return int(paddle.device.current_stream(f"gpu:{dev}").stream_base.cuda_stream)


# ---- paddle.jit.to_static ------------------------------------------------------------------------------

def _package_dirs():
    """Directories of paddle_dsa's code: the package, its ports and its ops (mapped from elsewhere)."""
    import importlib.util
    import os

    top = __name__.split(".")[0]  # "paddle_dsa" when installed
    dirs = []
    for name in (top, f"{top}.ports", f"{top}.ops"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or ()) if spec else ():
            dirs.append(os.path.join(os.path.abspath(loc), ""))
    return tuple(dict.fromkeys(dirs))


JIT_STATUS = {"sot_skip": None, "ast_ignore": None}


def keep_jit_out():
    """Make paddle.jit.to_static run paddle_dsa's code eagerly instead of translating it.

    - SOT (full_graph=False) translates every Python frame it meets; on 3.0-3.3 it breaks on paddle_dsa's
      validation (UnboundLocalError '___graph_fn_saved_orig_1' in its generated code for `t.place`
      checks). Frames from files under SOT's skip prefixes run eagerly; the skip list and its setup
      function are the same in 2.6.2-3.3.1 (paddle.jit.sot.opcode_translator.skip_files).
    - AST (full_graph=True) rewrites called functions; 3.0 mistranslates keyword-only arguments with
      defaults. paddle.jit.ignore_module (public since 2.5) leaves paddle_dsa's functions as they are, so
      they run on static Values/Variables and their dynamic-mode check refuses clearly.
    """
    import sys

    dirs = _package_dirs()
    try:
        from paddle.jit.sot.opcode_translator import skip_files

        skip_files.skip_file_names.update(dirs)
        skip_files.setup_skip_files()
        JIT_STATUS["sot_skip"] = dirs
    except Exception as exc:  # an internal API: report, never fail the import
        JIT_STATUS["sot_skip"] = f"not registered: {type(exc).__name__}: {exc}"
    top = __name__.split(".")[0]
    mods = [sys.modules[m] for m in (top, f"{top}.nn", f"{top}.nn.functional") if m in sys.modules]
    try:
        paddle.jit.ignore_module(mods)
        JIT_STATUS["ast_ignore"] = tuple(m.__name__ for m in mods)
    except Exception as exc:
        JIT_STATUS["ast_ignore"] = f"not registered: {type(exc).__name__}: {exc}"
