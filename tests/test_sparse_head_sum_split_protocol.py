"""CPU: a model of the HEAD_SPLIT schedule of the sparse score recompute (ops/common/sparse_head_sum_sm90.py): the
producer fills one ring of `stages` chunk buffers in order, publishing chunk g once chunk g + LAG is issued (and the
last LAG at the end); both consumers read every chunk and release chunk c of a block once chunk c + 1 arrived (the
pipelined promotion: head_sum_sm90.mma_block with a second partial, one group a chunk at PROMOTE 4 and 64-column
chunks), the block's last chunk after its own wait; then W1 hands its slot sums to W0 through a 2-stage pipeline
(acquire the empty stage, write, commit; W0 waits, reads, releases). The agents run round-robin as generators; a round
in which none moves is a deadlock. Every (chunks a block, LAG, block count) the kernel allows (lag(): LAG <= stages - 2)
must run to the end with each chunk released by both consumers once; LAG = stages - 1 must deadlock (the model can
fail). The kernel's order is transcribed here by hand: a change to blocks_split / mma_block / the producer loop must
be made here too."""
from agent_model import run_agents


def run(nc, stages, lag, n_blk):
    full, rel, empty_done = set(), {}, {}
    hfull, hempty = [0, 0], [0, 0]          # completed phases of the handoff's full / empty barrier of each stage

    def producer():
        total = n_blk * nc
        for g in range(total):
            prev = g - stages                   # the stage's previous chunk, released by both consumers
            while prev >= 0 and empty_done.get(prev, 0) < 2:
                yield ("acquire", g)
            if g >= lag:
                full.add(g - lag)
        for g in range(max(total - lag, 0), total):
            full.add(g)

    def wait(g):
        while g not in full:
            yield ("wait", g)

    def release(w, g):
        who = rel.setdefault(g, set())
        assert w not in who, f"W{w} released chunk {g} twice"
        who.add(w)
        empty_done[g] = empty_done.get(g, 0) + 1

    def consumer(w):
        for n in range(n_blk):
            base = n * nc
            yield from wait(base)
            for c in range(1, nc):
                yield from wait(base + c)
                release(w, base + c - 1)
            release(w, base + nc - 1)
            s, lap = n % 2, n // 2
            if w == 1:
                while hempty[s] < lap:          # W0 read this stage's previous use (block n - 2)
                    yield ("hacquire", n)
                hfull[s] += 1
            else:
                while hfull[s] < lap + 1:
                    yield ("hwait", n)
                hempty[s] += 1

    res = run_agents({"producer": producer(), "W0": consumer(0), "W1": consumer(1)})
    if res != "ok":
        return res
    for g in range(n_blk * nc):
        assert rel.get(g) == {0, 1}, f"chunk {g} released by {rel.get(g)}"
    return "ok"


def test_split_schedule_runs_through():
    from ops.common import sparse_head_sum_sm90 as m
    for nc in (8, 9):                       # Dqk 512 and 576 in 64-column chunks
        for lag in range(1, 8 - 1):
            for n_blk in range(6):
                assert run(nc, 8, lag, n_blk) == "ok", (nc, lag, n_blk)
    assert m.SparseHeadSumSm90.LAG <= 8 - 2


def test_lag_past_the_bound_deadlocks():
    assert run(9, 8, 7, 2).startswith("deadlock")
    assert run(8, 8, 7, 2).startswith("deadlock")
