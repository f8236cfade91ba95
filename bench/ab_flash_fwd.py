"""Same-run A/B of class knobs of the flash-attention forward (ops/flash_attention/forward_sm90.py, FlashFwdSm90):
the defaults against knob sets (--knobs NAME=VALUE,..., ops.common.switches.knob_specs forms) at the bench shape
B 2, H 16, S 8K, bf16, D 128 / 96 / 64, causal and not, through the seam on the same inputs. The table gives TFLOP/s
(2 B H S^2 (D + Dv), half with causal), the ratio, and how far out and lse moved (max |diff| / max |x|; NaN flagged).
Knob sets timed: FOLD=0 (the scale multiplied into every score before the softmax, the form before 2026-12-07:
0.92-0.99x on the H100, 2026-12-07 17:05). A knob of longer unmasked key blocks (BN 176 at D 128 and 144 at D 96, as
FlashAttention-3 picks; 160 at D 128) measured 0.97-0.99x in that call and was removed.

Knobs are applied by ops.flash_attention.fwd.set_trial_knobs: FlashFwdSm90 class knobs, and BM64="<unmasked>/<masked>"
(each 128 or 192), the D 64 row tiles of supported.fwd_block_m (the table PADDLE_DSA_FWD_BM64 sets at import).

Run:  python bench/ab_flash_fwd.py [--iters N] [--dims 128 96 64 192/128 256] [--knobs FOLD=0 BM64=192/128 ...]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.common.switches import knob_specs  # noqa: E402
from ops.flash_attention import fwd as seam  # noqa: E402
from timing import device_time  # noqa: E402


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def main(a):
    B, H, S = 2, 16, 8192
    st = torch.cuda.current_stream().cuda_stream
    settings = {"default": {}, **{k: knob_specs(k) for k in a.knobs}}
    for k, ks in settings.items():          # a bad name fails here, before any timing
        seam.set_trial_knobs(seam.set_trial_knobs(ks))
    caches = {s: {} for s in settings}      # the seam's compile cache per setting: each variant compiles once
    print(f"# flash forward knob sets against the defaults, {torch.cuda.get_device_name()}, B {B} H {H} S {S} bf16")
    print(f"{'row':16s} {'knob set':28s} {'default':>9s} {'knobs':>9s} {'ratio':>6s}  max|out diff| / max|lse diff| rel")
    for spec in a.dims:
        D, Dv = (int(x) for x in spec.split("/")) if "/" in spec else (int(spec), int(spec))
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(D + Dv + causal)
            q, k = (torch.randn(B, S, H, D, device="cuda", generator=g).bfloat16() for _ in range(2))
            v = torch.randn(B, S, H, Dv, device="cuda", generator=g).bfloat16()
            res = {}
            for s, values in settings.items():
                restore = seam.set_trial_knobs(values)
                seam._CACHE = caches[s]
                out = torch.full_like(v, float("nan"))
                lse = torch.full((B, H, S), float("nan"), device="cuda")
                t, _ = device_time(lambda: seam.flash_attn_fwd(q, k, v, out, lse, softmax_scale=D ** -0.5,
                                                               causal=causal, window=(-1, -1), stream=st), a.iters)
                res[s] = (t, out, lse)
                seam.set_trial_knobs(restore)
            flops = 2 * B * H * S * S * (D + Dv) / (2 if causal else 1)
            t0, o0, l0 = res["default"]
            for k in a.knobs:
                t1, o1, l1 = res[k]
                nan = bool(torch.isnan(o1).any() or torch.isnan(l1).any() or torch.isnan(o0).any())
                print(f"{'D%s %s' % (spec, 'causal' if causal else 'full'):16s} {k[:28]:28s} {flops / t0 / 1e12:6.1f} TF "
                      f"{flops / t1 / 1e12:6.1f} TF {t0 / t1:6.3f}  {rel(o1, o0):.1e} / {rel(l1, l0):.1e}"
                      f"{'  NaN!' if nan else ''}", flush=True)
    seam._CACHE = caches["default"]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--dims", nargs="*", default=["128", "96", "64"], help='head dims: "D" or "D/Dv" (e.g. 192/128)')
    p.add_argument("--knobs", nargs="+", default=["FOLD=0"],
                   help="knob sets NAME=VALUE,... (set_trial_knobs), each timed against the defaults")
    main(p.parse_args())
