"""Launch-shape sweep of the indexer backward kernels (ops/dsa/indexer/sparse_bwd_sm90.py and its dense subclass)
on the H200.

Each variant sets class knobs of the row's kernel class (SparseIndexerBwdSm90 / DenseIndexerBwdSm90, whose defaults
may differ): CONSUMERS (consumer warpgroups behind the producer: query-row blocks in flight per CTA) and REGS
(setmaxnreg of producer / consumers), and is compiled and timed at the bench rows' shapes (a variant equal to the
row's defaults is not run twice): the sparse backward at B 1, Sq 4K, Sk 8K, top-k 2048, 64 index heads, Di 128, fp32
weights, and the dense causal backward at Sq = Sk = 8K. Each variant's gradients are compared with the first
variant's (d_index_q bf16 and d_weights: another consumer count sums the per-consumer partials in another order;
d_index_k: fp32 atomics in any order): the largest difference relative to the largest magnitude is printed, and a
variant off by more than 1e-2 is marked. cuDNN frontend's indexer_backward_wrapper (sparse row) in the same run when
it is unpacked.
--ncu: one launch of the sparse row's default kernel and one of cuDNN frontend's between cudaProfilerStart / Stop
(tests/gpu/profile_pair.sh sparse_idx_bwd IndexerBwd python3 bench/indexer_bwd_shapes.py --ncu).

Run:  python bench/indexer_bwd_shapes.py [--iters N | --ncu]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.indexer import dense_bwd as dense_seam, sparse_bwd as sparse_seam  # noqa: E402
from ops.dsa.indexer.fwd import indexer_fwd  # noqa: E402
from ops.dsa.indexer.sparse import sparse_indexer_fwd  # noqa: E402
from ops.dsa.indexer.dense_bwd_sm90 import DenseIndexerBwdSm90  # noqa: E402
from ops.dsa.indexer.sparse_bwd_sm90 import SparseIndexerBwdSm90  # noqa: E402
from timing import cudnn_dsa, device_time, profile_launches  # noqa: E402

KNOBS = ("CONSUMERS", "REGS")
# knobs each variant sets (the rest at the row's default); the first is the default kernel. 2026-12-06 08:50 (H100) this
# list also held the epilogue's former forms (DA_STORE, DK_AHEAD, W_HOIST; ops/dsa/indexer/sparse_bwd_sm90.py's
# docstring has their figures; removed since)
VARIANTS = ({}, {"CONSUMERS": 2}, {"CONSUMERS": 3})
DEV = "cuda"


def sparse_case():
    Sq, Sk, K, H, D = 4096, 8192, 2048, 64, 128
    g = torch.Generator(device=DEV).manual_seed(11)
    q = torch.randn(1, Sq, H, D, device=DEV, generator=g).bfloat16()
    k = torch.randn(1, Sk, D, device=DEV, generator=g).bfloat16()
    w = torch.randn(1, Sq, H, device=DEV, generator=g) * H ** -0.5
    idx = torch.randint(0, Sk, (1, Sq, K), device=DEV, dtype=torch.int32, generator=g)
    s, lse = torch.empty(1, Sq, K, device=DEV), torch.empty(1, Sq, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    sparse_indexer_fwd(q, k, w, idx, s, lse, stream=st)
    a = torch.rand(1, Sq, K, device=DEV, generator=g)
    c = torch.tensor([1.0 / Sq], device=DEV)
    out = (torch.empty_like(q), torch.empty(k.shape, device=DEV), torch.empty(w.shape, device=DEV))
    run = lambda: sparse_seam.sparse_indexer_bwd(q, k, w, idx, s, lse, a, a.sum(-1), c, *out, stream=st)  # noqa: E731
    sparse_case.peer_inputs = (q, w.bfloat16(), k, a / a.sum(-1, keepdim=True), torch.exp(s - lse[..., None]), idx,
                               torch.ones(1, device=DEV))    # cuDNN frontend's indexer_backward_wrapper arguments
    return "sparse 4K/8K k2048 H64", run, out, 3 * 2.0 * Sq * K * H * D, SparseIndexerBwdSm90


def dense_case():
    S, H, D = 8192, 64, 128
    g = torch.Generator(device=DEV).manual_seed(12)
    q = torch.randn(1, S, H, D, device=DEV, generator=g).bfloat16()
    k = torch.randn(1, S, D, device=DEV, generator=g).bfloat16()
    w = torch.randn(1, S, H, device=DEV, generator=g) * H ** -0.5
    s, lse = torch.empty(1, S, S, device=DEV), torch.empty(1, S, device=DEV)
    st = torch.cuda.current_stream().cuda_stream
    indexer_fwd(q, k, w, s, lse, causal=True, stream=st)
    a = torch.rand(1, S, S, device=DEV, generator=g) * torch.isfinite(s)
    c = torch.tensor([1.0 / S], device=DEV)
    out = (torch.empty_like(q), torch.empty(k.shape, device=DEV), torch.empty(w.shape, device=DEV))
    run = lambda: dense_seam.dense_indexer_bwd(q, k, w, s, lse, a, a.sum(-1), c, *out, causal=True,  # noqa: E731
                                               stream=st)
    return "dense causal 8K H64", run, out, 3 * 2.0 * S * (S + 1) / 2 * H * D, DenseIndexerBwdSm90


def rel_diff(x, ref):
    x, ref = x.double(), ref.double()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def profile_once():
    """One launch of ours (sparse row, default knobs) and one of cuDNN frontend's indexer_backward_wrapper on the same
    inputs, for ncu (timing.profile_launches; tests/gpu/profile_pair.sh)."""
    _, run, _, _, _ = sparse_case()
    runs = [("ours", run)]
    dsa = cudnn_dsa()
    if dsa is not None:
        q, wb, k, t, p, idx, gl = sparse_case.peer_inputs
        runs.append(("cuDNN frontend", lambda: dsa.indexer_backward_wrapper(q, wb, k, t.clone(), p, idx, gl)))
    profile_launches(runs)


def main(a):
    if a.ncu:
        return profile_once()
    print(f"# indexer backward launch shapes, {torch.cuda.get_device_name()}")
    print(f"{'row':>24s} {'variant':>36s} {'ms':>8s} {'TFLOP/s':>8s} {'rel diff dq / dk / dw':>26s}", flush=True)
    for make in (sparse_case, dense_case):
        name, run, out, flops, Kernel = make()
        default = {k: getattr(Kernel, k) for k in KNOBS}
        print(f"# {name}: {Kernel.__name__} defaults {default}", flush=True)
        ref = None
        for knobs in VARIANTS:
            if knobs and all(default[k] == v for k, v in knobs.items()):
                continue
            for k, v in default.items():
                setattr(Kernel, k, knobs.get(k, v))
            shape = f"{' '.join(f'{k}={v}' for k, v in knobs.items()) or 'default':>36s}"
            sparse_seam._CACHE.clear()
            dense_seam._CACHE.clear()
            try:
                for o in out:
                    o.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                diff = "-"
                if ref is None:
                    ref = [o.clone() for o in out]
                else:
                    d = [rel_diff(o, r) for o, r in zip(out, ref)]
                    diff = " / ".join(f"{v:.1e}" for v in d) + (" OFF" if any(not v <= 1e-2 for v in d) else "")
                t, _ = device_time(run, a.iters)
                print(f"{name:>24s} {shape} {t * 1e3:8.3f} {flops / t / 1e12:8.0f} {diff:>26s}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{name:>24s} {shape} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        for k, v in default.items():
            setattr(Kernel, k, v)
        sparse_seam._CACHE.clear()
        dense_seam._CACHE.clear()
        del out, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--ncu", action="store_true", help="one launch of ours and of cuDNN's, for ncu (no timing)")
    main(p.parse_args())
