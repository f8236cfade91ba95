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
# query rows a forward CTA takes per (D, Dv, bounded mask): 64 a consumer warpgroup; 192 = three consumer warpgroups
# (the D 64 tile: a key block's two matmuls are half as long as at D 128 while the softmax per row is the same, so
# more rows share each K / V block); every other variant 128. At D 64 the 192-row tile is faster with and without a
# bounded mask since the mask's bounds are relative (H100 2026-12-07, B 2 H 16 S 8K, same run: non-causal 1.015x,
# causal 1.056x against 192/128; docs/performance.md), hence the default "192/192".
# PADDLE_DSA_FWD_BM64="<unmasked>/<masked>" (read at import, each 128 or 192) sets the D 64 rows, for same-run A/B.
FWD_BLOCK_M_DEFAULT = 128
_BM64 = __import__("os").environ.get("PADDLE_DSA_FWD_BM64", "192/192")


def _bm64_table(text):
    parts = text.split("/")
    if len(parts) != 2 or any(p not in ("128", "192") for p in parts):
        raise ValueError(f"PADDLE_DSA_FWD_BM64 must be '<unmasked>/<masked>' with each 128 or 192, got {text!r}")
    return {(64, 64, False): int(parts[0]), (64, 64, True): int(parts[1])}


FWD_BLOCK_M = None   # the table, parsed from the environment at first use (a bad value: ValueError then, not at import)


def fwd_block_m(head_dim, v_head_dim, bounded):
    global FWD_BLOCK_M
    if FWD_BLOCK_M is None:
        FWD_BLOCK_M = _bm64_table(_BM64)
    return FWD_BLOCK_M.get((int(head_dim), int(v_head_dim), bool(bounded)), FWD_BLOCK_M_DEFAULT)


# element types of q/k/v/out, by name.
DTYPES = ("bfloat16", "float16")
