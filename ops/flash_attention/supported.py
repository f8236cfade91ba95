"""The one table of what the flash-attention GPU kernels support (no cutlass import here).

paddle_dsa's validation reads this table for tensors on a CUDA place; the reference path accepts any
head_dim and head count. A configuration outside the table is rejected with ValueError before launch.
"""

# (query/key head_dim, value head_dim) pairs the sm90 forward kernel was written and tuned for
# (forward_sm90.TILES holds each pair's tile); out and dv follow the value head_dim.
FWD_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256))
# the pairs the sm90 backward kernels run (all forward pairs, H200 2026-12-04); a forward pair missing here would
# take the pure-Paddle reference backward (blockwise, on the same GPU, with a one-time warning).
BWD_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256))
# the wide pairs of BWD_HEAD_DIMS: backward_sm90.py's split form (dV, dK and dQ in separate launches, no atomics,
# deterministic by construction; no pipelined kernel).
BWD_WIDE_HEAD_DIMS = ((192, 128), (192, 192), (256, 256))
# query/key head_dim values of the forward table.
HEAD_DIMS = tuple(sorted({d for d, _ in FWD_HEAD_DIMS}))
# element types of q/k/v/out, by name.
DTYPES = ("bfloat16", "float16")
