"""Same-run A/B of class knobs of the pipelined flash-attention backward (ops/flash_attention/backward_fast_sm90.py,
FlashBwdSm90Fast): the defaults against a knob set (--knobs NAME=VALUE,..., ops.common.switches.knob_specs forms), at
the bench shape B 2, H 16, S 8K, bf16, D 128 / 96 / 64, causal and not, the default mode (the seam's
PADDLE_DSA_BWD_FAST) and the ordered deterministic form. Both run through the seam on the same inputs; the table
says whether dK and dV are bitwise equal and how far dQ moved (max |diff| / max |dQ|), and flags NaN. TFLOP/s = 2.5 x
the forward's 4 B H S^2 D (half with causal).
Knob sets timed so far (docs/performance.md): P_STMATRIX=0 (element-pair P / dS stores, 2026-12-05: stmatrix kept,
1.03x at D 128); DQ_COLS_DIMS=64:128, TURN_PASS=1, SPLIT_SDP=1, DS_STAGES=2 and SWAP_SDP=1 (2026-12-07: S^T / dP^T with
the keys as MMA rows, 1.06-1.17x, made the one form with the ordered form's DQ_COLS_DIMS 64, TURN_PASS 1, DS_STAGES 2;
P_STMATRIX, SPLIT_SDP and SWAP_SDP went with the earlier form); STAGES=3 and DQ_COLS_DIMS=64:128 again (08:14: within
1 %, 0.93x on some rows); STAT_AHEAD=1 (09:30: the column stats read into registers before the wgmma waits, D 128
1.03x, D 64 causal 0.97x: made the default at D 128 as STAT_AHEAD_DIMS). EARLY_SDP_DIMS=64:96:128 (10:10: the ordered form
1.03-1.12x, made its default as ORDERED_EARLY_SDP_DIMS; the default form 0.75-1.05x) and EARLY_RELEASE=1 (10:30, not
adopted). Knobs left: DQ_COLS_DIMS, ORDERED_DQ_COLS_DIMS, DS_STAGES, TURN_PASS, STAGES, STAT_AHEAD_DIMS, EARLY_SDP_DIMS,
ORDERED_EARLY_SDP_DIMS, EARLY_RELEASE (the default set, STAT_AHEAD_DIMS=0, is the stats read where used).

Run:  python bench/ab_flash_bwd.py [--iters N] [--dims 128 96 64] [--knobs DQ_COLS_DIMS=64:128 TURN_PASS=1 ...]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from flash_attention import _ws_alloc  # noqa: E402  (bench/flash_attention.py: the seam's workspace allocator)
from ops.common.switches import knob_specs  # noqa: E402
from ops.flash_attention import bwd as seam  # noqa: E402
from ops.flash_attention.backward_fast_sm90 import FlashBwdSm90Fast as Kernel  # noqa: E402
from ops.flash_attention.fwd import flash_attn_fwd  # noqa: E402
from timing import device_time  # noqa: E402


def main(a):
    B, H, S = 2, 16, 8192
    st = torch.cuda.current_stream().cuda_stream
    ws = _ws_alloc()
    sets = [knob_specs(k) for k in a.knobs]
    names = sorted({n for ks in sets for n in ks})
    for name in names:
        assert hasattr(Kernel, name), f"--knobs: FlashBwdSm90Fast has no knob {name}"
    default = {n: getattr(Kernel, n) for n in names}
    settings = {"default": default, **{k: {**default, **ks} for k, ks in zip(a.knobs, sets)}}
    caches = {s: {} for s in settings}      # the seam's compile cache per setting: each variant compiles once
    print(f"# flash backward knob sets against the defaults, {torch.cuda.get_device_name()}, B {B} H {H} S {S} bf16")
    for k in a.knobs:
        print(f"# set {k}")
    print(f"{'row':30s} {'knob set':24s} {'default':>9s} {'knobs':>9s} {'ratio':>6s}  dK, dV equal (else max rel diff) / max|dQ diff| rel")
    for D in a.dims:
        for causal in (False, True):
            for det in (False, True):
                g = torch.Generator(device="cuda").manual_seed(D + causal)
                q, k, v, dout = (torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16() for _ in range(4))
                out = torch.empty_like(q)
                lse = torch.empty(B, H, S, device="cuda")
                scale = D ** -0.5
                flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=(-1, -1), stream=st)
                res = {}
                for s, values in settings.items():
                    for n, val in values.items():
                        setattr(Kernel, n, val)
                    seam._CACHE = caches[s]
                    dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
                    kw = dict(softmax_scale=scale, causal=causal, window=(-1, -1), alloc=ws, stream=st)
                    if det:
                        kw.update(deterministic=True, det="ordered")
                    t, _ = device_time(lambda: seam.flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, **kw),
                                       a.iters)
                    res[s] = (t, dq, dk, dv)
                flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
                t0, dq0, dk0, dv0 = res["default"]
                name = f"D{D} {'causal' if causal else 'full'}{' ordered' if det else ''}"
                for k in a.knobs:
                    t1, dq1, dk1, dv1 = res[k]
                    same = bool(torch.equal(dk0, dk1) and torch.equal(dv0, dv1))
                    if not same:   # how far, relative to the largest entry (a layout bug shows as O(1))
                        same = "{:.1e}".format(max(float((x0.float() - x1.float()).abs().max() / x0.float().abs().max())
                                                   for x0, x1 in ((dk0, dk1), (dv0, dv1))))
                    dqd = float((dq0.float() - dq1.float()).abs().max() / dq0.float().abs().max())
                    nan = bool(torch.isnan(dq1).any() or torch.isnan(dk1).any() or torch.isnan(dv1).any())
                    print(f"{name:30s} {k[:24]:24s} {flops / t0 / 1e12:6.1f} TF {flops / t1 / 1e12:6.1f} TF "
                          f"{t0 / t1:6.3f}  {same} / {dqd:.1e}{'  NaN!' if nan else ''}", flush=True)
    for n, val in default.items():
        setattr(Kernel, n, val)
    seam._CACHE = caches["default"]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--dims", type=int, nargs="*", default=[128, 96, 64])
    p.add_argument("--knobs", nargs="+", default=["STAT_AHEAD_DIMS=0"],
                   help="knob sets NAME=VALUE,... (FlashBwdSm90Fast class knobs), each timed against the defaults")
    main(p.parse_args())
