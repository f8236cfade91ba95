"""CPU model of a causal flash-attention launch's tail: greedy dispatch of CTAs in linear block order onto 132 SMs,
one CTA an SM, a CTA's time = its key blocks (forward: one per key block its query block sees; backward: one per
query tile its key block sees) + a fixed part. Compares the per-head order (each (batch, head) pair's tiles longest
first, pair after pair: the kernels' order before LPT_MB) with ops.common.launch_order's LPT order at a given section
size, as the fraction of the ideal (total work / 132) the launch reaches. A model, not a measurement: the timings
are bench/ab_flash_fwd.py's and bench/ab_flash_bwd.py's (docs/performance.md, the LPT trial).

Run:  python bench/launch_order_model.py [--sms 132] [--fixed 1.5]
"""
import argparse
import heapq
import math


def makespan(costs, sms):
    free = [0.0] * sms
    end = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def lpt_order(n_ranks, n_pairs, sec):
    """Rank of each launch position in LPT order (the remainder section first), as launch_order.lpt_tile."""
    sec = max(1, min(sec, n_pairs))
    rem = n_pairs % sec
    sizes = ([rem] if rem else []) + [sec] * (n_pairs // sec)
    return [r for n in sizes for r in range(n_ranks) for _ in range(n)]


def main(a):
    print(f"# fraction of the ideal a causal launch reaches, {a.sms} SMs; per head -> LPT (section sizes)")
    secs = (2, 4, 6, 8, 0)
    print(f"{'kernel':9s} {'S':>6s} {'D':>4s} {'pairs':>5s} {'per head':>9s} " +
          " ".join(f"{'sec ' + (str(s) if s else 'all'):>8s}" for s in secs))
    for kernel, tile, rows in (("forward", {64: 192, 128: 128}, 128), ("backward", {64: 128, 128: 64}, 128)):
        for S in (2048, 4096, 8192, 16384):
            pairs = 32 if S <= 8192 else 16
            for D in (64, 128):
                if kernel == "forward":       # query block m (rank 0 = the last, longest) sees ceil(min((m+1) BM, S) / 128)
                    bm = tile[D]
                    n = math.ceil(S / bm)
                    cost = lambda r: math.ceil(min((n - r) * bm, S) / rows) + a.fixed  # noqa: E731
                else:                         # key block nb = rank sees the query tiles from nb * 128 / BM on
                    bm = tile[D]
                    n = math.ceil(S / rows)
                    cost = lambda r: math.ceil(S / bm) - (r * rows) // bm + a.fixed  # noqa: E731
                per_head = [cost(r) for _ in range(pairs) for r in range(n)]
                ideal = sum(per_head) / a.sms
                cells = [ideal / makespan([cost(r) for r in lpt_order(n, pairs, s or pairs)], a.sms) for s in secs]
                print(f"{kernel:9s} {S:6d} {D:4d} {pairs:5d} {ideal / makespan(per_head, a.sms):9.3f} " +
                      " ".join(f"{c:8.3f}" for c in cells))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--fixed", type=float, default=1.5, help="a CTA's fixed part, in key-block units")
    main(p.parse_args())
