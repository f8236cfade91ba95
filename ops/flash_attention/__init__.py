"""Flash attention (forward and backward) for sm90, CuTe DSL.

Seam functions (framework-agnostic; outputs are preallocated by the caller and fully written here):

- ``fwd.flash_attn_fwd(q, k, v, out, lse, *, softmax_scale, causal, window, cu_seqlens_q=None,
  cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, stream=0)``
- ``bwd.flash_attn_bwd(q, k, v, out, dout, lse, dq, dk, dv, *, dlse=None, softmax_scale, causal,
  window, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, deterministic=False,
  alloc, stream=0)``

Forward (``forward_sm90.py``): TMA bulk tensor loads + wgmma, 128 query rows per CTA (2 consumer warpgroups +
a producer warpgroup; 192 rows and 3 consumer warpgroups at head dim 64: supported.fwd_block_m), key blocks of BN = 128 (64 for head dims 192 / 256), QK(n+1) and PV(n) in flight during
softmax(n); dense BSHD and varlen THD, GQA/MQA, bottom-right causal, sliding windows, bf16/fp16, (head_dim,
value head_dim) as supported.FWD_HEAD_DIMS; the backward kernels take supported.BWD_HEAD_DIMS. Tested on the
H200 (tests/gpu/test_flash_fwd.py, compute-sanitizer racecheck/memcheck clean). Variants cached per (dtype,
head_dim, value head_dim, masked?, varlen?); ``fwd.all_variant_keys()`` lists them for the CPU compile tests.

They are imported lazily so that ``supported`` can be read without the DSL installed.
"""
from . import supported  # noqa: F401
