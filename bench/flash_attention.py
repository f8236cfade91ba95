"""Flash-attention benchmark on the H200: forward and backward TFLOP/s of ours against torch SDPA's
FLASH_ATTENTION and CUDNN_ATTENTION backends and FlashAttention-4, all measured in the same run.

Shapes: bf16, H = 16 heads, B * S = 16k tokens (B = 16384 // S: B = 2 at S = 8k, the issue's figures), S in
{1k, 2k, 4k, 8k, 16k}, head_dim 64 and 128 (--dims picks others, e.g. "96,192/128,192,256"; D/Dv is a query/key
head_dim D with a value head_dim Dv), causal and not.
FLOPs: forward 2 * B * H * Sq * Sk * (D + Dv) (two matmuls), halved for causal; backward counted as 2.5x the
forward.
Timing: device time of one call (median of ``--iters``), CUDA events around each call. Before the timed calls a
GPU spin (torch.cuda._sleep) holds the stream while the host queues all of them, so the host cost of a call (our
seam's DLPack marshalling, autograd) is not in the figure; a row where the host still could not keep ahead is
flagged "host-bound" in the notes and the CSV.
Peers: SDPA through F.scaled_dot_product_attention under sdpa_kernel(backend) (backward: autograd.grad on a
retained graph, so only the backward kernels run); FA4 through flash_attn.cute.interface.flash_attn_func if it is
importable (pack it with ../shared/device/pack.sh, see /work/shared/device/README.md), otherwise its column is
skipped with a note. Ours: the seam functions ops.flash_attention.fwd.flash_attn_fwd / bwd.flash_attn_bwd on
torch tensors allocated once per shape (the backward gets out/lse from our forward; default backward mode).

Run:  python bench/flash_attention.py                 # forward and backward table, CSV to $OUT (or /tmp/gpu_out)
      python bench/flash_attention.py --fwd | --bwd   # one direction only
      python bench/flash_attention.py --quick         # S = 8k only
      python bench/flash_attention.py --fwd --quick --dims 96,192/128,192,256 --csv PATH   # other head dims
      python bench/flash_attention.py --csv PATH --no-fa4 --iters 10
      python bench/flash_attention.py --bwd --quick --det   # + the deterministic backward's two kernels
                                                      #   (PADDLE_DSA_BWD_DET recompute / ordered)
      python bench/flash_attention.py --host          # host cost of one forward seam call (cProfile)
      python bench/flash_attention.py --ncu bwd       # one call of ours and of FA4 between cudaProfilerStart / Stop
        (first of --dims, first of --seqlens or 8192 with --quick, --causal): tests/gpu/profile_pair.sh flash_bwd
        _main_fast python3 bench/flash_attention.py --ncu bwd --quick --dims 128
Plot:  python bench/plot_performance.py CSV -o SVG
"""
import argparse
import csv
import datetime
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from ops.flash_attention.fwd import flash_attn_fwd  # noqa: E402
from timing import device_time, profile_launches  # noqa: E402

IMPLS = ("ours", "sdpa_flash", "sdpa_cudnn", "fa4")
DET_IMPLS = ("det_recompute", "det_ordered")   # --det: backward only, deterministic=True with det= each kernel
LABELS = {"ours": "ours", "sdpa_flash": "SDPA-FA2", "sdpa_cudnn": "cuDNN", "fa4": "FA4", "det_recompute": "det-rc",
          "det_ordered": "det-ord"}
CSV_FIELDS = ("pass", "head_dim", "causal", "batch", "heads", "seqlen", "impl", "ms", "tflops", "host_bound", "note")


def _ws_alloc():
    """Workspace allocator for our backward: one buffer per (shape, dtype), reused across calls."""
    cache = {}
    dts = {"float32": torch.float32, "int32": torch.int32}

    def alloc(shape, dtype):
        key = (tuple(int(s) for s in shape), dtype)
        if key not in cache:
            cache[key] = torch.empty(key[0], dtype=dts[dtype], device="cuda")
        return cache[key]
    return alloc


