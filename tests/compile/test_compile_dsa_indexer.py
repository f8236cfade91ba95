"""CPU CI: compile every variant of the lightning-indexer score kernel (ops/dsa/indexer/fwd.py) for sm_90a.

Static configurations: head_dim x index heads x weight dtype x varlen x with lse x with q_offsets (causal, ratio,
shapes and strides are runtime values). Fake tensors, no GPU. One variant's PTX is checked for warpgroup MMA,
TMA bulk tensor loads and no local memory.
"""
import os
import subprocess
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ops.dsa.indexer import fwd  # noqa: E402


@pytest.mark.parametrize("key", fwd.all_variant_keys(), ids=lambda k: "-".join(str(x) for x in k))
def test_compile_indexer_variant(key):
    assert fwd.compile_variant(key) is not None


def test_indexer_ptx(tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys; sys.path.insert(0, %r); from ops.dsa.indexer import fwd; "
            "fwd.compile_variant(fwd.variant_key(128, 64, 'float32', True, True, True))" % ROOT)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX dumped"
    text = ptx[0].read_text()
    assert text.count("wgmma.mma_async") == 8          # D = 128: 8 k-steps of m64n256k16
    assert "cp.async.bulk.tensor" in text
    assert "st.local" not in text and "ld.local" not in text
