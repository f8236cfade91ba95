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
