"""Precision against speed of the attention-score recompute kernels, per fp32 promotion interval (H200 diagnostic).

The kernels sum q . kv (Dqk 576 / 512) on the tensor core; dsa_attn_score's PROMOTE_KBLOCKS sets how many k-blocks
of 16 products one wgmma accumulator sums before it is added into an fp32 register accumulator
(ops/common/head_sum_sm90.mma_block). For each interval given (0 = never), this compiles both kernels, reports each
accuracy case's error as a multiple of a float32 implementation's error (tests/gpu/test_dsa_*'s gate is 2x), and
times the bench shapes (dense 8K x 8K, 128 heads, Dqk 576, causal; sparse Sq 4K, Sk 8K, top-k 2048). With cuDNN
frontend unpacked, its dense recompute's error on the first case is reported too (same inputs, same float64 truth).

Run:  python bench/dsa_attn_precision.py [--promote 0 4 4lag 2 2lag 1] [--iters N]
"""
import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from dsa_ref import attn_scores, rel_rms, sparse_attn_scores, true_lse  # noqa: E402
from ops.dsa.attn_score import dense, sparse  # noqa: E402
from ops.dsa.attn_score import dense_sm90  # noqa: E402
from timing import device_time  # noqa: E402

DEV = "cuda"


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, device=DEV, generator=g) * scale).bfloat16()


def dense_cases():
    """(name, q, kv, lse, scale, kwargs) small enough for the float64 truth."""
    g = torch.Generator(device=DEV).manual_seed(1)
    out = []
    q, kv = rnd(g, 1, 300, 128, 576), rnd(g, 1, 300, 576)
    s = 576 ** -0.5
    out.append(("causal S300 H128 576", q, kv, true_lse(q, kv, s), s, {}))
    q, kv = rnd(g, 1, 255, 64, 576), rnd(g, 1, 255, 576, scale=8.0)
    out.append(("kv x8 S255 H64", q, kv, true_lse(q, kv, s), s, {}))
    q, kv = rnd(g, 1, 1025, 128, 576), rnd(g, 1, 1025, 576)
    out.append(("causal S1025 H128", q, kv, true_lse(q, kv, s), s, {}))
    q, kv = rnd(g, 1, 200, 64, 512), rnd(g, 1, 300, 512)
    lse = torch.randn(1, 64, 200, device=DEV, generator=g) * 2 + 5
    out.append(("random lse 512 scale .05", q, kv, lse, 0.05, {"causal": False}))
    return out


def run_dense(q, kv, lse, scale, kw):
    a = torch.full((q.shape[0], q.shape[1], kv.shape[1]), float("nan"), device=DEV)
    l1 = torch.full(q.shape[:2], float("nan"), device=DEV)
    dense.dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=scale, stream=torch.cuda.current_stream().cuda_stream,
                               **kw)
    return a, l1


def ratios(got, exact, floor):
    return tuple(rel_rms(x, e) / max(rel_rms(f, e), 1e-300) for x, e, f in zip(got, exact, floor))


def sparse_case():
    g = torch.Generator(device=DEV).manual_seed(2)
    q, kv = rnd(g, 1, 64, 128, 576), rnd(g, 1, 700, 576)
    idx = torch.randint(0, 700, (1, 64, 512), device=DEV, dtype=torch.int32, generator=g)
    lse = torch.randn(1, 128, 64, device=DEV, generator=g) + 12.0
    return q, kv, lse, 576 ** -0.5, idx


def run_sparse(q, kv, lse, scale, idx):
    s = torch.full(idx.shape, float("nan"), device=DEV)
    l1 = torch.full(idx.shape[:-1], float("nan"), device=DEV)
    sparse.sparse_attn_score_fwd(q, kv, lse, idx, s, l1, softmax_scale=scale,
                                 stream=torch.cuda.current_stream().cuda_stream)
    return s, l1


