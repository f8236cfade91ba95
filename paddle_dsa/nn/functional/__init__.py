"""paddle_dsa.nn.functional: the public ops (paddle.incubate style)."""
from .flash_attention import flash_attention, flash_attention_varlen  # noqa: F401
from .dsa import (  # noqa: F401
    dense_attn_score_recompute,
    dense_indexer_backward,
    dense_indexer_score_recompute,
    indexer_kl_loss,
    indexer_score,
    indexer_topk,
    sparse_attention,
    sparse_attn_score_recompute,
    sparse_indexer_backward,
    sparse_indexer_score_recompute,
)
from .dsa import __all__ as _dsa_all

__all__ = ["flash_attention", "flash_attention_varlen"] + list(_dsa_all)
