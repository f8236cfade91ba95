"""GPU test setup: repo root and this folder on sys.path (``import ops...``, ``import reference``); skip without CUDA."""
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        ok = torch.cuda.is_available()
    except Exception:
        ok = False
    if not ok:
        skip = pytest.mark.skip(reason="needs torch with a CUDA device")
        for item in items:
            if HERE in str(item.fspath):
                item.add_marker(skip)
