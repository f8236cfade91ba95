"""The indexer's KL training loss and its gradient (dense warm-up and sparse stage).

Per query row, over its entries (dense: causally visible keys; sparse: valid top-k slots):
    log P = min(I - index_lse, 0)                       P = softmax(I), I the indexer score
    T     = attn_score / max(attn_l1norm, L1_EPS)       the target (head-summed attention, L1-normalised)
    T~    = max(T, PROB_MIN)
    loss  = loss_coeff / N * sum_rows sum_entries T~ (log T~ - max(log P, LOG_MIN))
(N = B * Sq, or cu_seqlens_q[-1] for THD). Its gradient with respect to I (the entropy term has none)
with c = loss_coeff * grad_loss / N:
    g = -c T~ 1[I - index_lse >= LOG_MIN];   G = g - P sum_entries g          ("grad signal")
and through I[t,s] = sum_h w[t,h] relu(q[t,h] . k_s):
    dw[t,h] = sum_s G relu(q_h . k_s);  dA = G w_h 1[q_h . k_s > 0]
    dq[t,h] = sum_s dA k_s;  dk[s] += sum_{t,h} dA q[t,h]
Entries outside the row's set get G = 0; a row whose index_lse is +inf gets zero gradient.
Everything is computed in the compute dtype (float32; float64 for float64 inputs), the loss included.
Dense: the loss and its gradient go row chunk by row chunk (_common.dense_chunks), each chunk's index
and attention scores [R, top] built, used and dropped, so no [Tq, width] tensor is ever formed; row
chunks (not key streaming) because T's clamp needs the row's full L1 norm before any entry.
"""
import paddle

from . import _common as C
from . import attn_score, indexer
from .indexer import head_logits


def _target(attn_score, attn_l1norm, mask, dtype):
    t = attn_score.astype(dtype) / C.max_nan(attn_l1norm.astype(dtype), C.L1_EPS).unsqueeze(-1)
    return paddle.where(mask, t, paddle.zeros_like(t))


def loss_sum(index_score, index_lse, attn_score, attn_l1norm, mask):
    """Sum over rows and entries of the clamped KL terms of [R, W] rows (mask: bool [R, W] of the row's
    entries), computed in the compute dtype of index_score (a scalar tensor)."""
    ct = index_score.dtype
    if index_score.shape[0] == 0 or index_score.shape[-1] == 0:
        return paddle.zeros([], dtype=ct)
    t = C.max_nan(_target(attn_score, attn_l1norm, mask, ct), C.PROB_MIN)
    x = index_score - index_lse.astype(ct).unsqueeze(-1)
    x = paddle.where(mask, x, paddle.zeros_like(x))
    log_p = C.max_nan(C.min_nan(x, 0.0), C.LOG_MIN)
    term = paddle.where(mask, t * (paddle.log(t) - log_p), paddle.zeros_like(t))
    return term.sum()


def loss_total(index_score, index_lse, attn_score, attn_l1norm, mask):
    """Scalar tensor in the compute dtype of index_score: loss_sum of [R, W] rows, row chunk by row chunk
    (temporaries within dense_budget elements)."""
    ct = index_score.dtype
    r, w = index_score.shape
    total = paddle.zeros([], dtype=ct)
    if w == 0:
        return total
    rows = C.row_chunk(r, w, C.dense_budget(index_score))
    for r0 in range(0, r, rows):
        r1 = min(r, r0 + rows)
        total = total + loss_sum(index_score[r0:r1], index_lse[r0:r1], attn_score[r0:r1], attn_l1norm[r0:r1],
                                 mask[r0:r1])
    return total


def loss_value(index_score, index_lse, attn_score, attn_l1norm, mask, loss_coeff, norm_rows):
    """Scalar tensor in the compute dtype of index_score: the clamped KL above (loss_total scaled by
    loss_coeff / norm_rows; 0 when norm_rows is 0)."""
    if index_score.shape[-1] == 0 or norm_rows == 0:
        return paddle.zeros([], dtype=index_score.dtype)
    return loss_total(index_score, index_lse, attn_score, attn_l1norm, mask) * (float(loss_coeff) / norm_rows)


