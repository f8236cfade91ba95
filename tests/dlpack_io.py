"""Fake-kernel I/O for the CPU tests of the Paddle side of the GPU seams (tests/test_kernel_seam.py,
tests/test_dsa_kernel_seam.py): read an exported input back as a Paddle tensor, write an output through the raw
DLPack pointer as a kernel would (Paddle's from_dlpack may copy on some releases, so writes never go through it)."""
import ctypes

import numpy as np
import paddle


def read(x):
    """The Paddle tensor behind a DLPack export (None stays None)."""
    return None if x is None else paddle.utils.dlpack.from_dlpack(x.__dlpack__())


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DTYPES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (0, 32): "int32"}


def write(dst, src):
    """Write src into the memory behind the DLPack export dst (raw pointer, no copy); dst must be compact."""
    capsule = dst.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = [t.shape[i] for i in range(t.ndim)]
    assert shape == list(src.shape), (shape, list(src.shape))
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
        # compact, size-1 axes included (TMA needs every stride to be a multiple of 16 bytes; the ports fix
        # Paddle 3.0-3.2's stride 1 on size-1 axes)
        assert strides == list(np.cumprod([1] + shape[::-1])[:-1][::-1]), f"outputs must be compact: {strides}"
    data = np.ascontiguousarray(src.astype(_DTYPES[(t.code, t.bits)]).numpy())  # bf16 comes back as uint16 bits
    ctypes.memmove(t.data + t.byte_offset, data.ctypes.data, data.nbytes)
