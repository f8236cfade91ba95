"""Run-time switches of paddle_dsa (plain module attributes)."""

# Check the values of cu_seqlens tensors (first 0, non-decreasing, within the token count, segment
# lengths <= max_seqlen). Reading them costs a device-to-host copy for tensors on a GPU, which breaks
# CUDA-graph capture; turn it off only for inputs you have validated yourself.
check_cu_seqlens_values = True

# Make the GPU backward reduce dQ in a fixed order (bitwise-reproducible gradients, somewhat slower).
deterministic_backward = False
