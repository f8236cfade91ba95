"""Run-time switches of paddle_dsa (plain module attributes)."""

# Check the values of cu_seqlens tensors (first 0, non-decreasing, within the token count, segment
# lengths <= max_seqlen). Reading them costs a device-to-host copy for tensors on a GPU, which breaks
# CUDA-graph capture; turn it off only for inputs you have validated yourself.
check_cu_seqlens_values = True

# Bitwise-reproducible GPU backwards (slower): flash attention reduces dQ in a fixed order; sparse_attention sums
# d_kv per key in a fixed order from a staging buffer (docs/dsa.md, "Determinism").
deterministic_backward = False

# The most bytes of staging buffer the deterministic sparse_attention backward takes at a time (it works through
# the query rows in chunks that fit; at least one row: one row needs batch x topk x (heads / 64) x Dqk x 4 bytes).
deterministic_workspace_bytes = 1 << 30
