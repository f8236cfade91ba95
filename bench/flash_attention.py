"""Flash-attention benchmark on the H200: TFLOP/s of ours vs torch SDPA (FLASH_ATTENTION and CUDNN_ATTENTION).

Forward part: B=2 H=16 S in {1k, 4k, 8k}, head_dim 64/128, causal and not, bf16.
FLOPs: 4 * B * H * Sq * Sk * D (two matmuls), halved for causal (Sq == Sk). Timing: CUDA events, median of
``--iters`` runs after warm-up. Run: python bench/flash_attention.py --fwd
"""
import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from ops.flash_attention.fwd import flash_attn_fwd  # noqa: E402


def timeit(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2] * 1e-3


def bench_fwd(iters, quick=False):
    B, H = 2, 16
    rows = []
    for D in (64, 128):
        for causal in (False, True):
            for S in ((8192,) if quick else (1024, 4096, 8192)):
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                out = torch.empty_like(q)
                lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
                scale = 1.0 / math.sqrt(D)
                stream = torch.cuda.current_stream().cuda_stream
                flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
                res = {}
                res["ours"] = timeit(lambda: flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal,
                                                            window=(-1, -1), stream=stream), iters)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(be):
                            res[name] = timeit(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                                      scale=scale), iters)
                    except Exception as e:  # backend unavailable
                        res[name] = None
                        print(f"# {name} D={D} causal={causal} S={S}: {type(e).__name__}: {str(e)[:100]}")
                tf = {n: (flops / t / 1e12 if t else float("nan")) for n, t in res.items()}
                rows.append((D, causal, S, tf["ours"], tf["sdpa_flash"], tf["sdpa_cudnn"]))
                print(f"D={D:3d} causal={int(causal)} S={S:5d}  ours {tf['ours']:7.1f}  sdpa_flash "
                      f"{tf['sdpa_flash']:7.1f}  sdpa_cudnn {tf['sdpa_cudnn']:7.1f}  TFLOP/s", flush=True)
                del q, k, v, out, lse
    print("\nforward bf16 B=2 H=16, TFLOP/s")
    print(f"{'D':>3} {'causal':>6} {'S':>5} | {'ours':>7} {'flash':>7} {'cudnn':>7} | ours/flash")
    for D, c, S, o, fl, cu in rows:
        print(f"{D:3d} {int(c):6d} {S:5d} | {o:7.1f} {fl:7.1f} {cu:7.1f} | {o / fl if fl == fl and fl else float('nan'):.2f}")


def profile_host(n=300):
    """Host cost of one seam call (no sync): wall time per call and the top cProfile entries."""
    import cProfile
    import pstats
    import time
    q, k, v = (torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(2, 16, 1024, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    call = lambda: flash_attn_fwd(q, k, v, out, lse, softmax_scale=0.088, causal=False, window=(-1, -1),  # noqa
                                  stream=stream)
    call()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t) / n
    torch.cuda.synchronize()
    print(f"host time per seam call: {host * 1e6:.1f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        call()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--fwd", action="store_true", default=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--host", action="store_true", help="profile the host cost of the seam call")
    ap.add_argument("--quick", action="store_true", help="S=8k only")
    a = ap.parse_args()
    if a.host:
        profile_host()
    else:
        bench_fwd(a.iters, quick=a.quick)
