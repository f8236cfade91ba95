"""One small config per path of the indexer score kernel (dense causal with q_offsets, THD with a tail) for
compute-sanitizer racecheck/memcheck; exits non-zero if any output element is left unwritten (NaN)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.indexer.fwd import indexer_fwd  # noqa: E402


def main():
    torch.manual_seed(0)
    dev, nan = "cuda", float("nan")
    stream = torch.cuda.current_stream().cuda_stream
    q = torch.randn(2, 150, 64, 128, device=dev).bfloat16()
    k = torch.randn(2, 200, 128, device=dev).bfloat16()
    w = torch.randn(2, 150, 64, device=dev)
    s = torch.full((2, 150, 200), nan, device=dev)
    lse = torch.full((2, 150), nan, device=dev)
    off = torch.tensor([0, 70], dtype=torch.int32, device=dev)
    indexer_fwd(q, k, w, s, lse, causal=True, ratio=1, q_offsets=off, stream=stream)
    cu_q = torch.tensor([0, 70, 70, 171], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 130, 131, 200], dtype=torch.int32, device=dev)
    qv = torch.randn(180, 16, 64, device=dev).bfloat16()
    kv = torch.randn(210, 64, device=dev).bfloat16()
    wv = torch.randn(180, 16, device=dev).bfloat16()
    sv = torch.full((180, 140), nan, device=dev)
    lv = torch.full((180,), nan, device=dev)
    indexer_fwd(qv, kv, wv, sv, lv, causal=True, ratio=2, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=101,
                stream=stream)
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t).sum() for t in (s, lse, sv, lv)))
    print("sanitize_dsa_indexer: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
