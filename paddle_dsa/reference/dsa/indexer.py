"""Lightning-indexer scores: I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j]) and their row lse.

Dense: [Tq, width] with -inf where key j is not visible (causal: j < clamp((offset + i + 1) // ratio,
0, Sk)); computed tile by tile (rows x KEY_BLOCK keys), temporaries O(rows x heads x block).
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
    return paddle.matmul(w.unsqueeze(1), paddle.nn.functional.relu(logits)).squeeze(1)


def dense_scores(index_q, index_k, weights, layout, limits):
    """index_q [Tq, Hi, Di], index_k [Tk, Di], weights [Tq, Hi] (any float dtypes) ->
    scores [Tq, width] in the compute dtype, -inf where not visible."""
    ct = C.compute_dtype(index_q)
    hi = index_q.shape[1]
    out = paddle.full([layout.tq, layout.width], C.NEG_INF, dtype=ct)
    for (qa, _, ka, _, _), r0, r1, j0, j1 in C.dense_blocks(layout, limits, hi * C.KEY_BLOCK):
        q = index_q[qa + r0:qa + r1].astype(ct)
        w = weights[qa + r0:qa + r1].astype(ct)
        k = index_k[ka + j0:ka + j1].astype(ct)
        s = weighted_relu_sum(w, head_logits(q, k))
        vis = C.block_mask(limits[qa + r0:qa + r1], j0, j1, s.place)
        out[qa + r0:qa + r1, j0:j1] = paddle.where(vis, s, paddle.full_like(s, C.NEG_INF))
    return out


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
