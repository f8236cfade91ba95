"""One small config per dense indexer backward flavour (BSHD causal with ratio 2, q_offsets and fp32 weights; THD
non-causal with bf16 weights, an empty segment and a tail) for compute-sanitizer racecheck/memcheck; exits non-zero
if any output element is left unwritten (NaN: d_index_q, d_weights and d_index_k are NaN-poisoned, the seam zeroes
d_index_k before accumulating). Each config runs in deterministic mode too (chunks of 2 and 4 rows, poisoned
staging: tests/gpu/workspace.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.indexer.dense_bwd import dense_indexer_bwd  # noqa: E402
from workspace import TorchWorkspace  # noqa: E402


def poisoned(q, k, w):
    nan = float("nan")
    return (torch.full(q.shape, nan, device=q.device).bfloat16(), torch.full(k.shape, nan, device=q.device),
            torch.full(w.shape, nan, device=q.device))


def main():
    torch.manual_seed(0)
    dev = "cuda"
    stream = torch.cuda.current_stream().cuda_stream
    c = torch.tensor([0.5], device=dev)
    outs = []
    q = torch.randn(2, 5, 64, 128, device=dev).bfloat16()
    k = torch.randn(2, 150, 128, device=dev).bfloat16()
    w = torch.randn(2, 5, 64, device=dev)
    s, a = torch.randn(2, 5, 150, device=dev), torch.rand(2, 5, 150, device=dev)
    lse, l1 = torch.randn(2, 5, device=dev) + 5, a.sum(-1)
    off = torch.tensor([140, 3], dtype=torch.int32, device=dev)
    for det in (False, True):
        dq, dk, dw = poisoned(q, k, w)
        dense_indexer_bwd(q, k, w, s, lse, a, l1, c, dq, dk, dw, causal=True, ratio=2, q_offsets=off,
                          deterministic=det, workspace=TorchWorkspace(), workspace_bytes=2 * 2 * 150 * 128 * 4,
                          stream=stream)
        outs += [dq, dk, dw]
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 100, 101, 180], dtype=torch.int32, device=dev)
    qa, ka = torch.randn(9, 16, 64, device=dev).bfloat16(), torch.randn(190, 64, device=dev).bfloat16()
    wa = torch.randn(9, 16, device=dev).bfloat16()
    sa, aa = torch.randn(9, 100, device=dev), torch.rand(9, 100, device=dev)
    la, l1a = torch.randn(9, device=dev) + 5, aa.sum(-1)
    for det in (False, True):
        dqa, dka, dwa = poisoned(qa, ka, wa)
        dense_indexer_bwd(qa, ka, wa, sa, la, aa, l1a, c, dqa, dka, dwa, causal=False, cu_seqlens_q=cu_q,
                          cu_seqlens_k=cu_k, deterministic=det, workspace=TorchWorkspace(),
                          workspace_bytes=4 * 100 * 64 * 4, stream=stream)
        outs += [dqa, dka, dwa]
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t.float()).sum() for t in outs))
    print("sanitize_dsa_indexer_dense_bwd: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
