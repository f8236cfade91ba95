"""Lightning indexer kernels (sm90, CuTe DSL).

- ``fwd.indexer_fwd``: scores ``sum_h w * relu(q_h . k)`` with the ratio-causal mask, optional row lse
  (indexer_score and dense_indexer_score_recompute); kernel in ``score_sm90.py``.

Imported lazily: ``ops.dsa.supported`` stays readable without the DSL.
"""
from .. import supported


def check_indexer_side(call, weights):
    """The checks both indexer seams add to their HeadSumCall / SparseHeadSumCall: head_dim and index heads in
    ops/dsa/supported.py, weights bf16/fp32 of shape rows + (H,). Returns the weights ArgTensor."""
    from ...common.tensors import arg_tensor
    H, D = call.heads, call.head_dim
    if D not in supported.INDEX_HEAD_DIMS:
        raise ValueError(f"index_q: head_dim {D} not supported (supported: {supported.INDEX_HEAD_DIMS})")
    if H not in supported.INDEX_HEADS:
        raise ValueError(f"index_q: {H} index heads not supported (supported: {supported.INDEX_HEADS})")
    w = arg_tensor(weights, "weights").require_dtype(*supported.WEIGHT_DTYPES)
    if w.shape != call.rows + (H,):
        raise ValueError(f"weights: expected shape {call.rows + (H,)}, got {w.shape}")
    return w
