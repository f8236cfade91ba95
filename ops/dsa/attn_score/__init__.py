"""Attention-score recompute kernels (sm90, CuTe DSL): the target of the indexer's KL loss.

- ``dense.dense_attn_score_fwd``: attn_score[t, j] = sum_h 2^min(c q_h . k_j - lse_h log2 e, 120) over the
  ratio-causal visible keys, 0 elsewhere, and its row sums attn_l1norm; kernel in ``dense_sm90.py``.

Imported lazily: ``ops.dsa.supported`` stays readable without the DSL.
"""
import math

from .. import supported


def check_attention_side(call, softmax_lse, softmax_scale):
    """The checks both attention-score seams add to their HeadSumCall / SparseHeadSumCall: Dqk and heads in
    ops/dsa/supported.py, softmax_lse float32 [B,H,Sq] / [H,Tq], a finite scale. Returns (lse ArgTensor, scale)."""
    from ...common.tensors import arg_tensor
    H, D = call.heads, call.head_dim
    dims = sorted({d for d, _ in supported.QK_V_HEAD_DIMS})
    if D not in dims:
        raise ValueError(f"query: head_dim {D} not supported (supported: {dims})")
    if H not in supported.QUERY_HEADS:
        raise ValueError(f"query: {H} heads not supported (supported: {supported.QUERY_HEADS})")
    lse = arg_tensor(softmax_lse, "softmax_lse").require_dtype("float32")
    want = (H, call.rows[0]) if call.varlen else (call.batch, H, call.rows[1])
    if lse.shape != want:
        raise ValueError(f"softmax_lse: expected shape {want}, got {lse.shape}")
    scale = float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return lse, scale
