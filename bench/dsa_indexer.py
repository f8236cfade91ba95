"""DSA indexer benchmark on the H200: ours against NVIDIA cuDNN frontend's sm90 DSA ops and a torch eager
reference, all in the same run.

Rows (bf16 index_q/index_k, fp32 weights, Di = 128, causal, ratio 1):
  indexer fwd      B1 Sq = Sk = 8K, 64 index heads: scores only           (cuDNN indexer_forward_wrapper)
  idx recompute    the same with the row lse (dense indexer recompute)   (cuDNN dense_indexer_score_recompute_wrapper)
  indexer + top-k  B1 32K x 32K, 32 heads, k = 2048: scores then top-k   (cuDNN indexer_forward_wrapper +
                   indexer_top_k_wrapper; torch eager: head loop + torch.topk)
  top-k            32K rows x 32K fp32 scores (our indexer's output), k = 2048: both sides with the causal row
                   lengths (cuDNN's call takes them), then both at full width, then both on randn rows
  attn recompute   B1 Sq = Sk = 8K, 128 heads, Dqk 576: scores + l1norm  (cuDNN dense_attn_score_recompute_wrapper)
  sparse idx rec.  B1 Sq 4K, Sk 8K, top-k 2048, 64 heads, Di 128: scores + lse (cuDNN
                   sparse_indexer_score_recompute_wrapper); FLOPs 2 * Sq * topk * H * D
  sparse attn rec. the same slots, 128 heads, Dqk 576: scores + l1norm   (cuDNN sparse_attn_score_recompute_wrapper)
  sparse idx bwd   the same slots, 64 index heads, Di 128: d_index_q, d_index_k, d_weights (cuDNN
                   indexer_backward_wrapper: predict probabilities and target in, its own layout); FLOPs 3 x 2 x Sq x
                   topk x H x D (the recompute, dq and dk products)
  dense idx bwd    B1 Sq = Sk = 8K (and 4K) causal, 64 index heads, Di 128: the same gradients over the visible keys (cuDNN:
                   indexer_backward_wrapper on the dense slot table, slot j = key j, -1 past the causal limit);
                   FLOPs 3 x 2 x (visible pairs) x H x D
Both backward rows also time ours in deterministic mode (deterministic=True, 1 GiB staging chunks: d_index_k summed
per key in a fixed order; the line "ours det" under the row).
FLOPs: 2 * H * D * (visible (query, key) pairs), about half of Sq * Sk when causal (the count cuDNN's 470 TFLOP/s
at 1.17 ms uses). Top-k: GB/s of the score bytes read once.
Timing: bench/timing.device_time (median device time of one call, CUDA events, host queued ahead).
Peers: cuDNN frontend 1.32.0 packed by ../shared/device/pack-cudnn-fe.sh (source .device/extra/unpack.sh); a
peer that is missing or fails prints its error in the notes and leaves its column empty.

Run:  python bench/dsa_indexer.py [--quick] [--iters N] [--csv PATH] [--rows SUBSTRING ...]
"""
import argparse
import csv
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.attn_score.dense import dense_attn_score_fwd  # noqa: E402
from ops.dsa.attn_score.sparse import sparse_attn_score_fwd  # noqa: E402
from ops.dsa.indexer.fwd import indexer_fwd  # noqa: E402
from ops.dsa.indexer.sparse import sparse_indexer_fwd  # noqa: E402
from timing import device_time  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
from workspace import TorchWorkspace  # noqa: E402

DEV = "cuda"


def topk_seam():
    try:
        from ops.dsa.topk.fwd import topk_fwd
        return topk_fwd
    except ImportError:
        return None


def cudnn_dsa():
    try:
        import importlib
        return importlib.import_module("cudnn.deepseek_sparse_attention")
    except Exception as e:  # noqa: BLE001
        print(f"# cuDNN frontend not available: {type(e).__name__}: {e}")
        return None


def visible_pairs(sq, sk):
    return sum(min(t + 1, sk) for t in range(sq)) if sq <= 65536 else sq * sk // 2


