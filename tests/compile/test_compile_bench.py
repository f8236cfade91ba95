"""CPU CI: the benchmarks' own kernels compile for sm_90a: bench/red_lines.py (red.v4 into random rows) and
bench/red_bulk.py (TMA bulk tensor reduces into random rows), the L2 reduction microbenchmarks."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("script,compiled", [("red_lines.py", "compiled [16, 32, 64, 128, 256, 512]"),
                                             ("red_bulk.py", "compiled [32, 64, 128, 256]")])
def test_reduction_benchmarks_compile(script, compiled):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), "--compile-only"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert compiled in out.stdout
