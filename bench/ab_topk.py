"""Same-run A/B of the streaming top-k kernel (ops/dsa/topk/stream_sm90.py): a base revision's kernel against the
working tree's, on the same scores in the same process, so that a change is judged on one card (a figure from
another day's card is not a baseline: the H100 and H200 differ in memory bandwidth).

The base is the revision's stream_sm90.py with the two modules it builds on (topk_sm90.py, sort_sm90.py), written next
to the current ones as untracked _ab_base_*.py files with their imports of each other pointed at the copies; every
other module (ops/common) is the working tree's. Both kernels run through ops.dsa.topk.fwd.topk_fwd (the seam's
checks, padding and launch), the base by swapping stream_sm90.TopkStreamSm90 for the run. Rows: the cases of
bench/topk_breakdown.py (32K rows: randn W 32K k 2048 / k 64, W 4K k 2048, causal, rounded), in score and column
order. Each row checks that both kernels select the same set of columns (score order may order ties differently),
then prints both times and the ratio. --lengths-rows adds bench/dsa_indexer.py's like-for-like rows: the indexer's
causal scores at 32K (32 heads, Di 128, its seeded inputs) and the causal randn row, each with the causal row lengths
(row r: r + 1 and r W / R + 1 columns).

Run (the base files must travel with the working tree):
  python bench/ab_topk.py --prepare REV        here: ops/dsa/topk/_ab_base_{stream,topk,sort}_sm90.py from REV
  python bench/ab_topk.py [--rows N] [--iters N] [--first] [--knobs SPEC ...] [--extra-k K ...]   on the device
    (e.g. --knobs SAMPLE_SCORE_MAX_P=2048 SAMPLE=0 SORT=key --extra-k 512 1024: where the score order's one read
    pays; SORT is sort_sm90.SelectionSort's, a string knob; REFINE_DIGITS=11:10, a tuple: ops.common.switches.knob_value)
  python bench/ab_topk.py --prebuild [--knobs ...] [--extra-k ...] [--part I/N]   the variants into the kernel store
    (no GPU needed; --part: N such processes at once, I = 0..N-1, each compiling every N-th variant)
  python bench/ab_topk.py --clean              here: remove the base files
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

PKG = os.path.join(ROOT, "ops", "dsa", "topk")
FILES = ("stream_sm90", "topk_sm90", "sort_sm90")


def base_name(mod):
    return f"_ab_base_{mod.replace('_sm90', '')}_sm90"


def prepare(rev):
    for mod in FILES:
        src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:ops/dsa/topk/{mod}.py"], check=True,
                             capture_output=True, text=True).stdout
        for other in FILES:                       # the copies import each other, not the working tree's modules
            src = src.replace(f"from .{other} import", f"from .{base_name(other)} import")
        with open(os.path.join(PKG, base_name(mod) + ".py"), "w") as fh:
            fh.write(f"# ab_topk.py --prepare {rev}: the base kernel (untracked; --clean removes it)\n" + src)
        print(f"wrote ops/dsa/topk/{base_name(mod)}.py from {rev}")


def clean():
    for mod in FILES:
        p = os.path.join(PKG, base_name(mod) + ".py")
        if os.path.exists(p):
            os.remove(p)
            print(f"removed {os.path.relpath(p, ROOT)}")


def same_selection(a, b):
    """Both outputs hold the same columns a row (order aside; -1 padding included)."""
    return bool((a.sort(dim=1).values == b.sort(dim=1).values).all())


def kernels_of(a):
    """[(tag, kernel class)]: the base revision's, the working tree's, and the working tree's with each knob set (a
    subclass named and placed like the class itself, so it traces to the key prebuild_knob_variants.py's setattr
    form stores)."""
    from ops.common.switches import knob_specs
    from ops.dsa.topk import stream_sm90
    if not os.path.exists(os.path.join(PKG, base_name("stream_sm90") + ".py")):
        sys.exit("no base kernel: run python bench/ab_topk.py --prepare REV here first")
    base = __import__(f"ops.dsa.topk.{base_name('stream_sm90')}", fromlist=["TopkStreamSm90"]).TopkStreamSm90
    cur = stream_sm90.TopkStreamSm90
    kernels = [("base", base), ("current", cur)]
    for spec in a.knobs:      # the current kernel with class knobs set (a subclass: its own compiled variants)
        attrs = knob_specs(spec)
        attrs["__module__"] = cur.__module__
        kernels.append((spec, type("TopkStreamSm90", (cur,), attrs)))
    return kernels


def prebuild(a):
    """Compile every variant run() launches (each kernel, both orders, the rows' padded k) into the kernel store
    (PADDLE_DSA_KERNEL_CACHE) without a GPU."""
    from ops.dsa.topk import fwd, stream_sm90
    from ops.dsa.topk.topk_sm90 import pad_k
    cur = stream_sm90.TopkStreamSm90
    ks = sorted({pad_k(k) for k in [2048, 64] + list(a.extra_k)})
    part, parts = (int(x) for x in a.part.split("/"))     # this process's share: every parts-th variant
    n = 0
    try:
        for tag, cls in kernels_of(a):
            stream_sm90.TopkStreamSm90 = cls
            for p in ks:
                for col in (False, True):
                    for hl in ((False, True) if a.lengths_rows else (False,)):
                        n += 1
                        if n % parts != part:
                            continue
                        fwd._CACHE.clear()
                        fwd.compile_variant(fwd.variant_key(p, hl, False, True, col))
                        print(f"prebuilt {tag} P {p} {'column' if col else 'score'} lengths {hl}", flush=True)
    finally:
        stream_sm90.TopkStreamSm90 = cur
        fwd._CACHE.clear()


def run(a):
    import torch
    from ops.dsa.topk import fwd, stream_sm90
    from ops.dsa.topk.fwd import topk_fwd
    from timing import device_time
    cur = stream_sm90.TopkStreamSm90
    kernels = kernels_of(a)
    from topk_breakdown import causal_lengths, topk_cases
    R = a.rows
    st = torch.cuda.current_stream().cuda_stream
    cases = topk_cases(R)
    if a.first:
        cases = cases[:1]
    cases += [(f"randn W32K k{k}", cases[0][1], k) for k in a.extra_k]
    cases = [c + (None,) for c in cases]          # (name, scores, k, lengths)
    if a.lengths_rows:
        W = cases[3][1].shape[1]
        cases.append(("causal W32K k2048 lengths", cases[3][1], 2048, causal_lengths(R, W)))
        if R == W:
            from dsa_indexer import inputs
            from ops.dsa.indexer.fwd import indexer_fwd
            q, kk, w = inputs(R, 32)
            si = torch.empty(1, R, R, device="cuda")
            indexer_fwd(q, kk, w, si, None, causal=True, stream=st)
            cases.append(("indexer 32K H32 k2048 lengths", si.view(R, R), 2048,
                          torch.arange(1, R + 1, dtype=torch.int32, device="cuda")))
    print(f"# top-k streaming kernel A/B, {torch.cuda.get_device_name()}, {R} rows; ms (median of {a.iters})")
    print(f"{'row':34s} {'base':>8s} {'current':>8s} {'cur/base':>8s}  same selection" +
          "".join(f"  {spec} (ms, /base, same)" for spec in a.knobs))
    fwd.STREAM = True
    try:
        for order in ("score", "column"):
            for name, s, k, lens in cases:
                res = {}
                for tag, cls in kernels:
                    stream_sm90.TopkStreamSm90 = cls
                    fwd._CACHE.clear()
                    out = torch.full((R, k), -7, dtype=torch.int32, device="cuda")   # -7: never a kernel value
                    t, _ = device_time(lambda: topk_fwd(s, out, lengths=lens, order=order, stream=st), a.iters)
                    res[tag] = (t, out.clone())
                (tb, ob), (tc, oc) = res["base"], res["current"]
                ok = same_selection(ob, oc) and not bool((oc == -7).any())
                extra = ""
                for spec in a.knobs:
                    tk, ok_ = res[spec]
                    same = same_selection(ob, ok_) and not bool((ok_ == -7).any())
                    extra += f"  {tk * 1e3:8.3f} {tk / tb:6.3f} {same}"
                print(f"{name + ' ' + order:34s} {tb * 1e3:8.3f} {tc * 1e3:8.3f} {tc / tb:8.3f}  {ok}{extra}",
                      flush=True)
    finally:
        stream_sm90.TopkStreamSm90 = cur
        fwd._CACHE.clear()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prepare", metavar="REV")
    p.add_argument("--clean", action="store_true")
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--first", action="store_true", help="only the first row (randn W 32K k 2048)")
    p.add_argument("--knobs", nargs="*", default=[],
                   help='the current kernel also with class knobs, e.g. "SAMPLE_SCORE_MAX_P=2048" "SAMPLE=0" "SORT=key"')
    p.add_argument("--extra-k", nargs="*", type=int, default=[], help="more randn W 32K rows at these k")
    p.add_argument("--lengths-rows", action="store_true", help="also the causal rows with their row lengths: randn "
                   "and the indexer's scores (module docstring)")
    p.add_argument("--prebuild", action="store_true", help="compile the variants a run launches into the kernel "
                   "store (PADDLE_DSA_KERNEL_CACHE), no GPU")
    p.add_argument("--part", default="0/1", help="with --prebuild: I/N compiles every N-th variant from the I-th, so "
                   "N processes (I = 0..N-1) share the list")
    a = p.parse_args()
    if a.prebuild:
        prebuild(a)
    elif a.prepare:
        prepare(a.prepare)
    elif a.clean:
        clean()
    else:
        run(a)
