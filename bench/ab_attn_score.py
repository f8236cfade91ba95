"""Same-run A/B of the sparse attention-score recompute (ops/dsa/attn_score/sparse_sm90.py on
ops/common/sparse_head_sum_sm90.py): the default kernel (HEAD_SPLIT since 2026-12-05: both consumers on every block,
half of the heads each) against variants with class knobs set, by default the lockstep schedule (each consumer its
own 64-slot blocks over all heads; the indexer's core).

With --dense, also the dense recompute's promotion (ops/dsa/attn_score/dense_sm90.py on ops/common/head_sum_sm90.py, PROMOTE_LAG:
the groups pipelined with a third accumulator, which compiles without spills there) against its default, at the
dense bench row: Sq = Sk = 8K causal, 128 heads, Dqk 576 (TFLOP/s over the visible half).

Shape: the bench row of bench/dsa_indexer.py ("sparse attn rec."): B 1, Sq 4K, Skv 8K, top-k 2048 (5 % of the indices
invalid), Dqk 576, heads 128 and 64. Every row runs through the seam on the same inputs; its scores and l1norm are
compared with the default's (relative to the largest magnitude: a schedule that adds the head sums in another order
differs by rounding only). TFLOP/s = 2 Sq K H Dqk / time. cuDNN frontend's row is
bench/dsa_indexer.py --rows "sparse attn rec." in the same call.

Rows: the default kernel, then one row per --knobs spec (class attributes of SparseAttnScoreSm90 set for that row:
"HEAD_SPLIT=0" (the lockstep schedule, the default list), "PROMOTE_LAG=1", ...), each
compared with the default's outputs.

Run:  python bench/ab_attn_score.py [--iters N] [--dense] [--knobs HEAD_SPLIT=0 ...]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.attn_score import dense as dense_seam, sparse as seam  # noqa: E402
from ops.dsa.attn_score.dense_sm90 import DenseAttnScoreSm90 as DenseKernel  # noqa: E402
from ops.dsa.attn_score.sparse_sm90 import SparseAttnScoreSm90 as Kernel  # noqa: E402
from timing import device_time  # noqa: E402


def case(H, dev="cuda"):
    Sq, Sk, K, D = 4096, 8192, 2048, 576
    g = torch.Generator(device=dev).manual_seed(5)
    q = torch.randn(1, Sq, H, D, device=dev, generator=g).bfloat16()
    kv = torch.randn(1, Sk, D, device=dev, generator=g).bfloat16()
    lse = torch.randn(1, H, Sq, device=dev, generator=g) + 8.0
    idx = torch.randint(0, Sk, (1, Sq, K), device=dev, dtype=torch.int32, generator=g)
    bad = torch.rand(1, Sq, K, device=dev, generator=g) < 0.05
    idx = torch.where(bad, torch.full_like(idx, -1), idx)
    return q, kv, lse, idx, 2.0 * Sq * K * H * D


def rel_diff(x, ref):
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def dense_rows(a, st):
    """The dense recompute with PROMOTE_LAG off (default) and on, same inputs; outputs compared."""
    S, H, D = 8192, 128, 576
    g = torch.Generator(device="cuda").manual_seed(6)
    q = torch.randn(1, S, H, D, device="cuda", generator=g).bfloat16()
    kv = torch.randn(1, S, D, device="cuda", generator=g).bfloat16()
    lse = torch.randn(1, H, S, device="cuda", generator=g) + 8.0
    flops = 2.0 * S * S * H * D / 2
    ref = None
    for lag in (False, True):
        DenseKernel.PROMOTE_LAG = lag
        dense_seam._CACHE.clear()
        s = torch.full((1, S, S), float("nan"), device="cuda")
        l1 = torch.full((1, S), float("nan"), device="cuda")
        t, _ = device_time(lambda: dense_seam.dense_attn_score_fwd(q, kv, lse, s, l1, softmax_scale=D ** -0.5,
                                                                   causal=True, stream=st), a.iters)
        diff = "-"
        if ref is None:
            ref = (s.clone(), l1.clone())
        else:
            diff = f"{rel_diff(s, ref[0]):.1e} / {rel_diff(l1, ref[1]):.1e}"
        name = f"dense 8K causal H{H} {'PROMOTE_LAG' if lag else 'default'}"
        print(f"{name:34s} {t * 1e3:8.3f} {flops / t / 1e12:8.1f}  {diff}", flush=True)
        del s, l1
    DenseKernel.PROMOTE_LAG = False
    dense_seam._CACHE.clear()


def knob_sets(specs):
    """[(name, {attr: int})]: the default kernel, then one row per spec "NAME=INT[,NAME=INT]"."""
    return [("default", {})] + [(sp, {k: int(v) for k, v in (kv.split("=") for kv in sp.split(","))})
                                for sp in specs]


def main(a):
    st = torch.cuda.current_stream().cuda_stream
    print(f"# sparse attention-score recompute, knob A/B, {torch.cuda.get_device_name()}")
    print(f"{'row':34s} {'ms':>8s} {'TFLOP/s':>8s}  rel diff scores / l1norm vs default")
    saved = {k: getattr(Kernel, k) for _, kn in knob_sets(a.knobs) for k in kn}
    for H in (128, 64):
        q, kv, lse, idx, flops = case(H)
        ref = None
        for name, kn in knob_sets(a.knobs):
            for k, v in saved.items():
                setattr(Kernel, k, kn.get(k, v))
            seam._CACHE.clear()
            s = torch.full(idx.shape, float("nan"), device="cuda")
            l1 = torch.full(idx.shape[:-1], float("nan"), device="cuda")
            t, _ = device_time(lambda: seam.sparse_attn_score_fwd(q, kv, lse, idx, s, l1, softmax_scale=576 ** -0.5,
                                                                  stream=st), a.iters)
            diff = "-"
            if ref is None:
                ref = (s.clone(), l1.clone())
            else:
                ds, dl = rel_diff(s, ref[0]), rel_diff(l1, ref[1])
                diff = f"{ds:.1e} / {dl:.1e}" + ("  NaN!" if bool(torch.isnan(s).any() or torch.isnan(l1).any())
                                                  else "")
            print(f"{f'H{H} {name}':34s} {t * 1e3:8.3f} {flops / t / 1e12:8.1f}  {diff}", flush=True)
    for k, v in saved.items():
        setattr(Kernel, k, v)
    seam._CACHE.clear()
    if a.dense:
        dense_rows(a, st)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--dense", action="store_true", help="also the dense recompute's PROMOTE_LAG A/B")
    p.add_argument("--knobs", nargs="*", default=["HEAD_SPLIT=0"],
                   help='rows besides the default kernel: class knobs "NAME=INT[,NAME=INT]" (default: the lockstep '
                        'schedule, HEAD_SPLIT=0)')
    main(p.parse_args())
