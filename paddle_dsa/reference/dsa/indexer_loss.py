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
"""
import paddle

from . import _common as C
from .indexer import head_logits


def _target(attn_score, attn_l1norm, mask, dtype):
    t = attn_score.astype(dtype) / paddle.clip(attn_l1norm.astype(dtype), min=C.L1_EPS).unsqueeze(-1)
    return paddle.where(mask, t, paddle.zeros_like(t))


def loss_value(index_score, index_lse, attn_score, attn_l1norm, mask, loss_coeff, norm_rows):
    """Scalar float64 tensor: the clamped KL above (mask: bool [R, W] of the row's entries)."""
    f64 = paddle.float64
    if index_score.shape[-1] == 0 or norm_rows == 0:
        return paddle.zeros([], dtype=f64)
    t = paddle.clip(_target(attn_score, attn_l1norm, mask, f64), min=C.PROB_MIN)
    x = index_score.astype(f64) - index_lse.astype(f64).unsqueeze(-1)
    x = paddle.where(mask, x, paddle.zeros_like(x))
    log_p = paddle.clip(paddle.minimum(x, paddle.zeros_like(x)), min=C.LOG_MIN)
    term = paddle.where(mask, t * (paddle.log(t) - log_p), paddle.zeros_like(t))
    return term.sum() * (float(loss_coeff) / norm_rows)


def grad_signal(index_score, index_lse, attn_score, attn_l1norm, mask, c):
    """G [R, W] in the compute dtype of index_score (c: scalar tensor, loss_coeff * grad_loss / N)."""
    ct = paddle.float64 if index_score.dtype == paddle.float64 else paddle.float32
    x = index_score.astype(ct) - index_lse.astype(ct).unsqueeze(-1)
    x = paddle.where(mask, x, paddle.zeros_like(x))
    p = C.clamped_exp(paddle.minimum(x, paddle.zeros_like(x)), mask)
    keep = paddle.logical_and(mask, x >= C.LOG_MIN)
    t = paddle.clip(_target(attn_score, attn_l1norm, mask, ct), min=C.PROB_MIN)
    g = paddle.where(keep, -c.astype(ct) * t, paddle.zeros_like(t))
    return g - p * g.sum(axis=-1, keepdim=True)


def dense_backward(index_q, index_k, weights, gsig, layout, limits):
    """Through I = sum_h w relu(q . k) for the dense tiles: (dq [Tq,Hi,Di], dk [Tk,Di], dw [Tq,Hi])."""
    ct = gsig.dtype
    tq, hi, di = index_q.shape
    dq = paddle.zeros([tq, hi, di], dtype=ct)
    dk = paddle.zeros([index_k.shape[0], di], dtype=ct)
    dw = paddle.zeros([tq, hi], dtype=ct)
    for (qa, _, ka, _, _), r0, r1, j0, j1 in C.dense_blocks(layout, limits, 3 * hi * C.KEY_BLOCK):
        a, b = qa + r0, qa + r1
        q = index_q[a:b].astype(ct)
        w = weights[a:b].astype(ct)
        k = index_k[ka + j0:ka + j1].astype(ct)
        g = gsig[a:b, j0:j1]
        logits = head_logits(q, k)
        dw[a:b] = dw[a:b] + paddle.matmul(paddle.nn.functional.relu(logits), g.unsqueeze(-1)).squeeze(-1)
        da = (g.unsqueeze(1) * w.unsqueeze(-1) * (logits > 0).astype(ct)).reshape([-1, j1 - j0])
        dq[a:b] = dq[a:b] + paddle.matmul(da, k).reshape([b - a, hi, di])
        dk[ka + j0:ka + j1] = dk[ka + j0:ka + j1] + paddle.matmul(da, q.reshape([-1, di]), transpose_x=True)
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
        dws.append(paddle.matmul(paddle.nn.functional.relu(logits), g.unsqueeze(-1)).squeeze(-1))
        da = g.unsqueeze(1) * w.unsqueeze(-1) * (logits > 0).astype(ct)
        dqs.append(paddle.matmul(da, gk))
        dgk = paddle.matmul(da, q, transpose_x=True)
        dk = paddle.index_add(dk, gidx[r0:r1].reshape([-1]), 0, dgk.reshape([-1, di]))
    cat = (lambda xs: paddle.concat(xs, axis=0) if len(xs) > 1 else xs[0])
    return cat(dqs), dk, cat(dws)