def eager_scores(q, k, w, chunk=4096):
    """torch eager: per head bf16 matmul, relu, fp32 weighted sum; causal -inf; chunked over query rows."""
    B, S, H, _ = q.shape
    Sk = k.shape[1]
    out = torch.empty(B, S, Sk, device=q.device)
    j = torch.arange(Sk, device=q.device)
    for b in range(B):
        for r0 in range(0, S, chunk):
            r1 = min(S, r0 + chunk)
            acc = torch.zeros(r1 - r0, Sk, device=q.device)
            for h in range(H):
                acc += w[b, r0:r1, h, None] * torch.relu(q[b, r0:r1, h] @ k[b].T).float()
            t = torch.arange(r0, r1, device=q.device)
            out[b, r0:r1] = acc.masked_fill(j[None, :] > t[:, None], float("-inf"))
    return out


def inputs(S, H, D=128, B=1):
    g = torch.Generator(device=DEV).manual_seed(S + H)
    q = torch.randn(B, S, H, D, device=DEV, generator=g).bfloat16()
    k = torch.randn(B, S, D, device=DEV, generator=g).bfloat16()
    w = torch.randn(B, S, H, device=DEV, generator=g) * H ** -0.5
    return q, k, w


def time_or_note(fn, iters, notes, name):
    try:
        t, hb = device_time(fn, iters)
        if hb:
            notes.append(f"{name}: host-bound")
        return t
    except Exception as e:  # noqa: BLE001
        notes.append(f"{name}: {type(e).__name__}: {str(e)[:160]}")
        return None


