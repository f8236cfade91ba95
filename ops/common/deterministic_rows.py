"""The deterministic form of the sparse backwards' scatter-add (dkv of the sparse attention backward, d_index_k of
the indexer backwards), host side: query rows in chunks, each chunk staged, sorted by key and summed in a fixed order.

For each chunk of query rows [row0, row0 + R) (R rows of every batch):
  1. `launch(stage, keys, row0)`: the backward kernel's deterministic variant writes entry e's `groups` gradient rows
     (width fp32 each) to stage rows e * groups + g and entry e's global key (the destination row of `out`, -1: no
     contribution) to keys[e], for every entry e = ((row - row0) * n_batch + batch) * n_slots + slot of the chunk;
  2. workspace.sort_keys(keys, n_out) -> (sorted_keys, order): the entries by key, equal keys by entry;
  3. segment_sum_sm90: out[k] += the rows of k's entries in that order (one launch, no atomics).
The per-key order is (row, slot, group) whatever the chunk size, so the result is bitwise the same for every
`workspace_bytes` and every run. `out` must be zeroed first (the caller does, on the same stream).

`workspace` is the framework's side: .alloc(shape, dtype_name) -> a new uninitialised tensor, .export(t) -> its
DLPack export (writable, never a copy), .sort_keys(keys, n_out) -> (sorted_keys, order), int32 [E] tensors of the
framework: the keys in non-decreasing order (an entry whose key is outside [0, n_out), i.e. -1, may sort anywhere
the order stays non-decreasing: it is never summed), order[i] the entry at position i, equal keys in increasing
entry order; every op on the caller's stream. Memory a chunk: the staging buffer (<= workspace_bytes, at least one
row's worth), the keys int32 [E], the sort's results (two int32 [E]) and its temporaries (the framework's: e.g.
int64 [E] values and the sort's scratch for paddle_dsa's DeterministicWorkspace).
"""


SMS = 132      # H200 SMs: a chunk holds whole waves of the backward's one-CTA-a-(row, head group, batch) grid


def check_workspace(workspace, workspace_bytes):
    """ValueError naming the argument unless deterministic mode can run with these."""
    if workspace is None or not all(callable(getattr(workspace, m, None)) for m in ("alloc", "export", "sort_keys")):
        raise ValueError("workspace: deterministic=True needs an object with alloc, export and sort_keys "
                         "(ops/common/deterministic_rows.py)")
    if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, int) or workspace_bytes < 0:
        raise ValueError(f"workspace_bytes: expected an int >= 0, got {workspace_bytes!r}")


def check_row(n_batch, n_slots, groups, width):
    """ValueError unless one query row's staging rows fit int32 element offsets (the seams call it before any
    launch); returns the rows a chunk may hold at most."""
    row_elems = n_batch * n_slots * groups * width
    cap = (2 ** 31 - 1) // max(row_elems, 1)                      # int32 element offsets in the staging buffer
    if cap < 1:
        raise ValueError(f"deterministic=True: one query row stages {row_elems} fp32 values (batch {n_batch} x "
                         f"{n_slots} slots x {groups} x {width}), more than int32 offsets reach; use the default "
                         f"mode or split the batch")
    return cap


def run_in_chunks(launch, *, n_rows, n_batch, n_slots, groups, width, out, out_rank, n_out, workspace,
                  workspace_bytes, stream):
    """Steps 1-3 above for rows [0, n_rows); out: the tvm_ffi fp32 tensor (out_rank axes, n_out rows of `width`
    contiguous); n_slots >= 1."""
    from .segment_sum_sm90 import segment_sum
    from .tensors import arg_tensor
    per_row = n_batch * n_slots                                   # entries a query row
    row_elems = per_row * groups * width
    cap = check_row(n_batch, n_slots, groups, width)
    chunk = max(1, min(cap, workspace_bytes // (row_elems * 4)))
    wave = max(1, SMS // (groups * n_batch))                      # rows whose CTAs fill the SMs once
    if chunk > wave:
        chunk -= chunk % wave                                     # whole waves (the sums do not depend on it)
    for row0 in range(0, n_rows, chunk):
        n_e = min(chunk, n_rows - row0) * per_row
        stage = arg_tensor(workspace.export(workspace.alloc((n_e * groups, width), "float32")), "staging workspace")
        keys_t = workspace.alloc((n_e,), "int32")
        launch(stage.ffi, arg_tensor(workspace.export(keys_t), "keys workspace").ffi, row0)
        if n_out:
            sorted_keys, order = workspace.sort_keys(keys_t, n_out)
            segment_sum(stage.ffi, arg_tensor(workspace.export(sorted_keys), "sorted keys").ffi,
                        arg_tensor(workspace.export(order), "entry order").ffi, out, width=width, rank=out_rank,
                        n_out=n_out, groups=groups, stream=stream)
