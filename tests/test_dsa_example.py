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


def test_port_attention_block_example_matches_paddle():
    """examples/port_attention_block.py: the block trained with paddle_dsa.compat's scaled_dot_product_attention and
    with Paddle's own has the same losses (Paddle's CPU SDPA takes causal GQA from 3.3 on)."""
    import paddle
    import pytest
    if tuple(int(x) for x in paddle.__version__.split(".")[:2]) < (3, 3):
        pytest.skip("Paddle's CPU scaled_dot_product_attention is causal / GQA from 3.3")
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "port_attention_block.py")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == "OK", res.stdout
