"""Summary of an ncu SASS source page (ncu -i REP --page source --csv --print-source sass): where a kernel's warp
instructions and stall samples go. Prints the total, the share of instructions and of samples by opcode, the
barrier wait loops' share (SYNCS.PHASECHK / NANOSLEEP: a warp waiting on an mbarrier), and the instructions holding
the most samples with their top stall reasons (the index is the instruction's row in the page, for reading the SASS
around it). --segments N also splits the page at its CTA barriers (BAR.SYNC / BAR.RED) and prints each stretch between
two barriers that holds at least 0.4 % of the instructions or samples, with its busiest instruction's executions a
launch unit (N: CTAs, e.g. the top-k's rows; 16 a row for 16 warps that each run it once): a kernel that reads
top-down (the top-k: sample, one read, radix passes, gather, ordering, output) is then told stage by stage without
line info.

Run:  python3 tests/gpu/sass_stalls.py NAME_sass.csv [--top N] [--segments CTAS]
"""
import argparse
import collections
import csv


def load(path):
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    hdr = rows[head]
    return hdr, [r for r in rows[head + 1:] if len(r) == len(hdr)]


def opcode(src):
    words = src.split()
    if not words:
        return ""
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def main(a):
    hdr, data = load(a.csv)
    col = {h: i for i, h in enumerate(hdr)}
    src, ex, smp = col["Source"], col["Instructions Executed"], col["Warp Stall Sampling (All Samples)"]
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    num = lambda r, i: int(r[i] or 0)  # noqa: E731
    tot_i = sum(num(r, ex) for r in data) or 1
    tot_s = sum(num(r, smp) for r in data) or 1
    print(f"# {a.csv}: {len(data)} SASS instructions, {tot_i} warp instructions executed, {tot_s} stall samples")
    by_i, by_s = collections.Counter(), collections.Counter()
    for r in data:
        by_i[opcode(r[src])] += num(r, ex)
        by_s[opcode(r[src])] += num(r, smp)
    print("opcode        % instr  % samples")
    for op, v in by_i.most_common(a.top):
        print(f"{op:12s} {100 * v / tot_i:7.1f} {100 * by_s[op] / tot_s:9.1f}")
    wait = sum(num(r, smp) for r in data if "PHASECHK" in r[src] or "NANOSLEEP" in r[src])
    print(f"mbarrier wait loops: {100 * wait / tot_s:.1f} % of samples")
    print("row   % samples  executed   top stall reasons          instruction")
    for i in sorted(range(len(data)), key=lambda i: -num(data[i], smp))[:a.top]:
        r = data[i]
        rs = sorted(((num(r, col[h]), h[6:]) for h in reasons), reverse=True)[:2]
        why = ", ".join(f"{n} {round(100 * v / max(num(r, smp), 1))}%" for v, n in rs if v)
        print(f"{i:5d} {100 * num(r, smp) / tot_s:9.1f} {num(r, ex):10d}   {why:26s} {r[src].strip()[:60]}")
    if a.segments:
        segments(data, src, ex, smp, num, tot_i, tot_s, a.segments)


def segments(data, src, ex, smp, num, tot_i, tot_s, ctas):
    """The stretches between CTA barriers (module docstring)."""
    print("rows         % instr  % samples  busiest / CTA   opcodes (% of the stretch's instructions)")
    start, ins, sam, ops = 0, 0, 0, collections.Counter()
    for i, r in enumerate(data):
        ins += num(r, ex)
        sam += num(r, smp)
        ops[opcode(r[src])] += num(r, ex)
        if "BAR.SYNC" in r[src] or "BAR.RED" in r[src] or i == len(data) - 1:
            if ins / tot_i > 0.004 or sam / tot_s > 0.004:
                top = " ".join(f"{k}:{round(100 * v / ins)}" for k, v in ops.most_common(5))
                busiest = max(num(data[j], ex) for j in range(start, i + 1)) / ctas
                print(f"{start:5d}-{i:5d} {100 * ins / tot_i:7.1f} {100 * sam / tot_s:9.1f} {busiest:13.1f}   {top}")
            start, ins, sam, ops = i + 1, 0, 0, collections.Counter()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--segments", type=int, default=0, metavar="CTAS", help="the stretches between CTA barriers")
    main(p.parse_args())
