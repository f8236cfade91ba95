"""Paddle CPU tensors through PORT.export into host-side @cute.jit code (CuTe DSL on CPU memory).

For every layout (contiguous, transposed views, sliced views, offset and misaligned views) and dtype
(bfloat16, float16, float32, int32, and fp8 where the release has it), the DSL must see the tensor's
shape, a stride that addresses the right elements, the right element type, and the right values. Values
are read inside jit code through the DSL's own layout: t[i] for i in colexicographic order of the shape.
"""
import numpy as np
import pytest

import paddle_dsa  # noqa: F401  (port import-order step before paddle)
from paddle_dsa.ports import PORT, _common

import paddle

cutlass = pytest.importorskip("cutlass")
cute = pytest.importorskip("cutlass.cute")
from cutlass.cute.runtime import from_dlpack  # noqa: E402

KEEPS_VIEWS = not PORT.FEATURES["strided_views"].startswith("copied")


@cute.jit
def _read(t: cute.Tensor, vals: cute.Tensor, meta: cute.Tensor):
    """vals[i] = float(t[i]) in the DSL's colex order; meta = shape then stride as the DSL sees them."""
    rank = cute.rank(t.layout)
    for d in cutlass.range_constexpr(rank):
        meta[d] = cutlass.Int64(t.shape[d])
        meta[rank + d] = cutlass.Int64(t.stride[d])
    for i in cutlass.range(cute.size(t)):
        vals[i] = t[i].to(cutlass.Float32)


def _dsl_view(export, dynamic):
    """What host-side jit code sees: (shape, stride, values in colex order)."""
    ct = _common.to_cute(export, assumed_align=16, dynamic=dynamic)
    shp = tuple(int(s) for s in export.t.shape)
    n = int(np.prod(shp))
    vals = np.full(max(n, 1), np.nan, dtype=np.float32)
    meta = np.zeros(2 * len(shp), dtype=np.int64)
    _read(ct, from_dlpack(vals), from_dlpack(meta))
    return ct, tuple(meta[: len(shp)]), tuple(meta[len(shp):]), vals[:n]


