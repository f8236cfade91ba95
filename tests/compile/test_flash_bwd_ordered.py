"""CPU check of the ordered deterministic flash-attention backward's turn rule (backward_fast_sm90.py, ordered=True;
ops/common/tile_order.py), with the kernel's index arithmetic mirrored in Python:

- every dQ tile's writers get the turns 0, 1, ..., each once (mode 1: both warpgroups of a key block add to the
  same columns, warpgroup 0 first), or 0, 2, 4, ... twice (mode 2: disjoint column halves), highest key block first;
- no schedule deadlocks when CTAs are dispatched in linear block order (key block grid_n - 1 - blockIdx.x) onto as
  few as one resident CTA at a time, with each warpgroup's turn passed one tile late (at its next reduce or at its
  end), the two-stage ring coupling the warpgroups, and mode 2's pair barriers;
- the final sums per tile come out in the same order on every schedule.
Shapes: causal, windows bounded on either side, Sq != Sk both ways, varlen segments (empty ones included), GQA.
The mirror follows the kernel line by line; the H200 tests (tests/gpu/test_flash_bwd.py, test_ordered_*) run the
kernel itself."""
import itertools
import os
import random
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ops.common.mask import UNBOUNDED  # noqa: E402

BM, BN = 64, 128   # backward_fast_sm90.BLOCK_M_FAST, BLOCK_N_FAST (BM 128: the BM128_DIMS knob, row-split dQ)


@pytest.fixture(autouse=True, params=[64, 128], ids=["bm64", "bm128"])
def _query_tile_rows(request, monkeypatch):
    """Every check at both query-tile heights the kernel has (64; 128 with FlashBwdSm90Fast.BM128_DIMS, where both
    warpgroups reduce disjoint row halves of a tile and take one turn, as dq_cols=True models)."""
    monkeypatch.setitem(globals(), "BM", request.param)


def window(causal, left, right):
    """ops/common/mask.effective_window without its cutlass import path."""
    left_eff = UNBOUNDED if left < 0 else left
    right_eff = UNBOUNDED if right < 0 else right
    if causal:
        right_eff = 0 if right < 0 else min(right_eff, 0)
    return left_eff, right_eff


def tdiv(a, b):
    """The DSL's Int32 ``//`` (floor division in the PTX: a shift and a select); the kernel only divides
    numerators that are >= 0 here, where floor and truncation agree."""
    return a // b


def cta_tiles(nb, slen_q, slen_k, wl, wr):
    """_main_fast's query blocks of key block nb (one query head), in order."""
    n0 = nb * BN
    if not n0 < slen_k:
        return []
    off = slen_k - slen_q
    i_lo = max(n0 - off - wr, 0)
    i_hi = min(n0 + BN - 1 - off + wl, slen_q - 1)
    m_min = tdiv(i_lo, BM)
    m_max = tdiv(max(i_hi + 1, 0) + BM - 1, BM)
    nm = max(m_max - m_min, 0)
    return list(range(m_min, m_min + nm))


def turn(nb, m, cwg, slen_q, slen_k, wr, dq_cols, grid_n=None):
    """_turns + the turn expression of _main_fast (grid_n: the launched key blocks, max_seqlen_k's)."""
    off = slen_k - slen_q
    right = min(wr, slen_q + slen_k)
    grid_n = (slen_k + BN - 1) // BN if grid_n is None else grid_n
    a = min(tdiv(slen_k - 1, BN), grid_n - 1) - nb
    c = BM + off + right - 1 - nb * BN
    assert m * BM + c >= 0, "the truncating division would differ from floor"
    t = 2 * min(a, tdiv(m * BM + c, BN))
    return t if dq_cols else t + cwg


def slot0(b, row0):
    """_turn_slot0: row0 = the segment's first row over all segments end to end (varlen off_q, dense b Sq)."""
    return b + tdiv(row0, BM)


