"""Torch references of the DSA ops for the GPU tests (docs/dsa.md semantics; torch only).

exact = indexer_scores(..., dtype=torch.float64): float64 from the same bf16 inputs.
floor = indexer_scores(..., dtype=torch.float32): a float32 implementation (fp32 products and sums, no TF32), the
        error level a kernel with fp32 accumulation must match: gate rel_rms(kernel - exact) <= 2 x
        rel_rms(floor - exact) over the visible entries.
Dense layouts: index_q [B,Sq,H,D], index_k [B,Sk,D], weights [B,Sq,H] -> scores [B,Sq,Sk], lse [B,Sq].
THD: [Tq,H,D], [Tk,D], [Tq,H] + cu_seqlens -> scores [Tq,W] (columns local, -inf past the row's keys and on
rows at or past cu_seqlens_q[-1]), lse [Tq] (0 on rows that see no key).
"""
import math

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


EXP_MAX = 120.0 * math.log(2.0)
EXP_MIN = -126.0 * math.log(2.0)
FLT_MAX = torch.finfo(torch.float32).max


def _attn_segment(q, kv, lse, scale, lim, dtype):
    """q [S,H,D], kv [Sk,D], lse [H,S] -> (scores [S,Sk], l1 [S]) in dtype: sum_h exp(clamp(scale q.k - lse))."""
    qd, kd, ld = q.to(dtype), kv.to(dtype), lse.to(dtype)
    a = torch.zeros(q.shape[0], kv.shape[0], dtype=dtype, device=q.device)
    for h in range(q.shape[1]):
        arg = torch.clamp(scale * (qd[:, h] @ kd.T) - ld[h, :, None], max=EXP_MAX)
        a += torch.where(arg < EXP_MIN, torch.zeros_like(arg), torch.exp(arg))
    j = torch.arange(kv.shape[0], device=q.device)
    a = a.masked_fill(j[None, :] >= lim[:, None], 0.0)
    return a, torch.clamp(a.sum(-1), max=FLT_MAX)


def attn_scores(q, kv, lse, scale, *, causal=True, ratio=1, q_offsets=None, cu_q=None, cu_k=None, width=None,
                dtype=torch.float64):
    """(attn_score, attn_l1norm) in dtype. Dense q [B,Sq,H,D], kv [B,Sk,D], lse [B,H,Sq]; THD [Tq,H,D], [Tk,D],
    lse [H,Tq], scores [Tq,W] (0 past the row's keys and on rows past cu_seqlens_q[-1])."""
    dev = q.device
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        if cu_q is None:
            B, Sq = q.shape[:2]
            Sk = kv.shape[1]
            a = torch.empty(B, Sq, Sk, dtype=dtype, device=dev)
            l1 = torch.empty(B, Sq, dtype=dtype, device=dev)
            for b in range(B):
                off = 0 if q_offsets is None else int(q_offsets[b])
                a[b], l1[b] = _attn_segment(q[b], kv[b], lse[b], scale, limits(Sq, Sk, off, causal, ratio, dev), dtype)
            return a, l1
        cq, ck = cu_q.tolist(), cu_k.tolist()
        a = torch.zeros(q.shape[0], width, dtype=dtype, device=dev)
        l1 = torch.zeros(q.shape[0], dtype=dtype, device=dev)
        for b in range(len(cq) - 1):
            qa, qb, ka, kb = cq[b], cq[b + 1], ck[b], ck[b + 1]
            if qb == qa:
                continue
            off = 0 if q_offsets is None else int(q_offsets[b])
            lim = limits(qb - qa, kb - ka, off, causal, ratio, dev)
            a[qa:qb, :kb - ka], l1[qa:qb] = _attn_segment(q[qa:qb], kv[ka:kb], lse[:, qa:qb], scale, lim, dtype)
        return a, l1
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def true_lse(q, kv, scale, *, causal=True, ratio=1, q_offsets=None):
    """Dense [B,H,Sq] float32 logsumexp of scale * q . kv over the indexer-visible keys (the attention's own lse,
    so the recomputed probabilities are <= 1); -inf for a row that sees no key."""
    B, Sq, H, _ = q.shape
    Sk = kv.shape[1]
    out = torch.empty(B, H, Sq, device=q.device)
    j = torch.arange(Sk, device=q.device)
    for b in range(B):
        off = 0 if q_offsets is None else int(q_offsets[b])
        lim = limits(Sq, Sk, off, causal, ratio, q.device)
        for h in range(H):
            s = scale * (q[b, :, h].double() @ kv[b].double().T)
            out[b, h] = torch.logsumexp(s.masked_fill(j[None, :] >= lim[:, None], float("-inf")), -1).float()
    return out


