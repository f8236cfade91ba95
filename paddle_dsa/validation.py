"""Input validation shared by every paddle_dsa op.

Every check raises before any work: TypeError for a wrong kind of argument, ValueError for a wrong
shape, dtype or value, NotImplementedError for an unsupported mode. Messages name the op, the
argument, the value received and what is supported. (An exception raised inside a PyLayer backward
reaches users as OSError, so all checks run in forward.)
"""
import numbers

import numpy as np

from . import config
from ._port import PORT


def fail(op, message, exc=ValueError):
    raise exc(f"paddle_dsa.{op}: {message}")


def require_dynamic_mode(op):
    if not PORT.in_dynamic_mode():
        fail(
            op,
            "static graph mode is not supported (the kernels run outside Paddle's graph and a traced "
            "program would get wrong gradients); use dygraph, or paddle.jit.to_static(full_graph=False)",
            NotImplementedError,
        )


def check_tensor(op, name, x, optional=False):
    if x is None and optional:
        return
    if not PORT.is_tensor(x):
        fail(op, f"`{name}` must be a paddle.Tensor, got {type(x).__name__}", TypeError)


def check_rank(op, name, x, rank, layout):
    shp = PORT.shape(x)
    if len(shp) != rank:
        fail(op, f"`{name}` must have rank {rank} ({layout}), got shape {list(shp)}")
    return shp


def check_dtype(op, name, x, allowed):
    got = PORT.dtype_name(x.dtype)
    if got not in allowed:
        fail(op, f"`{name}` dtype {got} is not supported; supported: {', '.join(allowed)}", TypeError)
    return got


def check_same_dtype(op, names, tensors):
    got = [PORT.dtype_name(t.dtype) for t in tensors]
    if len(set(got)) != 1:
        pairs = ", ".join(f"{n}={g}" for n, g in zip(names, got))
        fail(op, f"{', '.join(f'`{n}`' for n in names)} must share one dtype, got {pairs}", TypeError)
    return got[0]


def check_same_place(op, names, tensors):
    kinds = [PORT.is_gpu(t) for t in tensors]
    if len(set(kinds)) != 1:
        fail(op, f"{', '.join(f'`{n}`' for n in names)} must all be on the same device")


def check_bool(op, name, v):
    if not isinstance(v, (bool, np.bool_)):
        fail(op, f"`{name}` must be a bool, got {type(v).__name__}", TypeError)
    return bool(v)


def check_positive_dims(op, name, shp, dims):
    for d in dims:
        if shp[d] < 1:
            fail(op, f"`{name}` has an empty axis {d}: shape {list(shp)}; every axis must be >= 1")


def check_scale(op, name, v, default):
    """A finite real scale, or None for the default."""
    if v is None:
        return float(default)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        fail(op, f"`{name}` must be a real number or None, got {type(v).__name__}", TypeError)
    v = float(v)
    if not np.isfinite(v):
        fail(op, f"`{name}` must be finite, got {v}")
    return v


def check_int(op, name, v, minimum=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        fail(op, f"`{name}` must be an int, got {type(v).__name__}", TypeError)
    v = int(v)
    if minimum is not None and v < minimum:
        fail(op, f"`{name}` must be >= {minimum}, got {v}")
    return v


WINDOW_MAX = 2**31 - 1


def check_window(op, window_size):
    """(left, right), each an int >= -1 where -1 means unbounded."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        fail(op, f"`window_size` must be a pair (left, right), got {window_size!r}", TypeError)
    left, right = window_size
    for side, v in (("left", left), ("right", right)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            fail(op, f"`window_size` {side} must be an int, got {type(v).__name__}", TypeError)
        if v < -1:
            fail(op, f"`window_size` {side} must be >= 0, or -1 for unbounded; got {int(v)}")
    # a side beyond any sequence length is unbounded in effect: clamp it to the int32 the kernels take (2**70 would
    # otherwise overflow the mask arithmetic)
    return min(int(left), WINDOW_MAX), min(int(right), WINDOW_MAX)


def check_cu_seqlens(op, name, cu, total_tokens, max_name, max_seqlen):
    """cu_seqlens: int32 [batch + 1]. Returns batch. Values are checked per config."""
    check_tensor(op, name, cu)
    shp = check_rank(op, name, cu, 1, "[batch + 1]")
    check_dtype(op, name, cu, ("int32",))
    if shp[0] < 2:
        fail(op, f"`{name}` must have at least 2 entries ([batch + 1]), got shape {list(shp)}")
    if config.check_cu_seqlens_values or not PORT.is_gpu(cu):     # on the host anyway: checking costs nothing
        vals = PORT.to_numpy(cu).astype(np.int64)
        if vals[0] != 0:
            fail(op, f"`{name}` must start at 0, got {int(vals[0])}")
        lens = np.diff(vals)
        if (lens < 0).any():
            i = int(np.argmax(lens < 0))
            fail(op, f"`{name}` must be non-decreasing; entry {i + 1} ({int(vals[i + 1])}) < entry {i} ({int(vals[i])})")
        if vals[-1] > total_tokens:
            fail(op, f"`{name}`[-1] = {int(vals[-1])} exceeds the {total_tokens} tokens of its tensor")
        if lens.size and lens.max() > max_seqlen:
            fail(op, f"`{max_name}` = {max_seqlen} is smaller than the longest segment of `{name}` ({int(lens.max())})")
    return shp[0] - 1


def check_shape(op, name, x, expected, layout):
    """x's shape must equal `expected` (a tuple of ints); returns the shape."""
    shp = PORT.shape(x)
    if tuple(shp) != tuple(expected):
        fail(op, f"`{name}` must have shape {list(expected)} ({layout}), got {list(shp)}")
    return shp


def check_optional_int_tensor(op, name, x, expected, layout):
    """None, or an int32 tensor of shape `expected`."""
    if x is None:
        return None
    check_tensor(op, name, x)
    check_dtype(op, name, x, ("int32",))
    check_shape(op, name, x, expected, layout)
    return x


def check_in_table(op, what, value, allowed, hint="the CPU reference path accepts any"):
    """A value on a GPU place must be in the kernels' supported table (ValueError otherwise)."""
    if value not in allowed:
        fail(op, f"{what} {value} is not supported on a GPU place; supported: "
                 f"{', '.join(map(str, allowed))} ({hint})")
