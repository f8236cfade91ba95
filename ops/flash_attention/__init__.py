"""Flash attention (forward and backward) for sm90, CuTe DSL.

Seam functions (framework-agnostic; outputs are preallocated by the caller and fully written here):

- ``fwd.flash_attn_fwd(q, k, v, out, lse, *, softmax_scale, causal, window, cu_seqlens_q=None,
  cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, stream=0)``
- ``bwd.flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, *, dlse=None, softmax_scale, causal,
  window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, deterministic=False,
  alloc, stream=0)``

They are imported lazily so that ``supported`` can be read without the DSL installed.
"""
from . import supported  # noqa: F401
