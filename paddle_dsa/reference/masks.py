"""Attention visibility masks shared by the reference paths (numpy, host side)."""
import numpy as np


def effective_window(causal, window):
    """(left, right) with causal folded in; None = unbounded."""
    left, right = window
    left = None if left < 0 else left
    right = None if right < 0 else right
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def visible_block(sq, sk, j0, j1, left, right):
    """bool [sq, j1 - j0]: query i sees key j iff i+sk-sq-left <= j <= i+sk-sq+right (bottom-right)."""
    i = np.arange(sq, dtype=np.int64)[:, None] + (sk - sq)
    j = np.arange(j0, j1, dtype=np.int64)[None, :]
    vis = np.ones((sq, j1 - j0), dtype=bool)
    if right is not None:
        vis &= j <= i + right
    if left is not None:
        vis &= j >= i - left
    return vis