def grad_signal(index_score, index_lse, attn_score, attn_l1norm, mask, c):
    """G [R, W] in the compute dtype of index_score (c: scalar tensor, loss_coeff * grad_loss / N)."""
    ct = paddle.float64 if index_score.dtype == paddle.float64 else paddle.float32
    x = index_score.astype(ct) - index_lse.astype(ct).unsqueeze(-1)
    x = paddle.where(mask, x, paddle.zeros_like(x))
    p = C.clamped_exp(C.min_nan(x, 0.0), mask)
    keep = paddle.logical_and(mask, paddle.logical_not(C.below(x, C.LOG_MIN)))
    t = C.max_nan(_target(attn_score, attn_l1norm, mask, ct), C.PROB_MIN)
    g = paddle.where(keep, -c.astype(ct) * t, paddle.zeros_like(t))
    return g - p * g.sum(axis=-1, keepdim=True)


# ----------------------------------------------------------------------------------------------------
# Dense: row chunk by row chunk (_common.dense_chunks), never a [Tq, width] intermediate
# ----------------------------------------------------------------------------------------------------
def _chunk_backward(index_q, index_k, weights, g, seg, r0, r1, top, dq, dk, dw):
    """Through I = sum_h w relu(q . k) for one row chunk with its grad signal g [R, top] (compute dtype):
    writes dq / dw of the chunk's rows and adds into dk, key block by key block."""
    ct = g.dtype
    qa, _, ka, _, _ = seg
    a, b = qa + r0, qa + r1
    di = index_q.shape[2]
    q = index_q[a:b].astype(ct)
    w = weights[a:b].astype(ct)
    dq_c = paddle.zeros(q.shape, dtype=ct)
    dw_c = paddle.zeros(w.shape, dtype=ct)
    for j0, j1 in C.key_blocks(top):
        k = index_k[ka + j0:ka + j1].astype(ct)
        gb = g[:, j0:j1]
        logits = head_logits(q, k)
        dw_c = dw_c + paddle.matmul(C.nan_relu(logits), gb.unsqueeze(-1)).squeeze(-1)
        da = (gb.unsqueeze(1) * w.unsqueeze(-1) * C.relu_slope(logits)).reshape([-1, j1 - j0])
        dq_c = dq_c + paddle.matmul(da, k).reshape([b - a] + q.shape[1:])
        dk[ka + j0:ka + j1] = dk[ka + j0:ka + j1] + paddle.matmul(da, q.reshape([-1, di]), transpose_x=True)
    dq[a:b] = dq_c
    dw[a:b] = dw_c


def _grads_init(index_q, index_k, ct):
    tq, hi, di = index_q.shape
    return (paddle.zeros([tq, hi, di], dtype=ct), paddle.zeros([index_k.shape[0], di], dtype=ct),
            paddle.zeros([tq, hi], dtype=ct))


def _dense_stats(index_q, index_k, weights, query, kv, lse, scale, seg, r0, r1, top, limits, ct):
    """(index_score, index_lse, attn_score, attn_l1norm, mask) of one dense row chunk, compute dtype."""
    qa = seg[0]
    s = indexer.chunk_scores(index_q, index_k, weights, seg, r0, r1, top, limits, ct)
    mask = C.block_mask(limits[qa + r0:qa + r1], 0, top, s.place)
    ilse = indexer.index_lse(s, mask)
    a = attn_score.chunk_scores(query, kv, lse, scale, seg, r0, r1, top, limits, ct)
    return s, ilse, a, attn_score.chunk_l1(a), mask


def _chunk_heads(index_q, query):
    return max(index_q.shape[1], query.shape[1])


def dense_loss(index_q, index_k, weights, query, kv, lse, scale, layout, limits, loss_coeff):
    """The dense KL loss (scalar, compute dtype) straight from the inputs, row chunk by row chunk: the
    chunk's index and attention scores [R, top] are computed, reduced to the loss and dropped."""
    ct = C.compute_dtype(index_q)
    total = paddle.zeros([], dtype=ct)
    if layout.norm_rows == 0:
        return total
    for seg, r0, r1, top in C.dense_chunks(layout, limits, _chunk_heads(index_q, query), index_q):
        s, ilse, a, l1, mask = _dense_stats(index_q, index_k, weights, query, kv, lse, scale, seg, r0, r1, top,
                                            limits, ct)
        total = total + loss_sum(s, ilse, a, l1, mask)
    return total * (float(loss_coeff) / layout.norm_rows)


