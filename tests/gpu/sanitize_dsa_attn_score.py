"""One small config per path of the dense attention-score recompute kernel (dense causal with q_offsets, THD with a
tail) for compute-sanitizer racecheck/memcheck; exits non-zero if any output element is left unwritten (NaN)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.attn_score.dense import dense_attn_score_fwd  # noqa: E402


def main():
    torch.manual_seed(0)
    dev, nan = "cuda", float("nan")
    stream = torch.cuda.current_stream().cuda_stream
    q = torch.randn(2, 6, 64, 576, device=dev).bfloat16()      # small: racecheck instruments every smem access
    kv = torch.randn(2, 140, 576, device=dev).bfloat16()
    lse = torch.randn(2, 64, 6, device=dev) + 8
    a = torch.full((2, 6, 140), nan, device=dev)
    l1 = torch.full((2, 6), nan, device=dev)
    off = torch.tensor([0, 130], dtype=torch.int32, device=dev)
    dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=0.04, causal=True, q_offsets=off, stream=stream)
    cu_q = torch.tensor([0, 2, 2, 5], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 130, 131, 200], dtype=torch.int32, device=dev)
    qv = torch.randn(7, 128, 512, device=dev).bfloat16()
    kvv = torch.randn(210, 512, device=dev).bfloat16()
    lv = torch.randn(128, 7, device=dev) + 8
    av = torch.full((7, 140), nan, device=dev)
    l1v = torch.full((7,), nan, device=dev)
    dense_attn_score_fwd(qv, kvv, lv, av, l1v, softmax_scale=0.04, causal=True, ratio=2, cu_seqlens_q=cu_q,
                         cu_seqlens_k=cu_k, max_seqlen_q=3, stream=stream)
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t).sum() for t in (a, l1, av, l1v)))
    print("sanitize_dsa_attn_score: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
