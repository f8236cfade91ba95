"""CPU: a model of the sparse attention forward's synchronisation protocol (ops/dsa/sparse_attn/fwd_sm90.py): the
producer's fill order (the kernel's own gather_order) with a chunk group published LAG acquires after its own and every
period drained, the chunk pipeline's full / empty barriers (an empty barrier completes a phase when both consumers
arrived), the consumers' handoff mbarriers M0 / M1 / S1 / S0 (one consumer completes a phase, the other waits on
it by parity: an arrival may never complete a phase its waiter has not yet waited on, or the parity wait would hang
or pass early), SUM (both wait), and each consumer's waits and releases in the kernel's order. The agents run
round-robin as generators; a round in which none of them moves is a deadlock. Every (Dqk, LAG, pair count) must
run to the end, each consumer releasing each chunk of each block exactly once, after its own wait on it; W1
arriving on M1 only after its S0 wait (a cross wait with W0's M1 wait before its S0 arrival) must deadlock. The
shared-memory handoff buffers (sRed[0] m0 / l, sRed[1] m1 / l, sS1, sS0: its own
buffer at Dqk 512, slot 0's chunk 8 at 576) are checked with vector clocks that only the barriers' edges carry (an
arrival releases, a completed wait acquires): every access must happen after each conflicting access of the other
agents, in any interleaving, so a missing edge fails even where this schedule happens to be safe. The kernel's order
of waits, releases and accesses is transcribed here by hand: a change to consume_first / consume_second /
first_pair / epilogue must be made here too."""
import pytest
from agent_model import run_agents

pytest.importorskip("cutlass")

from ops.dsa.sparse_attn.fwd_sm90 import VQ, SparseAttnFwdSm90  # noqa: E402


