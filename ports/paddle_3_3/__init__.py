"""Port for Paddle 3.3: the interface layer between paddle_dsa and this release line.

See PORT.md beside this file for what differs from the other lines.
"""
import paddle
import paddle.utils.dlpack as _dlpack

NAME = "3.3"

_DTYPE_NAMES = (
    (paddle.bfloat16, "bfloat16"),
    (paddle.float16, "float16"),
    (paddle.float32, "float32"),
    (paddle.float64, "float64"),
    (paddle.int32, "int32"),
    (paddle.int64, "int64"),
    (paddle.bool, "bool"),
)
_FROM_NAMES = {name: dt for dt, name in _DTYPE_NAMES}


def dtype_name(dtype):
    """'bfloat16', 'float16', ... for a Paddle dtype object; the repr of anything else."""
    for dt, name in _DTYPE_NAMES:
        if dtype == dt:
            return name
    return str(dtype)


def dtype_from_name(name):
    return _FROM_NAMES[name]


def is_tensor(x):
    return isinstance(x, paddle.Tensor)


def shape(t):
    return tuple(int(s) for s in t.shape)


def is_gpu(t):
    return t.place.is_gpu_place()


def needs_grad(t):
    return not t.stop_gradient


def saved_tensors(ctx):
    return ctx.saved_tensor()


def in_dynamic_mode():
    return paddle.in_dynamic_mode()


def to_numpy(t):
    return t.numpy()


class _Export:
    """DLPack view of a Paddle tensor for the kernels: no grad check, no stream synchronisation."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None, **_):
        return _dlpack.to_dlpack(self.t)

    def __dlpack_device__(self):
        place = self.t.place
        if place.is_gpu_place():
            return (2, place.gpu_device_id())
        return (1, 0)


def export(t):
    return _Export(t.detach())


def stream_handle(t):
    """The raw handle of Paddle's current CUDA stream on t's device."""
    return int(paddle.device.current_stream().stream_base.cuda_stream)
