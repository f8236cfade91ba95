"""Where the top-k kernel's time goes (H200 diagnostic): one row per input kind / k / width, device ms each.

Rows: random normal scores (no -inf) at W 32K with k 2048 and k 64 (the sort shrinks from 2048 to 64 elements),
W 4K with k 2048 (a row an eighth as long), causal scores (row i: i + 1 finite columns, the rest -inf, as the
indexer writes them) and rounded scores (randn x 4000 rounded: the top 2048 hold runs of 2-5 equal keys). With
--ncu, run only the first row once (in column order with --column) (for `ncu -k regex:Topk --launch-count 1`: name
the kernel, the inputs' torch.randn kernels launch first; 2026-12-03 17:20 an unfiltered `-k regex:kernel` profiled
torch's randn).

Rows use the default ordering of the selection (sort_sm90.SelectionSort.SORT "bucket": a counting sort by key range
and a rank inside each bucket, the default since 2026-12-06); --sorts bucket,key,regs,smem times every row with each
(key: a key-only network and slots by rank, the default 2026-12-05/06; regs: the (key, column) pair network in
registers / shuffles, the default until 2026-12-05; smem: the pair network in shared memory); --column adds order="column" (the
selection in ascending column order through a bitmap, no sort). Every row runs on the streaming kernel
(stream_sm90, the default for aligned rows) and on the row-caching one (topk_sm90;
fwd.STREAM False).

--ncu --peer: one warmed-up launch of ours and one of cuDNN frontend's indexer_top_k_wrapper (32K rows, W 32K, k
2048) between cudaProfilerStart / Stop, for tests/gpu/profile_pair.sh topk Topk python3 bench/topk_breakdown.py
--ncu --peer --first --rows 8192.

--stages times the streaming kernel stopped after each stage (pass A; the threshold; the gathered selection; whole).

--causal-lengths: --stages, --sweep and --ncu take the causal row (row i: i W / R + 1 finite columns) with those counts as
the rows' lengths, ours and cuDNN's alike (bench/dsa_indexer.py's like-for-like top-k row: a row's cost is then
mostly its fixed part, not its read).

Run:  python bench/topk_breakdown.py [--rows N] [--ncu] [--sorts bucket,key,regs,smem] [--no-cached] [--column] [--stages]
                                    [--causal-lengths]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from ops.dsa.topk.fwd import topk_fwd  # noqa: E402
from timing import cudnn_dsa, device_time, profile_launches  # noqa: E402


def topk_cases(R):
    """The rows of the top-k benchmarks: [(name, fp32 scores [R, W], k)] (module docstring), seeded."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rand32 = torch.randn(R, 32768, device="cuda", generator=g)
    causal = rand32.clone()
    causal.masked_fill_(torch.arange(32768, device="cuda")[None, :] > torch.arange(R, device="cuda")[:, None] *
                        (32768 // R), float("-inf"))
    return [("randn W32K k2048", rand32, 2048), ("randn W32K k64", rand32, 64),
            ("randn W4K k2048", rand32[:, :4096].contiguous(), 2048), ("causal W32K k2048", causal, 2048),
            ("rounded W32K k2048", (rand32 * 4000).round(), 2048)]


def causal_lengths(R, W):
    """Row i of topk_cases' causal scores has i W / R + 1 finite columns (at most W): its row lengths."""
    return (torch.arange(R, device="cuda", dtype=torch.int32) * (W // R) + 1).clamp_(max=W)


def main(a):
    R = a.rows
    st = torch.cuda.current_stream().cuda_stream
    cases = topk_cases(R)
    lens = None
    if a.causal_lengths:     # the causal row with its finite count as the row length (topk_cases' mask)
        W = cases[3][1].shape[1]
        lens = causal_lengths(R, W)
        cases = [("causal W32K k2048 lengths", cases[3][1], 2048)]
    if a.first:
        cases = cases[:1]
    if a.sweep:
        sweep(cases, R, st, lens)
        return
    if a.stages:
        stages(cases, R, st, lens)
        return
    if a.ncu:
        s, k = cases[0][1], cases[0][2]
        out = torch.empty(R, k, dtype=torch.int32, device="cuda")
        ours = lambda: topk_fwd(s, out, lengths=lens, order="column" if a.column else "score",  # noqa: E731
                                stream=st)
        if not a.peer:         # one launch (ncu -k regex:Topk --launch-count 1)
            ours()
            torch.cuda.synchronize()
            return
        runs = [("ours", ours)]
        dsa = cudnn_dsa()
        if dsa is not None:
            cl = lens if lens is not None else torch.full((R,), s.shape[1], dtype=torch.int32, device="cuda")
            runs.append(("cuDNN frontend", lambda: dsa.indexer_top_k_wrapper(s, cl, k, return_val=False)))
        profile_launches(runs)
        return
    from ops.dsa.topk import fwd, sort_sm90
    for stream in ((True,) if a.no_cached else (True, False)):
        fwd.STREAM = stream
        for sort, order in [(x, "score") for x in a.sorts.split(",")] + [("bucket", "column")] * a.column:
            sort_sm90.SelectionSort.SORT = sort
            fwd._CACHE.clear()
            for name, s, k in cases:
                out = torch.empty(R, k, dtype=torch.int32, device="cuda")
                t, _ = device_time(lambda: topk_fwd(s, out, order=order, stream=st), 5)
                tag = (f" {sort}" if order == "score" else " by column") + (" stream" if stream else " cached")
                print(f"{name + tag:34s} {t * 1e3:8.3f} ms  {R * s.shape[1] * 4 / t / 1e9:7.0f} GB/s", flush=True)


def stages(cases, R, st, lens=None):
    """Where a row's time goes in the streaming kernel: the same launch ended after pass A (since the one-read select,
    stream_sm90 SAMPLE, "A" ends where "threshold" does), after the threshold
    (pass B and passes 1-3), after the selection's gather, and whole (TopkStreamSm90.STOP; the stopped launches'
    output is not the top-k). Differences of consecutive rows are the stages' times."""
    from ops.dsa.topk import fwd, stream_sm90
    fwd.STREAM = True
    for order in ("score", "column"):
        for name, s, k in cases[:1]:
            prev = 0.0
            for stop in ("A", "threshold", "selection", None):
                stream_sm90.TopkStreamSm90.STOP = stop
                fwd._CACHE.clear()
                out = torch.empty(R, k, dtype=torch.int32, device="cuda")
                t, _ = device_time(lambda: topk_fwd(s, out, lengths=lens, order=order, stream=st), 5)
                tag = f"{name} {order} to {stop or 'end'}"
                print(f"{tag:44s} {t * 1e3:8.3f} ms  (+{(t - prev) * 1e3:6.3f})", flush=True)
                prev = t
    stream_sm90.TopkStreamSm90.STOP = None
    fwd._CACHE.clear()


def sweep(cases, R, st, lens=None):
    """The streaming kernel's launch shape: U 16-byte vectors a thread per tile x CTAs an SM (registers capped
    to fit them; ptxas 2026-12-03: (4, 2) 55-63 registers, (2, 3) 38, (1, 4) 32, (8, 1) 121, no spills; (4, 3) and
    (8, 2) spill, so they are not in the list)."""
    from ops.dsa.topk import fwd, stream_sm90
    fwd.STREAM = True
    for u, mb in ((4, 2), (2, 2), (2, 3), (1, 3), (1, 4)):
        stream_sm90.TopkStreamSm90.U, stream_sm90.TopkStreamSm90.MIN_BLOCKS = u, mb
        fwd._CACHE.clear()
        for name, s, k in cases:
            out = torch.empty(R, k, dtype=torch.int32, device="cuda")
            try:
                t, _ = device_time(lambda: topk_fwd(s, out, lengths=lens, stream=st), 5)
                print(f"{name + f' U{u} x{mb}':34s} {t * 1e3:8.3f} ms  {R * s.shape[1] * 4 / t / 1e9:7.0f} GB/s",
                      flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{name + f' U{u} x{mb}':34s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--ncu", action="store_true")
    p.add_argument("--peer", action="store_true", help="with --ncu: also cuDNN frontend's indexer_top_k_wrapper, both "
                   "launches warmed up, then between cudaProfilerStart / Stop (tests/gpu/profile_pair.sh)")
    p.add_argument("--sorts", default="bucket", help="comma list of sort_sm90.SelectionSort.SORT values to time")
    p.add_argument("--no-cached", action="store_true", help="only the streaming kernel")
    p.add_argument("--column", action="store_true", help="also time order=\"column\" (ascending columns, no sort)")
    p.add_argument("--first", action="store_true", help="only the first row (randn W 32K k 2048)")
    p.add_argument("--sweep", action="store_true", help="time the streaming kernel's (U, CTAs an SM) shapes instead")
    p.add_argument("--causal-lengths", action="store_true",
                   help="--stages / --sweep / --ncu on the causal row with its finite counts as row lengths (both sides)")
    p.add_argument("--stages", action="store_true",
                   help="time the streaming kernel ended after each stage instead (TopkStreamSm90.STOP)")
    main(p.parse_args())
