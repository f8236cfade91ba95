"""Small top-k configs for compute-sanitizer racecheck/memcheck, through both kernels: aligned rows (the streaming
kernel, stream_sm90) and the same rows at a 4-byte offset (topk_sm90): ties at the threshold, lengths, rank 3, one
row past the shared-memory cache, one crowded first digit (the streaming kernel's whole-row fallback), rows whose top
k hold short runs of equal keys (the "bucket" ordering's atomic places and ranks; a run over BUCKET_MAX and an outlier
send rows to the "key" ordering, selections that cross zero take its value-linear buckets (and with a sink the
"key" ordering), whose atomic slots and in-place run sort run too, and a long run on to the pair
network), and the column order (order="column": the bitmap, and the key sort on
~column for a row wider than the bitmap), and rows the streaming kernel's one-read select sends back to its two
passes (more than 4096 candidates; a misleading sample). Exits
non-zero if any output element is left unwritten (-7). TOPK_KNOBS="NAME=VALUE,...": TopkStreamSm90 knobs on trial
(ints, strings, a:b tuples)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.topk.fwd import topk_fwd  # noqa: E402


def main():
    from ops.dsa.topk import stream_sm90
    from ops.common.switches import knob_specs
    for name, value in knob_specs(os.environ.get("TOPK_KNOBS", "")).items():    # knobs on trial, as test_dsa_topk
        assert hasattr(stream_sm90.TopkStreamSm90, name), f"TOPK_KNOBS: no knob {name}"
        setattr(stream_sm90.TopkStreamSm90, name, value)
    torch.manual_seed(0)
    dev = "cuda"
    stream = torch.cuda.current_stream().cuda_stream
    s = (torch.randn(2, 3, 900, device=dev) * 2).round()
    ln = torch.tensor([[900, 0, 500], [17, 899, 1000]], dtype=torch.int32, device=dev)
    out = torch.full((2, 3, 100), -7, dtype=torch.int32, device=dev)
    topk_fwd(s, out, lengths=ln, stream=stream)
    s2 = torch.randn(1, 41000, device=dev).round()
    out2 = torch.full((1, 64), -7, dtype=torch.int32, device=dev)
    topk_fwd(s2, out2, stream=stream)
    outs = [out, out2]
    crowded = 1.0 + torch.rand(2, 12000, device=dev)
    runs = (torch.randn(4, 8192, device=dev) * 3000).round()   # the "key" sort: runs of 2..8 equal keys (atomics)
    runs[1, :8] = 30000.0
    runs[2, :40] = 30000.0                                      # a bucket over BUCKET_MAX: "key", then the pair network
    runs[3, 5] = 3e38                                           # an outlier: few buckets, the "bucket" sort's fallback
    fallback = torch.randn(2, 8192, device=dev)                 # the one-read select's fallbacks (TopkStreamSm90.SAMPLE)
    fallback[0] = 1.5                                           # more than 4096 candidates
    fallback[1, [((t * 2048) // 512) * 4 for t in range(0, 512, 2)]] = 100.0    # a misleading sample
    cross = torch.randn(2, 2500, device=dev)                   # selections that cross zero: value-linear buckets,
    cross[1, 5] = 1e6                                           # and with a sink: the network
    for x in (s.reshape(6, 900), s2, crowded, runs, fallback, cross):
        buf = torch.empty(x.shape[0], x.shape[1] + 4, device=dev)
        buf[:, 1:x.shape[1] + 1] = x
        for src in (x, buf[:, 1:x.shape[1] + 1]):
            for k in (64, 300, 2048):               # the sorts at P < 512 (one pair a thread or none), E = 1, E = 4
                o = torch.full((x.shape[0], k), -7, dtype=torch.int32, device=dev)
                topk_fwd(src, o, stream=stream)
                outs.append(o)
    for x, k, ln_ in ((s, 100, ln), (runs, 2048, None), (torch.randn(2, 140000, device=dev), 300, None)):
        o = torch.full((*x.shape[:-1], k), -7, dtype=torch.int32, device=dev)   # column order: bitmap, key sort
        topk_fwd(x, o, lengths=ln_, order="column", stream=stream)
        outs.append(o)
    torch.cuda.synchronize()
    bad = int(sum((o == -7).sum() for o in outs))
    print("sanitize_dsa_topk: unwritten elements:", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
