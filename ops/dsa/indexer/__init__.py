"""Lightning indexer kernels (sm90, CuTe DSL).

- ``fwd.indexer_fwd``: scores ``sum_h w * relu(q_h . k)`` with the ratio-causal mask, optional row lse
  (indexer_score and dense_indexer_score_recompute); kernel in ``score_sm90.py``.

Imported lazily: ``ops.dsa.supported`` stays readable without the DSL.
"""
