"""Torch references of the DSA ops for the GPU tests (docs/dsa.md semantics; torch only).

exact = indexer_scores(..., dtype=torch.float64): float64 from the same bf16 inputs.
floor = indexer_scores(..., dtype=torch.float32): a float32 implementation (fp32 products and sums, no TF32), the
        error level a kernel with fp32 accumulation must match: gate rel_rms(kernel - exact) <= 2 x
        rel_rms(floor - exact) over the visible entries.
Dense layouts: index_q [B,Sq,H,D], index_k [B,Sk,D], weights [B,Sq,H] -> scores [B,Sq,Sk], lse [B,Sq].
THD: [Tq,H,D], [Tk,D], [Tq,H] + cu_seqlens -> scores [Tq,W] (columns local, -inf past the row's keys and on
rows at or past cu_seqlens_q[-1]), lse [Tq] (0 on rows that see no key).
"""
import torch


def limits(sq, sk, q_offset, causal, ratio, device):
    """int64 [sq]: query t sees keys j < lim[t]."""
    if not causal:
        return torch.full((sq,), sk, dtype=torch.int64, device=device)
    t = torch.arange(sq, dtype=torch.int64, device=device)
    return torch.clamp(torch.div(q_offset + t + 1, ratio, rounding_mode="floor"), 0, sk)


def _segment(q, k, w, lim, dtype):
    """q [S,H,D], k [Sk,D], w [S,H] -> scores [S,Sk] in dtype (head by head: no [S,H,Sk] tensor)."""
    qd, kd, wd = q.to(dtype), k.to(dtype), w.to(dtype)
    s = torch.zeros(q.shape[0], k.shape[0], dtype=dtype, device=q.device)
    for h in range(q.shape[1]):
        s += wd[:, h, None] * torch.relu(qd[:, h] @ kd.T)
    j = torch.arange(k.shape[0], device=q.device)
    return s.masked_fill(j[None, :] >= lim[:, None], float("-inf"))


def row_lse(s):
    """Natural-log logsumexp of each row's finite... visible entries (-inf excluded), 0 for a row with none."""
    lse = torch.logsumexp(s, dim=-1)
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def indexer_scores(q, k, w, *, causal=True, ratio=1, q_offsets=None, cu_q=None, cu_k=None, width=None,
                   dtype=torch.float64):
    """(scores, lse) in dtype; see the module docstring for layouts."""
    dev = q.device
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        if cu_q is None:
            B, Sq = q.shape[:2]
            Sk = k.shape[1]
            s = torch.empty(B, Sq, Sk, dtype=dtype, device=dev)
            for b in range(B):
                off = 0 if q_offsets is None else int(q_offsets[b])
                s[b] = _segment(q[b], k[b], w[b], limits(Sq, Sk, off, causal, ratio, dev), dtype)
            return s, row_lse(s)
        cq, ck = cu_q.tolist(), cu_k.tolist()
        s = torch.full((q.shape[0], width), float("-inf"), dtype=dtype, device=dev)
        for b in range(len(cq) - 1):
            qa, qb, ka, kb = cq[b], cq[b + 1], ck[b], ck[b + 1]
            if qb == qa:
                continue
            off = 0 if q_offsets is None else int(q_offsets[b])
            lim = limits(qb - qa, kb - ka, off, causal, ratio, dev)
            s[qa:qb, :kb - ka] = _segment(q[qa:qb], k[ka:kb], w[qa:qb], lim, dtype)
        return s, row_lse(s)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def rel_rms(x, ref):
    """||x - ref|| / ||ref|| over finite reference entries (both in float64)."""
    m = torch.isfinite(ref)
    d = (x.double() - ref)[m]
    return (d.norm() / ref[m].norm().clamp_min(1e-300)).item()
