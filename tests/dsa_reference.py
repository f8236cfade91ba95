"""Independent float64 numpy reference of the DSA ops for the CPU tests (no Paddle here).

Written from the math in docs/dsa.md with dense masks and einsum, one sequence at a time; nothing is
shared with paddle_dsa.reference. Gradients are analytic and checked against central finite
differences of the float64 forward functions in the tests themselves.
"""
import numpy as np

EXP_MAX = 120 * np.log(2.0)
EXP_MIN = -126 * np.log(2.0)
FLT_MAX = float(np.finfo(np.float32).max)
PMIN = np.exp(-100.0)


def sequences(batch_or_cu_q, cu_k=None, sq=None, sk=None):
    """[(q_start, q_len, k_start, k_len)] for BSHD (batch, sq, sk) or THD (cu_q, cu_k)."""
    if cu_k is None:
        b = batch_or_cu_q
        return [(i * sq, sq, i * sk, sk) for i in range(b)]
    cq, ck = np.asarray(batch_or_cu_q), np.asarray(cu_k)
    return [(int(cq[i]), int(cq[i + 1] - cq[i]), int(ck[i]), int(ck[i + 1] - ck[i])) for i in range(len(cq) - 1)]


def visible(ql, kl, offset=0, causal=True, ratio=1):
    if not causal:
        return np.ones((ql, kl), bool)
    lim = np.clip((offset + np.arange(ql) + 1) // ratio, 0, kl)
    return np.arange(kl)[None, :] < lim[:, None]


def index_logits(q, k, w):
    """q [R,Hi,Di], k [N,Di] or per-row [R,N,Di], w [R,Hi] -> sum_h w relu(q.k) [R,N] and q.k [R,Hi,N]."""
    a = np.einsum("rhd,nd->rhn", q, k) if k.ndim == 2 else np.einsum("rhd,rnd->rhn", q, k)
    return np.einsum("rh,rhn->rn", w, np.maximum(a, 0.0)), a


# ---------------------------------------------------------------- dense indexer over a token layout
def dense_index(q, k, w, seqs, width, offsets=None, causal=True, ratio=1):
    """Token-major q [Tq,Hi,Di], k [Tk,Di], w [Tq,Hi] -> scores [Tq,width] (-inf masked), lse [Tq], mask."""
    tq = q.shape[0]
    s = np.full((tq, width), -np.inf)
    m = np.zeros((tq, width), bool)
    for b, (qa, ql, ka, kl) in enumerate(seqs):
        off = 0 if offsets is None else int(offsets[b])
        vis = visible(ql, kl, off, causal, ratio)
        full, _ = index_logits(q[qa:qa + ql], k[ka:ka + kl], w[qa:qa + ql])
        s[qa:qa + ql, :kl] = np.where(vis, full, -np.inf)
        m[qa:qa + ql, :kl] = vis
    return s, row_lse(s, m), m


def row_lse(s, m):
    out = np.zeros(s.shape[0])
    for r in range(s.shape[0]):
        if m[r].any():
            v = s[r][m[r]]
            mx = v.max()
            out[r] = mx + np.log(np.exp(v - mx).sum())
    return out


def topk(scores, k, lengths=None):
    r, w = scores.shape
    out = np.full((r, k), -1, np.int64)
    for i in range(r):
        lim = w if lengths is None else max(0, min(w, int(lengths[i])))
        cand = [j for j in range(lim) if np.isfinite(scores[i, j])]
        cand.sort(key=lambda j: (-scores[i, j], j))
        cand = cand[:k]
        out[i, :len(cand)] = cand
    return out


# ---------------------------------------------------------------- slots
def slots(idx, seqs, tq, topk_length=None):
    """Local indices [Tq,K] -> (global index [Tq,K] (0 where invalid), valid [Tq,K])."""
    start = np.zeros(tq, np.int64)
    length = np.zeros(tq, np.int64)
    for qa, ql, ka, kl in seqs:
        start[qa:qa + ql] = ka
        length[qa:qa + ql] = kl
    valid = (idx >= 0) & (idx < length[:, None])
    if topk_length is not None:
        valid &= np.arange(idx.shape[1])[None, :] < np.asarray(topk_length).reshape(-1, 1)
    return np.where(valid, idx + start[:, None], 0), valid


def sparse_index(q, k, w, gidx, valid):
    s, _ = index_logits(q, k[gidx], w)
    s = np.where(valid, s, -np.inf)
    return s, row_lse(s, valid)


# ---------------------------------------------------------------- sparse attention
def sparse_attention(q, kv, gidx, valid, scale, dv, sink=None):
    """q [T,H,D], kv [Tk,D] -> out [T,H,dv], lse [T,H] (-inf for empty rows)."""
    g = kv[gidx]                                           # [T,K,D]
    s = scale * np.einsum("thd,tkd->thk", q, g)
    s = np.where(valid[:, None, :], s, -np.inf)
    has = valid.any(-1)[:, None]
    mx = np.where(has, s.max(-1), 0.0)
    e = np.where(valid[:, None, :], np.exp(s - mx[..., None]), 0.0)
    lse = np.where(has, mx + np.log(np.where(has, e.sum(-1), 1.0)), -np.inf)
    lse_p = lse if sink is None else np.logaddexp(lse, sink[None, :])
    p = np.where(valid[:, None, :], np.exp(s - np.where(has, lse_p, 0.0)[..., None]), 0.0)
    out = np.einsum("thk,tkd->thd", p, g[:, :, :dv])
    return out, lse


def sparse_attention_grads(q, kv, gidx, valid, scale, dv, sink, dout, dlse):
    """Analytic gradients of sum(out * dout) + sum(lse * dlse) (finite rows): dq, dkv, dsink."""
    g = kv[gidx]
    s = scale * np.einsum("thd,tkd->thk", q, g)
    s = np.where(valid[:, None, :], s, -np.inf)
    out, lse = sparse_attention(q, kv, gidx, valid, scale, dv, sink)
    has = valid.any(-1)[:, None]
    lse0 = np.where(has, lse, 0.0)
    lse_p = lse0 if sink is None else np.logaddexp(lse0, sink[None, :])
    p = np.where(valid[:, None, :], np.exp(s - lse_p[..., None]), 0.0)
    pn = np.where(valid[:, None, :], np.exp(s - lse0[..., None]), 0.0)
    delta = (out * dout).sum(-1)
    dp = np.einsum("thv,tkv->thk", dout, g[:, :, :dv])
    ds = p * (dp - delta[..., None]) + (0 if dlse is None else dlse[..., None] * pn)
    dq = scale * np.einsum("thk,tkd->thd", ds, g)
    dg = scale * np.einsum("thk,thd->tkd", ds, q)
    dg[:, :, :dv] += np.einsum("thk,thv->tkv", p, dout)
    dkv = np.zeros_like(kv)
    np.add.at(dkv, gidx.reshape(-1), (dg * valid[..., None]).reshape(-1, kv.shape[1]))
    dsink = None
    if sink is not None:
        dsink = -(np.where(has, np.exp(sink[None, :] - lse_p), 0.0) * delta).sum(0)
    return dq, dkv, dsink


# ---------------------------------------------------------------- attention-side recompute
def attn_probs_sum(q, k, lse, scale, mask):
    """q [R,H,D], k [R,N,D] or [N,D], lse [R,H], mask [R,N] -> sum_h exp(clamped arg) [R,N], l1 [R]."""
    a = np.einsum("rhd,nd->rhn", q, k) if k.ndim == 2 else np.einsum("rhd,rnd->rhn", q, k)
    with np.errstate(invalid="ignore", over="ignore"):
        x = scale * a - lse[..., None]
    e = np.where((x >= EXP_MIN) & mask[:, None, :], np.exp(np.minimum(np.nan_to_num(x, neginf=-1e300), EXP_MAX)), 0.0)
    sc = np.minimum(e.sum(1), FLT_MAX)
    return sc, np.minimum(sc.sum(-1), FLT_MAX)


def dense_attn(q, kv, lse, scale, seqs, width, offsets=None, causal=True, ratio=1):
    tq = q.shape[0]
    out = np.zeros((tq, width))
    l1 = np.zeros(tq)
    for b, (qa, ql, ka, kl) in enumerate(seqs):
        off = 0 if offsets is None else int(offsets[b])
        vis = visible(ql, kl, off, causal, ratio)
        sc, n = attn_probs_sum(q[qa:qa + ql], kv[ka:ka + kl], lse[qa:qa + ql], scale, vis)
        out[qa:qa + ql, :kl] = sc
        l1[qa:qa + ql] = n
    return out, l1


def sparse_attn(q, kv, lse, scale, gidx, valid):
    return attn_probs_sum(q, kv[gidx], lse, scale, valid)


# ---------------------------------------------------------------- the loss and its gradient
def kl_loss(s, lse, a, l1, mask, coeff, n):
    t = np.where(mask, a / np.maximum(l1, 1e-10)[:, None], 0.0)
    t = np.maximum(t, PMIN)
    with np.errstate(invalid="ignore"):
        logp = np.clip(np.minimum(s - lse[:, None], 0.0), -100.0, None)
    term = np.where(mask, t * (np.log(t) - logp), 0.0)
    return coeff / n * term.sum() if n else 0.0


def grad_signal(s, lse, a, l1, mask, c):
    t = np.maximum(np.where(mask, a / np.maximum(l1, 1e-10)[:, None], 0.0), PMIN)
    with np.errstate(invalid="ignore"):
        x = np.where(mask, s - lse[:, None], 0.0)
    p = np.where(mask, np.exp(np.minimum(x, 0.0)), 0.0)
    g = np.where(mask & (x >= -100.0), -c * t, 0.0)
    return g - p * g.sum(-1, keepdims=True)


def dense_index_grads(q, k, w, G, seqs):
    dq, dk, dw = np.zeros_like(q), np.zeros_like(k), np.zeros_like(w)
    for qa, ql, ka, kl in seqs:
        if ql == 0 or kl == 0:
            continue
        gg = G[qa:qa + ql, :kl]
        _, a = index_logits(q[qa:qa + ql], k[ka:ka + kl], w[qa:qa + ql])
        dw[qa:qa + ql] = np.einsum("rn,rhn->rh", gg, np.maximum(a, 0))
        da = gg[:, None, :] * w[qa:qa + ql][..., None] * (a > 0)
        dq[qa:qa + ql] = np.einsum("rhn,nd->rhd", da, k[ka:ka + kl])
        dk[ka:ka + kl] += np.einsum("rhn,rhd->nd", da, q[qa:qa + ql])
    return dq, dk, dw


def sparse_index_grads(q, k, w, G, gidx, valid):
    G = np.where(valid, G, 0.0)
    _, a = index_logits(q, k[gidx], w)
    dw = np.einsum("rn,rhn->rh", G, np.maximum(a, 0))
    da = G[:, None, :] * w[..., None] * (a > 0)
    dq = np.einsum("rhn,rnd->rhd", da, k[gidx])
    dk = np.zeros_like(k)
    np.add.at(dk, gidx.reshape(-1), np.einsum("rhn,rhd->rnd", da, q).reshape(-1, k.shape[1]))
    return dq, dk, dw


def finite_diff(f, x, eps=1e-6, entries=None, rng=None):
    """Central differences of scalar f at (a sample of) the entries of array x (modified in place)."""
    flat = x.reshape(-1)
    idx = range(flat.size) if entries is None else (rng or np.random.default_rng(0)).choice(flat.size, entries, replace=False)
    out = {}
    for i in idx:
        old = flat[i]
        flat[i] = old + eps
        hi = f()
        flat[i] = old - eps
        lo = f()
        flat[i] = old
        out[int(i)] = (hi - lo) / (2 * eps)
    return out


# ---------------------------------------------------------------- test-input helpers (numpy only)
def random_cu(rng, lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def assert_close(actual, expected, rtol, atol, what=""):
    """Finite entries close, and non-finite entries identical (same inf sign, same positions)."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    fin = np.isfinite(expected)
    assert np.array_equal(np.isfinite(actual), fin), f"{what}: finite pattern differs"
    assert np.array_equal(actual[~fin], expected[~fin]), f"{what}: non-finite values differ"
    np.testing.assert_allclose(actual[fin], expected[fin], rtol=rtol, atol=atol, err_msg=what)
