"""DeepSeek Sparse Attention kernels (lightning indexer, top-k, sparse MLA attention, indexer loss
pieces) for sm90, CuTe DSL.

No kernel has landed yet: ``supported`` holds the shape table that paddle_dsa validates GPU-place calls
against, and such calls run paddle_dsa's pure-Paddle reference path on the GPU. Kernels added here
follow the seam convention of ``ops.flash_attention`` (framework-agnostic, DLPack tensors, outputs
preallocated by the caller and fully written, integer stream handle) and must match the semantics
fixed in docs/dsa.md. ``supported`` imports without the DSL installed.
"""
from . import supported  # noqa: F401
