"""Sparse MLA attention kernels (sm90, CuTe DSL): MQA attention of each query row over its own top-k kv rows.

- ``fwd.sparse_attn_fwd``: out = softmax over the valid slots (optional sink in the denominator) times V = kv[:, :Dv],
  and softmax_lse (natural log, sink not included); kernel in ``fwd_sm90.py``.

Imported lazily: ``ops.dsa.supported`` stays readable without the DSL.
"""
