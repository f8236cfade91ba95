"""Per-row top-k of finite scores.

indices[r, :] = the columns of the k largest finite scores of row r, by descending score; ties keep
the lower column first (a stable sort); -1 fills the slots past the row's count of finite scores.
Non-finite scores (-inf masks, +inf, NaN) are never selected. lengths[r] limits row r to its first
lengths[r] columns. by_column: the same indices in ascending column order (indexer_topk(sorted=False)).
Rows are processed in chunks (memory O(chunk x width)).
"""
import paddle

from . import _common as C


def topk(scores, k, lengths=None):
    """scores [R, W] float, k >= 1, lengths int [R] or None -> int32 [R, k]."""
    r, w = scores.shape
    if r == 0:
        return paddle.zeros([0, k], dtype=paddle.int32)
    kk = min(k, w)
    parts = []
    rows = C.row_chunk(r, 4 * max(w, 1))
    for r0 in range(0, r, rows):
        r1 = min(r, r0 + rows)
        s = scores[r0:r1].astype(paddle.float64 if scores.dtype == paddle.float64 else paddle.float32)
        ok = paddle.isfinite(s)
        if lengths is not None and w > 0:
            col = paddle.arange(w, dtype=paddle.int64).unsqueeze(0)
            ok = paddle.logical_and(ok, col < lengths[r0:r1].astype(paddle.int64).unsqueeze(-1))
        if kk > 0:
            key = paddle.where(ok, -s, paddle.full_like(s, float("inf")))
            order = _stable_argsort(key)[:, :kk]
            picked_ok = paddle.isfinite(paddle.take_along_axis(key, order, axis=-1))
            idx = paddle.where(picked_ok, order, paddle.full_like(order, -1)).astype(paddle.int32)
        else:
            idx = paddle.zeros([r1 - r0, 0], dtype=paddle.int32)
        if kk < k:
            idx = paddle.concat([idx, paddle.full([r1 - r0, k - kk], -1, dtype=paddle.int32)], axis=-1)
        parts.append(idx)
    return paddle.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def by_column(idx):
    """int32 [..., k] top-k indices (-1 padding) -> the same indices in ascending column order, -1 last."""
    big = paddle.full_like(idx, 2 ** 31 - 1)
    srt = paddle.sort(paddle.where(idx < 0, big, idx), axis=-1)
    return paddle.where(srt == big, paddle.full_like(srt, -1), srt)


def _stable_argsort(key):
    """Ascending argsort of [R, W] with ties in column order, on every Paddle release (no `stable=`):
    sort once, give each sorted entry the dense rank of its value, then sort the unique int64 keys
    rank * (W + 1) + column."""
    w = key.shape[-1]
    order = paddle.argsort(key, axis=-1)
    v = paddle.take_along_axis(key, order, axis=-1)
    new_value = paddle.concat([paddle.zeros_like(v[:, :1], dtype=paddle.int64),
                               (v[:, 1:] != v[:, :-1]).astype(paddle.int64)], axis=-1)
    rank = paddle.cumsum(new_value, axis=-1)
    unique = rank * (w + 1) + order.astype(paddle.int64)
    return paddle.take_along_axis(order, paddle.argsort(unique, axis=-1), axis=-1)
