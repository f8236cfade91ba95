"""CPU: a model of the sparse attention forward's synchronisation protocol (ops/dsa/sparse_attn/fwd_sm90.py): the
producer's fill order (the kernel's own gather_order) with a chunk published LAG acquires after its own and every
period drained, the chunk pipeline's full / empty barriers (an empty barrier completes a phase when both consumers
arrived), the named barriers M0 / M1 / S1 (one consumer arrives, the other waits) and S0 (both wait), and each consumer's waits and releases in the kernel's order. The
agents run round-robin as generators; a round in which none of them moves is a deadlock. Every (Dqk, LAG,
QK_EARLY, pair count) must run to the end, each consumer releasing each chunk of each block exactly once, after its
own wait on it; the first QK_EARLY form (the next pair's whole S issued before W0's last release of the pair, found
by review on 2026-12-05) must deadlock. The kernel's order of waits and releases is transcribed here by hand: a
change to consume_first / consume_second / first_pair must be made here too."""
import pytest
from agent_model import run_agents

pytest.importorskip("cutlass")

from ops.dsa.sparse_attn.fwd_sm90 import VQ, SparseAttnFwdSm90  # noqa: E402


def run(D, lag, qk_early, n_pair, early_form="split"):
    kern = SparseAttnFwdSm90(D, 512, 64, False, False, False)
    NC = kern.NC
    order = list(kern.gather_order())
    full, empty, rel, bars = {}, {}, {}, {}

    def stage(n, c):
        return (n % 2) * NC + c

    def producer():
        for i in range(n_pair):
            pend = []
            for e, (b, c) in enumerate(order):
                n = 2 * i + b
                while empty.get(stage(n, c), 0) < n // 2:         # block n - 2's chunk released by both
                    yield ("acquire", n, c)
                pend.append(stage(n, c))
                if e >= lag:
                    s = pend.pop(0)
                    full[s] = full.get(s, 0) + 1
            for s in pend:
                full[s] = full.get(s, 0) + 1

    def wait(n, cs):
        for c in cs:
            while full.get(stage(n, c), 0) < n // 2 + 1:
                yield ("wait", n, c)

    def done(w, n, cs):
        for c in cs:
            yield from wait(n, [c])
            who = rel.setdefault((n, c), set())
            assert w not in who, f"W{w} released block {n} chunk {c} twice"
            who.add(w)
            if len(who) == 2:
                empty[stage(n, c)] = empty.get(stage(n, c), 0) + 1

    seen = {}

    def arrive(b):
        bars[b] = bars.get(b, 0) + 1

    def sync(w, b):
        seen[(w, b)] = seen.get((w, b), 0) + 1
        while bars.get(b, 0) < seen[(w, b)]:
            yield ("bar", b)

    def both(w, b):                                                # arrive_and_wait by both consumers
        arrive(f"{b}.{w}")
        yield from sync(w, f"{b}.{1 - w}")

    def w0():
        if qk_early and n_pair > 0:
            yield from wait(0, range(NC))
        for i in range(n_pair):
            n = 2 * i
            if not qk_early:
                yield from wait(n, range(NC))                      # issue_qk
            arrive("M0")
            yield from sync(0, "M1")
            yield from done(0, n, range(2 * VQ))
            yield from done(0, n + 1, range(VQ, NC))
            if NC == 9:
                yield from done(0, n, [NC - 1])                    # sS0 written into the rope chunk
            yield from both(0, "S0")
            yield from sync(0, "S1")
            yield from wait(n + 1, range(VQ))                      # wait_chunks before the P V on sS1
            if qk_early and i < n_pair - 1:
                if early_form == "split":
                    yield from wait(n + 2, range(VQ))
                    yield from done(0, n + 1, range(VQ))
                    yield from wait(n + 2, range(VQ, NC))
                else:                                              # the first form: whole S(n + 2), then release
                    yield from wait(n + 2, range(NC))
                    yield from done(0, n + 1, range(VQ))
            else:
                yield from done(0, n + 1, range(VQ))

    def w1():
        for i in range(n_pair):
            n = 2 * i + 1
            yield from wait(n, list(range(VQ, NC)) + list(range(VQ)))
            yield from done(1, n, range(VQ))
            if NC == 9:
                yield from done(1, n, [NC - 1])
            yield from done(1, n - 1, range(VQ))
            yield from sync(1, "M0")
            arrive("M1")
            arrive("S1")
            yield from both(1, "S0")
            yield from wait(n - 1, range(VQ, 2 * VQ))              # wait_chunks before the P V on sS0
            yield from done(1, n, range(VQ, 2 * VQ))
            yield from done(1, n - 1, range(VQ, NC))

    res = run_agents({"producer": producer(), "W0": w0(), "W1": w1()})
    if res != "ok":
        return res
    for n in range(2 * n_pair):
        for c in range(NC):
            assert rel.get((n, c)) == {0, 1}, f"block {n} chunk {c} released by {rel.get((n, c))}"
    return "ok"


@pytest.mark.parametrize("D", [512, 576])
@pytest.mark.parametrize("lag", [1, 3, 8])
@pytest.mark.parametrize("qk_early", [0, 1])
def test_protocol_runs_through(D, lag, qk_early):
    for n_pair in range(5):
        assert run(D, lag, qk_early, n_pair) == "ok", (D, lag, qk_early, n_pair)


@pytest.mark.parametrize("D", [512, 576])
def test_first_qk_early_form_deadlocks(D):
    """The model can fail: the QK_EARLY form that waited on all of S(n + 2)'s chunks before releasing slot 1's
    V-left chunks deadlocks from two pairs on."""
    assert run(D, 3, 1, 1, "whole") == "ok"
    assert run(D, 3, 1, 2, "whole").startswith("deadlock")
