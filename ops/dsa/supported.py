"""The one table of what the DSA GPU kernels support (no cutlass import here).

paddle_dsa's validation reads this table for tensors on a CUDA place and rejects anything outside it
with ValueError (TypeError for a dtype) before any work; the reference path accepts any shape.
A call that passes this check runs on a kernel where one exists (ops/dsa/__init__.py lists them), else on the reference path.
"""

# Lightning indexer (indexer_score, the dense/sparse indexer recompute and backward, indexer_kl_loss):
INDEX_HEAD_DIMS = (64, 128)      # Di of index_q / index_k
INDEX_HEADS = (16, 32, 64)       # Hi, index heads per (single) index key head
INDEX_DTYPES = ("bfloat16",)     # index_q, index_k
WEIGHT_DTYPES = ("bfloat16", "float32")

# Sparse MLA attention and the attention-score recompute (MQA: one latent kv row per token):
QK_V_HEAD_DIMS = ((576, 512), (512, 512))   # (Dqk, Dv) pairs
QUERY_HEADS = (64, 128)                      # H
ATTN_DTYPES = ("bfloat16",)                  # query, kv

# Top-k selection over indexer scores (larger k runs on the reference path):
TOPK_SCORE_DTYPES = ("float32",)
TOPK_MAX_K = 2048
