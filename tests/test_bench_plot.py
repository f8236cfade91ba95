"""CPU test of bench/plot_performance.py on a synthetic CSV in the format bench/flash_attention.py writes."""
import csv
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import plot_performance as pp  # noqa: E402

FIELDS = ("pass", "head_dim", "causal", "batch", "heads", "seqlen", "impl", "ms", "tflops", "host_bound", "note")
NS = "{http://www.w3.org/2000/svg}"


def _write_csv(path, skip_fa4_bwd=True):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(FIELDS)
        for p in ("fwd", "bwd"):
            for d in (64, 128):
                for c in (0, 1):
                    for s in (1024, 2048, 4096, 8192, 16384):
                        for n, impl in enumerate(("ours", "sdpa_flash", "sdpa_cudnn", "fa4")):
                            tf = 100.0 + 50 * n + s / 100.0 + d
                            if impl == "fa4" and p == "bwd" and skip_fa4_bwd:
                                w.writerow((p, d, c, 16384 // s, 16, s, impl, "", "", 0, "RuntimeError: x"))
                            else:
                                w.writerow((p, d, c, 16384 // s, 16, s, impl, "1.0", f"{tf:.2f}", 0, ""))


def test_plot_synthetic(tmp_path):
    src = tmp_path / "bench.csv"
    _write_csv(src)
    svg = pp.plot(str(src), str(tmp_path / "out.svg"), title="synthetic <test>")
    root = ET.parse(svg).getroot()
    assert root.tag == NS + "svg"
    panels = root.findall(f".//{NS}g[@class='panel']")
    assert len(panels) == 8  # (fwd, bwd) x (64, 128) x (causal, not)
    keys = {(g.get("data-pass"), g.get("data-head-dim"), g.get("data-causal")) for g in panels}
    assert ("bwd", "128", "1") in keys and ("fwd", "64", "0") in keys
    for g in panels:
        series = {pl.get("data-impl"): pl for pl in g.findall(f"{NS}polyline")}
        want = {"ours", "sdpa_flash", "sdpa_cudnn"} | ({"fa4"} if g.get("data-pass") == "fwd" else set())
        assert set(series) == want  # an unmeasured implementation draws no line
        for pl in series.values():
            pts = [tuple(map(float, xy.split(","))) for xy in pl.get("points").split()]
            assert len(pts) == 5
            xs = [x for x, _ in pts]
            assert xs == sorted(xs)
            ys = [y for _, y in pts]
            assert ys == sorted(ys, reverse=True)  # TFLOP/s grows with S in the synthetic data: y goes up
    assert "synthetic &lt;test&gt;" in open(svg).read()


def test_plot_cli_and_empty(tmp_path):
    src = tmp_path / "empty.csv"
    with open(src, "w", newline="") as fh:
        csv.writer(fh).writerow(FIELDS)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot_performance.py"), str(src)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "empty.svg"
    assert out.exists()
    ET.parse(out)  # well-formed even with nothing to draw


def test_read_rows_skips_missing(tmp_path):
    src = tmp_path / "b.csv"
    _write_csv(src)
    rows = pp.read_rows(str(src))
    assert len(rows) == 2 * 2 * 2 * 5 * 4 - 2 * 2 * 5  # fa4 bwd rows carry no tflops
    assert all(isinstance(r["causal"], bool) for r in rows)