def timings(iters):
    g = torch.Generator(device=DEV).manual_seed(3)
    S, H, D = 8192, 128, 576
    q, kv = rnd(g, 1, S, H, D), rnd(g, 1, S, D)
    lse = torch.randn(1, H, S, device=DEV, generator=g) + 10.0
    a, l1 = torch.empty(1, S, S, device=DEV), torch.empty(1, S, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    t_d, _ = device_time(lambda: dense.dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=D ** -0.5, stream=st),
                         iters)
    Sq, K = 4096, 2048
    qs = q[:, :Sq].contiguous()
    idx = torch.randint(0, S, (1, Sq, K), device=DEV, dtype=torch.int32, generator=g)
    s, l1s = torch.empty(1, Sq, K, device=DEV), torch.empty(1, Sq, device=DEV)
    lse_s = lse[:, :, :Sq].contiguous()
    t_s, _ = device_time(lambda: sparse.sparse_attn_score_fwd(qs, kv, lse_s, idx, s, l1s, softmax_scale=D ** -0.5,
                                                              stream=st), iters)
    fl_d = 2.0 * H * D * (S * (S + 1) // 2)
    fl_s = 2.0 * Sq * K * H * D
    return t_d, fl_d / t_d / 1e12, t_s, fl_s / t_s / 1e12


def cudnn_ratio(case):
    try:
        import importlib
        dsa = importlib.import_module("cudnn.deepseek_sparse_attention")
    except Exception as e:  # noqa: BLE001
        return f"cuDNN frontend not available ({type(e).__name__})"
    name, q, kv, lse, scale, kw = case
    try:
        out = dsa.dense_attn_score_recompute_wrapper(q, kv.unsqueeze(2), lse.transpose(1, 2).contiguous(), scale,
                                                     ratio=1)
    except Exception as e:  # noqa: BLE001
        return f"cuDNN call failed: {type(e).__name__}: {e}"
    torch.cuda.synchronize()
    vals = list(out.values()) if isinstance(out, dict) else list(out)
    exact = attn_scores(q, kv, lse, scale, **kw)
    floor = attn_scores(q, kv, lse, scale, dtype=torch.float32, **kw)
    a = vals[0].reshape(exact[0].shape)
    return f"cuDNN frontend on '{name}': scores {rel_rms(a, exact[0]) / rel_rms(floor[0], exact[0]):.2f} x floor"


def main(a):
    cases = dense_cases()
    truth = [(attn_scores(q, kv, l, s, **kw), attn_scores(q, kv, l, s, dtype=torch.float32, **kw))
             for _, q, kv, l, s, kw in cases]
    sq = sparse_case()
    s_exact = sparse_attn_scores(*sq[:4], sq[4])
    s_floor = sparse_attn_scores(*sq[:4], sq[4], dtype=torch.float32)
    names = [c[0] for c in cases] + ["sparse 64 rows k512"]
    print("# error / float32 floor as scores/l1norm per case (gate 2x); cases: " + "; ".join(
        f"case{i} = {n}" for i, n in enumerate(names)))
    print(f"{'promote':>7s}  " + "  ".join(f"{'case' + str(i):>11s}" for i in range(len(names)))
          + f"  {'dense ms':>8s} {'TF':>5s} {'sparse ms':>9s} {'TF':>5s}", flush=True)
    for p in a.promote:
        dense_sm90.AttnScoreEpilogue.PROMOTE = int(p.rstrip("lag"))
        dense_sm90.AttnScoreEpilogue.PROMOTE_LAG = p.endswith("lag")
        dense._CACHE.clear()
        sparse._CACHE.clear()
        errs = []
        for (name, q, kv, l, s, kw), (ex, fl) in zip(cases, truth):
            errs.append(ratios(run_dense(q, kv, l, s, kw), ex, fl))
        errs.append(ratios(run_sparse(*sq), s_exact, s_floor))
        torch.cuda.synchronize()
        td, tfd, ts, tfs = timings(a.iters)
        print(f"{p:>7s}  " + "  ".join(f"{e[0]:5.2f}/{e[1]:5.2f}" for e in errs)
              + f"  {td * 1e3:8.3f} {tfd:5.0f} {ts * 1e3:9.3f} {tfs:5.0f}", flush=True)
    print("# " + cudnn_ratio(cases[0]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--promote", nargs="+", default=["0", "4", "4lag", "2", "2lag", "1"],
                    help="k-blocks per promotion; a 'lag' suffix pipelines the groups (a third accumulator)")
    ap.add_argument("--iters", type=int, default=10)
    main(ap.parse_args())
