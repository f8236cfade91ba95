"""Lightning-indexer scores: I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) and their row lse.

Dense: [Tq, width] with -inf where key j is not visible (causal: j < clamp((offset + i + 1) // ratio,
0, Sk)); computed row chunk by row chunk and, within a chunk, key block by key block: temporaries
O(rows x heads x KEY_BLOCK) and O(rows x width) within _common.dense_budget (see dense_chunks).
Sparse: [Tq, K] over the slots of topk_indices, -inf at invalid slots; each slot is scored on its own
(a duplicated index gives two equal entries).
index_lse: natural-log logsumexp over the visible entries; 0 for a row with none (THD rows past
cu_seqlens_q[-1] included), so a consumer's exp(score - lse) is 0 there, never NaN.
"""
import paddle

from . import _common as C


def head_logits(q, k):
    """q [R, Hi, Di], k [BK, Di] -> q . k [R, Hi, BK]."""
    r, hi, di = q.shape
    return paddle.matmul(q.reshape([r * hi, di]), k, transpose_y=True).reshape([r, hi, k.shape[0]])


def weighted_relu_sum(w, logits):
    """w [R, Hi], logits [R, Hi, N] -> sum_h w * relu(logits) [R, N]."""
    return paddle.matmul(w.unsqueeze(1), C.nan_relu(logits)).squeeze(1)


def chunk_scores(index_q, index_k, weights, seg, r0, r1, top, limits, ct):
    """Scores of one dense row chunk (see _common.dense_chunks): [r1 - r0, top] in ct, -inf where not
    visible; built key block by key block (temporaries rows x Hi x KEY_BLOCK)."""
    qa, _, ka, _, _ = seg
    a, b = qa + r0, qa + r1
    q = index_q[a:b].astype(ct)
    w = weights[a:b].astype(ct)
    lim = limits[a:b]
    out = paddle.full([b - a, top], C.NEG_INF, dtype=ct)
    for j0, j1 in C.key_blocks(top):
        s = weighted_relu_sum(w, head_logits(q, index_k[ka + j0:ka + j1].astype(ct)))
        vis = C.block_mask(lim, j0, j1, s.place)
        out[:, j0:j1] = paddle.where(vis, s, paddle.full_like(s, C.NEG_INF))
    return out


def chunk_lse(scores, r0, r1, qa, limits):
    """index_lse of a row chunk's scores [R, top] (0 for rows with no visible key)."""
    return index_lse(scores, C.block_mask(limits[qa + r0:qa + r1], 0, scores.shape[1], scores.place))


def dense_scores(index_q, index_k, weights, layout, limits, out_dtype=paddle.float32, with_lse=False):
    """index_q [Tq, Hi, Di], index_k [Tk, Di], weights [Tq, Hi] (any float dtypes) ->
    scores [Tq, width] in out_dtype, -inf where not visible (and, with_lse, index_lse [Tq] in the compute
    dtype, 0 for rows with no visible key). Row chunk by row chunk: the only [Tq, width] tensor is the
    output; the lse of a chunk is taken from its compute-dtype scores before the cast."""
    ct = C.compute_dtype(index_q)
    out = paddle.full([layout.tq, layout.width], C.NEG_INF, dtype=out_dtype)
    lse = paddle.zeros([layout.tq], dtype=ct) if with_lse else None
    for seg, r0, r1, top in C.dense_chunks(layout, limits, index_q.shape[1], index_q):
        qa = seg[0]
        s = chunk_scores(index_q, index_k, weights, seg, r0, r1, top, limits, ct)
        out[qa + r0:qa + r1, :top] = s.astype(out_dtype)
        if with_lse:
            lse[qa + r0:qa + r1] = chunk_lse(s, r0, r1, qa, limits)
    return (out, lse) if with_lse else out


def sparse_scores(index_q, index_k, weights, gidx, valid):
    """Scores of the top-k slots: [Tq, K] in the compute dtype, -inf at invalid slots."""
    ct = C.compute_dtype(index_q)
    tq, hi, di = index_q.shape
    kk = gidx.shape[1]
    if tq == 0 or kk == 0:
        return paddle.full([tq, kk], C.NEG_INF, dtype=ct)
    k_all = index_k.astype(ct)
    rows = C.row_chunk(tq, kk * (di + hi))
    parts = []
    for r0 in range(0, tq, rows):
        r1 = min(tq, r0 + rows)
        gk = C.gather_rows(k_all, gidx[r0:r1], valid[r0:r1])
        logits = paddle.matmul(index_q[r0:r1].astype(ct), gk, transpose_y=True)
        s = weighted_relu_sum(weights[r0:r1].astype(ct), logits)
        parts.append(paddle.where(valid[r0:r1], s, paddle.full_like(s, C.NEG_INF)))
    return paddle.concat(parts, axis=0) if len(parts) > 1 else parts[0]


def index_lse(scores, mask):
    """Row logsumexp over mask, 0 for rows with no entry."""
    return C.row_lse(scores, mask, 0.0)
