"""Kernel arguments from DLPack objects, and the checks a launch needs, in one place.

Every seam (``ops/*/fwd.py``, ``bwd.py``) receives framework tensors as DLPack objects (a torch tensor in the
GPU tests, a Paddle export in paddle_dsa). Each is wrapped once as a ``tvm_ffi.Tensor`` (C-level, no copy, no
host sync): its shape, strides, dtype, device and data pointer are read from it for validation, and the same
object is what the compiled kernel (``cute.compile(..., options=COMPILE_OPTIONS)``) is called with. Calling
through TVM-FFI keeps the host cost of a launch to a few microseconds per argument instead of the DSL's
Python-side argument marshalling.

``ArgTensor`` keeps the metadata as plain Python tuples/strings so checks are cheap and error messages name
the argument.
"""
KDL_CUDA = 2
COMPILE_OPTIONS = "--enable-tvm-ffi"

# cutlass Numeric class name -> dtype name, for exports that carry fp8 as raw uint8 bytes and name the real
# element type in ``element_type_name`` (Paddle 3.0-3.2; ports/PORT_INTERFACE.md).
_ELEMENT_TYPE_NAMES = {"Float8E4M3FN": "float8_e4m3fn", "Float8E5M2": "float8_e5m2"}


def _tvm_ffi():
    try:
        import tvm_ffi
    except ImportError as e:  # pragma: no cover - install_requires has it
        raise ImportError("paddle_dsa's GPU kernels need apache-tvm-ffi (pip install apache-tvm-ffi); "
                          f"importing it failed: {e}") from e
    return tvm_ffi


class ArgTensor:
    """A DLPack object wrapped for a launch: ``ffi`` (the tvm_ffi.Tensor passed to the kernel), ``name``,
    ``shape``, ``strides`` (elements), ``dtype`` (e.g. "bfloat16"), ``bits``, ``ptr``, ``device_type``."""

    __slots__ = ("ffi", "name", "shape", "strides", "dtype", "bits", "ptr", "device_type")

    def __init__(self, x, name):
        tvm_ffi = _tvm_ffi()
        if isinstance(x, tvm_ffi.Tensor):
            t = x
        else:
            if not hasattr(x, "__dlpack__"):
                raise ValueError(f"{name}: expected a DLPack tensor, got {type(x).__name__}")
            try:
                t = tvm_ffi.from_dlpack(x)
            except Exception as e:  # noqa: BLE001  (the producer's own error, re-raised naming the argument)
                raise ValueError(f"{name}: not a DLPack tensor usable here ({type(e).__name__}: {e})") from e
        self.ffi = t
        self.name = name
        self.shape = tuple(t.shape)      # tvm_ffi gives tuples of ints
        self.strides = tuple(t.strides)
        self.dtype = str(t.dtype)
        self.bits = int(t.dtype.bits)
        self.ptr = int(t.data_ptr())
        self.device_type = int(t.device.dlpack_device_type())
        element_type_name = getattr(x, "element_type_name", None)
        if element_type_name:  # raw bytes of a dtype the exporter's DLPack cannot name
            self.dtype = _ELEMENT_TYPE_NAMES.get(element_type_name, element_type_name)

    def require_cuda(self):
        if self.device_type != KDL_CUDA:
            raise ValueError(f"{self.name}: must be on a CUDA device, got DLPack device type {self.device_type} "
                             f"({self.ffi.device})")
        return self

    def require_dtype(self, *names):
        if self.dtype not in names:
            raise ValueError(f"{self.name}: dtype {self.dtype} not supported here (expected {' or '.join(names)})")
        return self

    def require_tma(self):
        """The layout a TMA descriptor accepts: innermost stride 1, every other stride a multiple of 16 bytes
        (size-1 axes included: the descriptor encodes their stride too), base address 16-byte aligned."""
        if not self.strides or self.strides[-1] != 1:
            raise ValueError(f"{self.name}: innermost (head_dim) stride must be 1, got strides {self.strides}")
        eb = self.bits // 8
        for s in self.strides[:-1]:
            if (s * eb) % 16:
                raise ValueError(f"{self.name}: every stride must be a multiple of 16 bytes (TMA), got strides "
                                 f"{self.strides} of {eb}-byte elements")
        if self.ptr % 16:
            raise ValueError(f"{self.name}: base address must be 16-byte aligned (TMA)")
        return self

    def require_inner_contiguous(self, align=4):
        """Innermost stride 1 (or a single element) and the base ``align``-byte aligned: per-row fp32/int32
        vectors (lse, cu_seqlens) read with plain loads."""
        if self.shape and self.shape[-1] > 1 and self.strides[-1] != 1:
            raise ValueError(f"{self.name}: innermost stride must be 1, got strides {self.strides}")
        if self.ptr % align:
            raise ValueError(f"{self.name}: base address must be {align}-byte aligned")
        return self


GRID_YZ_MAX = 65535      # CUDA: the largest y or z dimension of one launch's grid


def check_grid_yz(count, name, what):
    """A count a kernel puts in its launch grid's y or z dimension (batch, or sequences + 1 for a THD kernel that
    gives the rows past cu_seqlens[-1] a slice of their own): ValueError naming the argument beyond 65535."""
    if count > GRID_YZ_MAX:
        raise ValueError(f"{name}: {count} {what}, more than one kernel launch takes ({GRID_YZ_MAX}: the y / z "
                         "dimension of its grid); split the call")


def arg_tensor(x, name, *, cuda=True):
    """``ArgTensor(x, name)``, checked to be on a CUDA device unless ``cuda=False``."""
    t = ArgTensor(x, name)
    return t.require_cuda() if cuda else t


def cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k):
    """Both varlen offset vectors wrapped and checked (int32, rank 1, inner stride 1, 4-byte aligned, the same
    length >= 1); returns (cu_q, cu_k, batch). Their values are the caller's contract (no device read here)."""
    pair = []
    for name, x in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        c = arg_tensor(x, name)
        if c.dtype != "int32" or len(c.shape) != 1 or c.shape[0] < 1:
            raise ValueError(f"{name}: must be a contiguous int32 vector of batch+1 entries, got {c.dtype} "
                             f"shape {c.shape}")
        pair.append(c.require_inner_contiguous(4))
    cu_q, cu_k = pair
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both have batch+1 entries, got {cu_q.shape[0]} and "
                         f"{cu_k.shape[0]}")
    return cu_q, cu_k, cu_q.shape[0] - 1


def stream_handle(stream):
    """The raw CUDA stream handle as an int (0 = the legacy default stream): an int, None, or anything whose
    ``int()`` is the handle (``cuda.bindings.driver.CUstream``, a framework's stream wrapper)."""
    return 0 if stream is None else int(stream)