def load_fa4():
    try:
        from flash_attn.cute.interface import flash_attn_func
        try:
            from importlib.metadata import version
            ver = version("flash-attn-4")
        except Exception:  # noqa: BLE001
            ver = "?"
        return flash_attn_func, ver, None
    except Exception as e:  # noqa: BLE001
        return None, None, f"{type(e).__name__}: {str(e)[:160]}"


# ------------------------------------------------------------------------------------------------ one shape
def bench_shape(D, causal, B, H, S, passes, iters, fa4, Dv=None, det=False):
    """Returns {pass: {impl: (seconds or None, host_bound, note)}} for one shape."""
    dt = torch.bfloat16
    Dv = D if Dv is None else Dv
    scale = 1.0 / math.sqrt(D)
    stream = torch.cuda.current_stream().cuda_stream
    gen = torch.Generator(device="cuda").manual_seed(S + D + int(causal))
    q, k = (torch.randn(B, S, H, D, device="cuda", dtype=dt, generator=gen) for _ in range(2))
    v, dout = (torch.randn(B, S, H, Dv, device="cuda", dtype=dt, generator=gen) for _ in range(2))
    out = torch.empty_like(dout)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, dout))  # BHSD views for SDPA
    res = {p: {} for p in passes}

    def run(p, impl, make):
        """make() builds the timed callable (and runs whatever set-up it needs, e.g. a forward with grad)."""
        try:
            t, hb = device_time(make(), iters)
            res[p][impl] = (t, hb, "host-bound" if hb else "")
        except Exception as e:  # noqa: BLE001  (backend unavailable for this shape, compile error, ...)
            res[p][impl] = (None, False, f"{type(e).__name__}: {str(e)[:120]}".replace("\n", " "))

    def ours_fwd():
        return lambda: flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=(-1, -1),
                                      stream=stream)

    if "fwd" in passes:
        run("fwd", "ours", ours_fwd)
        for impl, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(be), torch.no_grad():
                run("fwd", impl, lambda: (lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                                  scale=scale)))
        if fa4 is not None:
            with torch.no_grad():
                run("fwd", "fa4", lambda: (lambda: fa4(q, k, v, softmax_scale=scale, causal=causal)))

    if "bwd" in passes:
        from ops.flash_attention.bwd import flash_attn_bwd
        alloc = _ws_alloc()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def ours_bwd():
            flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=(-1, -1), stream=stream)
            return lambda: flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=scale, causal=causal,
                                          window=(-1, -1), alloc=alloc, stream=stream)
        run("bwd", "ours", ours_bwd)
        for impl in (DET_IMPLS if det else ()):
            def det_bwd(kind=impl[len("det_"):]):
                flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=(-1, -1),
                               stream=stream)
                return lambda: flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=scale,
                                              causal=causal, window=(-1, -1), alloc=alloc, stream=stream,
                                              deterministic=True, det=kind)
            run("bwd", impl, det_bwd)
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        for impl, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            def sdpa_bwd():
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                       is_causal=causal, scale=scale)
                return lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True)
            run("bwd", impl, sdpa_bwd)
        if fa4 is not None:
            def fa4_bwd():
                o = fa4(qg, kg, vg, softmax_scale=scale, causal=causal)
                o = o[0] if isinstance(o, (tuple, list)) else o
                return lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
            run("bwd", "fa4", fa4_bwd)
        del qg, kg, vg, dq, dk, dv
    del q, k, v, dout, out, lse
    return res


# ------------------------------------------------------------------------------------------------ table
def _fmt(x, w=7, p=1):
    return f"{x:{w}.{p}f}" if x is not None and x == x else f"{'-':>{w}}"


def _ratio(a, b):
    return a / b if a is not None and b is not None and b > 0 and a == a and b == b else None


def header(impls):
    cols = " ".join(f"{LABELS[i]:>8}" for i in impls)
    rats = " ".join(f"{'/' + LABELS[i]:>9}" for i in impls if i != "ours")
    return f"{'pass':4} {'D':>3} {'causal':>6} {'B':>3} {'S':>6} | {cols} | {rats} | notes"


