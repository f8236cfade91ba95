"""CPU CI: compile every backward variant the seam (ops/flash_attention/bwd.py) can choose, for sm_90a.

Static configurations: dtype x head_dim x varlen x deterministic (masks, GQA ratio, dlse and scale are runtime
values), plus the pipelined non-deterministic kernels (PADDLE_DSA_BWD_FAST=1 and 2, backward_fast_sm90.py) and the
pipelined kernel's ordered deterministic form (PADDLE_DSA_BWD_DET=ordered).
Uses fake tensors (no GPU needed)."""
import os
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ops.flash_attention import bwd  # noqa: E402
from ops.flash_attention import supported  # noqa: E402

# D = Dv pairs of the simple / pipelined kernels (the wide pairs: test_compile_bwd_wide)
NARROW = [d for d, dv in supported.BWD_HEAD_DIMS if (d, dv) not in supported.BWD_WIDE_HEAD_DIMS]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim", NARROW)
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd(dtype, head_dim, varlen, deterministic):
    fn = bwd.compile_variant(dtype, head_dim, varlen, deterministic)
    assert fn is not None


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim", NARROW)
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd_fast(dtype, head_dim, varlen):
    fn = bwd.compile_variant(dtype, head_dim, varlen, False, fast=1)
    assert fn is not None


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd_fast2(dtype, varlen):
    """PADDLE_DSA_BWD_FAST=2: column-split dQ, a distinct kernel for D = 128 only (D = 64 maps to mode 1)."""
    if (128, 128) not in supported.BWD_HEAD_DIMS:
        pytest.skip("D = 128 not supported")
    fn = bwd.compile_variant(dtype, 128, varlen, False, fast=2)
    assert fn is not None


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim", NARROW)
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd_ordered(dtype, head_dim, varlen):
    """The deterministic mode's ordered kernel: mode 2 at D = 128, mode 1 otherwise, dQ reduces in turn."""
    fn = bwd.compile_variant(dtype, head_dim, varlen, True, ordered=True)
    assert fn is not None
    assert (dtype, head_dim, varlen, True, 2 if head_dim == 128 else 1, True) in bwd._CACHE


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("dims", list(supported.BWD_WIDE_HEAD_DIMS), ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd_wide(dtype, dims, varlen):
    """The split form of backward_sm90.py for the wide (D, Dv) pairs (dV, dK and dQ in separate launches)."""
    fn = bwd.compile_variant(dtype, dims[0], varlen, True, v_head_dim=dims[1])
    assert fn is not None
