"""Sparse MLA attention in MQA mode over the top-k slots of each query row.

For query row t, head h and its valid slots j (0 <= idx < Skv of its sequence, position < topk_length):
    s[t,h,j]  = scale * q[t,h] . kv[idx_j]                 (all Dqk columns)
    lse[t,h]  = log sum_j exp(s[t,h,j])                      natural log, sink not included
    lse+      = logaddexp(lse, sink[h])                      (= lse without a sink)
    out[t,h]  = sum_j exp(s[t,h,j] - lse+) * kv[idx_j, :Dv]
A row with no valid slot: out 0, lse -inf, zero gradient. Each slot counts on its own, so an index
listed twice enters the softmax twice (as if its logit were raised by log 2).
Backward (Delta from the stored out, fp32 or fp64):
    P+ = exp(s - lse+); dP = dout . V; dS = P+ (dP - Delta) + dlse * exp(s - lse)
    dq = scale sum_j dS k_j;  dkv[idx_j] += scale sum_h dS q_h;  dkv[idx_j, :Dv] += sum_h P+ dout_h
    d_sink[h] = -sum_t exp(sink[h] - lse+[t,h]) Delta[t,h]
Rows are processed in chunks (memory O(chunk x K x Dqk)); gathers read no row through an invalid slot.
"""
import paddle

from . import _common as C


def _lse_plus(lse, has, sink):
    """lse [R,H,1] (-inf where empty), sink [H] or None -> logaddexp(lse, sink) (finite where has)."""
    if sink is None:
        return lse
    sk = sink.reshape([1, -1, 1]).expand_as(lse)
    base = paddle.where(has, lse, sk)
    mx = C.stable_max(base, sk)
    return mx + paddle.log(paddle.exp(base - mx) + paddle.exp(sk - mx))


def _chunk_logits(query, kv, gidx, valid, r0, r1, scale, ct):
    gk = C.gather_rows(kv, gidx[r0:r1], valid[r0:r1])
    has = valid[r0:r1].any(axis=-1).reshape([-1, 1, 1])
    q = query[r0:r1].astype(ct)
    q = paddle.where(has, q, paddle.zeros_like(q))      # rows with no valid slot are never read
    s = paddle.matmul(q, gk, transpose_y=True) * scale
    vmask = valid[r0:r1].unsqueeze(1).expand(s.shape)
    return q, gk, s, vmask, has


def forward(query, kv, gidx, valid, scale, v_dim, sink=None):
    """query [Tq,H,Dqk], kv [Tk,Dqk] -> out [Tq,H,Dv], lse [Tq,H] (compute dtype; -inf for empty rows)."""
    ct = C.compute_dtype(query)
    tq, h, d = query.shape
    kk = gidx.shape[1]
    if tq == 0 or kk == 0:
        return paddle.zeros([tq, h, v_dim], dtype=ct), paddle.full([tq, h], C.NEG_INF, dtype=ct)
    kv_c = kv.astype(ct)
    sink_c = None if sink is None else sink.astype(ct)
    rows = C.row_chunk(tq, kk * (d + 2 * h))
    outs, lses = [], []
    for r0 in range(0, tq, rows):
        r1 = min(tq, r0 + rows)
        _, gk, s, vmask, has = _chunk_logits(query, kv_c, gidx, valid, r0, r1, scale, ct)
        m = paddle.where(vmask, s, paddle.full_like(s, C.NEG_INF)).max(axis=-1, keepdim=True)
        m_safe = paddle.where(has, m, paddle.zeros_like(m))
        l = C.masked_exp(s - m_safe, vmask).sum(axis=-1, keepdim=True)
        l_safe = paddle.where(has, l, paddle.ones_like(l))
        lse = paddle.where(has, m_safe + paddle.log(l_safe), paddle.full_like(m, C.NEG_INF))
        lse_p = _lse_plus(lse, has, sink_c)
        p = C.masked_exp(C.min_nan(s - lse_p, 0.0), vmask)
        outs.append(paddle.matmul(p, gk[:, :, :v_dim]))
        lses.append(lse.squeeze(-1))
    cat = (lambda xs: paddle.concat(xs, axis=0) if len(xs) > 1 else xs[0])
    return cat(outs), cat(lses)


def backward(query, kv, gidx, valid, out, dout, lse, dlse, scale, v_dim, sink=None):
    """Gradients of forward: d_query [Tq,H,Dqk], d_kv [Tk,Dqk], d_sink [H] or None (compute dtype).
    lse [Tq,H] as returned by forward; dlse [Tq,H] or None."""
    ct = C.compute_dtype(query)
    tq, h, d = query.shape
    kk = gidx.shape[1]
    dq = paddle.zeros([tq, h, d], dtype=ct)
    dkv = paddle.zeros([kv.shape[0], d], dtype=ct)
    dsink = None if sink is None else paddle.zeros([h], dtype=ct)
    if tq == 0 or kk == 0:
        return dq, dkv, dsink
    kv_c = kv.astype(ct)
    sink_c = None if sink is None else sink.astype(ct)
    rows = C.row_chunk(tq, kk * (2 * d + 4 * h))
    dqs = []
    for r0 in range(0, tq, rows):
        r1 = min(tq, r0 + rows)
        q, gk, s, vmask, has = _chunk_logits(query, kv_c, gidx, valid, r0, r1, scale, ct)
        lse_c = lse[r0:r1].astype(ct).unsqueeze(-1)
        lse_p = _lse_plus(lse_c, has, sink_c)
        p = C.masked_exp(C.min_nan(s - lse_p, 0.0), vmask)
        do = dout[r0:r1].astype(ct)
        delta = paddle.where(has, (out[r0:r1].astype(ct) * do).sum(axis=-1, keepdim=True),
                             paddle.zeros([r1 - r0, h, 1], dtype=ct))
        gv = gk[:, :, :v_dim]
        ds = p * (paddle.matmul(do, gv, transpose_y=True) - delta)
        if dlse is not None:
            lse_safe = paddle.where(has, lse_c, paddle.zeros_like(lse_c))
            pn = C.masked_exp(C.min_nan(s - lse_safe, 0.0), vmask)
            ds = ds + dlse[r0:r1].astype(ct).unsqueeze(-1) * pn
        dqs.append(paddle.matmul(ds, gk) * scale)
        dgk = paddle.matmul(ds, q, transpose_x=True) * scale
        dgv = paddle.matmul(p, do, transpose_x=True)
        if v_dim < d:
            dgk = paddle.concat([dgk[:, :, :v_dim] + dgv, dgk[:, :, v_dim:]], axis=-1)
        else:
            dgk = dgk + dgv
        dkv = paddle.index_add(dkv, gidx[r0:r1].reshape([-1]), 0, dgk.reshape([-1, d]))
        if sink is not None:
            ps = paddle.where(has, paddle.exp(sink_c.reshape([1, -1, 1]) - lse_p), paddle.zeros_like(lse_p))
            dsink = dsink - (ps * delta).sum(axis=[0, 2])
    dq = paddle.concat(dqs, axis=0) if len(dqs) > 1 else dqs[0]
    return dq, dkv, dsink
