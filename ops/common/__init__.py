"""Device-side building blocks shared by the sm90 attention kernels (CuTe DSL; no torch, no Paddle).

- ``mask``: visibility predicates (bottom-right aligned causal / sliding window / sequence end) and the
  key-block ranges that follow from them.
- ``softmax``: online softmax over a wgmma accumulator in base 2 (scale * log2(e) folded in fp32).
- ``tensors``: host side of a launch: DLPack objects wrapped as tvm_ffi tensors, their metadata and the
  layout checks (TMA strides, alignment, device), the stream handle.
"""
