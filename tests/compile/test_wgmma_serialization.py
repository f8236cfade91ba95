"""CPU CI: no wgmma kernel makes ptxas serialize its wgmmas (warning C7520, "wgmma.mma_async instructions are
serialized due to ..."). A serialized kernel still computes the right numbers, only slower, so nothing on the GPU
would fail: this catches it at compile time. Seen on 2026-12-04 (CPU, not kept): an indexer backward schedule that
issued the next block's X^T wgmmas under a condition (`if n + W < n_blk`, behind the block's first dk tile) was
serialized ("compiler-inserted WG.AR in divergent path"); this test failed on it. Every kernel of the tree passes.

One variant of each wgmma kernel family is compiled for sm_90a with its PTX kept, and the PTX is assembled with the
CUDA toolkit's ptxas -v (the DSL's PTX version header lowered to 9.0 for that ptxas); skipped where no ptxas is on
PATH.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNELS = {
    "flash_fwd_128": "from ops.flash_attention import fwd as m; m.compile_variant(m.variant_key('bfloat16', 128, "
                     "False, False))",
    "flash_fwd_64_causal": "from ops.flash_attention import fwd as m; m.compile_variant(m.variant_key('bfloat16', 64, "
                           "True, True))",
    "flash_fwd_192_128": "from ops.flash_attention import fwd as m; m.compile_variant(m.variant_key('bfloat16', "
                         "192, True, False, 128))",
    "flash_bwd_fast": "from ops.flash_attention import bwd as m; m.compile_variant('bfloat16', 128, False, False, "
                      "fast=2)",
    "flash_bwd_deterministic": "from ops.flash_attention import bwd as m; m.compile_variant('bfloat16', 128, False, "
                               "True)",
    "flash_bwd_ordered": "from ops.flash_attention import bwd as m; m.compile_variant('bfloat16', 128, True, True, "
                         "ordered=True); m.compile_variant('float16', 64, True, True, ordered=True)",
    # the knobs' other settings (bench/ab_flash_bwd.py), with the 64-row tiles at D 64 (BM128_DIMS = 0; a 3-deep
    # ring and dS double-buffered do not fit with the 128-row ones): a 3-deep ring with dS double-buffered in mode 2,
    # mode 2 at D 64 outside the ordered form, the column stats read ahead at D 64 (and read where used at D 128),
    # the ordered form's first turn pass, its mode 1 at D 64, its tiles without the early S^T / dP^T
    "flash_bwd_knobs": "from ops.flash_attention import bwd as m; from ops.flash_attention.backward_fast_sm90 "
                       "import FlashBwdSm90Fast as K; K.BM128_DIMS = 0; K.STAGES = 3; K.DS_STAGES = 2; "
                       "K.DQ_COLS_DIMS = (64, 128); "
                       "K.STAT_AHEAD_DIMS = (64, 96); "
                       "m.compile_variant('bfloat16', 128, True, False, fast=2); "
                       "m.compile_variant('bfloat16', 64, False, False, fast=2); "
                       "K.STAGES = 2; K.DS_STAGES = None; K.TURN_PASS = 0; K.ORDERED_DQ_COLS_DIMS = (128,); "
                       "K.ORDERED_EARLY_SDP_DIMS = 0; "
                       "m.compile_variant('float16', 64, True, True, ordered=True)",
    # the previous tile's dQ epilogue under this tile's S^T / dP^T (EARLY_SDP_DIMS; the ordered form's default):
    # modes 1 and 2, ordered
    "flash_bwd_early": "from ops.flash_attention import bwd as m; from ops.flash_attention.backward_fast_sm90 "
                       "import FlashBwdSm90Fast as K; K.EARLY_SDP_DIMS = (64, 96, 128); "
                       "m.compile_variant('bfloat16', 64, False, False, fast=2); "
                       "m.compile_variant('bfloat16', 128, True, False, fast=2); K.EARLY_RELEASE = 1; "
                       "m.compile_variant('float16', 64, True, True, ordered=True); "
                       "m.compile_variant('bfloat16', 96, False, False, fast=2)",
    # the 64-row query tiles at D 64 (BM128_DIMS = 0; the 128-row ones are the default): both forms, with and
    # without the early S^T / dP^T
    "flash_bwd_bm64": "from ops.flash_attention import bwd as m; from ops.flash_attention.backward_fast_sm90 "
                      "import FlashBwdSm90Fast as K; K.BM128_DIMS = 0; "
                      "m.compile_variant('bfloat16', 64, True, False, fast=2); "
                      "m.compile_variant('float16', 64, True, True, ordered=True); K.EARLY_SDP_DIMS = (64,); "
                      "m.compile_variant('bfloat16', 64, False, False, fast=2)",
    "flash_bwd_wide": "from ops.flash_attention import bwd as m; m.compile_variant('bfloat16', 192, False, False, "
                      "v_head_dim=128)",
    "indexer_fwd": "from ops.dsa.indexer import fwd as m; m.compile_variant(m.variant_key(128, 64, 'float32', False, "
                   "True, False))",
    "sparse_indexer_scores": "from ops.dsa.indexer import sparse as m; m.compile_variant(m.variant_key(128, 64, "
                             "'float32', False, True))",
    "dense_attn_scores": "from ops.dsa.attn_score import dense as m; m.compile_variant(m.variant_key(576, 128, False, "
                         "False))",
    "sparse_attn_scores": "from ops.dsa.attn_score import sparse as m; m.compile_variant(m.variant_key(576, 128, "
                          "False, True))",
    "sparse_attn_scores_lockstep": "from ops.dsa.attn_score import sparse as m, sparse_sm90 as k; "
                                   "k.SparseAttnScoreSm90.HEAD_SPLIT = False; "
                                   "m.compile_variant(m.variant_key(576, 128, True, True))",
    "sparse_attn_fwd": "from ops.dsa.sparse_attn import fwd as m; m.compile_variant(m.variant_key(576, 512, 128, "
                       "False, True, True))",
    "sparse_attn_fwd_varlen": "from ops.dsa.sparse_attn import fwd as m; m.compile_variant(m.variant_key(576, 512, "
                              "128, True, True, True))",
    "sparse_attn_bwd": "from ops.dsa.sparse_attn import bwd as m; m.compile_variant(m.variant_key(576, 512, 128, "
                       "False, True, True, False))",
    "sparse_attn_bwd_deterministic": "from ops.dsa.sparse_attn import bwd as m; m.compile_variant(m.variant_key(576, "
                                     "512, 128, True, True, True, True, True))",
    "sparse_indexer_bwd": "from ops.dsa.indexer import sparse_bwd as m; m.compile_variant(m.variant_key(128, 64, "
                          "'float32', False, False))",
    "sparse_indexer_bwd_deterministic": "from ops.dsa.indexer import sparse_bwd as m; m.compile_variant("
                                        "m.variant_key(128, 64, 'float32', True, True, True))",
    "dense_indexer_bwd_deterministic": "from ops.dsa.indexer import dense_bwd as m; m.compile_variant("
                                       "m.variant_key(128, 64, 'bfloat16', False, True, True))",
    "dense_indexer_bwd": "from ops.dsa.indexer import dense_bwd as m; m.compile_variant(m.variant_key(128, 64, "
                         "'bfloat16', True, True))",
}


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="no ptxas on PATH")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_no_wgmma_serialization(name, tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); {KERNELS[name]}"], env=env,
                   check=True, timeout=900)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX kept"
    for p in ptx:
        src = tmp_path / "assemble.ptx"
        src.write_text(re.sub(r"(?m)^\.version 9\.\d+", ".version 9.0", p.read_text()))
        out = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(src), "-o", os.devnull], capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        serialized = [line for line in out.stderr.splitlines() if "C7520" in line or "serialized" in line]
        assert not serialized, "\n".join(serialized)
