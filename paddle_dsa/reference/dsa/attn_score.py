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
    return C.min_nan(e.sum(axis=1), C.FLT_MAX)


def _dense_head_sum(s, lse, vis):
    """_head_sum for a dense tile whose mask is the same for every head: s [R,H,N], lse [R,H], vis [R,N].
    The flush and the clamp are per element; the mask is applied once, after the head sum (a masked
    entry is exactly 0 either way, and a NaN there does not pass a where)."""
    x = s - lse.unsqueeze(-1)
    e = paddle.exp(C.min_nan(x, C.EXP_ARG_MAX))
    e = paddle.where(C.below(x, C.EXP_ARG_MIN), paddle.zeros_like(e), e)     # a NaN x stays NaN
    hs = C.min_nan(e.sum(axis=1), C.FLT_MAX)
    return paddle.where(vis, hs, paddle.zeros_like(hs))


def _l1(score):
    if score.shape[-1] == 0:
        return paddle.zeros(score.shape[:-1], dtype=score.dtype)
    return C.min_nan(score.sum(axis=-1), C.FLT_MAX)


def chunk_scores(query, kv, lse, scale, seg, r0, r1, top, limits, ct):
    """attn_score of one dense row chunk (see _common.dense_chunks): [r1 - r0, top] in ct, 0 where not
    visible; built key block by key block (temporaries rows x H x KEY_BLOCK)."""
    qa, _, ka, _, _ = seg
    a, b = qa + r0, qa + r1
    h, d = query.shape[1], query.shape[2]
    q = query[a:b].astype(ct).reshape([-1, d])
    lse_c = lse[a:b].astype(ct)
    lim = limits[a:b]
    out = paddle.zeros([b - a, top], dtype=ct)
    for j0, j1 in C.key_blocks(top):
        k = kv[ka + j0:ka + j1].astype(ct)
        s = paddle.matmul(q, k, transpose_y=True).reshape([b - a, h, j1 - j0]) * scale
        out[:, j0:j1] = _dense_head_sum(s, lse_c, C.block_mask(lim, j0, j1, s.place))
    return out


def chunk_l1(score):
    """attn_l1norm of a row chunk's scores (saturated at FLT_MAX)."""
    return _l1(score)


def dense(query, kv, lse, scale, layout, limits, out_dtype=paddle.float32):
    """query [Tq,H,D], kv [Tk,D], lse [Tq,H] -> (attn_score [Tq, width] in out_dtype, attn_l1norm [Tq] in
    the compute dtype). Row chunk by row chunk: the only [Tq, width] tensor is the output; a chunk's
    l1norm is summed from its compute-dtype scores before the cast."""
    ct = C.compute_dtype(query)
    out = paddle.zeros([layout.tq, layout.width], dtype=out_dtype)
    l1 = paddle.zeros([layout.tq], dtype=ct)
    for seg, r0, r1, top in C.dense_chunks(layout, limits, query.shape[1], query):
        qa = seg[0]
        a = chunk_scores(query, kv, lse, scale, seg, r0, r1, top, limits, ct)
        out[qa + r0:qa + r1, :top] = a.astype(out_dtype)
        l1[qa + r0:qa + r1] = chunk_l1(a)
    return out, l1


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