def slot_rows(idx, topk_length=None, cu_q=None, cu_k=None, sk=None):
    """Token-major (valid [T,K], global key row [T,K]) of top-k slots: dense idx [B,Sq,K] with sk keys per batch
    (global row b * sk + idx), THD idx [Tq,K] local to the row's sequence (rows past cu_q[-1] all invalid)."""
    if cu_q is None:
        B, Sq, K = idx.shape
        base = (torch.arange(B, device=idx.device) * sk).view(B, 1, 1).expand(B, Sq, 1).reshape(-1, 1)
        ks = torch.full((B * Sq, 1), sk, device=idx.device)
        flat = idx.reshape(-1, K).long()
        tl = None if topk_length is None else topk_length.reshape(-1, 1)
    else:
        T, K = idx.shape
        seg = torch.searchsorted(cu_q.long(), torch.arange(T, device=idx.device), right=True) - 1
        inside = torch.arange(T, device=idx.device) < cu_q[-1]
        seg = seg.clamp(0, len(cu_q) - 2)
        base = cu_k.long()[seg].view(-1, 1)
        ks = torch.where(inside, (cu_k[1:] - cu_k[:-1]).long()[seg], torch.zeros_like(seg)).view(-1, 1)
        flat = idx.long()
        tl = None if topk_length is None else topk_length.view(-1, 1)
    valid = (flat >= 0) & (flat < ks)
    if tl is not None:
        valid &= torch.arange(flat.shape[1], device=idx.device)[None, :] < tl
    return valid, torch.where(valid, base + flat, torch.zeros_like(flat))


def _gathered(q_rows, k_rows, grow, dtype, fn, chunk=64):
    """sum_h fn(q[t,h] . k[grow[t,s]], t, h) over row chunks: [T, K] in dtype."""
    T, H, _ = q_rows.shape
    out = torch.zeros(T, grow.shape[1], dtype=dtype, device=q_rows.device)
    for r0 in range(0, T, chunk):
        r1 = min(T, r0 + chunk)
        kg = k_rows.to(dtype)[grow[r0:r1]]                      # [R, K, D]
        x = torch.einsum("rhd,rkd->rhk", q_rows[r0:r1].to(dtype), kg)
        out[r0:r1] = fn(x, r0, r1).sum(1)
    return out


