"""CPU compile check of every forward kernel variant the seam (ops/flash_attention/fwd.py) can choose, for sm_90a.

Uses stand-in tensors with dynamic shapes/strides (the same compile path as the seam); no GPU needed. Also checks
the generated PTX uses warpgroup MMA and TMA bulk tensor loads.
"""
import os

os.environ["CUTE_DSL_ARCH"] = "sm_90a"  # before cutlass is imported anywhere

import sys  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("cutlass")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ops.flash_attention import fwd  # noqa: E402


@pytest.mark.parametrize("key", fwd.all_variant_keys(), ids=lambda k: "-".join(str(x) for x in k))
def test_compile_forward_variant(key):
    fn = fwd.compile_variant(key)
    assert fn is not None


def test_forward_ptx_uses_wgmma_and_tma(tmp_path):
    """Compile one variant in a fresh process with the DSL told to keep the PTX, then inspect it."""
    import subprocess
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys; sys.path.insert(0, %r); from ops.flash_attention import fwd; "
            "fwd.compile_variant(fwd.variant_key('bfloat16', 128, True, True))" % ROOT)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX dumped"
    text = ptx[0].read_text()
    assert "wgmma.mma_async" in text
    assert "cp.async.bulk.tensor" in text
    assert "st.local" not in text, "register spills / local arrays in the forward kernel"


@pytest.mark.skipif(__import__("shutil").which("ptxas") is None, reason="no ptxas on PATH")
@pytest.mark.parametrize("knobs", ["", "BM64=128/128"])
def test_d64_masked_forward_has_no_spills(knobs, tmp_path):
    """The D 64 forward with a bounded mask, as the defaults build it (192-row tile) and with the 128-row tile:
    ptxas -v reports no spill. At 192 rows a consumer thread has 160 registers; the mask's former absolute-column
    form spilled 84 B there, the relative bounds of ops.common.mask.apply_mask none."""
    import re
    import subprocess
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"), PADDLE_DSA_KERNEL_CACHE=str(tmp_path / "store"))
    code = ("import sys; sys.path.insert(0, %r); from ops.flash_attention import fwd; "
            "from ops.common.switches import knob_specs; fwd.set_trial_knobs(knob_specs(%r)); "
            "fwd.compile_variant(fwd.variant_key('bfloat16', 64, True, False))" % (ROOT, knobs))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX dumped"
    src = tmp_path / "assemble.ptx"
    src.write_text(re.sub(r"(?m)^\.version 9\.\d+", ".version 9.0", ptx[0].read_text()))
    out = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(src), "-o", os.devnull], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores", out.stderr)
    assert spills and all(int(n) == 0 for n in spills), out.stderr[-2000:]