def row_text(p, D, causal, B, S, tf, notes, impls):
    cols = " ".join(_fmt(tf.get(i), 8) for i in impls)
    rats = " ".join(_fmt(_ratio(tf.get("ours"), tf.get(i)), 9, 2) for i in impls if i != "ours")
    return f"{p:4} {str(D):>3} {int(causal):6d} {B:3d} {S:6d} | {cols} | {rats} | {notes}"


def main(a):
    t_start = time.time()
    passes = [p for p in ("fwd", "bwd") if (p == "fwd" and not a.bwd) or (p == "bwd" and not a.fwd)]
    seqlens = [8192] if a.quick else [int(s) for s in a.seqlens.split(",")]
    fa4, fa4_ver, fa4_err = (None, None, "disabled (--no-fa4)") if a.no_fa4 else load_fa4()
    impls = [i for i in IMPLS if i != "fa4" or fa4 is not None] + (list(DET_IMPLS) if a.det else [])
    out_dir = os.environ.get("OUT") or "/tmp/gpu_out"
    csv_path = a.csv or os.path.join(out_dir, "bench_flash_attention.csv")
    os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)

    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  {torch.cuda.get_device_name()}  torch {torch.__version__}"
          f"  cuDNN {torch.backends.cudnn.version()}", flush=True)
    print(f"# bf16 H={a.heads} B*S={a.tokens} tokens, TFLOP/s (fwd 2BHSS(D+Dv), causal halved; bwd 2.5x fwd), device time,"
          f" median of {a.iters}; ratio columns = ours / peer", flush=True)
    print("# FA4: " + (f"flash-attn-4 {fa4_ver}" if fa4 is not None else f"column skipped ({fa4_err})"), flush=True)
    print(header(impls), flush=True)

    rows = []   # (pass, D, causal, B, S, {impl: tflops}, notes)
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_FIELDS)
        for D, Dv in parse_dims(a.dims):
            for causal in (False, True):
                for S in seqlens:
                    B = max(1, a.tokens // S)
                    res = bench_shape(D, causal, B, a.heads, S, passes, a.iters, fa4, Dv, det=a.det)
                    label = D if Dv == D else f"{D}/{Dv}"
                    for p in passes:
                        flops = 2.0 * B * a.heads * S * S * (D + Dv) * (0.5 if causal else 1.0) * \
                            (2.5 if p == "bwd" else 1.0)
                        tf, notes = {}, []
                        for impl in impls:
                            t, hb, note = res[p].get(impl, (None, False, "not run"))
                            tf[impl] = flops / t / 1e12 if t else None
                            if note:
                                notes.append(f"{LABELS[impl]}: {note[:70]}")
                            w.writerow((p, label, int(causal), B, a.heads, S, impl,
                                        f"{t * 1e3:.4f}" if t else "", f"{tf[impl]:.2f}" if t else "",
                                        int(hb), note))
                        fh.flush()
                        rows.append((p, label, causal, B, S, tf, "; ".join(notes)))
                        print(row_text(*rows[-1], impls), flush=True)
                    torch.cuda.empty_cache()

    print(f"\n# table (sorted by pass), {time.time() - t_start:.0f} s in all; CSV: {csv_path}")
    print(header(impls))
    for r in sorted(rows, key=lambda r: (r[0] != "fwd", str(r[1]), r[2], r[4])):
        print(row_text(*r, impls))
    if fa4 is None:
        print(f"# FA4 column skipped: {fa4_err}")
    return rows


# ------------------------------------------------------------------------------------------------ host cost
def profile_host(n=300):
    """Host cost of one seam call (no sync), forward and backward: wall time per call, then the top cProfile
    entries of the forward. The GPU is kept busy by a spin, so the calls only queue (host time, not device)."""
    import cProfile
    import pstats
    from ops.flash_attention.bwd import flash_attn_bwd
    q, k, v, dout = (torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(2, 16, 1024, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    alloc = _ws_alloc()
    calls = {
        "forward": lambda: flash_attn_fwd(q, k, v, out, lse, softmax_scale=0.088, causal=False, window=(-1, -1),
                                          stream=stream),
        "backward": lambda: flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=0.088, causal=False,
                                           window=(-1, -1), alloc=alloc, stream=stream),
    }
    for name, call in calls.items():
        call()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e9))  # ~1 s of GPU spin: the timed calls only queue
        t = time.perf_counter()
        for _ in range(n):
            call()
        host = (time.perf_counter() - t) / n
        torch.cuda.synchronize()
        print(f"# host time per {name} seam call: {host * 1e6:.1f} us (B2 S1k H16 D128 bf16, {n} calls)")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        calls["forward"]()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(14)


