"""Attention-side score recompute: the target distribution of the indexer loss.

    attn_score[t, j] = sum_h exp(clamp(scale * q[t,h] . k_j - lse[t,h]))      visible / valid j
    attn_l1norm[t]   = sum_j attn_score[t, j]
The exp argument is clamped above at EXP_ARG_MAX and flushed to 0 below EXP_ARG_MIN (see _common), so
a softmax_lse of -1e30, -inf or +inf on some rows gives finite values (an lse of +inf gives a zero
row); scores and norms saturate at FLT_MAX. Masked entries (dense) and invalid slots (sparse) are 0;
so are THD rows past cu_seqlens_q[-1], with l1norm 0.
"""
import paddle

from . import _common as C


def _head_sum(s, lse, mask):
    """s [R,H,N] (scaled logits), lse [R,H], mask [R,1,N] bool -> [R,N] saturated head sums."""
    e = C.clamped_exp(s - lse.unsqueeze(-1), mask.expand(s.shape))
    return paddle.minimum(e.sum(axis=1), paddle.full([1], C.FLT_MAX, dtype=s.dtype))


def _l1(score):
    if score.shape[-1] == 0:
        return paddle.zeros(score.shape[:-1], dtype=score.dtype)
    return paddle.minimum(score.sum(axis=-1), paddle.full([1], C.FLT_MAX, dtype=score.dtype))


def dense(query, kv, lse, scale, layout, limits):
    """query [Tq,H,D], kv [Tk,D], lse [Tq,H] -> (attn_score [Tq, width], attn_l1norm [Tq]), compute dtype."""
    ct = C.compute_dtype(query)
    h, d = query.shape[1], query.shape[2]
    out = paddle.zeros([layout.tq, layout.width], dtype=ct)
    for (qa, _, ka, _, _), r0, r1, j0, j1 in C.dense_blocks(layout, limits, h * C.KEY_BLOCK):
        q = query[qa + r0:qa + r1].astype(ct)
        k = kv[ka + j0:ka + j1].astype(ct)
        s = paddle.matmul(q.reshape([-1, d]), k, transpose_y=True).reshape([r1 - r0, h, j1 - j0]) * scale
        vis = C.block_mask(limits[qa + r0:qa + r1], j0, j1, s.place).unsqueeze(1)
        out[qa + r0:qa + r1, j0:j1] = _head_sum(s, lse[qa + r0:qa + r1].astype(ct), vis)
    return out, _l1(out)


def sparse(query, kv, lse, scale, gidx, valid):
    """Over the top-k slots: (attn_score [Tq, K], attn_l1norm [Tq]), compute dtype, 0 at invalid slots."""
    ct = C.compute_dtype(query)
    tq, h, d = query.shape
    kk = gidx.shape[1]
    if tq == 0 or kk == 0:
        out = paddle.zeros([tq, kk], dtype=ct)
        return out, paddle.zeros([tq], dtype=ct)
    kv_c = kv.astype(ct)
    rows = C.row_chunk(tq, kk * (d + 2 * h))
    parts = []
    for r0 in range(0, tq, rows):
        r1 = min(tq, r0 + rows)
        gk = C.gather_rows(kv_c, gidx[r0:r1], valid[r0:r1])
        s = paddle.matmul(query[r0:r1].astype(ct), gk, transpose_y=True) * scale
        parts.append(_head_sum(s, lse[r0:r1].astype(ct), valid[r0:r1].unsqueeze(1)))
    out = paddle.concat(parts, axis=0) if len(parts) > 1 else parts[0]
    return out, _l1(out)
