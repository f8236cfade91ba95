"""CPU CI: compile every backward variant the seam (ops/flash_attention/bwd.py) can choose, for sm_90a.

Static configurations: dtype x head_dim x varlen x deterministic (masks, GQA ratio, dlse and scale are runtime
values), plus the pipelined non-deterministic kernel (PADDLE_DSA_BWD_FAST=1, backward_fast_sm90.py).
Uses fake tensors (no GPU needed)."""
import os
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ops.flash_attention import bwd  # noqa: E402
from ops.flash_attention import supported  # noqa: E402


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim", list(supported.HEAD_DIMS))
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd(dtype, head_dim, varlen, deterministic):
    fn = bwd.compile_variant(dtype, head_dim, varlen, deterministic)
    assert fn is not None


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim", list(supported.HEAD_DIMS))
@pytest.mark.parametrize("dtype", list(supported.DTYPES))
def test_compile_bwd_fast(dtype, head_dim, varlen):
    fn = bwd.compile_variant(dtype, head_dim, varlen, False, fast=True)
    assert fn is not None
