"""DeepSeek Sparse Attention kernels for sm90, CuTe DSL (framework-agnostic seams; DLPack tensors, outputs
preallocated by the caller and fully written, an integer stream handle; semantics of docs/dsa.md).

- ``indexer/``: ``fwd.indexer_fwd`` (indexer_score and dense_indexer_score_recompute: scores, optional lse) and
  ``sparse.sparse_indexer_fwd`` (sparse_indexer_score_recompute over top-k slots).
- ``attn_score/``: ``dense.dense_attn_score_fwd`` and ``sparse.sparse_attn_score_fwd`` (the attention-score
  recomputes: head-summed clamped probabilities and their l1 norm).
- ``topk/``: ``fwd.topk_fwd`` (indexer_topk), where installed.
- ``sparse_attn/``: ``fwd.sparse_attn_fwd`` (the sparse MLA attention forward of sparse_attention).
The dense kernels share ops/common/head_sum_sm90.py, the sparse score ones ops/common/sparse_head_sum_sm90.py; the
sparse ones share ops/common/gather_sm90.py.
``supported`` is the one shape table paddle_dsa validates GPU-place calls against; it imports without the DSL (the
kernel modules are imported lazily by their seams).
"""
from . import supported  # noqa: F401
