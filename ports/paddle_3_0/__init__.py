"""Port for Paddle 3.0-3.2 (tested: 3.0.0, 3.2.2): the interface layer between paddle_dsa and this release line.

Interface: ports/PORT_INTERFACE.md. What differs from the other lines: PORT.md beside this file.
"""
import paddle

from .. import _common as C

NAME = "3.0-3.2"
RELEASES = ("3.0.0", "3.2.2")
FEATURES = {
    "dlpack_export": "to_dlpack shim (Tensor.__dlpack__ refuses grad-requiring tensors and syncs the host for any stream)",
    "strided_views": "exported as views with their own strides",
    "fp8": "uint8 view + element_type (DLPack fp8 from 3.0-3.2 is rejected by CuTe: bit width 8)",
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


# Paddle float8 dtypes -> the cutlass element type the DSL must use for their uint8 bytes.
_FP8 = ((paddle.float8_e4m3fn, "Float8E4M3FN"), (paddle.float8_e5m2, "Float8E5M2"))


def _fp8_element_type(dtype):
    for dt, cute_name in _FP8:
        if dtype == dt:
            return cute_name
    return None


def export(t, writable=False):
    """DLPack export for the DSL without a host sync: same shape, strides and dtype.

    fp8: Paddle 3.0-3.2 put fp8 into DLPack as a float of bit width 8, which CuTe rejects ("Unsupported
    float bit width: 8"); the export carries a uint8 view of the same memory (same shape and strides)
    and names the element type in element_type_name (to_cute() applies it).
    A view whose data pointer is not ALIGN-aligned is copied (refused when writable=True).
    """
    t = t.detach()
    copied = False
    if not C.aligned(t):
        C.refuse_copy(t, "its data pointer is not 16-byte aligned", writable)
        t, copied = C.fresh_copy(t), True
    fp8 = _fp8_element_type(t.dtype)
    if fp8 is not None:
        return C.Export(t.view(paddle.uint8), element_type_name=fp8, copied=copied)
    return C.Export(t, copied=copied)


def to_cute(t, assumed_align=None, dynamic=False):
    """cute.Tensor of a Paddle tensor (imports cutlass): from_dlpack(export(t)) with the export's fixes."""
    return C.to_cute(export(t), assumed_align, dynamic)


stream_handle = C.stream_handle


def dsl_import_error():
    """None: on 3.0-3.2 cutlass can be imported before or after paddle."""
    return None


# paddle.jit.to_static: run paddle_dsa eagerly (SOT skip list) and untransformed (AST ignore list).
C.keep_jit_out()