def run(D, lag, n_pair, m1_late=False, drop_edge=None):
    kern = SparseAttnFwdSm90(D, 512, 64, False, False, False)
    NC, G = kern.NC, kern.G
    units = kern.gather_groups()                                   # a pipeline stage: a chunk group
    order = list(kern.gather_order())                              # (block of the pair, unit)
    full, empty, rel = {}, {}, {}
    full_vc, empty_vc, rel_vc = {}, {}, {}
    vc = {a: {} for a in ("P", "W0", "W1")}
    hand = {b: {"done": 0, "waited": 0, "vc": []} for b in ("M0", "M1", "S1", "S0")}
    acc, sum_vc = {}, {}

    def stage(n, u):
        return (n % 2) * G + u

    def buf(n, c):
        return (n % 2) * NC + c

    def tick(a):
        vc[a][a] = vc[a].get(a, 0) + 1
        return dict(vc[a])

    def join(a, other):
        for k, v in other.items():
            vc[a][k] = max(vc[a].get(k, 0), v)

    def access(a, loc, kind):
        """a reads ("r") or writes ("w") loc: every conflicting access of another agent must happen before it."""
        now = tick(a)
        for a2, k2, v2 in acc.get(loc, []):
            if a2 != a and "w" in (kind, k2):
                assert v2[a2] <= now.get(a2, 0), f"{loc}: {k2} by {a2} not ordered before {kind} by {a}"
        acc[loc] = [(a, kind, now)] if kind == "w" else acc.get(loc, []) + [(a, kind, now)]

    def producer():
        for i in range(n_pair):
            pend = []
            for e, (b, u) in enumerate(order):
                n = 2 * i + b
                while empty.get(stage(n, u), 0) < n // 2:         # block n - 2's unit released by both
                    yield ("acquire", n, u)
                if n >= 2:
                    join("P", empty_vc[(stage(n, u), n // 2)])
                for c in units[u]:
                    access("P", ("kv", buf(n, c)), "w")            # cp.async / zero stores of the unit's chunks
                pend.append(stage(n, u))
                if e >= lag:
                    publish(pend.pop(0))
            for s in pend:
                publish(s)

    def publish(s):
        full[s] = full.get(s, 0) + 1
        full_vc[(s, full[s])] = tick("P")

    def wait(w, n, cs):
        for u in kern.touched_groups(tuple(cs)):
            while full.get(stage(n, u), 0) < n // 2 + 1:
                yield ("wait", n, u)
            join(f"W{w}", full_vc[(stage(n, u), n // 2 + 1)])

    def done(w, n, cs, prior=()):
        """W{w}'s last reads of block n's chunks cs are behind it (prior: the chunks of block n it freed before): its
        own full waits, the reads, then the release of each unit this completes (the kernel's released_groups)."""
        cs = tuple(cs)
        yield from wait(w, n, cs)
        for c in cs:
            access(f"W{w}", ("kv", buf(n, c)), "r")
        for u in kern.released_groups(cs, tuple(prior)):
            who = rel.setdefault((n, u), set())
            assert w not in who, f"W{w} released block {n} unit {u} twice"
            who.add(w)
            rel_vc.setdefault((n, u), []).append(tick(f"W{w}"))
            if len(who) == 2:
                empty[stage(n, u)] = empty.get(stage(n, u), 0) + 1
                merged = {}
                for v in rel_vc[(n, u)]:
                    for k, x in v.items():
                        merged[k] = max(merged.get(k, 0), x)
                empty_vc[(stage(n, u), empty[stage(n, u)])] = merged

    def arrive(w, b):
        """The writer's 128 threads complete the handoff barrier's next phase (release)."""
        h = hand[b]
        assert h["done"] == h["waited"], \
            f"{b}: phase {h['done']} completed before its waiter waited phase {h['waited']}"
        h["done"] += 1
        h["vc"].append({} if b == drop_edge else tick(f"W{w}"))

    def wait_bar(w, b):
        """Parity wait on the handoff barrier's next phase (acquire)."""
        h = hand[b]
        k = h["waited"]
        while h["done"] <= k:
            yield ("bar", b, k)
        join(f"W{w}", h["vc"][k])
        h["waited"] += 1

    def sum_bar(w):                                                # named barrier SUM: both arrive and wait
        sum_vc[w] = tick(f"W{w}")
        while 1 - w not in sum_vc:
            yield ("bar", "SUM")
        join(f"W{w}", sum_vc[1 - w])

    s0 = (lambda n: ("kv", buf(n, NC - 1))) if NC == 9 else (lambda n: "sS0")

    def w0():
        for i in range(n_pair):
            n = 2 * i
            yield from wait(0, n, range(NC))                       # issue_qk
            access("W0", "sRed0", "w")                             # m0
            arrive(0, "M0")
            yield from wait_bar(0, "M1")
            yield from done(0, n, range(2 * VQ))                   # release_first
            yield from done(0, n + 1, range(VQ, NC))
            access("W0", "sRed1", "r")                             # m1
            access("W0", s0(n), "w")                               # P rescaled to m1 (stmatrix)
            if NC == 9:
                yield from done(0, n, [NC - 1], range(2 * VQ))     # sS0 written into the rope chunk
            arrive(0, "S0")
            yield from wait_bar(0, "S1")
            yield from wait(0, n + 1, range(VQ))                   # wait_chunks before the P V on sS1
            access("W0", "sS1", "r")                               # wait_group(0)
            yield from done(0, n + 1, range(VQ), range(VQ, NC))
        access("W0", "sRed0", "w")                                 # epilogue: l
        yield from sum_bar(0)
        access("W0", "sRed0", "r")
        access("W0", "sRed1", "r")

    def w1():
        for i in range(n_pair):
            n = 2 * i + 1
            yield from wait(1, n, list(range(VQ, NC)) + list(range(VQ)))
            yield from done(1, n, range(VQ))                       # release_second
            if NC == 9:
                yield from done(1, n, [NC - 1], range(VQ))
            yield from done(1, n - 1, range(VQ))
            yield from wait_bar(1, "M0")
            access("W1", "sRed0", "r")                             # m0
            access("W1", "sRed1", "w")                             # m1
            if not m1_late:
                arrive(1, "M1")
            access("W1", "sS1", "w")                               # P (stmatrix)
            arrive(1, "S1")
            yield from wait_bar(1, "S0")
            if m1_late:
                arrive(1, "M1")
            yield from wait(1, n - 1, range(VQ, 2 * VQ))           # wait_chunks before the P V on sS0
            yield from done(1, n, range(VQ, 2 * VQ),               # after wait_group(1): own P V retired
                            list(range(VQ)) + ([NC - 1] if NC == 9 else []))
            access("W1", s0(n - 1), "r")                           # wait_group(0): the P V on sS0 retired
            yield from done(1, n - 1, range(VQ, NC), range(VQ))
        access("W1", "sRed1", "w")                                 # epilogue: l
        yield from sum_bar(1)
        access("W1", "sRed0", "r")
        access("W1", "sRed1", "r")

    res = run_agents({"producer": producer(), "W0": w0(), "W1": w1()})
    if res != "ok":
        return res
    for n in range(2 * n_pair):
        for u in range(G):
            assert rel.get((n, u)) == {0, 1}, f"block {n} unit {u} released by {rel.get((n, u))}"
    for b, h in hand.items():
        assert h["done"] == h["waited"] == n_pair, (b, h["done"], h["waited"])
    return "ok"


@pytest.mark.parametrize("D", [512, 576])
@pytest.mark.parametrize("lag", [1, 2, 3, 4])
def test_protocol_runs_through(D, lag):
    """A pipeline stage is a chunk group (V-left, the rest), 4 a pair; each consumer frees a group once, after its
    last read of every chunk in it (released_groups); lag counts groups, up to the 4 of a pair."""
    for n_pair in range(5):
        assert run(D, lag, n_pair) == "ok", (D, lag, n_pair)


@pytest.mark.parametrize("D", [512, 576])
def test_released_groups(D):
    """Each consumer frees each group of each block exactly once (the run checks it) and only after its last read of
    all the group's chunks: a group is freed by the call that covers its last chunk."""
    k = SparseAttnFwdSm90(D, 512, 64, False, False, False)
    NC = k.NC
    assert k.gather_groups() == (tuple(range(VQ)), tuple(range(VQ, NC)))
    assert k.released_groups(tuple(range(2 * VQ))) == ((0, 1) if NC == 8 else (0,))
    assert k.released_groups((NC - 1,), tuple(range(2 * VQ))) == ((1,) if NC == 9 else ())
    assert k.released_groups(tuple(range(VQ, 2 * VQ)), tuple(range(VQ)) + (NC - 1,)) == (1,)
    assert k.released_groups((3, 1, 2)) == () and k.released_groups((3, 1, 2), (0,)) == (0,) and k.G == 2


@pytest.mark.parametrize("D", [512, 576])
def test_early_group_release_is_caught(D):
    """The access check catches a group freed before one of its chunks is read: W1 freeing slot 1's second group at
    its rope chunk (as a kernel with a stage a chunk would free chunk 8 alone) while its V-right P V still reads
    chunks 4-7."""
    import ops.dsa.sparse_attn.fwd_sm90 as fm
    orig = fm.SparseAttnFwdSm90.released_groups

    def early(self, chunks, prior=()):
        if tuple(chunks) == (self.NC - 1,) and tuple(prior) == tuple(range(VQ)):
            return (1,)
        if tuple(chunks) == tuple(range(VQ, 2 * VQ)) and (self.NC - 1) in tuple(prior):
            return ()
        return orig(self, chunks, prior)
    fm.SparseAttnFwdSm90.released_groups = early
    try:
        if D == 576:
            with pytest.raises(AssertionError, match="not ordered before"):
                run(D, 1, 3)
        else:
            assert run(D, 1, 3) == "ok"        # no rope chunk at Dqk 512: the mutation never fires
    finally:
        fm.SparseAttnFwdSm90.released_groups = orig


@pytest.mark.parametrize("D", [512, 576])
def test_cross_wait_deadlocks(D):
    """The model can fail: W1 arriving on M1 only after waiting on S0, which W0 arrives on only after its M1 wait."""
    assert run(D, 3, 0, m1_late=True) == "ok"
    assert run(D, 3, 1, m1_late=True).startswith("deadlock")


@pytest.mark.parametrize("edge", ["M0", "M1", "S1", "S0"])
@pytest.mark.parametrize("D", [512, 576])
def test_each_handoff_edge_is_needed(D, edge):
    """The access check can fail: with one handoff barrier's ordering edge dropped (its waits still block, but
    carry nothing), some access of the buffers it guards is no longer ordered."""
    with pytest.raises(AssertionError, match="not ordered before"):
        run(D, 3, 3, drop_edge=edge)
