"""Port for Paddle 2.6 (tested: 2.6.2): the interface layer between paddle_dsa and this release line.

Interface: ports/PORT_INTERFACE.md. What differs from the other lines: PORT.md beside this file.
"""
# Import order: zlib before paddle. paddle_dsa.ports already did it (BEFORE_PADDLE) when this module is
# reached through PORT; importing this module directly needs it too.
import sys

if "paddle" not in sys.modules:
    import zlib  # noqa: F401  (must precede `import paddle` on 2.6; see ports/__init__.py)

import paddle  # noqa: E402,F401  (after zlib: the order this line needs)

from .. import EARLY
from .. import _common as C

NAME = "2.6"
RELEASES = ("2.6.2",)
FEATURES = {
    "dlpack_export": "to_dlpack shim (2.6 has no Tensor.__dlpack__)",
    "strided_views": "copied to contiguous (2.6 to_dlpack writes contiguous strides for a strided view)",
    "fp8": "none (2.6 has no float8 dtypes)",
    "stream": "paddle.device.current_stream(dev).stream_base.cuda_stream",
    "pylayer": "PyLayer; ctx.saved_tensor()",
    "to_static": "full_graph=True refused (NotImplementedError); full_graph=False (SOT) runs eagerly",
}

_DTYPES = C.DtypeMap(NAME)

# The parts of the interface that are the same on every line (ports/_common.py).
dtype_name = _DTYPES.name  # 'bfloat16', 'float16', ... for a Paddle dtype object
dtype_from_name = _DTYPES.from_name
is_tensor = C.is_tensor
shape = C.shape
is_gpu = C.is_gpu
needs_grad = C.needs_grad
saved_tensors = C.saved_tensors
inplace_version = C.inplace_version
grad_wanted = C.grad_wanted
input_grads = C.input_grads
in_dynamic_mode = C.in_dynamic_mode
to_numpy = C.to_numpy


def export(t, writable=False):
    """DLPack export for the DSL without a host sync: same shape and dtype, compact strides.

    Paddle 2.6's to_dlpack describes a strided view (transpose, slice) with the contiguous strides of its
    shape over the base storage, so the DSL would read the wrong elements: a non-contiguous view is
    exported as a contiguous copy (refused when writable=True), as is a view whose data pointer is not
    ALIGN-aligned.
    """
    t = t.detach()
    if not t.is_contiguous():
        C.refuse_copy(t, "Paddle 2.6 exports wrong strides for a non-contiguous view", writable)
        # clone(), not contiguous(): on 2.6 (and 3.0) contiguous() converts the tensor in place, and a
        # detached view shares its impl with the caller's view, which would stop being a view.
        return C.Export(C.fresh_copy(t), copied=True)
    if not C.aligned(t):
        C.refuse_copy(t, "its data pointer is not 16-byte aligned", writable)
        return C.Export(C.fresh_copy(t), copied=True)
    return C.Export(t)


def to_cute(t, assumed_align=None, dynamic=False):
    """cute.Tensor of a Paddle tensor (imports cutlass): from_dlpack(export(t)) with the export's fixes."""
    return C.to_cute(export(t), assumed_align, dynamic)


stream_handle = C.stream_handle


def dsl_import_error():
    """Why cutlass must not be imported in this process, or None.

    On 2.6, Python's zlib loaded after paddle crashes on first use, and cutlass uses zlib at import. If
    paddle was imported before paddle_dsa (and zlib was not loaded yet), the kernels cannot be used:
    import paddle_dsa (or zlib) before paddle.
    """
    if "zlib" in EARLY["late"]:
        return ("Paddle 2.6 was imported before paddle_dsa and before Python's zlib; on 2.6 zlib (and so "
                "nvidia-cutlass-dsl, which uses it at import) crashes when first loaded after paddle. Import "
                "paddle_dsa (or `import zlib`) before paddle to use the GPU kernels.")
    return None


class _RefuseDSL:
    """Meta-path finder installed only in the broken-order case: importing cutlass / cuda.bindings would
    crash the interpreter (SIGSEGV in inflateReset2); raise ImportError instead (the kernels' loader falls
    back to the reference path on ImportError)."""

    _ROOTS = ("cutlass", "cuda.bindings")

    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in self._ROOTS):
            raise ImportError(f"paddle_dsa: not importing {name}: {dsl_import_error()}")
        return None


if dsl_import_error() is not None and "cutlass" not in sys.modules:
    import warnings

    warnings.warn("paddle_dsa: " + dsl_import_error() + " The reference path still works.", RuntimeWarning,
                  stacklevel=2)
    sys.meta_path.insert(0, _RefuseDSL())


# paddle.jit.to_static: run paddle_dsa eagerly (SOT skip list) and untransformed (AST ignore list).
C.keep_jit_out()
