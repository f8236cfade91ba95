"""Same-run A/B of knobs of the flash-attention forward (ops/flash_attention/forward_sm90.py, FlashFwdSm90): the
defaults against knob sets (--knobs NAME=VALUE,..., ops.common.switches.knob_specs forms), at the bench shape B 2,
H 16, S 8K, bf16, D 128 / 96 / 64, causal and not. A knob is a FlashFwdSm90 class attribute, or TREE (the chains of
ops/common/softmax.py's row max / row sum, a module constant read while tracing). Both run through the seam on the
same inputs; the table says whether out and lse are bitwise equal (else the largest difference, relative to max |out|
and in lse units) and flags NaN. TFLOP/s = 4 B H S^2 D (half with causal).
Knob sets (docs/performance.md): FOLD=0,TREE=1 (the form before 2026-12-07: every score scaled by its own multiply
before the max, one dependent chain per row for max and sum), TREE=1 (the fold alone), POLY_EXP_DIMS=64:96:128 with
POLY_EXP=1 or 2 (1 or 2 of every 8 exponentials on the FMA pipe).

Run:  python bench/ab_flash_fwd.py [--iters N] [--dims 128 96 64] [--knobs FOLD=0,TREE=1 TREE=1 ...]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.common import softmax as softmax_mod  # noqa: E402
from ops.common.switches import knob_specs  # noqa: E402
from ops.flash_attention import fwd as seam  # noqa: E402
from ops.flash_attention.forward_sm90 import FlashFwdSm90 as Kernel  # noqa: E402
from timing import device_time  # noqa: E402

MODULE_KNOBS = {"TREE": softmax_mod}


def _owner(name):
    if name in MODULE_KNOBS:
        return MODULE_KNOBS[name]
    assert hasattr(Kernel, name), f"--knobs: FlashFwdSm90 has no knob {name} (module knobs: {sorted(MODULE_KNOBS)})"
    return Kernel


def main(a):
    B, H, S = 2, 16, a.seq
    st = torch.cuda.current_stream().cuda_stream
    sets = [knob_specs(k) for k in a.knobs]
    names = sorted({n for ks in sets for n in ks})
    default = {n: getattr(_owner(n), n) for n in names}
    settings = {"default": default, **{k: {**default, **ks} for k, ks in zip(a.knobs, sets)}}
    caches = {s: {} for s in settings}      # the seam's compile cache per setting: each variant compiles once
    print(f"# flash forward knob sets against the defaults, {torch.cuda.get_device_name()}, B {B} H {H} S {S} bf16")
    for k in a.knobs:
        print(f"# set {k}")
    print(f"{'row':16s} {'knob set':24s} {'default':>9s} {'knobs':>9s} {'ratio':>6s}  out, lse equal (else max diff "
          "out rel / lse)")
    for D in a.dims:
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(D + causal)
            q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
            scale = D ** -0.5
            res = {}
            for s, values in settings.items():
                for n, val in values.items():
                    setattr(_owner(n), n, val)
                seam._CACHE = caches[s]
                out = torch.full_like(q, float("nan"))
                lse = torch.full((B, H, S), float("nan"), device="cuda")
                t, _ = device_time(lambda: seam.flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal,
                                                               window=(-1, -1), stream=st), a.iters)
                res[s] = (t, out, lse)
            flops = 4 * B * H * S * S * D / (2 if causal else 1)
            t0, o0, l0 = res["default"]
            name = f"D{D} {'causal' if causal else 'full'}"
            for k in a.knobs:
                t1, o1, l1 = res[k]
                same = bool(torch.equal(o0, o1) and torch.equal(l0, l1))
                if not same:
                    same = "{:.1e} / {:.1e}".format(float((o0.float() - o1.float()).abs().max() / o0.float().abs().max()),
                                                    float((l0 - l1).abs().max()))
                nan = bool(torch.isnan(o1).any() or torch.isnan(l1).any() or torch.isnan(o0).any())
                print(f"{name:16s} {k[:24]:24s} {flops / t0 / 1e12:6.1f} TF {flops / t1 / 1e12:6.1f} TF "
                      f"{t0 / t1:6.3f}  {same}{'  NaN!' if nan else ''}", flush=True)
    for n, val in default.items():
        setattr(_owner(n), n, val)
    seam._CACHE = caches["default"]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--dims", type=int, nargs="*", default=[128, 96, 64])
    p.add_argument("--knobs", nargs="+", default=["FOLD=0,TREE=1"],
                   help="knob sets NAME=VALUE,... (FlashFwdSm90 class knobs, TREE), each timed against the defaults")
    main(p.parse_args())
