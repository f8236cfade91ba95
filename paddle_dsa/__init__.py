"""paddle_dsa: flash attention and DeepSeek Sparse Attention for PaddlePaddle.

The public API lives in ``paddle_dsa.nn.functional`` and is re-exported here. Paddle is imported
lazily (on first use of an API name), so ``import paddle_dsa.ops`` works on a machine without Paddle.
"""
__version__ = "0.1.0"

# The port's import-order step (e.g. Paddle 2.6 needs zlib loaded before paddle) runs here, before any
# module of paddle_dsa imports paddle. It reads the Paddle release from package metadata and imports no
# Paddle itself; the port module is selected on first use of paddle_dsa.ports.PORT.
from . import ports as _ports  # noqa: E402,F401

_FUNCTIONAL = (
    "flash_attention",
    "flash_attention_varlen",
    "indexer_score",
    "indexer_topk",
    "sparse_attention",
    "dense_indexer_score_recompute",
    "dense_attn_score_recompute",
    "dense_indexer_backward",
    "sparse_indexer_score_recompute",
    "sparse_attn_score_recompute",
    "sparse_indexer_backward",
    "indexer_kl_loss",
)

__all__ = list(_FUNCTIONAL) + ["nn", "config"]


def __getattr__(name):
    if name in _FUNCTIONAL:
        from .nn import functional

        return getattr(functional, name)
    if name in ("nn", "config"):
        import importlib

        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'paddle_dsa' has no attribute {name!r}")
