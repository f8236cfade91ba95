"""Round-robin runner of the CPU protocol models (tests/test_*_protocol.py): each agent is a generator that yields
a state tuple while it waits; a round in which no agent finished and none changed its state is a deadlock."""


def run_agents(agents):
    """Run the generators in ``agents`` (name -> generator) to the end: "ok", or "deadlock: {name: state}"."""
    agents = dict(agents)
    last = {}
    while agents:
        moved = False
        for k in list(agents):
            try:
                st = next(agents[k])
            except StopIteration:
                del agents[k]
                moved = True
                continue
            moved = moved or last.get(k) != st
            last[k] = st
        if not moved:
            return f"deadlock: {last}"
    return "ok"