def test_turn_slots_injective():
    """Every dQ tile (segment, query block) of a head has its own counter, inside the buffer bwd.py allocates
    (segments + ceil(rows / 64) a head), for varlen segments of any lengths (empty ones included) and dense batches."""
    rng = random.Random(3)
    layouts = [[rng.randrange(0, 300) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    layouts += [[0], [1], [64], [65], [0, 0, 5], [63, 1, 64, 0, 129]]
    for lens in layouts:
        for dense in (False, True):
            if dense:
                lens = [max(lens)] * len(lens)
            rows = sum(lens)
            n_slots = len(lens) + (rows + BM - 1) // BM
            seen = set()
            row0 = 0
            for b, n in enumerate(lens):
                for m in range((n + BM - 1) // BM):
                    s = slot0(b, row0) + m
                    assert 0 <= s < n_slots and s not in seen, (lens, b, m)
                    seen.add(s)
                row0 += n


def segments(rng):
    kinds = []
    for sq, sk in [(1, 1), (17, 17), (255, 255), (1000, 1000), (300, 190), (113, 603), (1, 257), (255, 17),
                   (700, 1100), (4097, 4097), (0, 5), (5, 0)]:
        kinds.append([(sq, sk)])
    for _ in range(6):
        kinds.append([(rng.randrange(0, 700), rng.randrange(0, 700)) for _ in range(rng.randrange(1, 5))])
    return kinds


WINDOWS = [(False, -1, -1), (True, -1, -1), (False, 32, 16), (True, 100, 7), (False, -1, 0), (False, 0, 300),
           (False, 64, -1), (False, 0, 0), (True, 64, -1)]


def test_turns_cover_each_tile_once():
    rng = random.Random(5)
    n_tiles = 0
    for segs, (causal, l, r), dq_cols in itertools.product(segments(rng), WINDOWS, (False, True)):
        wl, wr = window(causal, l, r)
        for sq, sk in segs:
            if sq == 0 or sk == 0:
                continue
            grid_n = (sk + BN - 1) // BN
            writers = {}
            for nb in range(grid_n):
                for m in cta_tiles(nb, sq, sk, wl, wr):
                    assert 0 <= m < (sq + BM - 1) // BM
                    for cwg in (0, 1):
                        writers.setdefault(m, []).append((turn(nb, m, cwg, sq, sk, wr, dq_cols), nb, cwg))
            for m, w in writers.items():
                n_blocks = len(w) // 2
                turns = sorted(t for t, _, _ in w)
                want = sorted([2 * k for k in range(n_blocks)] * 2) if dq_cols else list(range(2 * n_blocks))
                assert turns == want, (sq, sk, causal, l, r, m, w)
                # highest key block first
                by_turn = sorted(w)
                assert [nb for _, nb, _ in by_turn] == sorted((nb for _, nb, _ in w), reverse=True)
                n_tiles += 1
    assert n_tiles > 1000


def simulate(segs, wl, wr, heads, dq_cols, resident, rng, qpk=1, grid_n=None):
    """Runs every CTA's two warpgroups as step machines; returns the order of writers per tile, or raises on a
    deadlock. CTAs (key block, kv head, segment) are dispatched in linear order, nb = grid_n - 1 - x fastest; a CTA
    walks its qpk query heads (GQA) outer, its query blocks inner, as _main_fast's it // nm, it % nm. grid_n: the
    launched key blocks (default: enough for the longest segment; fewer models a max_seqlen_k below it)."""
    if grid_n is None:
        grid_n = max(1, max((sk + BN - 1) // BN for _, sk in segs))
    ctas = [(grid_n - 1 - x, h, b) for b in range(len(segs)) for h in range(heads) for x in range(grid_n)]
    counters, order = {}, {}
    queue, live = list(ctas), []

    def start(cta):
        nb, h, b = cta
        sq, sk = segs[b]
        tiles = [(h * qpk + j, m) for j in range(qpk) for m in cta_tiles(nb, sq, sk, wl, wr)] if sq and sk else []
        wgs = [dict(i=0, phase="compute", last=None) for _ in range(2)]
        return dict(cta=cta, tiles=tiles, wgs=wgs, released=[0, 0], computed=[0, 0])

    def step(c, w):
        """One step of warpgroup w of CTA c; False if it must wait."""
        nb, h, b = c["cta"]
        sq, sk = segs[b]
        g = c["wgs"][w]
        tiles = c["tiles"]
        if g["phase"] == "done":
            return False
        if g["i"] == len(tiles):
            if g["last"] is not None:                       # after the loop: pass the last tile's turn
                counters[g["last"]] = counters.get(g["last"], 0) + 1
                g["last"] = None
                return True
            g["phase"] = "done"
            return True
        i = g["i"]
        if g["phase"] == "compute":                         # needs stage i loaded: both released tile i - 2
            if i >= 2 and min(c["released"]) < i - 1:
                return False
            c["computed"][w] = i + 1
            g["phase"] = "pair"
            return True
        if g["phase"] == "pair":                            # mode 2: both halves of dS written before the dQ MMA
            if dq_cols and c["computed"][1 - w] < i + 1:
                return False
            c["released"][w] = i + 1
            g["phase"] = "reduce"
            return True
        if g["phase"] == "reduce":
            if g["last"] is not None:                       # the previous tile's reduce done: pass its turn
                counters[g["last"]] = counters.get(g["last"], 0) + 1
                g["last"] = None
                return True
            hh, m = tiles[i]
            key = (b, hh, m)
            if counters.get(key, 0) < turn(nb, m, w, sq, sk, wr, dq_cols, grid_n):
                return False
            order.setdefault(key, []).append((nb, w))
            g["last"] = key
            g["i"] = i + 1
            g["phase"] = "compute"
            return True
        raise AssertionError(g)

    while queue or live:
        while queue and len(live) < resident:
            live.append(start(queue.pop(0)))
        moves = [(c, w) for c in live for w in (0, 1)]
        rng.shuffle(moves)
        progressed = False
        for c, w in moves:
            if step(c, w):
                progressed = True
                break
        if not progressed:
            raise RuntimeError(f"deadlock: {[(c['cta'], [g['phase'] for g in c['wgs']]) for c in live]}")
        live = [c for c in live if any(g["phase"] != "done" for g in c["wgs"])]
    return order


@pytest.mark.parametrize("dq_cols", [False, True])
@pytest.mark.parametrize("resident", [1, 2, 7])
def test_no_deadlock_and_fixed_order(dq_cols, resident):
    rng = random.Random(11 + resident + 100 * dq_cols)
    cases = [([(1000, 1000)], window(True, -1, -1)), ([(700, 1100)], window(False, -1, -1)),
             ([(900, 900)], window(True, 100, 7)), ([(640, 640)], window(False, 0, 300)),
             ([(777, 500)], window(False, 64, -1)), ([(300, 190), (113, 603)], window(True, -1, -1)),
             ([(0, 5), (1, 0), (17, 40), (282, 160)], window(False, -1, -1)),
             ([(rng.randrange(1, 900), rng.randrange(1, 900)) for _ in range(3)], window(False, 200, 50))]
    for segs, (wl, wr) in cases:
        first = simulate(segs, wl, wr, 2, dq_cols, resident, random.Random(1), qpk=2)
        again = simulate(segs, wl, wr, 2, dq_cols, resident, random.Random(2), qpk=2)
        if dq_cols:   # the two warpgroups of a key block share a turn (disjoint columns): compare key blocks
            first = {k: [nb for nb, _ in v] for k, v in first.items()}
            again = {k: [nb for nb, _ in v] for k, v in again.items()}
        assert first == again, "the writers' order of a tile depends on the schedule"
        for key, ws in first.items():
            nbs = ws if dq_cols else [nb for nb, _ in ws]
            assert nbs == sorted(nbs, reverse=True), (key, ws)


@pytest.mark.parametrize("dq_cols", [False, True])
def test_no_deadlock_when_max_seqlen_k_is_too_small(dq_cols):
    """A max_seqlen_k below a segment's keys launches too few key blocks (wrong gradients, the caller's contract, as in
    the other modes): the turns stop at the grid's last key block, so nothing waits for a CTA never launched."""
    for segs, (wl, wr) in [([(1000, 1000)], window(False, -1, -1)), ([(900, 900)], window(True, -1, -1)),
                           ([(300, 700), (50, 900)], window(False, 100, 7))]:
        for grid_n in (1, 2, 3):
            order = simulate(segs, wl, wr, 1, dq_cols, 1, random.Random(3), grid_n=grid_n)
            assert all(nb < grid_n for ws in order.values() for nb, _ in ws)
