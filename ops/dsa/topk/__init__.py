"""Top-k selection over indexer scores (sm90, CuTe DSL): ``fwd.topk_fwd``; kernel in ``topk_sm90.py``.

Imported lazily: ``ops.dsa.supported`` stays readable without the DSL.
"""
