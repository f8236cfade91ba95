"""Shared pieces of the DSA reference-path tests."""
import numpy as np
import paddle
import pytest


@pytest.fixture(autouse=True, params=["tiles-default", "tiles-tiny"])
def tiles(request, monkeypatch):
    """Run every test twice: default tiles, and 1-row chunks x 3-key blocks (the multi-tile code paths)."""
    if request.param == "tiles-tiny":
        from paddle_dsa.reference.dsa import _common
        monkeypatch.setattr(_common, "KEY_BLOCK", 3)
        monkeypatch.setattr(_common, "ELEMENT_BUDGET", 1)


def pd(a, dtype="float64", grad=False):
    t = paddle.to_tensor(np.asarray(a), dtype=dtype)
    t.stop_gradient = not grad
    return t
