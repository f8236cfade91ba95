"""Reference flash attention in pure Paddle: blockwise over keys, online softmax, fp32 accumulation.

Math (one sequence, one query head h, its key/value head g = h // (H / Hkv)):
    s_ij = scale * q_i . k_j                       visible (i, j) only (see masks.visible_block)
    lse_i = log sum_j exp(s_ij)                    natural log; -inf when row i sees no key
    out_i = sum_j exp(s_ij - lse_i) v_j            0 when row i sees no key
Backward, with dlse the gradient flowing into lse:
    P_ij = exp(min(s_ij - lse_i, 0))               0 for masked entries and dead rows
    Delta_i = sum_d out_id dout_id - dlse_i
    dv_j = sum_i P_ij dout_i ; dS_ij = P_ij (dout_i . v_j - Delta_i)
    dq_i = scale sum_j dS_ij k_j ; dk_j = scale sum_i dS_ij q_i      (GQA: summed over each group)

Memory is O(S x BLOCK) per (batch, head): keys are visited BLOCK at a time. The online softmax keeps
the running max m as max(running max, tile max), starts it at -inf and never subtracts -inf from
-inf (a fully masked tile or row leaves m at -inf, its probabilities at 0 and its rescale at 0).
Probabilities of masked entries are set to 0 with `where`, never computed as exp(-inf) (Paddle's CPU
exp of -inf is not exactly 0 on its vectorised path).

Tensors here are [B, H, S, D] in float32 (float64 inputs stay float64); the public layout
[B, S, H, D] is transposed by the callers below. dout . v_j and Delta_i are formed in float64 (then dS is
rounded to the compute dtype): on a row whose softmax is one key, out = v_j exactly and dS = P (dP - Delta) must
cancel to 0, but two float32 dot products summed in different orders leave a residue of eps |dout| |v| that dq
multiplies by |k| (K scaled x5000: dq of that row O(1e-3) where the exact value is 0).
"""
import numpy as np
import paddle

from .masks import effective_window, visible_block

BLOCK = 128
_NEG_INF = float("-inf")


def _mask_tensor(vis, place):
    return paddle.to_tensor(vis, place=place)


def _expand_kv(x, groups):
    """[B, Hkv, S, D] -> [B, Hkv * groups, S, D] (query head h reads kv head h // groups)."""
    return x if groups == 1 else paddle.repeat_interleave(x, groups, axis=1)


