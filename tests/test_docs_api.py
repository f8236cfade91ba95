"""docs/api.md stays in step with the code: every public op, config switch and PADDLE_DSA_* environment
variable the package reads is documented there, and the seam signatures it shows are the real ones."""
import inspect
import pathlib
import re

import paddle_dsa
from paddle_dsa import config

ROOT = pathlib.Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()
DSA = (ROOT / "docs" / "dsa.md").read_text()


def test_every_public_op_is_documented():
    for name in paddle_dsa._FUNCTIONAL:
        assert name in API or name in DSA, f"{name} is in neither docs/api.md nor docs/dsa.md"


def test_every_config_switch_is_documented():
    for name, value in vars(config).items():
        if not name.startswith("_") and isinstance(value, bool):
            assert f"paddle_dsa.config.{name}" in API, name


def test_every_env_switch_is_documented():
    names = set()
    for path in list((ROOT / "ops").rglob("*.py")) + list((ROOT / "paddle_dsa").rglob("*.py")):
        names |= set(re.findall(r"PADDLE_DSA_[A-Z0-9_]+", path.read_text()))
    assert names, "no PADDLE_DSA_* switch found: the scan is broken"
    for name in sorted(names):
        assert f"`{name}`" in API, f"{name} is read by the package but not documented in docs/api.md"


def test_flash_attention_signatures_match():
    from paddle_dsa.nn import functional as F
    for fn in (F.flash_attention, F.flash_attention_varlen):
        shown = f"F.{fn.__name__}{inspect.signature(fn)}"
        assert shown in API, f"docs/api.md does not show {shown}"


def test_dsa_thd_extent_signatures_match():
    """The DSA ops that take max_seqlen_q / max_seqlen_k are shown in docs/api.md with their real signatures."""
    from paddle_dsa.nn import functional as F
    shown_text = re.sub(r",\s+", ", ", API)
    for fn in (F.indexer_score, F.dense_indexer_score_recompute, F.dense_attn_score_recompute):
        assert "max_seqlen_k" in inspect.signature(fn).parameters
        shown = f"F.{fn.__name__}{inspect.signature(fn)}"
        assert shown in shown_text, f"docs/api.md does not show {shown}"


def test_seam_parameters_match():
    """The seam modules import cutlass; read their signatures from source instead."""
    import ast
    for path, fn in (("flash_attention/fwd.py", "flash_attn_fwd"), ("flash_attention/bwd.py", "flash_attn_bwd"),
                     ("dsa/indexer/fwd.py", "indexer_fwd"), ("dsa/indexer/sparse.py", "sparse_indexer_fwd"),
                     ("dsa/topk/fwd.py", "topk_fwd"), ("dsa/attn_score/dense.py", "dense_attn_score_fwd"),
                     ("dsa/attn_score/sparse.py", "sparse_attn_score_fwd"),
                     ("dsa/sparse_attn/fwd.py", "sparse_attn_fwd"), ("dsa/sparse_attn/bwd.py", "sparse_attn_bwd"),
                     ("dsa/indexer/sparse_bwd.py", "sparse_indexer_bwd"),
                     ("dsa/indexer/dense_bwd.py", "dense_indexer_bwd")):
        tree = ast.parse((ROOT / "ops" / path).read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        params = [a.arg for a in node.args.args] + [a.arg for a in node.args.kwonlyargs]
        block = API[API.index(f"{fn}("):]
        block = block[:block.index(")")]
        documented = [p.strip().split("=")[0].strip("* ") for p in block[len(fn) + 1:].replace("\n", " ").split(",")]
        assert [p for p in documented if p] == params, (fn, documented, params)
