"""Same-run A/B of the sparse MLA attention kernels (ops/dsa/sparse_attn/fwd_sm90.py, bwd_sm90.py): a base
revision's kernel file against the working tree's on the same inputs, outputs compared, plus knockouts of the working
tree's kernel that show where its time goes. A knockout computes wrong numbers by design: only its time means anything.

Knockouts (subclasses of the working tree's kernel, defined here):
  nogather  the producer acquires and publishes every chunk (and the slot rows) but moves no kv data: the time
            without the gather's memory traffic;
  nored     (backward) every dkv reduction skipped (red.global behind a runtime test that never holds, the data
            flow to it kept): the time without the dkv reduction traffic.

Run (the base file must travel with the working tree, so it is written next to the current kernels, untracked):
  python bench/ab_sparse_attn.py --prepare REV      here: ops/dsa/sparse_attn/_ab_base_{fwd,bwd}_sm90.py from REV
  python bench/ab_sparse_attn.py [--bwd] [--heads 64 128] [--skv 8192 65536] [--knobs DKV_A=2 ...]
                                 [--knockouts nogather nored]
                                 [--iters N]   on the device
  python bench/ab_sparse_attn.py --check            here (no GPU): the knockout variants compile for sm_90a
  PADDLE_DSA_KERNEL_CACHE=DIR python bench/ab_sparse_attn.py --prebuild [--bwd] [--heads ...] --knobs SPEC ...
                                                    here: the knob variants into the kernel store
  python bench/ab_sparse_attn.py --clean            here: remove the base files
Shape: B 1, Sq 4096, Skv 8192 (--skv), top-k 2048 (uniform random indices), Dqk 576, Dv 512; the backward with a sink.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import Int32  # noqa: E402

from ops.common.softmax import acc_mn_view  # noqa: E402
from ops.common.vector_red_sm90 import red_tile_lines  # noqa: E402
from ops.dsa.sparse_attn import bwd, bwd_sm90, fwd, fwd_sm90  # noqa: E402

PKG = os.path.join(ROOT, "ops", "dsa", "sparse_attn")
BASE = {"fwd": "_ab_base_fwd_sm90", "bwd": "_ab_base_bwd_sm90"}


class NoGather:
    """Mixin: the producer keeps its protocol (acquire, slot rows, commit, publish) and moves no kv data
    (gather_sm90.BlockGather.MOVE_DATA)."""

    MOVE_DATA = False


class NoRed:
    """Mixin for the backward: add_dkv (the tile's whole-line reductions) with every reduction behind `krow == -7`
    (never true for a valid slot), the lane exchanges kept."""

    @cute.jit
    def add_dkv(self, acc, krow_b, lane, mdKV, batch, col0: cutlass.Constexpr):
        dead = cute.make_rmem_tensor((2, 2), Int32)
        for r in cutlass.range_constexpr(2):
            for b in cutlass.range_constexpr(2):
                dead[b, r] = Int32(cutlass.select_(krow_b[b, r] == Int32(-7), krow_b[b, r], Int32(-1)))
        red_tile_lines(acc_mn_view(acc), dead, lane, mdKV, batch, col0, bwd_sm90.DC // 32)


def variants(kind, knockouts, knobs=()):
    """[(name, kernel class)]: the base revision's (when prepared), the working tree's, the working tree's with class
    knobs set (each "NAME=INT[,NAME=INT]": a subclass with those class attributes), then the knockouts."""
    mod, cls_name = (fwd_sm90, "SparseAttnFwdSm90") if kind == "fwd" else (bwd_sm90, "SparseAttnBwdSm90")
    cur = getattr(mod, cls_name)
    out = []
    if os.path.exists(os.path.join(PKG, BASE[kind] + ".py")):
        base = __import__(f"ops.dsa.sparse_attn.{BASE[kind]}", fromlist=[cls_name])
        out.append(("base", getattr(base, cls_name)))
    out.append(("current", cur))
    for spec in knobs:      # set on the class itself (run()), so a variant's store key is the one prebuilt here
        out.append((spec, cur))
    mixins = {"nogather": NoGather, "nored": NoRed}
    for k in knockouts:
        if k == "nored" and kind == "fwd":
            continue
        out.append((f"current-{k}", type(f"{cls_name}_{k}", (mixins[k], cur), {})))
    return out


def knob_attrs(spec):
    """{"NAME": int} of a knob spec "NAME=INT[,NAME=INT]"."""
    return {k: int(v) for k, v in (kv.split("=") for kv in spec.split(","))}


def prebuild(a):
    """Compile (into the kernel store, PADDLE_DSA_KERNEL_CACHE) the working tree's kernel with each --knobs spec at the
    run's keys (B 1, Sq 4096, top-k 2048, 576 / 512, --heads; the backward with a sink), as run() will on the device."""
    import importlib
    kind = "bwd" if a.bwd else "fwd"
    module = importlib.import_module(f"ops.dsa.sparse_attn.{kind}")
    cls = fwd_sm90.SparseAttnFwdSm90 if kind == "fwd" else bwd_sm90.SparseAttnBwdSm90
    for spec in a.knobs:
        saved = {k: getattr(cls, k) for k in knob_attrs(spec)}
        for k, v in knob_attrs(spec).items():
            setattr(cls, k, v)
        for H in a.heads:
            key = (fwd.variant_key(576, 512, H, False, False, False) if kind == "fwd"
                   else bwd.variant_key(576, 512, H, False, False, True, False))
            module._CACHE.clear()
            module.compile_variant(key)
            print(f"{kind} {spec} H{H}: compiled", flush=True)
        for k, v in saved.items():
            setattr(cls, k, v)


def prepare(rev):
    for kind, name in BASE.items():
        src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:ops/dsa/sparse_attn/{kind}_sm90.py"], check=True,
                             capture_output=True, text=True).stdout
        with open(os.path.join(PKG, name + ".py"), "w") as fh:
            fh.write(f"# ab_sparse_attn.py --prepare {rev}: the base kernel (untracked; --clean removes it)\n" + src)
        print(f"wrote ops/dsa/sparse_attn/{name}.py from {rev}")


