"""CPU CI: compile every variant of the sparse score recompute kernels (ops/dsa/indexer/sparse.py,
ops/dsa/attn_score/sparse.py) for sm_90a; one variant each checked for warpgroup MMA, 16-byte cp.async gathers and no
local memory."""
import os
import subprocess
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ops.dsa.attn_score import sparse as attn_sparse  # noqa: E402
from ops.dsa.indexer import sparse as indexer_sparse  # noqa: E402
from ops.dsa.indexer.sparse_sm90 import SparseIndexerScoreSm90  # noqa: E402

KEYS = [(indexer_sparse, k) for k in indexer_sparse.all_variant_keys()] + \
       [(attn_sparse, k) for k in attn_sparse.all_variant_keys()]


@pytest.mark.parametrize("mod,key", KEYS, ids=lambda x: "-".join(str(v) for v in x) if isinstance(x, tuple)
                         else x.__name__.split(".")[-2])
def test_compile_sparse_variant(mod, key):
    assert mod.compile_variant(key) is not None


@pytest.mark.parametrize("module,key,wgmma,cp_async", [
    # 8 pieces a producer thread a block, the producer's loop unrolled by IDX_AHEAD (2: two blocks' copy sites)
    ("ops.dsa.indexer.sparse", "(128, 64, 'float32', True, True)", 8, 8 * SparseIndexerScoreSm90.IDX_AHEAD),
    ("ops.dsa.attn_score.sparse", "(576, 128, True, True)", 36, 36)])
def test_sparse_ptx(tmp_path, module, key, wgmma, cp_async):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = f"import sys; sys.path.insert(0, {ROOT!r}); import {module} as m; m.compile_variant({key})"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX dumped"
    text = ptx[0].read_text()
    assert text.count("wgmma.mma_async") == wgmma
    assert text.count("cp.async.ca.shared.global") + text.count("cp.async.cg.shared.global") == cp_async
    assert ", 16, 16;" in text or ", 16;" in text        # 16-byte pieces
    assert "st.local" not in text and "ld.local" not in text
