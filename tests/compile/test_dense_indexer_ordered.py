"""CPU check of the dense indexer backward's ordered deterministic form (dense_bwd_sm90.py, ordered=True), its index
arithmetic mirrored in Python: for every key block of every batch / sequence, the rows that add into it get the turns
0, 1, ... each once, in launch order (so each d_index_k element's sum runs over its rows in a fixed order and no
row waits for a row launched after it), and the counter slots are distinct and inside the buffer the seam
allocates. BSHD and THD, causal (rows launched longest first) and not, ratio, q_offsets, empty sequences, tail rows.
The H200 tests (tests/gpu/test_dsa_indexer_dense_bwd.py, both deterministic forms) run the kernel itself."""
import random

BK = 64


def visible_limit(t, pos0, causal, ratio, seqlen_k):
    """ops/common/head_sum_sm90.visible_limit (non-negative operands: floor = truncation)."""
    if not causal:
        return seqlen_k
    return max(min((pos0 + t + 1) // ratio if pos0 + t + 1 >= 0 else -((-(pos0 + t + 1)) // ratio), seqlen_k), 0)


def launches(lens_q, lens_k, offsets, causal, ratio, width, thd, tail):
    """Yields (launch index, counter slot of block 0, turn, blocks) per query row, in launch order, as
    dense_kernel computes them."""
    if thd:
        cu_q = [0]
        for n in lens_q:
            cu_q.append(cu_q[-1] + n)
        cu_k = [0]
        for n in lens_k:
            cu_k.append(cu_k[-1] + n)
        gx = cu_q[-1] + tail
        for bx in range(gx):
            row = gx - 1 - bx if causal else bx
            if row >= cu_q[-1]:
                continue                                    # clear_row: no blocks
            b = max(i for i in range(len(lens_q)) if cu_q[i] <= row < cu_q[i + 1])
            seqlen_k = cu_k[b + 1] - cu_k[b]
            lim = min(visible_limit(row - cu_q[b], offsets[b], causal, ratio, seqlen_k), width)
            turn = cu_q[b + 1] - 1 - row if causal else row - cu_q[b]
            yield bx, b + cu_k[b] // BK, turn, (lim + BK - 1) // BK, b
    else:
        Sq, Sk = lens_q[0], lens_k[0]
        for batch in range(len(lens_q)):
            for bx in range(Sq):
                row = Sq - 1 - bx if causal else bx
                lim = min(visible_limit(row, offsets[batch], causal, ratio, Sk), width)
                yield batch * Sq + bx, batch + (batch * Sk) // BK, bx, (lim + BK - 1) // BK, batch


def check(lens_q, lens_k, offsets, causal, ratio, thd, tail=0):
    width = max(lens_k) if lens_k else 0
    n_seq = len(lens_q)
    n_slots = n_seq + (sum(lens_k) + BK - 1) // BK
    writers = {}
    for order, slot0, turn, n_blk, seq in launches(lens_q, lens_k, offsets, causal, ratio, width, thd, tail):
        for n in range(n_blk):
            writers.setdefault((seq, n), []).append((order, turn, slot0 + n))
    slots = {}
    for (seq, n), ws in writers.items():
        assert sorted(t for _, t, _ in ws) == list(range(len(ws))), (seq, n, ws)
        assert [t for _, t, _ in sorted(ws)] == list(range(len(ws))), "turns must follow launch order"
        (slot,) = {s for _, _, s in ws}
        assert 0 <= slot < n_slots and slots.setdefault(slot, (seq, n)) == (seq, n), (slot, seq, n)
    return len(writers)


def test_bshd():
    n = 0
    for causal in (True, False):
        for ratio in (1, 2, 4):
            for offs in ([0, 0], [140, 3], [5, 0]):
                n += check([70, 70], [300, 300], offs, causal, ratio, thd=False)
                n += check([5, 5], [150, 150], offs, causal, ratio, thd=False)
    assert n > 100


def test_thd():
    rng = random.Random(7)
    n = check([5, 0, 37, 1, 20], [300, 40, 129, 1, 517], [0, 3, -5, 2, 10], True, 1, thd=True, tail=6)
    n += check([3, 0, 4], [100, 1, 79], [0, 0, 0], False, 1, thd=True, tail=2)
    for _ in range(200):
        k = rng.randrange(1, 6)
        lens_q = [rng.randrange(0, 200) for _ in range(k)]
        lens_k = [rng.randrange(1, 400) for _ in range(k)]
        offs = [rng.randrange(-10, 300) for _ in range(k)]
        n += check(lens_q, lens_k, offs, rng.random() < 0.7, rng.choice([1, 2, 4]), thd=True,
                   tail=rng.randrange(0, 5))
    assert n > 1000
