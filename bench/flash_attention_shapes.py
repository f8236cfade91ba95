"""The GQA and varlen rows of the flash-attention benchmark (issue 12): ours against SDPA's FLASH_ATTENTION and
CUDNN_ATTENTION backends and FlashAttention-4, forward and backward, all in the same run.

Shapes (bf16, D 128, causal and not):
  gqa     8:1, 64 query heads over 8 kv heads, B 2 x S 8192 (B * S = 16k tokens, as bench/flash_attention.py);
          SDPA gets the 8 kv heads with enable_gqa=True, FA4 the same tensors as ours.
  varlen  16 documents of mixed length (VARLEN_LENS, 32768 tokens in all, 1 to 8192 long), 16 heads, packed THD
          with cu_seqlens; SDPA has no packed form, so its columns are skipped; FA4 through flash_attn_varlen_func.
FLOPs: 4 * H * Sq * Sk * D summed over the sequences (halved for causal), 2.5x that for the backward (the
convention of bench/flash_attention.py). Timing: bench/timing.py device_time (median of --iters).

Run:  python bench/flash_attention_shapes.py [--rows gqa varlen] [--fwd | --bwd] [--iters N] [--no-fa4]
"""
import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from flash_attention import LABELS, _fmt, _ratio, _ws_alloc, load_fa4  # noqa: E402
from ops.flash_attention.bwd import flash_attn_bwd  # noqa: E402
from ops.flash_attention.fwd import flash_attn_fwd  # noqa: E402
from timing import device_time  # noqa: E402

D = 128
VARLEN_LENS = (4096, 512, 3000, 1, 8192, 777, 2048, 1500, 4097, 300, 2500, 1024, 1200, 600, 1745, 1176)
assert sum(VARLEN_LENS) == 32768 and len(VARLEN_LENS) == 16


def timed(fn, iters):
    """(seconds or None, note)."""
    try:
        t, host_bound = device_time(fn(), iters)
        return t, "host-bound" if host_bound else ""
    except Exception as e:  # noqa: BLE001  (a peer without a kernel for the shape, ...)
        return None, f"{type(e).__name__}: {str(e)[:100]}".replace("\n", " ")


def gqa_rows(causal, passes, iters, fa4, H=64, Hkv=8, B=2, S=8192):
    """{pass: {impl: (seconds, note)}} and the forward FLOPs of the GQA shape."""
    g = torch.Generator(device="cuda").manual_seed(7 + causal)
    q, dout = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    scale, st = 1.0 / math.sqrt(D), torch.cuda.current_stream().cuda_stream
    fwd = lambda: flash_attn_fwd(q, k, v, out, lse, softmax_scale=scale, causal=causal, window=(-1, -1),  # noqa
                                 stream=st)
    res = {p: {} for p in passes}
    if "fwd" in passes:
        res["fwd"]["ours"] = timed(lambda: fwd, iters)
        for impl, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(be), torch.no_grad():
                res["fwd"][impl] = timed(lambda: (lambda: F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale,
                    enable_gqa=True)), iters)
        if fa4 is not None:
            with torch.no_grad():
                res["fwd"]["fa4"] = timed(lambda: (lambda: fa4(q, k, v, softmax_scale=scale, causal=causal)), iters)
    if "bwd" in passes:
        alloc = _ws_alloc()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def ours():
            fwd()
            return lambda: flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, softmax_scale=scale, causal=causal,
                                          window=(-1, -1), alloc=alloc, stream=st)
        res["bwd"]["ours"] = timed(ours, iters)
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        for impl, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            def sdpa():
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                       is_causal=causal, scale=scale, enable_gqa=True)
                return lambda: torch.autograd.grad(o, (qg, kg, vg), dout.transpose(1, 2), retain_graph=True)
            res["bwd"][impl] = timed(sdpa, iters)
        if fa4 is not None:
            def fa4_bwd():
                o = fa4(qg, kg, vg, softmax_scale=scale, causal=causal)
                o = o[0] if isinstance(o, (tuple, list)) else o
                return lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
            res["bwd"]["fa4"] = timed(fa4_bwd, iters)
    return res, 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)