def profile_pair(a):
    """One call of ours and one of FA4 (if importable) for ncu: pass a.ncu, D / Dv the first of --dims, S the first
    of --seqlens (8192 with --quick), B = tokens // S, causal with --causal, and with --det the deterministic ordered
    backward too; the backward's forward runs before the profiled range."""
    from ops.flash_attention.bwd import flash_attn_bwd
    D, Dv = parse_dims(a.dims)[0]
    S = 8192 if a.quick else int(a.seqlens.split(",")[0])
    B, H, dt = max(1, a.tokens // S), a.heads, torch.bfloat16
    scale, stream = 1.0 / math.sqrt(D), torch.cuda.current_stream().cuda_stream
    q, k = (torch.randn(B, S, H, D, device="cuda", dtype=dt) for _ in range(2))
    v, dout = (torch.randn(B, S, H, Dv, device="cuda", dtype=dt) for _ in range(2))
    out, dq, dk, dv = torch.empty_like(dout), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    alloc = _ws_alloc()
    fwd = lambda: flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=a.causal, window=(-1, -1),  # noqa
                                 stream=stream)
    fa4, _, err = load_fa4()
    runs = []
    if a.ncu == "fwd":
        runs.append(("ours fwd", fwd))
        if fa4 is not None:
            runs.append(("fa4 fwd", lambda: fa4(q, k, v, softmax_scale=scale, causal=a.causal)))
    else:
        fwd()
        runs.append(("ours bwd", lambda: flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=scale,
                                                        causal=a.causal, window=(-1, -1), alloc=alloc,
                                                        stream=stream)))
        if a.det:
            runs.append(("ours bwd det ordered", lambda: flash_attn_bwd(
                q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=scale, causal=a.causal, window=(-1, -1),
                alloc=alloc, stream=stream, deterministic=True, det="ordered")))
        if fa4 is not None:
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            o = fa4(qg, kg, vg, softmax_scale=scale, causal=a.causal)
            o = o[0] if isinstance(o, (tuple, list)) else o
            runs.append(("fa4 bwd", lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)))
    print(f"# ncu: {a.ncu} D {D}/{Dv} B {B} S {S} H {H} causal {int(a.causal)}; FA4: "
          f"{'yes' if fa4 is not None else err}", flush=True)
    profile_launches(runs)


def parse_dims(text):
    """'64,128,192/128' -> [(64, 64), (128, 128), (192, 128)]: D, or D/Dv."""
    out = []
    for item in text.split(","):
        d, _, dv = item.strip().partition("/")
        out.append((int(d), int(dv or d)))
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--fwd", action="store_true", help="forward only")
    g.add_argument("--bwd", action="store_true", help="backward only")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per measurement (median)")
    ap.add_argument("--quick", action="store_true", help="S=8k only")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--tokens", type=int, default=16384, help="B * S")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dims", default="64,128", help="head dims, D or D/Dv, comma separated")
    ap.add_argument("--csv", default=None, help="CSV path (default $OUT/bench_flash_attention.csv)")
    ap.add_argument("--no-fa4", action="store_true", help="leave FlashAttention-4 out")
    ap.add_argument("--host", action="store_true", help="profile the host cost of the seam call")
    ap.add_argument("--ncu", choices=("fwd", "bwd"), default=None,
                    help="one call of ours and of FA4 for ncu (tests/gpu/profile_pair.sh), no timing")
    ap.add_argument("--causal", action="store_true", help="--ncu: the causal mask")
    ap.add_argument("--det", action="store_true", help="also time the deterministic backward (both kernels); "
                                                       "the ratio columns ours / det-rc and ours / det-ord are the "
                                                       "inverse of det's fraction of the default's speed")
    return ap.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if args.host:
        profile_host()
    elif args.ncu:
        profile_pair(args)
    else:
        main(args)
