"""Pure-Paddle reference of the DeepSeek Sparse Attention (DSA) ops: the CPU fallback and the test oracle.

One small module per job:
    _common          constants (clamps), the token layout shared by BSHD and THD, masks, gathers
    indexer          lightning-indexer scores (dense blockwise over keys, sparse over top-k slots) and lse
    topk             per-row top-k of finite scores
    sparse_attention sparse MLA (MQA) attention forward and backward
    attn_score       attention-side score recompute (dense and sparse) for the indexer loss
    indexer_loss     the KL loss value and the indexer backward (dense and sparse)

Everything here works on a token-major layout (see _common.Layout): BSHD tensors are reshaped to
[B * S, ...] and THD tensors are used as they are, so both layouts run the same code.
"""
