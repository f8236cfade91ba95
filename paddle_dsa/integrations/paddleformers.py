"""PaddleFormers' attention registry: ``register()`` adds paddle_dsa under a key of
``paddleformers.nn.attention.interface.AttentionInterface``; a model then selects it with
``config._attn_implementation = "paddle_dsa"``. PaddleFormers is imported only when register() runs.

The registered function keeps PaddleFormers' calling convention (its sdpa / flashmask forwards, 1.2.0):
    attention_forward(module, query, key, value, attention_mask=None, attn_mask_startend_row_indices=None,
                      dropout=0.0, sink=None, scaling=None, is_causal=None, **kwargs) -> (out [b, s, h * d], None)
with query / key / value [b, h, s, d]. Its rules, as PaddleFormers' flashmask forward has them: without a mask,
is_causal None means causal when s > 1 and the module's `is_causal` (default True) allows it; a startend_row_indices
of 3 dims gets a last axis; one column means causal, four columns non-causal (paddle_dsa.compat.flashmask_attention:
document masks). `scaling` is honoured when given (PaddleFormers' own non-sink paths use 1/sqrt(d)). Raised as
NotImplementedError, never ignored: a dense attention_mask, a sink, dropout > 0 while the module trains.
"""
from .. import compat

DEFAULT_NAME = "paddle_dsa"


def attention_forward(module, query, key, value, attention_mask=None, attn_mask_startend_row_indices=None,
                      dropout=0.0, sink=None, scaling=None, is_causal=None, **kwargs):
    op = "integrations.paddleformers.attention_forward"
    if attention_mask is not None:
        raise NotImplementedError(f"paddle_dsa.{op}: a dense attention_mask is not supported (pass "
                                  "attn_mask_startend_row_indices, or is_causal)")
    if sink is not None:
        raise NotImplementedError(f"paddle_dsa.{op}: attention sinks are not supported on dense attention")
    if dropout and getattr(module, "training", False):
        raise NotImplementedError(f"paddle_dsa.{op}: dropout = {dropout} while training is not supported")
    q, k, v = (x.transpose([0, 2, 1, 3]) for x in (query, key, value))      # [b, h, s, d] -> [b, s, h, d]
    sri = attn_mask_startend_row_indices
    if sri is None:
        if is_causal is None:
            is_causal = q.shape[1] > 1 and getattr(module, "is_causal", True)
    else:
        if sri.ndim == 3:
            sri = sri.unsqueeze(-1)
        is_causal = sri.shape[-1] == 1
    out = compat.flashmask_attention(q, k, v, sri, causal=bool(is_causal), softmax_scale=scaling, training=False)
    b, s = out.shape[0], out.shape[1]
    return out.reshape([b, s, out.shape[2] * out.shape[3]]), None


def register(name=DEFAULT_NAME):
    """Register attention_forward with PaddleFormers' AttentionInterface under `name`; returns the name."""
    try:
        from paddleformers.nn.attention.interface import AttentionInterface
    except ImportError as e:
        raise ImportError("paddle_dsa.integrations.paddleformers.register needs paddleformers "
                          f"(pip install paddleformers): {e}") from e
    AttentionInterface.register(name, attention_forward)
    return name