def _compact(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def _base(dtype, shape=(4, 6, 8)):
    n = int(np.prod(shape))
    # distinct small integers (exact in bf16/fp16/fp8 up to 240 with this range), signed
    vals = ((np.arange(n) * 7) % 61 - 30).astype(np.float32).reshape(shape)
    x = paddle.to_tensor(vals)
    return x.astype(dtype) if dtype != "float32" else x


LAYOUTS = {
    "contiguous": lambda x: x,
    "transposed_01": lambda x: x.transpose([1, 0, 2]),
    "transposed_last": lambda x: x.transpose([0, 2, 1]),
    "sliced_middle": lambda x: x[:, 1:5, :],
    "sliced_last": lambda x: x[:, :, 4:8],
    "sliced_rows_offset": lambda x: x[1:3],
    "misaligned_flat": lambda x: x.reshape([-1])[1:],
}
DTYPES = ("bfloat16", "float16", "float32", "int32")


def _expected(view):
    return view.astype("float32").numpy()


# static layouts for all; mark_layout_dynamic() (what compiled kernels use) for the rank-3 layouts
CASES = [(lay, False) for lay in LAYOUTS] + [(lay, True) for lay in LAYOUTS if lay != "misaligned_flat"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout,dynamic", CASES, ids=[f"{lay}-{'dyn' if d else 'static'}" for lay, d in CASES])
def test_export_into_jit(layout, dtype, dynamic):
    view = LAYOUTS[layout](_base(dtype))
    expected = _expected(view)
    ex = PORT.export(view)
    ct, shp, stride, vals = _dsl_view(ex, dynamic)

    assert shp == tuple(view.shape)
    assert ct.element_type is getattr(cutlass, _common.CUTE_TYPE_NAMES[dtype])
    # The stride the DSL sees must be the exported tensor's true stride: the view's own (shared memory)
    # or, when the port copied, the compact stride of the copy.
    if ex.copied:
        assert stride == _compact(shp)
    else:
        assert stride == tuple(view.strides)
        assert ex.t.data_ptr() == view.data_ptr()
    np.testing.assert_array_equal(vals, expected.flatten(order="F"))
    # alignment: the pointer handed to the DSL honours the promised alignment
    assert int(ex.t.data_ptr()) % ex.align == 0


@pytest.mark.parametrize("layout", ["transposed_01", "transposed_last", "sliced_middle", "sliced_last"])
def test_strided_views_policy(layout):
    """3.x: strided views go through as views (no copy, no sync); 2.6: they must be copied."""
    view = LAYOUTS[layout](_base("float32"))
    assert not view.is_contiguous()
    ex = PORT.export(view)
    assert ex.copied is (not KEEPS_VIEWS)
    if not KEEPS_VIEWS:
        with pytest.raises(ValueError, match="wrong strides"):
            PORT.export(view, writable=True)


def test_misaligned_view_is_copied_and_writable_refused():
    view = LAYOUTS["misaligned_flat"](_base("float32"))
    assert int(view.data_ptr()) % 16 != 0
    ex = PORT.export(view)
    assert ex.copied and int(ex.t.data_ptr()) % 16 == 0
    with pytest.raises(ValueError, match="aligned"):
        PORT.export(view, writable=True)


def test_export_of_grad_requiring_tensor():
    """Tensors that require grad (PyLayer inputs) export without Paddle's __dlpack__ grad check."""
    x = _base("float32")
    x.stop_gradient = False
    ex = PORT.export(x)
    _, shp, _, vals = _dsl_view(ex, False)
    assert shp == tuple(x.shape)
    np.testing.assert_array_equal(vals, x.numpy().flatten(order="F"))
    assert x.stop_gradient is False


def test_output_written_by_jit_is_seen_by_paddle():
    """An exported output is the Paddle tensor's memory: writes from jit code land in it."""

    @cute.jit
    def _fill(t: cute.Tensor):
        for i in cutlass.range(cute.size(t)):
            t[i] = cutlass.Float32(i)

    out = paddle.empty([3, 5], dtype="float32")
    ex = PORT.export(out, writable=True)
    assert not ex.copied
    _fill(_common.to_cute(ex))
    np.testing.assert_array_equal(out.numpy(), np.arange(15, dtype=np.float32).reshape(3, 5, order="F"))


FP8 = ("float8_e4m3fn", "float8_e5m2")


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("layout", ["contiguous", "transposed_last", "sliced_middle"])
def test_fp8_export(layout, dtype):
    if not PORT.FEATURES["fp8"].split()[0] in ("native", "uint8"):
        assert not hasattr(paddle, dtype)
        with pytest.raises(TypeError, match="not available"):
            PORT.dtype_from_name(dtype)
        return
    view = LAYOUTS[layout](_base(dtype))
    ex = PORT.export(view)
    ct = _common.to_cute(ex, assumed_align=16)
    assert tuple(ct.shape) == tuple(view.shape)
    assert ct.element_type is getattr(cutlass, _common.CUTE_TYPE_NAMES[dtype])
    assert tuple(ct.stride) == (_compact(tuple(view.shape)) if ex.copied else tuple(view.strides))
    # Host code cannot convert fp8 to float (the CPU execution engine fails on the fp8 cast): compare
    # the bytes the DSL reads through the fp8 tensor's layout with the view's bytes.
    n = int(np.prod(view.shape))
    vals = np.full(n, np.nan, dtype=np.float32)
    _read_bytes(ct, from_dlpack(vals))
    np.testing.assert_array_equal(vals, view.view(paddle.uint8).numpy().astype(np.float32).flatten(order="F"))
    # and those bytes are the fp8 encoding of the values
    np.testing.assert_array_equal(view.astype("float32").numpy(), _expected(view))


@cute.jit
def _read_bytes(t: cute.Tensor, vals: cute.Tensor):
    b = cute.recast_tensor(t, cutlass.Uint8)
    for i in cutlass.range(cute.size(b)):
        vals[i] = b[i].to(cutlass.Float32)


@pytest.mark.parametrize("layout", ["transposed_last", "sliced_middle", "misaligned_flat"])
def test_export_leaves_the_callers_view_alone(layout):
    """A copying export must not convert the caller's tensor (Tensor.contiguous() does, in place, on 2.6
    and 3.0): the view keeps its strides and its storage, so it still aliases its base."""
    base = _base("float32")
    view = LAYOUTS[layout](base)
    strides, ptr, contiguous = list(view.strides), view.data_ptr(), view.is_contiguous()
    PORT.export(view)
    assert list(view.strides) == strides and view.data_ptr() == ptr and view.is_contiguous() == contiguous
