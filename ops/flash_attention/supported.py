"""The one table of what the flash-attention GPU kernels support (no cutlass import here).

paddle_dsa's validation reads this table for tensors on a CUDA place; the reference path accepts any
head_dim and head count. A configuration outside the table is rejected with ValueError before launch.
"""

# head_dim values the sm90 kernels were written and tuned for (query/key and value share head_dim).
HEAD_DIMS = (64, 128)
# element types of q/k/v/out, by name.
DTYPES = ("bfloat16", "float16")
