"""paddle_dsa.nn.functional: the public ops (paddle.incubate style)."""
from .flash_attention import flash_attention, flash_attention_varlen  # noqa: F401

__all__ = ["flash_attention", "flash_attention_varlen"]
