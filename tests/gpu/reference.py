"""Reference attention for the GPU tests (torch only; shared by the forward and backward tests).

exact  = attention_ref(q, k, v, ..., upcast=torch.float64)                 -- float64 from the same low-precision inputs
floor  = attention_ref(q, k, v, ..., upcast=torch.float32, round_p_to=q.dtype)
         -- fp32 with the unnormalised probabilities P = exp(S - rowmax) rounded to the input dtype before P @ V,
            divided by the fp32 row sum, which is where a flash kernel must round; the caller rounds the stored
            output to the dtype as well (``floor_out.to(dtype)``).
Gate:    rel_rms(kernel - exact) <= 2 * rel_rms(floor - exact)                  (see shared/notes/attention-numerics.md)

Conventions (fixed by the lead): BSHD dense q [B,Sq,H,D], k/v [B,Sk,Hkv,D]; varlen THD q [Tq,H,D] with cu_seqlens int32
[batch+1]. Query head h uses kv head h // (H // Hkv). Causal is bottom-right aligned; window=(left, right), -1 unbounded,
causal means right = 0. lse is natural log, [B,H,Sq] (varlen [H,Tq]); a row that sees no key has out 0 and lse -inf;
varlen rows at or past cu_seqlens_q[-1] too.
"""
import math

import torch

__all__ = ["visible_mask", "attention_ref", "rel_rms", "gate_ratio", "poison_like", "lse_tol"]


def visible_mask(sq, sk, *, causal=False, window=(-1, -1), device=None):
    """bool [sq, sk]: query i sees key j (bottom-right aligned causal/window)."""
    left, right = (-1, -1) if window is None else window
    if causal:
        right = 0
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(sk, device=device).view(1, -1)
    diag = i + (sk - sq)
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        vis &= j <= diag + right
    if left >= 0:
        vis &= j >= diag - left
    return vis


def _dense_ref(q, k, v, *, causal, window, softmax_scale, upcast, round_p_to):
    # q [B,Sq,H,D], k/v [B,Sk,Hkv,D] -> out [B,Sq,H,D] (upcast), lse [B,H,Sq] (upcast)
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = H // Hkv
    qf = q.to(upcast).permute(0, 2, 1, 3)                                   # B,H,Sq,D
    kf = k.to(upcast).repeat_interleave(g, dim=2).permute(0, 2, 1, 3)       # B,H,Sk,D
    vf = v.to(upcast).repeat_interleave(g, dim=2).permute(0, 2, 1, 3)
    vis = visible_mask(Sq, Sk, causal=causal, window=window, device=q.device)
    out = torch.empty(B, H, Sq, v.shape[-1], dtype=upcast, device=q.device)
    lse = torch.empty(B, H, Sq, dtype=upcast, device=q.device)
    for b in range(B):  # one batch at a time keeps the float64 score matrix small
        s = torch.matmul(qf[b], kf[b].transpose(-1, -2)) * softmax_scale       # H,Sq,Sk
        s = s.masked_fill(~vis, float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        dead = torch.isneginf(m)
        m = torch.where(dead, torch.zeros_like(m), m)
        p = torch.exp(s - m)                                                  # unnormalised, exp(-inf) = 0
        l = p.sum(dim=-1, keepdim=True)
        if round_p_to is not None:
            p = p.to(round_p_to).to(upcast)
        o = torch.matmul(p, vf[b]) / torch.where(l == 0, torch.ones_like(l), l)
        o = torch.where(dead, torch.zeros_like(o), o)
        out[b] = o
        lse[b] = torch.where(dead, torch.full_like(m, float("-inf")), m + torch.log(l)).squeeze(-1)
        del s, p
    return out.permute(0, 2, 1, 3).contiguous(), lse


def attention_ref(q, k, v, *, causal=False, window=(-1, -1), softmax_scale=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, upcast=torch.float64, round_p_to=None):
    """Attention in ``upcast`` precision from the given (low-precision) tensors. Returns (out, lse) in ``upcast``.

    Dense: q [B,Sq,H,D] -> out [B,Sq,H,Dv], lse [B,H,Sq]. Varlen (cu_seqlens given): q [Tq,H,D] -> out [Tq,H,Dv],
    lse [H,Tq]; rows at or past cu_seqlens_q[-1] get out 0, lse -inf.
    """
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if window is None:
        window = (-1, -1)
    kw = dict(causal=causal, window=tuple(window), softmax_scale=softmax_scale, upcast=upcast, round_p_to=round_p_to)
    if cu_seqlens_q is None:
        return _dense_ref(q, k, v, **kw)
    Tq, H, _ = q.shape
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    out = torch.zeros(Tq, H, v.shape[-1], dtype=upcast, device=q.device)
    lse = torch.full((H, Tq), float("-inf"), dtype=upcast, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 == q0:
            continue
        if k1 == k0:  # no keys: out 0, lse -inf (already)
            continue
        o, l = _dense_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **kw)
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l[0]
    return out, lse


def rel_rms(x, ref):
    """RMS(x - ref) / RMS(ref) over finite reference entries, in float64."""
    x = x.double()
    ref = ref.double()
    num = (x - ref).pow(2).mean().sqrt()
    den = ref.pow(2).mean().sqrt()
    return float(num / den) if float(den) > 0 else float(num)


def gate_ratio(kernel, exact, floor):
    """relRMS(kernel - exact) / relRMS(floor - exact); the test gate is <= 2."""
    e_k = rel_rms(kernel, exact)
    e_f = rel_rms(floor, exact)
    return e_k / max(e_f, 1e-30), e_k, e_f


def lse_tol(q, k, softmax_scale):
    """|lse error| bound 2^-16 * max(1, max|S|) estimated from norms (S stays fp32 in the kernel)."""
    smax = float(q.float().norm(dim=-1).max() * k.float().norm(dim=-1).max()) * abs(softmax_scale)
    return 2.0 ** -16 * max(1.0, smax)


def poison_like(x):
    return torch.full_like(x, float("nan"))
