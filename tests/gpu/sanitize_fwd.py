"""Small forward configs (dense causal GQA, varlen; head dims 64 (dense causal; varlen unmasked), 128, 96,
192 / 128, 256) for compute-sanitizer racecheck / memcheck. FLASH_FWD_KNOBS (test_flash_fwd.py) applies here too."""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.common.switches import knob_specs  # noqa: E402
from ops.flash_attention.fwd import flash_attn_fwd, set_trial_knobs  # noqa: E402

set_trial_knobs(knob_specs(os.environ.get("FLASH_FWD_KNOBS", "")))     # knobs on trial, as test_flash_fwd.py


def main():
    torch.manual_seed(0)
    dev = "cuda"
    q = torch.randn(1, 200, 4, 64, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 150, 2, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 4, 200), float("nan"), device=dev)
    flash_attn_fwd(q, k, v, out, lse, softmax_scale=1 / 8, causal=True, window=(-1, -1),
                   stream=torch.cuda.current_stream().cuda_stream)
    cu_q = torch.tensor([0, 70, 70, 171], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 130, 131, 131], dtype=torch.int32, device=dev)
    qv = torch.randn(180, 2, 128, device=dev, dtype=torch.float16)
    kv = torch.randn(140, 1, 128, device=dev, dtype=torch.float16)
    vv = torch.randn_like(kv)
    ov = torch.full_like(qv, float("nan"))
    lv = torch.full((2, 180), float("nan"), device=dev)
    flash_attn_fwd(qv, kv, vv, ov, lv, softmax_scale=1 / math.sqrt(128), causal=False, window=(32, 8),
                   cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=101, max_seqlen_k=130,
                   stream=torch.cuda.current_stream().cuda_stream)
    # head dims beyond 64 / 128: (192, 128) dense causal GQA (BN 128), (256, 256) varlen (BN 64), (96, 96) dense
    extra = []
    # (64, 64) varlen unmasked: the 192-row tile's 512-thread unmasked path and its tail clearing (9 rows past the end)
    for (d, dv, varlen) in ((192, 128, False), (256, 256, True), (96, 96, False), (64, 64, True)):
        if varlen:
            x = (torch.randn(180, 2, d, device=dev, dtype=torch.bfloat16), torch.randn(140, 1, d, device=dev,
                 dtype=torch.bfloat16), torch.randn(140, 1, dv, device=dev, dtype=torch.bfloat16))
            o = torch.full((180, 2, dv), float("nan"), device=dev, dtype=torch.bfloat16)
            lx = torch.full((2, 180), float("nan"), device=dev)
            flash_attn_fwd(*x, o, lx, softmax_scale=1 / math.sqrt(d), causal=d != 64, window=(-1, -1),
                           cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=101, max_seqlen_k=130,
                           stream=torch.cuda.current_stream().cuda_stream)
        else:
            x = (torch.randn(1, 200, 4, d, device=dev, dtype=torch.bfloat16), torch.randn(1, 150, 2, d, device=dev,
                 dtype=torch.bfloat16), torch.randn(1, 150, 2, dv, device=dev, dtype=torch.bfloat16))
            o = torch.full((1, 200, 4, dv), float("nan"), device=dev, dtype=torch.bfloat16)
            lx = torch.full((1, 4, 200), float("nan"), device=dev)
            flash_attn_fwd(*x, o, lx, softmax_scale=1 / math.sqrt(d), causal=True, window=(-1, -1),
                           stream=torch.cuda.current_stream().cuda_stream)
        extra += [o, lx]
    torch.cuda.synchronize()
    bad = int(torch.isnan(out).sum() + torch.isnan(lse).sum() + torch.isnan(ov).sum() + torch.isnan(lv).sum())
    bad += int(sum(torch.isnan(t).sum() for t in extra))
    print("sanitize_fwd: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