def dense_loss_backward(index_q, index_k, weights, query, kv, lse, scale, layout, limits, c):
    """Gradients of dense_loss (c: scalar tensor, loss_coeff * grad_loss / N): the chunk statistics are
    recomputed, turned into the grad signal and pushed through the indexer, chunk by chunk.
    (dq [Tq,Hi,Di], dk [Tk,Di], dw [Tq,Hi]) in the compute dtype."""
    ct = C.compute_dtype(index_q)
    dq, dk, dw = _grads_init(index_q, index_k, ct)
    c = c.astype(ct)
    for seg, r0, r1, top in C.dense_chunks(layout, limits, _chunk_heads(index_q, query), index_q):
        s, ilse, a, l1, mask = _dense_stats(index_q, index_k, weights, query, kv, lse, scale, seg, r0, r1, top,
                                            limits, ct)
        g = grad_signal(s, ilse, a, l1, mask, c)
        _chunk_backward(index_q, index_k, weights, g, seg, r0, r1, top, dq, dk, dw)
    return dq, dk, dw


def dense_backward(index_q, index_k, weights, index_score, index_lse, attn_score_, attn_l1norm, layout, limits, c):
    """Gradients from given dense statistics ([Tq, width] scores, [Tq] lse / l1norm, any float dtype):
    each row chunk's [R, top] slice is cast to the compute dtype, turned into the grad signal and pushed
    through the indexer. (dq [Tq,Hi,Di], dk [Tk,Di], dw [Tq,Hi]) in the compute dtype."""
    ct = C.compute_dtype(index_q)
    dq, dk, dw = _grads_init(index_q, index_k, ct)
    c = c.astype(ct)
    for seg, r0, r1, top in C.dense_chunks(layout, limits, index_q.shape[1], index_q):
        qa = seg[0]
        a, b = qa + r0, qa + r1
        mask = C.block_mask(limits[a:b], 0, top, index_q.place)
        g = grad_signal(index_score[a:b, :top].astype(ct), index_lse[a:b], attn_score_[a:b, :top],
                        attn_l1norm[a:b], mask, c)
        _chunk_backward(index_q, index_k, weights, g, seg, r0, r1, top, dq, dk, dw)
    return dq, dk, dw


def sparse_backward(index_q, index_k, weights, gsig, gidx, valid):
    """Through I over the top-k slots: (dq [Tq,Hi,Di], dk [Tk,Di], dw [Tq,Hi]); dk scatter-added."""
    ct = gsig.dtype
    tq, hi, di = index_q.shape
    kk = gidx.shape[1]
    dk = paddle.zeros([index_k.shape[0], di], dtype=ct)
    if tq == 0 or kk == 0:
        return paddle.zeros([tq, hi, di], dtype=ct), dk, paddle.zeros([tq, hi], dtype=ct)
    k_all = index_k.astype(ct)
    rows = C.row_chunk(tq, kk * (2 * di + 3 * hi))
    dqs, dws = [], []
    for r0 in range(0, tq, rows):
        r1 = min(tq, r0 + rows)
        has = valid[r0:r1].any(axis=-1).reshape([-1, 1, 1])
        q = index_q[r0:r1].astype(ct)
        q = paddle.where(has, q, paddle.zeros_like(q))  # rows with no valid slot are never read
        w = weights[r0:r1].astype(ct)
        w = paddle.where(has.squeeze(-1), w, paddle.zeros_like(w))
        g = paddle.where(valid[r0:r1], gsig[r0:r1], paddle.zeros_like(gsig[r0:r1]))
        gk = C.gather_rows(k_all, gidx[r0:r1], valid[r0:r1])
        logits = paddle.matmul(q, gk, transpose_y=True)
        dws.append(paddle.matmul(C.nan_relu(logits), g.unsqueeze(-1)).squeeze(-1))
        da = g.unsqueeze(1) * w.unsqueeze(-1) * C.relu_slope(logits)
        dqs.append(paddle.matmul(da, gk))
        dgk = paddle.matmul(da, q, transpose_x=True)
        dk = paddle.index_add(dk, gidx[r0:r1].reshape([-1]), 0, dgk.reshape([-1, di]))
    cat = (lambda xs: paddle.concat(xs, axis=0) if len(xs) > 1 else xs[0])
    return cat(dqs), dk, cat(dws)
