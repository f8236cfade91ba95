"""CPU CI: compile every variant of the dense attention-score recompute kernel (ops/dsa/attn_score/dense.py) for
sm_90a: Dqk x heads x varlen x with q_offsets (causal, ratio, scale, shapes and strides are runtime values). Fake
tensors, no GPU. One variant's PTX is checked for warpgroup MMA, TMA bulk tensor loads and no local memory."""
import os
import subprocess
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ops.dsa.attn_score import dense  # noqa: E402


@pytest.mark.parametrize("key", dense.all_variant_keys(), ids=lambda k: "-".join(str(x) for x in k))
def test_compile_dense_attn_score_variant(key):
    assert dense.compile_variant(key) is not None


def test_dense_attn_score_ptx(tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys; sys.path.insert(0, %r); from ops.dsa.attn_score import dense; "
            "dense.compile_variant(dense.variant_key(576, 128, True, True))" % ROOT)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX dumped"
    text = ptx[0].read_text()
    assert text.count("wgmma.mma_async") == 36         # Dqk 576: 9 chunks x 4 k-steps of m64n128k16
    assert "cp.async.bulk.tensor" in text
    assert "st.local" not in text and "ld.local" not in text
