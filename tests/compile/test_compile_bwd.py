"""CPU CI: compile every backward variant the seam (ops/flash_attention/bwd.py) can choose, for sm_90a.

Static configurations (bwd.all_variant_args): dtype x head_dim x varlen x deterministic for the simple kernels (masks,
GQA ratio, dlse and scale are runtime values), the pipelined non-deterministic kernels (PADDLE_DSA_BWD_FAST=1 and 2,
backward_fast_sm90.py), the pipelined kernel's ordered deterministic form (PADDLE_DSA_BWD_DET=ordered), and the wide
pairs' split form. Uses fake tensors (no GPU needed)."""
import os
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ops.flash_attention import bwd  # noqa: E402
from ops.flash_attention import supported  # noqa: E402


def _id(args):
    dt, d, vl, det, fast, dv, ordered = args
    mode = "ordered" if ordered else "det" if det else f"fast{fast}"
    return f"{dt}-{d}{'' if dv is None else f'x{dv}'}-{'thd' if vl else 'bshd'}-{mode}"


@pytest.mark.parametrize("args", bwd.all_variant_args(), ids=_id)
def test_compile_bwd(args):
    assert bwd.compile_variant(*args) is not None


def test_variant_list():
    """The list covers each family once: per dtype and layout, the narrow pairs' simple kernels in both modes, modes 1
    and 2 of the pipelined kernel, the ordered form (mode 2 at D 64 and 128, 1 at D 96), the wide pairs."""
    narrow = [d for d, dv in supported.BWD_HEAD_DIMS if (d, dv) not in supported.BWD_WIDE_HEAD_DIMS]
    per = 2 * len(narrow) + len(narrow) + 1 + len(narrow) + len(supported.BWD_WIDE_HEAD_DIMS)
    args = bwd.all_variant_args()
    assert len(args) == len(set(args)) == per * 2 * len(supported.DTYPES)


@pytest.mark.parametrize("varlen", [False, True])
def test_ordered_modes(varlen):
    """The ordered form is mode 2 (column-split dQ) at D 64 and 128, mode 1 at D 96 (ORDERED_DQ_COLS_DIMS)."""
    for d in (64, 96, 128):
        bwd.compile_variant("bfloat16", d, varlen, True, ordered=True)
        assert ("bfloat16", d, varlen, True, 1 if d == 96 else 2, True) in bwd._CACHE


def test_fast_schedule_knobs_per_form():
    """The measured per-form choices (H100 2026-12-07, docs/performance.md): the ordered form runs a tile's dQ
    epilogue under the next tile's S^T / dP^T at D 64 / 96 / 128, the default form only at D 64 (its 128-row query
    tiles, which always do); the column stats are read ahead at D 128 only; every variant with the early S^T / dP^T
    has one dQ chunk; D 64 runs 128-row query tiles with dQ split by rows in both forms, whatever mode is asked."""
    import cutlass
    from ops.flash_attention.backward_fast_sm90 import FlashBwdSm90Fast
    for d in (64, 96, 128):
        for ordered in (False, True):
            for dq_cols in (False, True):
                k = FlashBwdSm90Fast(cutlass.BFloat16, d, False, dq_cols, ordered)
                assert k.early_sdp == ((ordered or d == 64) and k.nsplit == 1), (d, ordered, dq_cols)
                assert k.stat_ahead == (d == 128), (d, ordered, dq_cols)
                assert (k.bm, k.dq_rows) == ((128, True) if d == 64 else (64, False)), (d, ordered, dq_cols)
                assert not (k.dq_rows and k.dq_cols)
        # the ordered variants the seam compiles (mode 2 where ORDERED_DQ_COLS_DIMS says) all take it
        k = FlashBwdSm90Fast(cutlass.BFloat16, d, False, d in FlashBwdSm90Fast.dq_cols_dims(True), True)
        assert k.early_sdp and k.nsplit == 1, d


def test_query_tile_knob_checks(monkeypatch):
    """BM128_DIMS takes head_dim 64 only (the S^T, dP^T, dK, dV accumulators of wider heads do not fit in 240
    registers), and a knob set past sm90's shared memory is refused before any compile, both with a ValueError."""
    import cutlass
    from ops.flash_attention.backward_fast_sm90 import FlashBwdSm90Fast
    monkeypatch.setattr(FlashBwdSm90Fast, "BM128_DIMS", (64, 96))
    with pytest.raises(ValueError, match="head_dim 64"):
        FlashBwdSm90Fast(cutlass.BFloat16, 96, False, False, False)
    monkeypatch.setattr(FlashBwdSm90Fast, "BM128_DIMS", (64,))
    monkeypatch.setattr(FlashBwdSm90Fast, "STAGES", 3)
    monkeypatch.setattr(FlashBwdSm90Fast, "DS_STAGES", 2)
    with pytest.raises(ValueError, match="shared memory"):
        FlashBwdSm90Fast(cutlass.BFloat16, 64, False, False, True)
    monkeypatch.setattr(FlashBwdSm90Fast, "BM128_DIMS", 0)   # the 64-row form fits there
    assert FlashBwdSm90Fast(cutlass.BFloat16, 64, False, False, True).bm == 64
