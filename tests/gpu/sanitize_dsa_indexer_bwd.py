"""One small config per sparse indexer backward flavour (dense with topk_length, fp32 weights and invalid slots; THD
with bf16 weights, an empty segment and a tail) for compute-sanitizer racecheck/memcheck; exits non-zero if any
output element is left unwritten (NaN: d_index_q, d_weights and d_index_k are NaN-poisoned, the seam zeroes
d_index_k before accumulating). Each config runs in deterministic mode too (chunks of 1 and 4 rows, poisoned
staging: tests/gpu/workspace.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.indexer.sparse_bwd import sparse_indexer_bwd  # noqa: E402
from workspace import TorchWorkspace  # noqa: E402


def main():
    torch.manual_seed(0)
    dev, nan = "cuda", float("nan")
    stream = torch.cuda.current_stream().cuda_stream
    outs = []
    q = torch.randn(2, 3, 64, 128, device=dev).bfloat16()
    k = torch.randn(2, 300, 128, device=dev).bfloat16()
    w = torch.randn(2, 3, 64, device=dev)
    idx = torch.randint(-1, 310, (2, 3, 200), device=dev, dtype=torch.int32)
    tl = torch.randint(0, 220, (2, 3), device=dev, dtype=torch.int32)
    s, a = torch.randn(2, 3, 200, device=dev), torch.rand(2, 3, 200, device=dev)
    lse, l1 = torch.randn(2, 3, device=dev) + 5, a.sum(-1)
    c = torch.tensor([0.5], device=dev)
    for det in (False, True):
        dq, dk, dw = (torch.full(q.shape, nan, device=dev).bfloat16(), torch.full(k.shape, nan, device=dev),
                      torch.full(w.shape, nan, device=dev))
        sparse_indexer_bwd(q, k, w, idx, s, lse, a, l1, c, dq, dk, dw, topk_length=tl, deterministic=det,
                           workspace=TorchWorkspace(), workspace_bytes=2 * 200 * 128 * 4, stream=stream)
        outs += [dq, dk, dw]
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 100, 101, 180], dtype=torch.int32, device=dev)
    qa, ka = torch.randn(9, 16, 64, device=dev).bfloat16(), torch.randn(190, 64, device=dev).bfloat16()
    wa = torch.randn(9, 16, device=dev).bfloat16()
    ia = torch.randint(-1, 110, (9, 130), device=dev, dtype=torch.int32)
    sa, aa = torch.randn(9, 130, device=dev), torch.rand(9, 130, device=dev)
    la, l1a = torch.randn(9, device=dev) + 5, aa.sum(-1)
    for det in (False, True):
        dqa, dka, dwa = (torch.full(qa.shape, nan, device=dev).bfloat16(), torch.full(ka.shape, nan, device=dev),
                         torch.full(wa.shape, nan, device=dev))
        sparse_indexer_bwd(qa, ka, wa, ia, sa, la, aa, l1a, c, dqa, dka, dwa, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                           deterministic=det, workspace=TorchWorkspace(), workspace_bytes=4 * 130 * 64 * 4,
                           stream=stream)
        outs += [dqa, dka, dwa]
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t.float()).sum() for t in outs))
    print("sanitize_dsa_indexer_bwd: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
