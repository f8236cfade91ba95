"""Plot the CSV of bench/flash_attention.py as an SVG: TFLOP/s against sequence length, one line per implementation,
one panel per (forward/backward, head_dim, causal). Plain SVG text, standard library only (no matplotlib, no torch).

CSV columns used: pass, head_dim, causal, seqlen, impl, tflops (empty tflops = not measured; skipped).
Run:  python bench/plot_performance.py bench_flash_attention.csv -o docs/flash_attention_h200.svg [--title TEXT]
"""
import argparse
import csv
import math
import os
import sys
from xml.sax.saxutils import escape

LABELS = {"ours": "paddle_dsa", "sdpa_flash": "SDPA FLASH_ATTENTION", "sdpa_cudnn": "SDPA CUDNN_ATTENTION",
          "fa4": "FlashAttention-4"}
COLORS = {"ours": "#d62728", "sdpa_flash": "#1f77b4", "sdpa_cudnn": "#2ca02c", "fa4": "#9467bd"}
EXTRA_COLORS = ("#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
PASS_ORDER = {"fwd": 0, "bwd": 1}
PASS_NAME = {"fwd": "forward", "bwd": "backward"}

PANEL_W, PANEL_H = 300, 220
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 52, 14, 28, 40


def read_rows(csv_path):
    """-> list of dicts with pass, head_dim (int, or a "D/Dv" string), causal (bool), seqlen (int), impl, tflops
    (float)."""
    rows = []
    with open(csv_path, newline="") as fh:
        for r in csv.DictReader(fh):
            t = (r.get("tflops") or "").strip()
            if not t:
                continue
            try:
                tf = float(t)
            except ValueError:
                continue
            if not math.isfinite(tf):
                continue
            rows.append({"pass": r["pass"].strip(), "head_dim": _head_dim(r["head_dim"]),
                         "causal": str(r["causal"]).strip().lower() in ("1", "true", "yes"),
                         "seqlen": int(r["seqlen"]), "impl": r["impl"].strip(), "tflops": tf})
    return rows


def _nice_max(v):
    if v <= 0:
        return 1.0
    step = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * step:
            return m * step
    return 10 * step


def _ticks(top):
    step = top / 5.0
    return [i * step for i in range(6)]


def _s_label(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def _head_dim(text):
    """'128' -> 128; '192/128' (query/key and value head dims) stays a string."""
    text = str(text).strip()
    return int(text) if text.isdigit() else text


def _dims_key(d):
    return tuple(int(x) for x in str(d).split("/"))


def render(rows, title=None):
    """SVG text for the rows of read_rows()."""
    panels = sorted({(r["pass"], r["head_dim"], r["causal"]) for r in rows},
                    key=lambda k: (PASS_ORDER.get(k[0], 9), k[0], _dims_key(k[1]), k[2]))
    impls = []
    for r in rows:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    impls.sort(key=lambda i: (list(LABELS).index(i) if i in LABELS else len(LABELS), i))
    color = dict(COLORS)
    for n, i in enumerate(i for i in impls if i not in COLORS):
        color[i] = EXTRA_COLORS[n % len(EXTRA_COLORS)]

    pass_rows = sorted({p for p, _, _ in panels}, key=lambda p: (PASS_ORDER.get(p, 9), p))
    cols = sorted({(d, c) for _, d, c in panels}, key=lambda dc: (_dims_key(dc[0]), dc[1]))
    ncol, nrow = max(1, len(cols)), max(1, len(pass_rows))
    top_h = 56
    width = ncol * PANEL_W + 20
    height = top_h + nrow * PANEL_H + 10
    ymax = _nice_max(max((r["tflops"] for r in rows), default=1.0))
    seqs = sorted({r["seqlen"] for r in rows})
    lx = [math.log2(s) for s in seqs] or [0.0]
    x0, x1 = min(lx), max(lx)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    out.append(f'<text x="10" y="18" font-size="14" font-weight="bold">'
               f'{escape(title or "Flash attention, TFLOP/s vs sequence length")}</text>')
    lxp = 10
    for i in impls:
        out.append(f'<g class="legend"><line x1="{lxp}" y1="36" x2="{lxp + 22}" y2="36" stroke="{color[i]}" '
                   f'stroke-width="2.5"/><circle cx="{lxp + 11}" cy="36" r="3" fill="{color[i]}"/>'
                   f'<text x="{lxp + 27}" y="40">{escape(LABELS.get(i, i))}</text></g>')
        lxp += 40 + 7 * len(LABELS.get(i, i))

    for (p, d, c) in panels:
        ci, ri = cols.index((d, c)), pass_rows.index(p)
        ox, oy = 10 + ci * PANEL_W, top_h + ri * PANEL_H
        pl, pt = ox + MARGIN_L, oy + MARGIN_T
        pw, ph = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B

        def X(s):
            return pl + (math.log2(s) - x0) / (x1 - x0) * pw

        def Y(t):
            return pt + ph - min(max(t, 0.0), ymax) / ymax * ph

        name = f"{PASS_NAME.get(p, p)}, hdim {d}, {'causal' if c else 'non-causal'}"
        g = [f'<g class="panel" data-pass="{escape(p)}" data-head-dim="{d}" data-causal="{int(c)}">',
             f'<text x="{pl + pw / 2:.1f}" y="{oy + 16}" text-anchor="middle" font-weight="bold">{escape(name)}</text>',
             f'<rect x="{pl}" y="{pt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
        for t in _ticks(ymax):
            y = Y(t)
            g.append(f'<line x1="{pl}" y1="{y:.1f}" x2="{pl + pw}" y2="{y:.1f}" stroke="#ddd"/>')
            g.append(f'<text x="{pl - 4}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        for s in seqs:
            x = X(s)
            g.append(f'<line x1="{x:.1f}" y1="{pt}" x2="{x:.1f}" y2="{pt + ph}" stroke="#eee"/>')
            g.append(f'<text x="{x:.1f}" y="{pt + ph + 14}" text-anchor="middle">{_s_label(s)}</text>')
        g.append(f'<text x="{pl + pw / 2:.1f}" y="{pt + ph + 30}" text-anchor="middle">sequence length</text>')
        g.append(f'<text transform="translate({ox + 12},{pt + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
                 f'TFLOP/s</text>')
        for i in impls:
            pts = sorted((r["seqlen"], r["tflops"]) for r in rows
                         if r["impl"] == i and r["pass"] == p and r["head_dim"] == d and r["causal"] == c)
            if not pts:
                continue
            coords = " ".join(f"{X(s):.1f},{Y(t):.1f}" for s, t in pts)
            g.append(f'<polyline class="series" data-impl="{escape(i)}" points="{coords}" fill="none" '
                     f'stroke="{color[i]}" stroke-width="2"/>')
            for s, t in pts:
                g.append(f'<circle cx="{X(s):.1f}" cy="{Y(t):.1f}" r="2.5" fill="{color[i]}">'
                         f'<title>{escape(LABELS.get(i, i))} S={s}: {t:.1f} TFLOP/s</title></circle>')
        g.append("</g>")
        out.extend(g)
    if not panels:
        out.append(f'<text x="10" y="{top_h + 20}">no measurements in the CSV</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def plot(csv_path, svg_path=None, title=None):
    """Reads ``csv_path``, writes the SVG (default: the CSV path with .svg) and returns its path."""
    svg_path = svg_path or os.path.splitext(csv_path)[0] + ".svg"
    text = render(read_rows(csv_path), title=title)
    with open(svg_path, "w") as fh:
        fh.write(text)
    return svg_path


def main(argv=None):
    ap = argparse.ArgumentParser(description="TFLOP/s vs S plot (SVG) from bench/flash_attention.py's CSV")
    ap.add_argument("csv")
    ap.add_argument("-o", "--out", default=None, help="SVG path (default: CSV path with .svg)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args(argv)
    path = plot(a.csv, a.out, a.title)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