def bench_indexer(S, H, iters, dsa, with_lse, notes):
    q, k, w = inputs(S, H)
    s = torch.empty(1, S, S, device=DEV)
    lse = torch.empty(1, S, device=DEV) if with_lse else None
    st = torch.cuda.current_stream().cuda_stream
    res = {"ours": time_or_note(lambda: indexer_fwd(q, k, w, s, lse, causal=True, stream=st), iters, notes, "ours")}
    if dsa is not None:
        k4 = k.unsqueeze(2)
        if with_lse:   # (its sm90 recompute takes bf16 weights only)
            wb = w.bfloat16()
            fn = lambda: dsa.dense_indexer_score_recompute_wrapper(q, k4, wb, ratio=1)  # noqa: E731
        else:
            fn = lambda: dsa.indexer_forward_wrapper(q, k4, w, ratio=1)  # noqa: E731
        res["cudnn"] = time_or_note(fn, iters, notes, "cudnn")
    res["eager"] = time_or_note(lambda: eager_scores(q, k, w), max(2, iters // 5), notes, "eager")
    return res, 2.0 * H * 128 * visible_pairs(S, S)


def eager_attn_scores(q, kv, lse, scale, chunk=2048):
    """torch eager: per head bf16 matmul, fp32 clamped exp, head sum; causal 0; chunked over query rows."""
    B, S, H, _ = q.shape
    j = torch.arange(S, device=q.device)
    out = torch.empty(B, S, S, device=q.device)
    for r0 in range(0, S, chunk):
        r1 = min(S, r0 + chunk)
        acc = torch.zeros(r1 - r0, S, device=q.device)
        for h in range(H):
            acc += torch.exp(torch.clamp(scale * (q[0, r0:r1, h] @ kv[0].T).float() - lse[0, h, r0:r1, None],
                                         max=83.17))
        t = torch.arange(r0, r1, device=q.device)
        out[0, r0:r1] = acc.masked_fill(j[None, :] > t[:, None], 0.0)
    return out, out.sum(-1)


def bench_attn_score(S, H, D, iters, dsa, notes):
    g = torch.Generator(device=DEV).manual_seed(S + H + D)
    q = torch.randn(1, S, H, D, device=DEV, generator=g).bfloat16()
    kv = torch.randn(1, S, D, device=DEV, generator=g).bfloat16()
    lse = torch.randn(1, H, S, device=DEV, generator=g) + 10.0
    scale = D ** -0.5
    a = torch.empty(1, S, S, device=DEV)
    l1 = torch.empty(1, S, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    res = {"ours": time_or_note(lambda: dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=scale, stream=st),
                                iters, notes, "ours")}
    if dsa is not None:
        kv4 = kv.unsqueeze(2)
        lse_bsh = lse.transpose(1, 2).contiguous()     # its lse layout is [B, Sq, H]
        res["cudnn"] = time_or_note(lambda: dsa.dense_attn_score_recompute_wrapper(q, kv4, lse_bsh, scale, ratio=1),
                                    iters, notes, "cudnn")
    res["eager"] = time_or_note(lambda: eager_attn_scores(q, kv, lse, scale), 2, notes, "eager")
    return res, 2.0 * H * D * visible_pairs(S, S)


def bench_sparse(kind, Sq, Sk, K, H, D, iters, dsa, notes):
    g = torch.Generator(device=DEV).manual_seed(Sq + K + H)
    q = torch.randn(1, Sq, H, D, device=DEV, generator=g).bfloat16()
    k = torch.randn(1, Sk, D, device=DEV, generator=g).bfloat16()
    idx = torch.randint(0, Sk, (1, Sq, K), device=DEV, dtype=torch.int32, generator=g)
    s = torch.empty(1, Sq, K, device=DEV)
    stat = torch.empty(1, Sq, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    if kind == "indexer":        # (cuDNN's sparse recomputes take the 3-D MQA kv [B, Sk, D])
        w = torch.randn(1, Sq, H, device=DEV, generator=g) * H ** -0.5
        res = {"ours": time_or_note(lambda: sparse_indexer_fwd(q, k, w, idx, s, stat, stream=st), iters, notes,
                                    "ours")}
        if dsa is not None:
            wb = w.bfloat16()
            res["cudnn"] = time_or_note(lambda: dsa.sparse_indexer_score_recompute_wrapper(q, k, wb, idx), iters,
                                        notes, "cudnn")
    else:
        lse = torch.randn(1, H, Sq, device=DEV, generator=g) + 10.0
        scale = D ** -0.5
        res = {"ours": time_or_note(lambda: sparse_attn_score_fwd(q, k, lse, idx, s, stat, softmax_scale=scale,
                                                                  stream=st), iters, notes, "ours")}
        if dsa is not None:
            lse_bsh = lse.transpose(1, 2).contiguous()
            res["cudnn"] = time_or_note(lambda: dsa.sparse_attn_score_recompute_wrapper(q, k, lse_bsh, idx, scale),
                                        iters, notes, "cudnn")
    return res, 2.0 * Sq * K * H * D


def bench_sparse_bwd(Sq, Sk, K, H, D, iters, dsa, notes):
    from ops.dsa.indexer.sparse_bwd import sparse_indexer_bwd
    g = torch.Generator(device=DEV).manual_seed(Sq + K + H + 1)
    q = torch.randn(1, Sq, H, D, device=DEV, generator=g).bfloat16()
    k = torch.randn(1, Sk, D, device=DEV, generator=g).bfloat16()
    w = torch.randn(1, Sq, H, device=DEV, generator=g) * H ** -0.5
    idx = torch.randint(0, Sk, (1, Sq, K), device=DEV, dtype=torch.int32, generator=g)
    s = torch.empty(1, Sq, K, device=DEV)
    lse = torch.empty(1, Sq, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    sparse_indexer_fwd(q, k, w, idx, s, lse, stream=st)
    a = torch.rand(1, Sq, K, device=DEV, generator=g)
    l1 = a.sum(-1)
    c = torch.tensor([1.0 / Sq], device=DEV)
    dq, dk, dw = torch.empty_like(q), torch.empty(k.shape, device=DEV), torch.empty(w.shape, device=DEV)
    res = {"ours": time_or_note(lambda: sparse_indexer_bwd(q, k, w, idx, s, lse, a, l1, c, dq, dk, dw, stream=st),
                                iters, notes, "ours"),
           "ours det": time_or_note(lambda: sparse_indexer_bwd(q, k, w, idx, s, lse, a, l1, c, dq, dk, dw, stream=st,
                                                               deterministic=True,
                                                               workspace=TorchWorkspace(poison=False)),
                                    iters, notes, "ours det")}
    if dsa is not None:
        p = torch.exp(s - lse[..., None])
        t = a / l1[..., None]
        wb = w.bfloat16()
        gl = torch.ones(1, device=DEV)
        res["cudnn"] = time_or_note(lambda: dsa.indexer_backward_wrapper(q, wb, k, t.clone(), p, idx, gl), iters,
                                    notes, "cudnn")
    return res, 3 * 2.0 * Sq * K * H * D


def bench_dense_bwd(S, H, iters, dsa, notes):
    """Dense (causal) indexer backward from the dense recompute's scores and lse; cuDNN: its indexer backward on the
    dense slot table (slot j = key j, -1 past the causal limit; predict probabilities and target as [S, S])."""
    from ops.dsa.indexer.dense_bwd import dense_indexer_bwd
    q, k, w = inputs(S, H)
    st = torch.cuda.current_stream().cuda_stream
    s = torch.empty(1, S, S, device=DEV)
    lse = torch.empty(1, S, device=DEV)
    indexer_fwd(q, k, w, s, lse, causal=True, stream=st)
    g = torch.Generator(device=DEV).manual_seed(S + H)
    a = torch.rand(1, S, S, device=DEV, generator=g) * torch.isfinite(s)
    l1 = a.sum(-1)
    c = torch.tensor([1.0 / S], device=DEV)
    dq, dk, dw = torch.empty_like(q), torch.empty(k.shape, device=DEV), torch.empty(w.shape, device=DEV)
    res = {"ours": time_or_note(lambda: dense_indexer_bwd(q, k, w, s, lse, a, l1, c, dq, dk, dw, causal=True,
                                                          stream=st), iters, notes, "ours"),
           "ours det": time_or_note(lambda: dense_indexer_bwd(q, k, w, s, lse, a, l1, c, dq, dk, dw, causal=True,
                                                              stream=st, deterministic=True,
                                                              workspace=TorchWorkspace(poison=False)),
                                    iters, notes, "ours det")}
    if dsa is not None:
        j = torch.arange(S, device=DEV, dtype=torch.int32)
        idx = torch.where(j[None, :] <= j[:, None], j[None, :], torch.full_like(j[None, :], -1))[None]
        p = torch.exp(s - lse[..., None])
        t = a / l1[..., None]
        gl = torch.ones(1, device=DEV)
        res["cudnn"] = time_or_note(lambda: dsa.indexer_backward_wrapper(q, w.bfloat16(), k, t.clone(), p, idx, gl),
                                    iters, notes, "cudnn")
    return res, 3 * 2.0 * S * (S + 1) / 2 * H * q.shape[-1]


def bench_indexer_topk(S, H, K, iters, dsa, topk_fwd, notes):
    """Indexer + top-k, and the top-k alone, each side given the same row lengths. cuDNN's top-k takes lengths (the
    causal scores: row r's r + 1 columns, about half of the S x S); so does ours (indexer_topk(lengths=...)): both
    are timed with them (the like-for-like row), then both with every row at full width (lengths = S: the scores past
    the diagonal read as -inf), then both on full rows of randn (no -inf anywhere). Before 2026-12-06 ours was timed
    without lengths against cuDNN with them (it read twice the bytes)."""
    q, k, w = inputs(S, H)
    s = torch.empty(1, S, S, device=DEV)
    idx = torch.empty(1, S, K, dtype=torch.int32, device=DEV)
    lens = torch.arange(1, S + 1, dtype=torch.int32, device=DEV)
    full = torch.full((S,), S, dtype=torch.int32, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    res = {}
    if topk_fwd is not None:
        def ours():
            indexer_fwd(q, k, w, s, None, causal=True, stream=st)
            topk_fwd(s, idx, lengths=lens.view(1, S), stream=st)
        res["ours"] = time_or_note(ours, iters, notes, "ours")
        res["ours no lengths"] = time_or_note(lambda: (indexer_fwd(q, k, w, s, None, causal=True, stream=st),
                                                       topk_fwd(s, idx, stream=st)), iters, notes, "ours no lengths")
        indexer_fwd(q, k, w, s, None, causal=True, stream=st)
        topk_fwd(s, idx, lengths=lens.view(1, S), stream=st)
        with_len = idx.clone()
        topk_fwd(s, idx, stream=st)
        if not torch.equal(with_len, idx):
            notes.append("ours: the causal lengths changed the selection (they must not: past them scores are -inf)")
        for tag, ln in (("", lens), (" full", full)):
            res["ours_topk" + tag] = time_or_note(lambda ln=ln: topk_fwd(s, idx, lengths=ln.view(1, S), stream=st),
                                                  iters, notes, "ours top-k" + tag)
            # column order (indexer_topk(sorted=False)): cuDNN's top-k does not order its indices either
            res["ours_topk_col" + tag] = time_or_note(
                lambda ln=ln: topk_fwd(s, idx, lengths=ln.view(1, S), order="column", stream=st), iters, notes,
                "ours top-k column order" + tag)
    else:
        notes.append("ours: no top-k kernel")
    if dsa is not None:
        k4 = k.unsqueeze(2)

        def cudnn_both():
            sc = dsa.indexer_forward_wrapper(q, k4, w, ratio=1)["scores"]
            dsa.indexer_top_k_wrapper(sc.view(S, S), lens, K, return_val=False)
        res["cudnn"] = time_or_note(cudnn_both, iters, notes, "cudnn")
        indexer_fwd(q, k, w, s, None, causal=True, stream=st)
        for tag, ln in (("", lens), (" full", full)):
            res["cudnn_topk" + tag] = time_or_note(
                lambda ln=ln: dsa.indexer_top_k_wrapper(s.view(S, S), ln, K, return_val=False), iters, notes,
                "cudnn top-k" + tag)
    res["eager"] = time_or_note(lambda: torch.topk(eager_scores(q, k, w), K, dim=-1), 2, notes, "eager")
    res["eager_topk"] = time_or_note(lambda: torch.topk(s, K, dim=-1), max(2, iters // 3), notes, "eager top-k")
    s.normal_()                                 # randn rows, every column finite
    if topk_fwd is not None:
        res["ours_topk randn"] = time_or_note(lambda: topk_fwd(s, idx, stream=st), iters, notes, "ours top-k randn")
        res["ours_topk_col randn"] = time_or_note(lambda: topk_fwd(s, idx, order="column", stream=st), iters, notes,
                                                  "ours top-k column order randn")
    if dsa is not None:
        res["cudnn_topk randn"] = time_or_note(
            lambda: dsa.indexer_top_k_wrapper(s.view(S, S), full, K, return_val=False), iters, notes,
            "cudnn top-k randn")
    return res, 2.0 * H * 128 * visible_pairs(S, S)


TOPK_ROWS = (("", "causal, both with lengths", True), (" full", "causal, full rows", False),
             (" randn", "randn, full rows", False))


def fmt(x, w=8, p=2):
    return f"{x:{w}.{p}f}" if x is not None else " " * (w - 1) + "-"


def print_row(name, res, flops, notes, out):
    o, c, e = res.get("ours"), res.get("cudnn"), res.get("eager")
    tf = lambda t: None if t is None else flops / t / 1e12  # noqa: E731
    ms = lambda t: None if t is None else t * 1e3  # noqa: E731
    ratio = lambda p: None if (p is None or o is None) else p / o  # noqa: E731
    print(f"{name:30s} {fmt(ms(o))} {fmt(ms(c))} {fmt(ms(e))} {fmt(tf(o), p=0)} {fmt(tf(c), p=0)} "
          f"{fmt(ratio(c))} {fmt(ratio(e))}", flush=True)
    if "ours_topk" in res or "cudnn_topk" in res:
        on = res.get("ours no lengths")
        if on is not None:
            print(f"{'  ours, top-k without lengths':30s} {fmt(ms(on))} {'':8s} {'':8s} {fmt(tf(on), p=0)}", flush=True)
        for tag, label, causal in TOPK_ROWS:
            # GB/s of the score bytes inside the rows' lengths (causal: about half of 32K x 32K)
            nbytes = 4 * (visible_pairs(32768, 32768) if causal else 32768 * 32768)
            gbs = lambda t, n=nbytes: None if t is None else n / t / 1e9  # noqa: E731
            ct = res.get("cudnn_topk" + tag)
            for okey, what in (("ours_topk", "score order"), ("ours_topk_col", "column order")):
                ot = res.get(okey + tag)
                et = res.get("eager_topk") if (tag == "" and okey == "ours_topk") else None
                print(f"  top-k alone, {label}, {what}:")
                print(f"{'    (GB/s in TF col)':30s} {fmt(ms(ot))} {fmt(ms(ct))} {fmt(ms(et))} "
                      f"{fmt(gbs(ot), p=0)} {fmt(gbs(ct), p=0)} {fmt(None if ot is None or ct is None else ct / ot)} "
                      f"{fmt(None if ot is None or et is None else et / ot)}", flush=True)
    if "ours det" in res:
        d = res["ours det"]
        print(f"{'  ours det (deterministic)':30s} {fmt(ms(d))} {'':8s} {'':8s} {fmt(tf(d), p=0)} {'':8s} "
              f"{fmt(None if c is None or d is None else c / d)}   time / ours {fmt(None if d is None else ratio(d))}",
              flush=True)
    for n in notes:
        print(f"    note: {n}", flush=True)
    for impl, t in res.items():
        out.append({"case": name, "impl": impl, "ms": None if t is None else round(t * 1e3, 4),
                    "tflops": None if t is None or "topk" in impl else round(flops / t / 1e12, 1)})


def cases(a, dsa, topk_fwd):
    """(name, thunk) per benchmark row; the thunk returns (res, flops) and appends to its notes."""
    out = []
    for name, with_lse in (("indexer fwd 8K H64", False), ("idx recompute 8K H64", True)):
        out.append((name, lambda n, w=with_lse: bench_indexer(8192, 64, a.iters, dsa, w, n)))
    out.append(("attn recompute 8K H128 576", lambda n: bench_attn_score(8192, 128, 576, a.iters, dsa, n)))
    for kind, H, D, name in (("indexer", 64, 128, "sparse idx rec. 4K/8K k2048 H64"),
                             ("attn", 128, 576, "sparse attn rec. 4K/8K k2048 H128")):
        out.append((name, lambda n, k=kind, h=H, d=D: bench_sparse(k, 4096, 8192, 2048, h, d, a.iters, dsa, n)))
    out.append(("sparse idx bwd 4K/8K k2048 H64", lambda n: bench_sparse_bwd(4096, 8192, 2048, 64, 128, a.iters,
                                                                            dsa, n)))
    out.append(("dense idx bwd 8K H64", lambda n: bench_dense_bwd(8192, 64, a.iters, dsa, n)))
    # cuDNN's indexer backward did not launch on the 8192-slot table (2026-12-03: 234,496 bytes of shared memory
    # asked, 232,448 allowed); at 4K its 4096-slot table may, for a same-run ratio
    out.append(("dense idx bwd 4K H64", lambda n: bench_dense_bwd(4096, 64, a.iters, dsa, n)))
    if not a.quick:
        out.append(("indexer+top-k 32K H32 k2048",
                    lambda n: bench_indexer_topk(32768, 32, 2048, a.iters, dsa, topk_fwd, n)))
    if a.rows:
        out = [(n, f) for n, f in out if any(r in n for r in a.rows)]
    return out


def main(a):
    dsa = cudnn_dsa()
    topk_fwd = topk_seam()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# DSA indexer bench, {torch.cuda.get_device_name()}, {when}")
    print("\n# table (ms; TFLOP/s of the indexer FLOPs; ratio = peer time / ours); each row printed when measured")
    print(f"{'case':30s} {'ours ms':>8s} {'cuDNN ms':>8s} {'eager ms':>8s} {'ours TF':>8s} {'cuDNN TF':>8s} "
          f"{'x cuDNN':>8s} {'x eager':>8s}", flush=True)
    out = []
    for name, thunk in cases(a, dsa, topk_fwd):
        notes = []
        res, flops = thunk(notes)
        print_row(name, res, flops, notes, out)
        torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=("case", "impl", "ms", "tflops"))
            wr.writeheader()
            wr.writerows(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="8K rows only")
    p.add_argument("--csv", default=None)
    p.add_argument("--rows", nargs="*", default=None, help="only the rows whose name contains one of these")
    main(p.parse_args())
