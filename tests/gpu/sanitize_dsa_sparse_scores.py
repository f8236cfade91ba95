"""One small config per sparse score recompute kernel (dense with topk_length and invalid slots; THD with a tail),
and the attention kernel (HEAD_SPLIT schedule) also dense with topk_length over several blocks a row, for
compute-sanitizer racecheck/memcheck; exits non-zero if any output element is left unwritten (NaN).
SANITIZE_KNOBS="NAME=VALUE,..." (ops.common.switches.knob_specs; spaces also separate) sets class knobs of both kernels first (e.g. LEAN_GATHER=0: the indexer's copies rebuilt per piece)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.common.switches import knob_specs  # noqa: E402
from ops.dsa.attn_score.sparse import sparse_attn_score_fwd  # noqa: E402
from ops.dsa.attn_score.sparse_sm90 import SparseAttnScoreSm90  # noqa: E402
from ops.dsa.indexer.sparse import sparse_indexer_fwd  # noqa: E402
from ops.dsa.indexer.sparse_sm90 import SparseIndexerScoreSm90  # noqa: E402

# knob_specs takes ',' between specs; a space, this script's former separator, is read as one too
for _name, _value in knob_specs(os.environ.get("SANITIZE_KNOBS", "").replace(" ", ",")).items():
    for _cls in (SparseIndexerScoreSm90, SparseAttnScoreSm90):
        assert hasattr(_cls, _name), f"SANITIZE_KNOBS: {_cls.__name__} has no knob {_name}"
        setattr(_cls, _name, _value)
    print(f"sanitize_dsa_sparse_scores: {_name} = {_value}")


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
    s, st = torch.full(idx.shape, nan, device=dev), torch.full((2, 3), nan, device=dev)
    sparse_indexer_fwd(q, k, w, idx, s, st, topk_length=tl, stream=stream)
    outs += [s, st]
    cu_q = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 100, 101, 180], dtype=torch.int32, device=dev)
    qa = torch.randn(9, 128, 576, device=dev).bfloat16()
    kva = torch.randn(190, 576, device=dev).bfloat16()
    lse = torch.randn(128, 9, device=dev) + 6
    ia = torch.randint(-1, 110, (9, 130), device=dev, dtype=torch.int32)
    sa, la = torch.full(ia.shape, nan, device=dev), torch.full((9,), nan, device=dev)
    sparse_attn_score_fwd(qa, kva, lse, ia, sa, la, softmax_scale=0.04, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                          stream=stream)
    outs += [sa, la]
    qd = torch.randn(1, 3, 128, 576, device=dev).bfloat16()
    kvd = torch.randn(1, 400, 576, device=dev).bfloat16()
    lsed = torch.randn(1, 128, 3, device=dev) + 6
    idd = torch.randint(-1, 410, (1, 3, 300), device=dev, dtype=torch.int32)
    tld = torch.tensor([[300, 0, 150]], dtype=torch.int32, device=dev)
    sd, ld = torch.full(idd.shape, nan, device=dev), torch.full((1, 3), nan, device=dev)
    sparse_attn_score_fwd(qd, kvd, lsed, idd, sd, ld, softmax_scale=0.04, topk_length=tld, stream=stream)
    outs += [sd, ld]
    torch.cuda.synchronize()
    bad = int(sum(torch.isnan(t).sum() for t in outs))
    print("sanitize_dsa_sparse_scores: unwritten (NaN) elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