def varlen_rows(causal, passes, iters, fa4_varlen, H=16):
    """{pass: {impl: (seconds, note)}} and the forward FLOPs of the packed documents."""
    T = sum(VARLEN_LENS)
    cu = torch.tensor([0] + list(torch.tensor(VARLEN_LENS).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    mx = max(VARLEN_LENS)
    g = torch.Generator(device="cuda").manual_seed(11 + causal)
    q, k, v, dout = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    out, lse = torch.empty_like(q), torch.empty(H, T, device="cuda", dtype=torch.float32)
    scale, st = 1.0 / math.sqrt(D), torch.cuda.current_stream().cuda_stream
    kw = dict(softmax_scale=scale, causal=causal, window=(-1, -1), cu_seqlens_q=cu, cu_seqlens_k=cu,
              max_seqlen_q=mx, max_seqlen_k=mx, stream=st)
    fwd = lambda: flash_attn_fwd(q, k, v, out, lse, **kw)  # noqa: E731
    fa_kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx, max_seqlen_k=mx, softmax_scale=scale,
                 causal=causal)
    res = {p: {} for p in passes}
    skip = (None, "no packed varlen form")
    if "fwd" in passes:
        res["fwd"].update(ours=timed(lambda: fwd, iters), sdpa_flash=skip, sdpa_cudnn=skip)
        if fa4_varlen is not None:
            with torch.no_grad():
                res["fwd"]["fa4"] = timed(lambda: (lambda: fa4_varlen(q, k, v, **fa_kw)), iters)
    if "bwd" in passes:
        alloc = _ws_alloc()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def ours():
            fwd()
            return lambda: flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, alloc=alloc, **kw)
        res["bwd"].update(ours=timed(ours, iters), sdpa_flash=skip, sdpa_cudnn=skip)
        if fa4_varlen is not None:
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

            def fa4_bwd():
                o = fa4_varlen(qg, kg, vg, **fa_kw)
                o = o[0] if isinstance(o, (tuple, list)) else o
                return lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)
            res["bwd"]["fa4"] = timed(fa4_bwd, iters)
    flops = sum(4.0 * H * n * n * D * (0.5 if causal else 1.0) for n in VARLEN_LENS)
    return res, flops


def main(a):
    passes = [p for p in ("fwd", "bwd") if not (p == "fwd" and a.bwd) and not (p == "bwd" and a.fwd)]
    fa4, ver, err = (None, None, "disabled (--no-fa4)") if a.no_fa4 else load_fa4()
    fa4_varlen = None
    if fa4 is not None:
        from flash_attn.cute.interface import flash_attn_varlen_func as fa4_varlen
    impls = ("ours", "sdpa_flash", "sdpa_cudnn") + (("fa4",) if fa4 is not None else ())
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; FA4: {ver or err}; bf16 D {D}, TFLOP/s "
          f"(median of {a.iters}); ratio = ours / peer", flush=True)
    print(f"{'row':7} {'pass':4} {'causal':6} | " + " ".join(f"{LABELS[i]:>8}" for i in impls) + " | " +
          " ".join(f"{'/' + LABELS[i]:>9}" for i in impls if i != "ours") + " | notes", flush=True)
    for row in a.rows:
        for causal in (False, True):
            res, flops = (gqa_rows(causal, passes, a.iters, fa4) if row == "gqa"
                          else varlen_rows(causal, passes, a.iters, fa4_varlen))
            for p in passes:
                f = flops * (2.5 if p == "bwd" else 1.0)
                tf = {i: (f / res[p][i][0] / 1e12 if res[p].get(i, (None,))[0] else None) for i in impls}
                notes = "; ".join(f"{LABELS[i]}: {res[p][i][1]}" for i in impls if res[p].get(i, (0, ""))[1])
                print(f"{row:7} {p:4} {int(causal):6d} | " + " ".join(_fmt(tf[i], 8) for i in impls) + " | " +
                      " ".join(_fmt(_ratio(tf["ours"], tf[i]), 9, 2) for i in impls if i != "ours") + f" | {notes}",
                      flush=True)
            torch.cuda.empty_cache()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--fwd", action="store_true", help="forward only")
    g.add_argument("--bwd", action="store_true", help="backward only")
    ap.add_argument("--rows", nargs="*", default=["gqa", "varlen"], choices=["gqa", "varlen"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-fa4", action="store_true", help="leave FlashAttention-4 out")
    return ap.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