def sparse_indexer_scores(q, k, w, idx, *, topk_length=None, cu_q=None, cu_k=None, dtype=torch.float64):
    """(index_score, index_lse) in dtype over the top-k slots; -inf / 0 conventions of docs/dsa.md."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dense = cu_q is None
        valid, grow = slot_rows(idx, topk_length, cu_q, cu_k, None if not dense else k.shape[1])
        qr = q.reshape(-1, *q.shape[-2:])
        kr = k.reshape(-1, k.shape[-1])
        wr = w.reshape(-1, w.shape[-1]).to(dtype)
        s = _gathered(qr, kr, grow, dtype, lambda x, a, b: wr[a:b, :, None] * torch.relu(x))
        s = s.masked_fill(~valid, float("-inf"))
        lse = row_lse(s)
        return s.reshape(idx.shape), lse.reshape(idx.shape[:-1])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def sparse_attn_scores(q, kv, lse, scale, idx, *, topk_length=None, cu_q=None, cu_k=None, dtype=torch.float64):
    """(attn_score, attn_l1norm) in dtype over the top-k slots; lse [B,H,Sq] / THD [H,Tq]."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dense = cu_q is None
        valid, grow = slot_rows(idx, topk_length, cu_q, cu_k, None if not dense else kv.shape[1])
        qr = q.reshape(-1, *q.shape[-2:])
        kr = kv.reshape(-1, kv.shape[-1])
        lr = (lse.permute(0, 2, 1).reshape(-1, lse.shape[1]) if dense else lse.T).to(dtype)   # [T, H]

        def term(x, a, b):
            arg = torch.clamp(scale * x - lr[a:b, :, None], max=EXP_MAX)
            return torch.where(arg < EXP_MIN, torch.zeros_like(arg), torch.exp(arg))
        s = _gathered(qr, kr, grow, dtype, term).masked_fill(~valid, 0.0)
        l1 = torch.clamp(s.sum(-1), max=FLT_MAX)
        return s.reshape(idx.shape), l1.reshape(idx.shape[:-1])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def sparse_attention(q, kv, scale, idx, *, dv=512, sink=None, topk_length=None, cu_q=None, cu_k=None,
                     dtype=torch.float64, floor=False, chunk=32):
    """(out [.., H, dv], lse [B,H,Sq] / [H,Tq]) of sparse MLA attention (docs/dsa.md) in dtype. floor=True: the
    float32 implementation that rounds where the kernel must (fp32 logits and sums, P rounded to bf16 for P V, out
    to bf16). A row with no valid slot: out 0, lse -inf."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dense = cu_q is None
        valid, grow = slot_rows(idx, topk_length, cu_q, cu_k, None if not dense else kv.shape[1])
        qr = q.reshape(-1, *q.shape[-2:])
        kr = kv.reshape(-1, kv.shape[-1])
        T, H, _ = qr.shape
        out = torch.zeros(T, H, dv, dtype=dtype, device=q.device)
        lse = torch.full((T, H), float("-inf"), dtype=dtype, device=q.device)
        sk = None if sink is None else sink.to(dtype)
        for r0 in range(0, T, chunk):
            r1 = min(T, r0 + chunk)
            kg = kr.to(dtype)[grow[r0:r1]]                                   # [R, K, D]
            x = scale * torch.einsum("rhd,rkd->rhk", qr[r0:r1].to(dtype), kg)
            vm = valid[r0:r1, None, :]
            x = x.masked_fill(~vm, float("-inf"))
            m = x.amax(-1, keepdim=True)
            has = vm.any(-1, keepdim=True)
            m = torch.where(has, m, torch.zeros_like(m))
            p = torch.exp(x - m)                                             # 0 at invalid slots
            l = p.sum(-1, keepdim=True)
            den = l if sk is None else l + torch.exp(sk.view(1, H, 1) - m)
            pv = p.to(torch.bfloat16).to(dtype) if floor else p
            o = torch.einsum("rhk,rkd->rhd", pv, kg[..., :dv]) / den
            o = torch.where(has, o, torch.zeros_like(o))
            out[r0:r1] = o.to(torch.bfloat16).to(dtype) if floor else o
            lse[r0:r1] = torch.where(has, m + torch.log(l), torch.full_like(m, float("-inf"))).squeeze(-1)
        if dense:
            B, Sq = idx.shape[:2]
            return out.reshape(B, Sq, H, dv), lse.reshape(B, Sq, H).permute(0, 2, 1)
        return out, lse.T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _lse_plus(lse, sink):
    """logaddexp(lse, sink) per (row, head), lse [R, H] (-inf for an empty row: the sink)."""
    if sink is None:
        return lse
    sk = sink.view(1, -1).expand_as(lse)
    return torch.where(torch.isneginf(lse), sk, torch.logaddexp(lse, sk))


def sparse_attention_bwd(q, kv, scale, idx, out, dout, lse, *, dv=512, sink=None, dlse=None, topk_length=None,
                         cu_q=None, cu_k=None, dtype=torch.float64, floor=False, chunk=16):
    """(dq like q, dkv like kv, d_sink_rows [.., H] or None) of sparse_attention from the given out (bf16) and lse
    (float32, public layout), the math of ops/dsa/sparse_attn/bwd_sm90.py. floor=True: the float32 implementation
    that rounds where the kernel must (c dS and P to bf16 before their products, dq to bf16)."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dense = cu_q is None
        valid, grow = slot_rows(idx, topk_length, cu_q, cu_k, None if not dense else kv.shape[1])
        qr = q.reshape(-1, *q.shape[-2:])
        kr = kv.reshape(-1, kv.shape[-1])
        T, H, D = qr.shape
        rows_of = (lambda x: x.permute(0, 2, 1).reshape(-1, x.shape[1])) if dense else (lambda x: x.T)
        lr = rows_of(lse).to(dtype)
        dlr = None if dlse is None else rows_of(dlse).to(dtype)
        o = out.reshape(T, H, dv).to(dtype)
        do = dout.reshape(T, H, dv).to(dtype)
        sk = None if sink is None else sink.to(dtype)
        bf = (lambda x: x.to(torch.bfloat16).to(dtype)) if floor else (lambda x: x)
        dq = torch.zeros(T, H, D, dtype=dtype, device=q.device)
        dkv = torch.zeros(kr.shape, dtype=dtype, device=q.device)
        dsink = torch.zeros(T, H, dtype=dtype, device=q.device)
        for r0 in range(0, T, chunk):
            r1 = min(T, r0 + chunk)
            vm = valid[r0:r1, None, :]
            kg = kr.to(dtype)[grow[r0:r1]]                                   # [R, K, D]
            qc = qr[r0:r1].to(dtype)
            s = scale * torch.einsum("rhd,rkd->rhk", qc, kg)
            lsep = _lse_plus(lr[r0:r1], sk)
            p = torch.where(vm, torch.exp(torch.clamp(s - lsep[..., None], max=0.0)), torch.zeros_like(s))
            delta = (do[r0:r1] * o[r0:r1]).sum(-1)                           # [R, H]
            dp = torch.einsum("rhv,rkv->rhk", do[r0:r1], kg[..., :dv])
            ds = p * (dp - delta[..., None])
            if dlr is not None:
                pn = torch.where(vm, torch.exp(torch.clamp(s - lr[r0:r1, :, None], max=0.0)), torch.zeros_like(s))
                ds = ds + dlr[r0:r1, :, None] * pn
            ds = torch.where(vm, ds, torch.zeros_like(ds))
            dsb, pb = bf(scale * ds), bf(p)
            dq[r0:r1] = torch.einsum("rhk,rkd->rhd", dsb, kg)
            contrib = torch.einsum("rhk,rhd->rkd", dsb, qc)
            contrib[..., :dv] += torch.einsum("rhk,rhv->rkv", pb, do[r0:r1])
            m = valid[r0:r1]
            dkv.index_add_(0, grow[r0:r1][m], contrib[m])
            if sk is not None:
                ps = torch.exp(torch.clamp(sk.view(1, -1) - lsep, max=0.0))
                ps = torch.where(torch.isneginf(sk).view(1, -1), torch.zeros_like(ps), ps)    # no -inf - -inf
                dsink[r0:r1] = -ps * delta
        dq = bf(dq)
        return dq.reshape(q.shape), dkv.reshape(kv.shape), None if sink is None else dsink.reshape(*q.shape[:-2], H)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def sparse_indexer_bwd(q, k, w, idx, score, lse, attn, l1, c, *, topk_length=None, cu_q=None, cu_k=None,
                       dtype=torch.float64, floor=False, chunk=32, dw_scale=False):
    """(d_index_q like q, d_index_k like k, d_weights [.., Hi]) of the sparse indexer KL loss (the math of
    ops/dsa/indexer/sparse_bwd_sm90.py / paddle_dsa/reference/dsa/indexer_loss.py) from the given statistics and
    c = loss_coeff * grad_loss / N. floor=True: the float32 implementation that rounds where the kernel must (dA to
    bf16 before its products, d_index_q to bf16). dw_scale=True adds a fourth output: sum_s |G[s]| relu(X[s, h]) like
    d_weights, the magnitude its rounding errors scale with (d_weights itself cancels: sum_s G[s] is about 0)."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        dense = cu_q is None
        valid, grow = slot_rows(idx, topk_length, cu_q, cu_k, None if not dense else k.shape[1])
        qr = q.reshape(-1, *q.shape[-2:])
        kr = k.reshape(-1, k.shape[-1])
        T, H, D = qr.shape
        wr = w.reshape(T, H).to(dtype)
        sr, ar = score.reshape(T, -1).to(dtype), attn.reshape(T, -1).to(dtype)
        lr, l1r = lse.reshape(T).to(dtype), l1.reshape(T).to(dtype)
        cc = c.reshape(()).to(dtype)
        bf = (lambda x: x.to(torch.bfloat16).to(dtype)) if floor else (lambda x: x)
        dq = torch.zeros(T, H, D, dtype=dtype, device=q.device)
        dk = torch.zeros(kr.shape, dtype=dtype, device=q.device)
        dw = torch.zeros(T, H, dtype=dtype, device=q.device)
        dws = torch.zeros(T, H, dtype=dtype, device=q.device)
        for r0 in range(0, T, chunk):
            r1 = min(T, r0 + chunk)
            vm = valid[r0:r1]
            x = torch.where(vm, sr[r0:r1] - lr[r0:r1, None], torch.zeros_like(sr[r0:r1]))
            p = torch.where(vm & ~(x < EXP_MIN), torch.exp(torch.clamp(x, max=0.0)), torch.zeros_like(x))
            t = ar[r0:r1] / torch.clamp(l1r[r0:r1, None], min=1e-10)
            t = torch.where(t < math.exp(-100.0), torch.full_like(t, math.exp(-100.0)), t)
            g = torch.where(vm & ~(x < -100.0), -cc * t, torch.zeros_like(t))
            G = torch.where(vm, g - p * g.sum(-1, keepdim=True), torch.zeros_like(g))      # [R, K]
            kg = kr.to(dtype)[grow[r0:r1]]                                                  # [R, K, D]
            qc = qr[r0:r1].to(dtype)
            X = torch.einsum("rhd,rkd->rhk", qc, kg)
            relu = torch.where(X < 0, torch.zeros_like(X), X)
            slope = torch.where(X > 0, torch.ones_like(X), torch.where(X <= 0, torch.zeros_like(X), X))
            dw[r0:r1] = (G[:, None, :] * relu).sum(-1)
            dws[r0:r1] = (G.abs()[:, None, :] * relu).sum(-1)
            dA = bf(G[:, None, :] * wr[r0:r1, :, None] * slope)                            # [R, H, K]
            dq[r0:r1] = torch.einsum("rhk,rkd->rhd", dA, kg)
            contrib = torch.einsum("rhk,rhd->rkd", dA, qc)
            dk.index_add_(0, grow[r0:r1][vm], contrib[vm])
        out = (bf(dq).reshape(q.shape), dk.reshape(k.shape), dw.reshape(*q.shape[:-2], H))
        return out + (dws.reshape(*q.shape[:-2], H),) if dw_scale else out
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def rel_rms(x, ref):
    """||x - ref|| / ||ref|| over finite reference entries (both in float64)."""
    m = torch.isfinite(ref)
    d = (x.double() - ref)[m]
    return (d.norm() / ref[m].norm().clamp_min(1e-300)).item()
