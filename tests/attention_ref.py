"""Float64 numpy attention (full matrices), independent of paddle_dsa: the exact reference of the tests.

One segment at a time: q [Sq, H, D], k/v [Sk, Hkv, D] as float64 arrays made from the same
low-precision inputs the op received.
"""
import numpy as np


def visible(sq, sk, causal, window):
    left, right = window
    i = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    vis = np.ones((sq, sk), dtype=bool)
    if causal:
        vis &= j <= i
    if right >= 0:
        vis &= j <= i + right
    if left >= 0:
        vis &= j >= i - left
    return vis


def _expand(x, h):
    return np.repeat(x, h // x.shape[1], axis=1)


def forward(q, k, v, scale, causal, window):
    """-> out [Sq, H, D], lse [H, Sq] (-inf for rows that see no key)."""
    sq, h, d = q.shape
    sk = k.shape[0]
    ke, ve = _expand(k, h), _expand(v, h)
    s = scale * np.einsum("ihd,jhd->hij", q, ke)
    vis = visible(sq, sk, causal, window)[None]
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk else np.full((h, sq, 1), -np.inf)
    live = np.isfinite(m)
    p = np.where(vis & live, np.exp(s - np.where(live, m, 0.0)), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", p / np.where(l > 0, l, 1.0), ve)
    lse = np.where(l > 0, np.log(np.where(l > 0, l, 1.0)) + np.where(live, m, 0.0), -np.inf)[..., 0]
    return out, lse


def backward(q, k, v, dout, dlse, scale, causal, window, stored_out=None, fp32=False):
    """Gradients of sum(out * dout) + sum(lse * dlse) (dlse [H, Sq] or None) -> dq, dk, dv.

    The floor of a flash backward (what a correct implementation must incur, given its contract) comes
    from two options: stored_out, the output as the op stored it (rounded to its dtype), from which
    Delta = rowsum(out * dout) must be taken; fp32, every step in float32 arithmetic (scores, lse,
    P, dP - Delta, the matmuls), as an fp32 implementation computes them.
    """
    sq, h, d = q.shape
    sk, hkv, _ = k.shape
    out, lse = forward(q, k, v, scale, causal, window)
    if stored_out is not None:
        out = stored_out
    ct = np.float32 if fp32 else np.float64
    q, k, v, dout, out = (np.asarray(x, ct) for x in (q, k, v, dout, out))
    ke, ve = _expand(k, h), _expand(v, h)
    vis = visible(sq, sk, causal, window)[None]
    # matmul (BLAS) rather than einsum: its float32 accumulation is that of an ordinary fp32 GEMM.
    s = ct(scale) * np.matmul(q.transpose(1, 0, 2), ke.transpose(1, 2, 0))
    if fp32:
        lse, _ = _lse(s, vis)
    lse = np.asarray(lse, ct)
    live = np.isfinite(lse)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(vis & live, np.exp(np.minimum(s - np.where(live, lse[..., None], 0), 0)), 0).astype(ct)
    dv = np.einsum("hij,ihd->jhd", p, dout)
    dp = np.einsum("ihd,jhd->hij", dout, ve)
    delta = np.einsum("ihd,ihd->hi", out, dout)[..., None]
    if dlse is not None:
        delta = delta - np.asarray(dlse, ct)[..., None]
    ds = p * (dp - delta)
    dq = ct(scale) * np.einsum("hij,jhd->ihd", ds, ke)
    dk = ct(scale) * np.einsum("hij,ihd->jhd", ds, q)
    g = h // hkv
    dk = dk.reshape(sk, hkv, g, d).sum(axis=2)
    dv = dv.reshape(sk, hkv, g, v.shape[-1]).sum(axis=2)
    return tuple(x.astype(np.float64) for x in (dq, dk, dv))


def _lse(s, vis):
    """logsumexp over visible entries in s's dtype; -inf for rows with none."""
    sm = np.where(vis, s, -np.inf)
    if sm.shape[-1] == 0:
        return np.full(sm.shape[:-1], -np.inf, s.dtype), np.zeros(sm.shape[:-1] + (1,), bool)
    m = sm.max(axis=-1, keepdims=True)
    live = np.isfinite(m)
    m0 = np.where(live, m, 0).astype(s.dtype)
    with np.errstate(divide="ignore"):
        lse = np.log(np.where(vis, np.exp(sm - m0), 0).sum(-1)) + m0[..., 0]
    return np.where(live[..., 0], lse, -np.inf).astype(s.dtype), live


def rel_rms(x, ref):
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    denom = np.sqrt(np.mean(ref * ref))
    err = np.sqrt(np.mean((x - ref) ** 2))
    return err / denom if denom > 0 else err
