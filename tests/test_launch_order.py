"""ops/common/launch_order.lpt_rank_pair, the LPT launch order of the flash kernels' LPT_MB knob, on Python ints (the
same lines the kernels trace): a bijection of the launch positions onto (rank, pair), the remainder section first,
each section rank-major over its pairs, and the longest rank of every pair dispatched before any pair's next rank
within its section."""
import itertools

import pytest

from ops.common.launch_order import lpt_rank_pair

CASES = [(n_ranks, n_pairs, sec) for n_ranks, n_pairs, sec in
         itertools.product((1, 2, 7, 43, 64), (1, 2, 3, 5, 16, 32, 33), (1, 2, 3, 6, 8, 40))]


@pytest.mark.parametrize("n_ranks,n_pairs,sec", CASES)
def test_bijection_and_order(n_ranks, n_pairs, sec):
    seen = [lpt_rank_pair(lin, n_ranks, n_pairs, sec) for lin in range(n_ranks * n_pairs)]
    assert sorted(seen) == [(r, p) for r in range(n_ranks) for p in range(n_pairs)], "not a bijection"
    s = max(1, min(sec, n_pairs))
    rem = n_pairs % s
    sizes = ([rem] if rem else []) + [s] * (n_pairs // s)
    expect, base = [], 0
    for n in sizes:                                   # remainder section first, then full ones, each rank-major
        expect += [(r, base + p) for r in range(n_ranks) for p in range(n)]
        base += n
    assert seen == expect


def test_sec_clamped():
    """sec 0 or past the pair count acts as 1 / as all pairs (the kernels clamp what the L2 budget gives)."""
    assert [lpt_rank_pair(i, 3, 4, 0) for i in range(12)] == [lpt_rank_pair(i, 3, 4, 1) for i in range(12)]
    assert [lpt_rank_pair(i, 3, 4, 99) for i in range(12)] == [(i // 4, i % 4) for i in range(12)]
