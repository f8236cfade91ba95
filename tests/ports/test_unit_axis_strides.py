"""Size-1 axes reach the DSL with TMA-legal strides on every release.

Paddle 3.0-3.2 export stride 1 for every size-1 axis; TMA descriptors need each stride to be a multiple of
16 bytes, so without the port's fix a batch of 1, a single query or an MQA key/value head (Hkv = 1) would
be refused by the kernels' stride check. The values read through the DSL must not change either.
"""
import numpy as np
import pytest

import paddle_dsa  # noqa: F401  (port import-order step before paddle)
from paddle_dsa.ports import PORT

import paddle

pytest.importorskip("cutlass")
from cutlass.cute.runtime import from_dlpack  # noqa: E402


def _tma_legal(shape, strides, elem_bytes):
    return strides[-1] == 1 and all((s * elem_bytes) % 16 == 0 for s in strides[:-1])


@pytest.mark.parametrize("shape", [[1, 8, 2, 64], [2, 1, 2, 64], [2, 8, 1, 64], [1, 1, 1, 64], [1, 5, 128]])
@pytest.mark.parametrize("writable", [False, True])
def test_unit_axes_get_compact_strides(shape, writable):
    x = paddle.empty(shape, dtype="bfloat16")
    t = from_dlpack(PORT.export(x, writable=writable), assumed_align=16)
    strides = [int(s) for s in t.stride]
    compact = list(np.cumprod([1] + shape[::-1])[:-1][::-1])
    assert strides == compact, f"{shape}: DSL strides {strides}, compact {compact}"
    assert _tma_legal(shape, strides, 2)


def test_unit_axis_of_a_view_keeps_values():
    x = paddle.arange(2 * 3 * 8, dtype="float32").reshape([2, 3, 8])
    v = x[:, 1:2, :]  # [2, 1, 8]
    got = np.from_dlpack(PORT.export(v))
    np.testing.assert_array_equal(got, v.numpy())
    t = from_dlpack(PORT.export(v), assumed_align=4)
    keeps_views = not PORT.FEATURES["strided_views"].startswith("copied")
    assert int(t.stride[-1]) == 1 and int(t.stride[0]) == (24 if keeps_views else 8)
