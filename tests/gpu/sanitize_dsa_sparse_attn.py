"""One small config per sparse attention forward flavour (dense with topk_length, sink and invalid slots; THD with
an empty segment and a tail) for compute-sanitizer racecheck/memcheck; exits non-zero if any output element is left
unwritten (NaN). SANITIZE_KNOBS="NAME=VALUE,..." (ops.common.switches.knob_specs) sets class knobs of the kernel first (the knobs on trial)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.sparse_attn import fwd_sm90  # noqa: E402
from ops.dsa.sparse_attn.fwd import sparse_attn_fwd  # noqa: E402


def main():
    from ops.common.switches import knob_specs
    for name, value in knob_specs(os.environ.get("SANITIZE_KNOBS", "")).items():   # e.g. LAG=2
        assert hasattr(fwd_sm90.SparseAttnFwdSm90, name), f"SANITIZE_KNOBS: no knob {name}"
        setattr(fwd_sm90.SparseAttnFwdSm90, name, value)
        print(f"sanitize_dsa_sparse_attn: {name} = {value}")
    torch.manual_seed(0)
    dev, nan = "cuda", float("nan")
    stream = torch.cuda.current_stream().cuda_stream
    outs = []
    q = torch.randn(2, 3, 128, 576, device=dev).bfloat16()
    kv = torch.randn(2, 300, 576, device=dev).bfloat16()
    idx = torch.randint(-1, 310, (2, 3, 200), device=dev, dtype=torch.int32)
    tl = torch.randint(0, 220, (2, 3), device=dev, dtype=torch.int32)
    sink = torch.randn(128, device=dev)
    o, l = torch.full((2, 3, 128, 512), nan, device=dev).bfloat16(), torch.full((2, 128, 3), nan, device=dev)
    sparse_attn_fwd(q, kv, idx, o, l, softmax_scale=0.04, attn_sink=sink, topk_length=tl, stream=stream)
    outs += [o, l]
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 100, 101, 180], dtype=torch.int32, device=dev)
    qa = torch.randn(9, 64, 512, device=dev).bfloat16()
    kva = torch.randn(190, 512, device=dev).bfloat16()
    ia = torch.randint(-1, 110, (9, 130), device=dev, dtype=torch.int32)
    oa, la = torch.full((9, 64, 512), nan, device=dev).bfloat16(), torch.full((64, 9), nan, device=dev)
    sparse_attn_fwd(qa, kva, ia, oa, la, softmax_scale=0.04, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, stream=stream)
    outs += [oa, la]
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t.float()).sum() for t in outs))
    print("sanitize_dsa_sparse_attn: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
