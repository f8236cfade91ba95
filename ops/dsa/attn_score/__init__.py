"""Attention-score recompute kernels (sm90, CuTe DSL): the target of the indexer's KL loss.

- ``dense.dense_attn_score_fwd``: attn_score[t, j] = sum_h 2^min(c q_h . k_j - lse_h log2 e, 120) over the
  ratio-causal visible keys, 0 elsewhere, and its row sums attn_l1norm; kernel in ``dense_sm90.py``.

Imported lazily: ``ops.dsa.supported`` stays readable without the DSL.
"""
