"""examples/train_indexer.py runs on CPU and its loss falls."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_train_indexer_example_loss_falls():
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "train_indexer.py"), "--steps", "20"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"dense loss ([\d.]+) -> ([\d.]+); sparse loss ([\d.]+) -> ([\d.]+)", res.stdout)
    assert m, res.stdout
    d0, d1, s0, s1 = map(float, m.groups())
    assert d1 < 0.8 * d0 and s1 < s0
