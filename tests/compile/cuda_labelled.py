"""Host numpy arrays exported through DLPack as if they were CUDA memory, for CPU tests of the kernel seams' checks.

The seams read shape/stride/dtype/pointer metadata from the DLPack tensor exactly as from real device tensors; no
kernel ever runs on these (the tests make invalid calls that must end in the seam's ValueError). ``bf16`` relabels a
uint16 array's element type as bfloat16 (numpy has none).
"""
import ctypes

import numpy as np


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_get = ctypes.pythonapi.PyCapsule_GetPointer
_get.restype = ctypes.c_void_p
_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
KDL_BFLOAT = 4


class CudaLabelled:
    """A numpy array exported through DLPack with device type kDLCUDA (2) (and, if asked, element type bf16)."""

    def __init__(self, a, bf16=False):
        self.a = a
        self.bf16 = bf16

    def __dlpack__(self, **_):
        cap = self.a.__dlpack__()
        t = _DLTensor.from_address(_get(cap, b"dltensor"))
        t.device_type = 2
        if self.bf16:
            t.code = KDL_BFLOAT
        return cap

    def __dlpack_device__(self):
        return (2, 0)


def cuda(a):
    return CudaLabelled(a)


def bf16(*shape):
    """A zero 'CUDA' bfloat16 tensor of this shape (or pass an existing uint16 array view)."""
    return CudaLabelled(np.zeros(shape, dtype=np.uint16), bf16=True)


def bf16_view(a):
    return CudaLabelled(a, bf16=True)
