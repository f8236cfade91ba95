"""Launch-shape sweep of the sparse indexer score recompute (ops/dsa/indexer/sparse_sm90.py) on the H200.

Each variant sets the kernel class's STAGES (ring buffers of one 64-slot block of key rows), MIN_BLOCKS (CTAs an SM:
the launch bound caps registers at 64 K / (384 MIN_BLOCKS)), REGS (setmaxnreg of producer / consumers) and LAG (chunks,
here whole blocks, of cp.async a producer thread keeps in flight; below STAGES: sparse_head_sum_sm90.lag()) and
IDX_AHEAD (blocks ahead the producer loads its pieces' idx) and LEAN_GATHER (the producer's copies by addresses formed
once: sparse_head_sum_sm90.produce_block's lean copies), is compiled, checked bit for bit against the first variant (same wgmmas, same epilogue order: the results must be
identical; 5 % of the indices invalid), and timed at the bench row's shape: B 1, Sq 4K, Sk 8K, top-k 2048, 64 heads,
Di 128, fp32 weights; cuDNN frontend's sparse_indexer_score_recompute_wrapper in the same run when it is unpacked.

--hints: the default launch shape with the gather's L2 hints on trial instead (gather_sm90.GatherHints:
GATHER_PREFETCH 0 / 1 / 2 / 3).

--ncu: one launch of the default kernel and one of cuDNN frontend's between cudaProfilerStart / Stop, nothing timed
(tests/gpu/profile_sparse_idx_rec.sh runs it under ncu).

Run:  python bench/sparse_score_shapes.py [--iters N] [--hints | --ncu]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.indexer import sparse as seam  # noqa: E402
from ops.dsa.indexer.sparse_sm90 import SparseIndexerScoreSm90 as Kernel  # noqa: E402
from timing import cudnn_dsa, device_time, profile_launches  # noqa: E402

VARIANTS = tuple(dict(STAGES=st, MIN_BLOCKS=mb, REGS=r, LAG=lag, IDX_AHEAD=ia, LEAN_GATHER=lean)
                 for st, mb, r, lag, ia, lean in (
                     (4, 2, (48, 96), 3, 1, True), (4, 2, (40, 96), 3, 1, True), (4, 2, (40, 96), 3, 2, False),
                     (4, 2, (64, 88), 3, 1, True), (6, 2, (48, 96), 3, 1, True), (6, 2, (48, 96), 4, 1, True),
                     (6, 2, (48, 96), 5, 1, True)))
HINTS = tuple(dict(GATHER_PREFETCH=v) for v in (0, 1, 2, 3))


def main(a):
    dev = "cuda"
    Sq, Sk, K, H, D = 4096, 8192, 2048, 64, 128
    g = torch.Generator(device=dev).manual_seed(7)
    q = torch.randn(1, Sq, H, D, device=dev, generator=g).bfloat16()
    k = torch.randn(1, Sk, D, device=dev, generator=g).bfloat16()
    w = torch.randn(1, Sq, H, device=dev, generator=g) * H ** -0.5
    idx = torch.randint(0, Sk, (1, Sq, K), device=dev, dtype=torch.int32, generator=g)
    bad = torch.rand(1, Sq, K, device=dev, generator=g) < 0.05
    idx_bad = torch.where(bad, torch.where(torch.rand(1, Sq, K, device=dev, generator=g) < 0.5, -1, Sk + 3),
                          idx).int()
    st = torch.cuda.current_stream().cuda_stream
    flops = 2.0 * Sq * K * H * D
    if a.ncu:
        return profile_once(q, k, w, idx, st)
    variants = HINTS if a.hints else VARIANTS
    default = {n: getattr(Kernel, n) for v in variants for n in v}
    print(f"# sparse indexer recompute {'gather hints' if a.hints else 'launch shapes'}, "
          f"{torch.cuda.get_device_name()}; default {default}")
    print(f"{'variant':>44s} {'ms':>8s} {'TFLOP/s':>8s} {'same bits':>9s}", flush=True)
    ref = None
    for v in variants:
        for n in default:
            setattr(Kernel, n, v.get(n, default[n]))
        seam._CACHE.clear()
        s = torch.full((1, Sq, K), float("nan"), device=dev)
        lse = torch.full((1, Sq), float("nan"), device=dev)
        name = " ".join(f"{n}={x}" for n, x in v.items())
        try:
            seam.sparse_indexer_fwd(q, k, w, idx_bad, s, lse, stream=st)
            torch.cuda.synchronize()
            same = "-"
            if ref is None:
                ref = (s.clone(), lse.clone())
            else:
                same = str(bool(torch.equal(s, ref[0]) and torch.equal(lse, ref[1])))
            t, _ = device_time(lambda: seam.sparse_indexer_fwd(q, k, w, idx, s, lse, stream=st), a.iters)
            print(f"{name:>44s} {t * 1e3:8.3f} {flops / t / 1e12:8.0f} {same:>9s}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:>44s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    for n, x in default.items():
        setattr(Kernel, n, x)
    seam._CACHE.clear()
    try:
        import importlib
        dsa = importlib.import_module("cudnn.deepseek_sparse_attention")
        wb = w.bfloat16()
        t, _ = device_time(lambda: dsa.sparse_indexer_score_recompute_wrapper(q, k, wb, idx), a.iters)
        print(f"{'cuDNN frontend':>44s} {t * 1e3:8.3f} {flops / t / 1e12:8.0f}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"# cuDNN frontend: {type(e).__name__}: {str(e)[:200]}")


def profile_once(q, k, w, idx, st):
    """One launch of ours (default knobs) and one of cuDNN frontend's, for ncu (timing.profile_launches;
    tests/gpu/profile_sparse_idx_rec.sh)."""
    s = torch.empty(idx.shape, device="cuda")
    lse = torch.empty(idx.shape[:-1], device="cuda")
    runs = [("ours", lambda: seam.sparse_indexer_fwd(q, k, w, idx, s, lse, stream=st))]
    dsa = cudnn_dsa()
    if dsa is not None:
        wb = w.bfloat16()
        runs.append(("cuDNN frontend", lambda: dsa.sparse_indexer_score_recompute_wrapper(q, k, wb, idx)))
    profile_launches(runs)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--hints", action="store_true")
    p.add_argument("--ncu", action="store_true", help="one launch of ours and of cuDNN's for ncu, nothing timed")
    main(p.parse_args())
