"""CPU CI: the benchmarks' own kernels (bench/red_lines.py, the L2 reduction microbenchmark) compile for sm_90a."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_red_lines_compiles():
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "red_lines.py"), "--compile-only"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "compiled [16, 32, 64, 128, 256, 512]" in out.stdout
