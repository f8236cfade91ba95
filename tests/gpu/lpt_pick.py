"""Picks the LPT_MB knob set to adopt per direction from the tables of bench/ab_flash_fwd.py and bench/ab_flash_bwd.py
(tests/gpu/lpt_call.sh): a set wins when the geometric mean of its causal rows' ratios (default time / knob time) is
at least 1 + max(0.01, twice the largest move of the rows the order leaves alone: the run's noise), no row it changes
is under 0.985 (the forward's full rows are not masked, LPT leaves them alone: noise), and its outputs equal the default's bit for bit (the launch order changes no tile's arithmetic: the forward's out and
lse, the backward's dK and dV; the ordered backward keeps its order, so its dQ too). The best such set, or none.

Run:  python tests/gpu/lpt_pick.py AB_FWD.txt AB_BWD.txt     (prints "forward pick: SET|none", "backward pick: ...")
"""
import math
import re
import sys

ROW = re.compile(r"^(D[\d/]+) (full|causal)( ordered)?\s+(\S+)\s+([\d.]+) TF\s+([\d.]+) TF\s+([\d.]+)\s+(\S+) / (\S+)"
                 r"(\s+NaN!)?")


def rows(path):
    out = []
    with open(path) as f:
        for line in f:
            m = ROW.match(line.strip())
            if m:
                dim, kind, ordered, knob, _t0, _t1, ratio, eq, dq, nan = m.groups()
                out.append(dict(dim=dim, causal=kind == "causal", ordered=bool(ordered), knob=knob,
                                ratio=float(ratio), eq=eq, dq=dq, nan=bool(nan)))
    return out


def pick(table, forward):
    verdicts = {}
    for knob in sorted({r["knob"] for r in table}):
        rs = [r for r in table if r["knob"] == knob]
        why = []
        for r in rs:
            equal = (float(r["eq"]) == 0 and float(r["dq"]) == 0) if forward else \
                (r["eq"] == "True" and (not r["ordered"] or float(r["dq"]) == 0))
            if r["nan"] or not equal:
                why.append(f"{r['dim']} {'causal' if r['causal'] else 'full'}{' ordered' if r['ordered'] else ''}: "
                           f"outputs differ ({r['eq']} / {r['dq']}{', NaN' if r['nan'] else ''})")
        changed = [r for r in rs if not r["ordered"] and (r["causal"] or not forward)]
        low = [r for r in changed if r["ratio"] < 0.985]
        if low:
            why.append("rows under 0.985x: " + ", ".join(f"{r['dim']} {r['ratio']:.3f}" for r in low))
        causal = [r["ratio"] for r in rs if r["causal"] and not r["ordered"]]
        gm = math.exp(sum(math.log(x) for x in causal) / len(causal)) if causal else 0.0
        # the run's noise: how far the rows the order leaves alone moved (the forward's full rows, the ordered
        # backward); a gain must stand twice that clear of 1 (12-08: the backward's no-op LPT_MB 8 "won" at 1.011)
        still = [r["ratio"] for r in rs if r["ordered"] or (forward and not r["causal"])]
        need = 1 + max(0.01, 2 * max((abs(x - 1) for x in still), default=0.0))
        if gm < need:
            why.append(f"causal geometric mean {gm:.3f} < {need:.3f}")
        verdicts[knob] = (gm, why)
    ok = {k: v[0] for k, v in verdicts.items() if not v[1]}
    for k, (gm, why) in verdicts.items():
        print(f"  {'forward' if forward else 'backward'} {k}: causal gm {gm:.3f}; "
              f"{'wins' if not why else '; '.join(why)}")
    return max(ok, key=ok.get) if ok else "none"


def main(fwd_path, bwd_path):
    fp = pick(rows(fwd_path), True)
    bp = pick(rows(bwd_path), False)
    print(f"forward pick: {fp}")
    print(f"backward pick: {bp}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