def _reduce_groups(dx, groups):
    """[B, H, S, D] -> [B, H / groups, S, D] summed over each group."""
    if groups == 1:
        return dx
    b, h, s, d = dx.shape
    return dx.reshape([b, h // groups, groups, s, d]).sum(axis=2)


def forward_bhsd(q, k, v, scale, causal, window):
    """q [B,H,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv] (compute dtype) -> out [B,H,Sq,Dv], lse [B,H,Sq]."""
    b, h, sq, d = q.shape
    dv = v.shape[-1]
    sk = k.shape[2]
    groups = h // k.shape[1]
    k, v = _expand_kv(k, groups), _expand_kv(v, groups)
    left, right = effective_window(causal, window)
    m = paddle.full([b, h, sq, 1], _NEG_INF, dtype=q.dtype)
    l = paddle.zeros([b, h, sq, 1], dtype=q.dtype)
    acc = paddle.zeros([b, h, sq, dv], dtype=q.dtype)
    for j0 in range(0, sk, BLOCK):
        j1 = min(j0 + BLOCK, sk)
        vis_np = visible_block(sq, sk, j0, j1, left, right)
        if not vis_np.any():
            continue
        vis = _mask_tensor(vis_np, q.place)
        s = paddle.matmul(q, k[:, :, j0:j1], transpose_y=True) * scale
        s = paddle.where(vis, s, paddle.full_like(s, _NEG_INF))
        m_new = paddle.maximum(m, s.max(axis=-1, keepdim=True))
        dead = m_new == _NEG_INF
        m_safe = paddle.where(dead, paddle.zeros_like(m_new), m_new)
        p = paddle.where(vis, paddle.exp(s - m_safe), paddle.zeros_like(s))
        alpha = paddle.where(m == _NEG_INF, paddle.zeros_like(m), paddle.exp(m - m_safe))
        l = l * alpha + p.sum(axis=-1, keepdim=True)
        acc = acc * alpha + paddle.matmul(p, v[:, :, j0:j1])
        m = m_new
    empty = l == 0
    l_safe = paddle.where(empty, paddle.ones_like(l), l)
    out = paddle.where(empty, paddle.zeros_like(acc), acc / l_safe)
    lse = paddle.where(empty, paddle.full_like(l, _NEG_INF), m + paddle.log(l_safe))
    return out, lse.squeeze(-1)


def backward_bhsd(q, k, v, out, dout, lse, dlse, scale, causal, window):
    """Gradients of forward_bhsd. dlse may be None. Returns dq, dk, dv (k/v shapes)."""
    b, h, sq, d = q.shape
    dvd = v.shape[-1]
    sk = k.shape[2]
    groups = h // k.shape[1]
    k, v = _expand_kv(k, groups), _expand_kv(v, groups)
    left, right = effective_window(causal, window)
    wide = paddle.float64
    dout_w = dout.astype(wide)
    delta = (out.astype(wide) * dout_w).sum(axis=-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.astype(wide).unsqueeze(-1)
    lse = lse.unsqueeze(-1)
    dead = lse == _NEG_INF
    lse_safe = paddle.where(dead, paddle.zeros_like(lse), lse)
    dq = paddle.zeros_like(q)
    dk_blocks, dv_blocks = [], []
    for j0 in range(0, sk, BLOCK):
        j1 = min(j0 + BLOCK, sk)
        vis_np = visible_block(sq, sk, j0, j1, left, right)
        if not vis_np.any():
            dk_blocks.append(paddle.zeros([b, h, j1 - j0, d], dtype=q.dtype))
            dv_blocks.append(paddle.zeros([b, h, j1 - j0, dvd], dtype=q.dtype))
            continue
        live = paddle.logical_and(_mask_tensor(vis_np, q.place), paddle.logical_not(dead))
        kb, vb = k[:, :, j0:j1], v[:, :, j0:j1]
        s = paddle.matmul(q, kb, transpose_y=True) * scale
        # s <= lse up to rounding: the exponent is clamped at 0, so a stale or degenerate lse
        # cannot overflow it.
        p = paddle.where(live, paddle.exp(paddle.minimum(s - lse_safe, paddle.zeros_like(s))), paddle.zeros_like(s))
        dv_blocks.append(paddle.matmul(p, dout, transpose_x=True))
        dp = paddle.matmul(dout_w, vb.astype(wide), transpose_y=True)
        ds = p * (dp - delta).astype(q.dtype)
        dq = dq + paddle.matmul(ds, kb) * scale
        dk_blocks.append(paddle.matmul(ds, q, transpose_x=True) * scale)
    dk = paddle.concat(dk_blocks, axis=2)
    dv = paddle.concat(dv_blocks, axis=2)
    return dq, _reduce_groups(dk, groups), _reduce_groups(dv, groups)


def _compute_dtype(x):
    return paddle.float64 if x.dtype == paddle.float64 else paddle.float32


def _bhsd(x, ct):
    """[B, S, H, D] -> [B, H, S, D] in the compute dtype."""
    return x.astype(ct).transpose([0, 2, 1, 3])


def _bshd(x, dtype):
    return x.transpose([0, 2, 1, 3]).astype(dtype)


def flash_attention_fwd(q, k, v, scale, causal, window):
    """Public layout: q [B,Sq,H,D], k [B,Sk,Hkv,D], v [B,Sk,Hkv,Dv] -> out [B,Sq,H,Dv] (q dtype), lse f32 [B,H,Sq]."""
    ct = _compute_dtype(q)
    out, lse = forward_bhsd(_bhsd(q, ct), _bhsd(k, ct), _bhsd(v, ct), scale, causal, window)
    return _bshd(out, q.dtype), lse.astype(paddle.float32)


def flash_attention_bwd(q, k, v, out, dout, lse, dlse, scale, causal, window):
    ct = _compute_dtype(q)
    dq, dk, dv = backward_bhsd(
        _bhsd(q, ct), _bhsd(k, ct), _bhsd(v, ct), _bhsd(out, ct), _bhsd(dout, ct),
        lse.astype(ct), None if dlse is None else dlse.astype(ct), scale, causal, window,
    )
    return _bshd(dq, q.dtype), _bshd(dk, k.dtype), _bshd(dv, v.dtype)


def _segments(cu_q, cu_k):
    cq = np.asarray(cu_q, dtype=np.int64)
    ck = np.asarray(cu_k, dtype=np.int64)
    return [(int(cq[i]), int(cq[i + 1]), int(ck[i]), int(ck[i + 1])) for i in range(len(cq) - 1)]


def _seg_bhsd(x, a, b, ct):
    """[T, H, D] rows a:b -> [1, H, b - a, D]."""
    return x[a:b].astype(ct).transpose([1, 0, 2]).unsqueeze(0)


def flash_attention_varlen_fwd(q, k, v, cu_q, cu_k, scale, causal, window):
    """Packed: q [Tq,H,D], k [Tk,Hkv,D], v [Tk,Hkv,Dv], cu_* host int arrays -> out [Tq,H,Dv], lse f32 [H,Tq]."""
    ct = _compute_dtype(q)
    tq, h, _ = q.shape
    out = paddle.zeros([tq, h, v.shape[-1]], dtype=ct)
    lse = paddle.full([h, tq], _NEG_INF, dtype=ct)
    for qa, qb, ka, kb in _segments(cu_q, cu_k):
        if qb == qa or kb == ka:
            continue  # no query rows, or rows that see no key: out 0, lse -inf as initialised
        o, l = forward_bhsd(_seg_bhsd(q, qa, qb, ct), _seg_bhsd(k, ka, kb, ct), _seg_bhsd(v, ka, kb, ct), scale, causal, window)
        out[qa:qb] = o[0].transpose([1, 0, 2])
        lse[:, qa:qb] = l[0]
    return out.astype(q.dtype), lse.astype(paddle.float32)


def flash_attention_varlen_bwd(q, k, v, out, dout, lse, dlse, cu_q, cu_k, scale, causal, window):
    ct = _compute_dtype(q)
    dq = paddle.zeros(q.shape, dtype=ct)
    dk = paddle.zeros(k.shape, dtype=ct)
    dv = paddle.zeros(v.shape, dtype=ct)
    for qa, qb, ka, kb in _segments(cu_q, cu_k):
        if qb == qa or kb == ka:
            continue
        seg_dlse = None if dlse is None else dlse[:, qa:qb].astype(ct).unsqueeze(0)
        gq, gk, gv = backward_bhsd(
            _seg_bhsd(q, qa, qb, ct), _seg_bhsd(k, ka, kb, ct), _seg_bhsd(v, ka, kb, ct),
            _seg_bhsd(out, qa, qb, ct), _seg_bhsd(dout, qa, qb, ct),
            lse[:, qa:qb].astype(ct).unsqueeze(0), seg_dlse, scale, causal, window,
        )
        dq[qa:qb] = gq[0].transpose([1, 0, 2])
        dk[ka:kb] = gk[0].transpose([1, 0, 2])
        dv[ka:kb] = gv[0].transpose([1, 0, 2])
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
