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


def backward(q, k, v, dout, dlse, scale, causal, window, stored_out=None):
    """Gradients of sum(out * dout) + sum(lse * dlse) (dlse [H, Sq] or None) -> dq, dk, dv.

    stored_out: the output as the op stored it (rounded to its dtype). A flash backward must take
    Delta = rowsum(out * dout) from the stored output; passing it gives the rounding floor of that step.
    """
    sq, h, d = q.shape
    sk, hkv, _ = k.shape
    out, lse = forward(q, k, v, scale, causal, window)
    if stored_out is not None:
        out = stored_out
    ke, ve = _expand(k, h), _expand(v, h)
    s = scale * np.einsum("ihd,jhd->hij", q, ke)
    vis = visible(sq, sk, causal, window)[None]
    live = np.isfinite(lse)[..., None]
    p = np.where(vis & live, np.exp(s - np.where(live, lse[..., None], 0.0)), 0.0)
    dv = np.einsum("hij,ihd->jhd", p, dout)
    dp = np.einsum("ihd,jhd->hij", dout, ve)
    delta = np.einsum("ihd,ihd->hi", out, dout)[..., None]
    ds = p * (dp - delta)
    if dlse is not None:
        ds = ds + p * dlse[..., None]
    dq = scale * np.einsum("hij,jhd->ihd", ds, ke)
    dk = scale * np.einsum("hij,ihd->jhd", ds, q)
    g = h // hkv
    dk = dk.reshape(sk, hkv, g, d).sum(axis=2)
    dv = dv.reshape(sk, hkv, g, d).sum(axis=2)
    return dq, dk, dv


def rel_rms(x, ref):
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    denom = np.sqrt(np.mean(ref * ref))
    err = np.sqrt(np.mean((x - ref) ** 2))
    return err / denom if denom > 0 else err