def clean():
    for name in BASE.values():
        p = os.path.join(PKG, name + ".py")
        if os.path.exists(p):
            os.remove(p)
            print(f"removed {os.path.relpath(p, ROOT)}")


def check():
    """Compile every knockout variant for sm_90a (CPU): a knockout that no longer fits the kernel fails here."""
    from ops.common.tensors import COMPILE_OPTIONS
    for kind, module, key in (("fwd", fwd, fwd.variant_key(576, 512, 128, False, False, False)),
                              ("bwd", bwd, bwd.variant_key(576, 512, 64, False, False, True, False))):
        for name, cls in variants(kind, ["nogather", "nored"]):
            assert cute.compile(cls(*key), *module.fake_args(key), options=COMPILE_OPTIONS) is not None
            print(f"{kind} {name}: compiled")


def run(a):
    import torch
    from timing import device_time
    st = torch.cuda.current_stream().cuda_stream
    Sq, K, D, dv = 4096, 2048, 576, 512
    kind = "bwd" if a.bwd else "fwd"
    module, holder = (bwd, bwd_sm90) if a.bwd else (fwd, fwd_sm90)
    attr = "SparseAttnBwdSm90" if a.bwd else "SparseAttnFwdSm90"
    cur = getattr(holder, attr)
    for Skv, H in [(s, h) for s in a.skv for h in a.heads]:
        g = torch.Generator(device="cuda").manual_seed(H)
        q = torch.randn(1, Sq, H, D, device="cuda", generator=g).bfloat16()
        kv = torch.randn(1, Skv, D, device="cuda", generator=g).bfloat16()
        idx = torch.randint(0, Skv, (1, Sq, K), device="cuda", dtype=torch.int32, generator=g)
        sink = torch.randn(H, device="cuda", generator=g)
        out = torch.empty(1, Sq, H, dv, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(1, H, Sq, device="cuda")
        scale = D ** -0.5
        flops = 2 * Sq * K * H * (D + dv) * (2.5 if a.bwd else 1.0)
        if a.bwd:
            fwd.sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=scale, attn_sink=sink, stream=st)
            dout = torch.randn(out.shape, device="cuda", generator=g).bfloat16()
        res = {}
        for name, cls in variants(kind, a.knockouts, a.knobs):
            setattr(holder, attr, cls)
            saved = {}
            if name in a.knobs:
                for k, v in knob_attrs(name).items():
                    saved[k] = getattr(cls, k)
                    setattr(cls, k, v)
            module._CACHE.clear()
            if a.bwd:
                dq, dkv = torch.full_like(q, float("nan")), torch.empty(kv.shape, device="cuda")
                dsr = torch.full((1, Sq, H), float("nan"), device="cuda")
                outs = (dq, dkv, dsr)
                call = lambda: bwd.sparse_attn_bwd(q, kv, idx, out, dout, lse, dq, dkv,  # noqa: E731
                                                   softmax_scale=scale, attn_sink=sink, d_sink_rows=dsr, stream=st)
            else:
                o, l_ = torch.full_like(out, float("nan")), torch.full_like(lse, float("nan"))
                outs = (o, l_)
                call = lambda: fwd.sparse_attn_fwd(q, kv, idx, o, l_, softmax_scale=scale, stream=st)  # noqa: E731
            t, _ = device_time(call, a.iters)
            for k, v in saved.items():
                setattr(cls, k, v)
            res[name] = [x.float().clone() for x in outs]
            print(f"{kind} Skv {Skv} H{H} {name:18s} {t * 1e3:8.3f} ms {flops / t / 1e12:6.1f} TFLOP/s", flush=True)
        setattr(holder, attr, cur)
        names = ("dq", "dkv", "d_sink_rows") if a.bwd else ("out", "lse")
        for other in [k for k in ("base", *a.knobs) if k in res]:       # the current kernel's outputs as reference
            diffs = []
            for n, x, y in zip(names, res["current"], res[other]):
                d = (x - y).abs().nan_to_num(float("inf")).max().item()
                diffs.append(f"max|{n} current - {other}| {d:.3e} (|{n}| max {x.abs().max().item():.2e}, "
                             f"NaN in {other}: {bool(y.isnan().any())})")
            print("  " + "; ".join(diffs), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", metavar="REV")
    p.add_argument("--clean", action="store_true")
    p.add_argument("--check", action="store_true")
    p.add_argument("--prebuild", action="store_true", help="here: compile the --knobs variants into the kernel store")
    p.add_argument("--bwd", action="store_true")
    p.add_argument("--heads", nargs="*", type=int, default=[128])
    p.add_argument("--skv", nargs="*", type=int, default=[8192])
    p.add_argument("--knockouts", nargs="*", default=[], choices=["nogather", "nored"])
    p.add_argument("--knobs", nargs="*", default=[], help='class knobs of the current kernel, e.g. "DKV_A=2"')
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    if a.prepare:
        prepare(a.prepare)
    elif a.clean:
        clean()
    elif a.check:
        check()
    elif a.prebuild:
        prebuild(a)
    else:
        run(a)


if __name__ == "__main__":
    main()
