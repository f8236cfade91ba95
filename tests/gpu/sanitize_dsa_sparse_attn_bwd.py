"""One small config per sparse attention backward flavour (dense with topk_length, sink, dlse and invalid slots; THD
with an empty segment and a tail), each also in deterministic mode in chunks (the staging kernel, the framework's
sort, the segment sums; staging buffers NaN-poisoned), for compute-sanitizer racecheck/memcheck; exits non-zero if any
output element is left unwritten (NaN: dq, d_sink_rows and dkv are NaN-poisoned, the seam zeroes dkv before
accumulating) or a staging row is read unwritten (its NaN reaches dkv)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.sparse_attn.bwd import sparse_attn_bwd  # noqa: E402
from workspace import TorchWorkspace as Workspace  # noqa: E402


def main():
    torch.manual_seed(0)
    dev, nan = "cuda", float("nan")
    stream = torch.cuda.current_stream().cuda_stream
    outs = []
    q = torch.randn(2, 3, 128, 576, device=dev).bfloat16()
    kv = torch.randn(2, 300, 576, device=dev).bfloat16()
    idx = torch.randint(-1, 310, (2, 3, 100), device=dev, dtype=torch.int32)
    tl = torch.randint(0, 110, (2, 3), device=dev, dtype=torch.int32)
    sink = torch.randn(128, device=dev)
    out, dout = torch.randn(2, 3, 128, 512, device=dev).bfloat16(), torch.randn(2, 3, 128, 512, device=dev).bfloat16()
    lse, dlse = torch.randn(2, 128, 3, device=dev) + 5, torch.randn(2, 128, 3, device=dev)
    for det in (False, True):
        dq, dkv = torch.full(q.shape, nan, device=dev).bfloat16(), torch.full(kv.shape, nan, device=dev)
        ds = torch.full((2, 3, 128), nan, device=dev)
        sparse_attn_bwd(q, kv, idx, out, dout, lse, dq, dkv, softmax_scale=0.04, attn_sink=sink, d_sink_rows=ds,
                        dlse=dlse, topk_length=tl, deterministic=det, workspace=Workspace(),
                        workspace_bytes=2 * 100 * 2 * 576 * 4, stream=stream)       # chunks of one row
        outs += [dq, dkv, ds]
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 100, 101, 180], dtype=torch.int32, device=dev)
    qa, kva = torch.randn(9, 64, 512, device=dev).bfloat16(), torch.randn(190, 512, device=dev).bfloat16()
    ia = torch.randint(-1, 110, (9, 70), device=dev, dtype=torch.int32)
    oa, doa = torch.randn(9, 64, 512, device=dev).bfloat16(), torch.randn(9, 64, 512, device=dev).bfloat16()
    la = torch.randn(64, 9, device=dev) + 5
    for det in (False, True):
        dqa, dkva = torch.full(qa.shape, nan, device=dev).bfloat16(), torch.full(kva.shape, nan, device=dev)
        sparse_attn_bwd(qa, kva, ia, oa, doa, la, dqa, dkva, softmax_scale=0.04, cu_seqlens_q=cu_q,
                        cu_seqlens_k=cu_k, deterministic=det, workspace=Workspace(), workspace_bytes=4 * 70 * 512 * 4,
                        stream=stream)                                                  # chunks of 4 rows
        outs += [dqa, dkva]
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t.float()).sum() for t in outs))
    print("sanitize_dsa_sparse_attn_bwd: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
