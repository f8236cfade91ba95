"""Host side of the head-summed score kernels (ops/common/head_sum_sm90.py): argument checks, stand-in arguments for
compiling, the launch. Shared by the seams ops/dsa/indexer/fwd.py and ops/dsa/attn_score/dense.py.

A launch: q [B,Sq,H,D] / THD [Tq,H,D] (bf16, the (row, head) axes mergeable: row stride == H x head stride),
k [B,Sk,D] / [Tk,D] (bf16), a per-(row, head) column source (the seam checks it), scores fp32 [B,Sq,Sk] / [Tq,W],
a row statistic fp32 [B,Sq] / [Tq] (optional where the kernel allows), q_offsets int32 [B], cu_seqlens int32
[batch+1], max_seqlen_q (THD grid, a host int: no device read). Every check raises ValueError naming the argument
before any compile or launch.
"""
from .tensors import arg_tensor, check_grid_yz, cu_seqlens_pair, stream_handle


def _query_key(at, q_name, k_name, varlen, cu_seqlens_q, cu_seqlens_k, thd_slices=False):
    """Checks shared by both calls: bf16 q/k of ranks 4/3 (BSHD) or 3/2 (THD), one head_dim, the cu_seqlens pair or
    one batch, and the grid's y dimension (BSHD: the batch; THD with thd_slices: sequences + 1). Returns (heads,
    head_dim, rows, batch); stores the cu_seqlens ArgTensors in at."""
    qa, ka = at[q_name], at[k_name]
    qa.require_dtype("bfloat16")
    ka.require_dtype("bfloat16")
    nd = 3 if varlen else 4
    if len(qa.shape) != nd or len(ka.shape) != nd - 1:
        raise ValueError(f"{q_name}/{k_name}: expected ranks {nd}/{nd - 1} ({'THD' if varlen else 'BSHD'}), "
                         f"got shapes {qa.shape} and {ka.shape}")
    heads, head_dim = qa.shape[-2], qa.shape[-1]
    if ka.shape[-1] != head_dim:
        raise ValueError(f"{k_name}: head_dim {ka.shape[-1]} differs from {q_name}'s {head_dim}")
    rows = qa.shape[:-2]
    if varlen:
        at["cu_seqlens_q"], at["cu_seqlens_k"], batch = cu_seqlens_pair(cu_seqlens_q, cu_seqlens_k)
        if thd_slices:
            check_grid_yz(batch + 1, "cu_seqlens_q", "sequences + 1 (grid slices)")
    else:
        batch = rows[0]
        if ka.shape[0] != batch:
            raise ValueError(f"{k_name}: batch {ka.shape[0]} differs from {q_name}'s {batch}")
        check_grid_yz(batch, q_name, "batch rows")
    return heads, head_dim, rows, batch


def _require_mergeable(qa, heads):
    if qa.strides[-3] != heads * qa.strides[-2]:
        raise ValueError(f"{qa.name}: the (row, head) axes must be mergeable (row stride == heads x head stride), "
                         f"got strides {qa.strides}")


class HeadSumCall:
    """Checked arguments: ``at`` (name -> ArgTensor), ``varlen``, ``heads``, ``head_dim``, ``batch``, ``rows`` (the
    leading shape of q), ``grid_rows`` (query rows the grid must cover per sequence), ``empty`` (nothing to do).
    thd_slices: the kernel gives each THD sequence, and the rows past cu_seqlens_q[-1], a grid y slice (the dense
    score kernels, head_sum_sm90; the dense indexer backward does not)."""

    def __init__(self, names, q, k, scores, stat, q_offsets, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, ratio,
                 thd_slices=True):
        q_name, k_name, s_name, stat_name = names
        self.names = names
        self.varlen = cu_seqlens_q is not None
        if self.varlen != (cu_seqlens_k is not None):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
        at = {q_name: arg_tensor(q, q_name), k_name: arg_tensor(k, k_name), s_name: arg_tensor(scores, s_name)}
        if stat is not None:
            at[stat_name] = arg_tensor(stat, stat_name)
        if q_offsets is not None:
            at["q_offsets"] = arg_tensor(q_offsets, "q_offsets")
        self.at = at
        qa, ka, sa = at[q_name], at[k_name], at[s_name]
        sa.require_dtype("float32")
        self.heads, self.head_dim, self.rows, self.batch = _query_key(at, q_name, k_name, self.varlen, cu_seqlens_q,
                                                                      cu_seqlens_k, thd_slices)
        if self.varlen:
            if len(sa.shape) != 2 or sa.shape[0] != self.rows[0]:
                raise ValueError(f"{s_name}: expected shape ({self.rows[0]}, W), got {sa.shape}")
            stat_shape = self.rows
            self.grid_rows = int(max_seqlen_q)
            if self.grid_rows < 0:
                raise ValueError(f"max_seqlen_q must be >= 0, got {max_seqlen_q}")
            no_keys = ka.shape[0] == 0
        else:
            sq, sk = self.rows[1], ka.shape[1]
            if sa.shape != (self.batch, sq, sk):
                raise ValueError(f"{s_name}: expected shape {(self.batch, sq, sk)}, got {sa.shape}")
            stat_shape = (self.batch, sq)
            self.grid_rows = sq
            no_keys = sk == 0
        if stat is not None and at[stat_name].shape != stat_shape:
            raise ValueError(f"{stat_name}: expected shape {stat_shape}, got {at[stat_name].shape}")
        if q_offsets is not None:
            off = at["q_offsets"]
            if off.dtype != "int32" or off.shape != (self.batch,):
                raise ValueError(f"q_offsets: expected int32 [{self.batch}], got {off.dtype} {off.shape}")
            off.require_inner_contiguous(4)
        if int(ratio) < 1:
            raise ValueError(f"ratio must be >= 1, got {ratio}")
        self.empty = self.rows[0] == 0 or (not self.varlen and self.rows[1] == 0) or sa.shape[-1] == 0
        if self.empty:
            return
        if no_keys:
            raise ValueError(f"{k_name}: zero keys cannot be loaded by TMA (the caller writes the empty-key result)")
        qa.require_tma()
        ka.require_tma()
        _require_mergeable(qa, self.heads)
        sa.require_inner_contiguous(4)
        if stat is not None:
            at[stat_name].require_inner_contiguous(4)

    def launch(self, fn, col, n_cols, scale, causal, ratio, stream):
        """Call the compiled kernel: grid x covers grid_rows in tiles of n_cols / heads queries."""
        qt = n_cols // self.heads
        grid_x = max(1, -(-self.grid_rows // qt))
        q_name, k_name, s_name, stat_name = self.names
        opt = lambda n: self.at[n].ffi if n in self.at else None  # noqa: E731
        fn(self.at[q_name].ffi, self.at[k_name].ffi, col.ffi, self.at[s_name].ffi, opt(stat_name), opt("q_offsets"),
           opt("cu_seqlens_q"), opt("cu_seqlens_k"), float(scale), 1 if causal else 0, int(ratio), grid_x,
           stream_handle(stream))


def fake_tensor(dtype, shape, divisibility, align):
    """A stand-in tensor: None extents dynamic, inner stride 1, the other strides dynamic int64 multiples of
    `divisibility` elements, base `align`-byte aligned."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    shape = tuple(cute.sym_int() if s is None else s for s in shape)
    stride = tuple(cute.sym_int64(divisibility=divisibility) for _ in shape[:-1]) + (1,)
    return make_fake_tensor(dtype, shape, stride, assumed_align=align)


def _fake_common(head_dim, heads, varlen, col_dtype, col_shape):
    """(lead, q, k, col, cu factory) shared by both calls' stand-ins."""
    import cutlass
    t = fake_tensor
    lead = (None,) if varlen else (None, None)
    q = t(cutlass.BFloat16, lead + (heads, head_dim), 8, 16)
    k = t(cutlass.BFloat16, lead + (head_dim,), 8, 16)
    col = t(col_dtype, col_shape, 1, col_dtype.width // 8)
    cu = (lambda: t(cutlass.Int32, (None,), 1, 4)) if varlen else (lambda: None)
    return lead, q, k, col, cu


def fake_args(head_dim, heads, varlen, col_dtype, col_shape, with_stat, has_offsets):
    """Stand-in arguments (dynamic shapes and strides) under the layout rules HeadSumCall checks. col_shape: the
    column source's shape with None for dynamic extents (its innermost stride is 1, the others dynamic)."""
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    f32, i32 = cutlass.Float32, cutlass.Int32
    lead, q, k, col, cu = _fake_common(head_dim, heads, varlen, col_dtype, col_shape)
    s = fake_tensor(f32, lead + (None,), 1, 4)
    stat = fake_tensor(f32, lead, 1, 4) if with_stat else None
    off = fake_tensor(i32, (None,), 1, 4) if has_offsets else None
    return (q, k, col, s, stat, off, cu(), cu(), f32(1.0), i32(1), i32(1), i32(1), make_fake_stream())


class SparseHeadSumCall:
    """Checked arguments of a sparse (top-k slot) launch: q [B,Sq,H,D] / [Tq,H,D], k [B,Sk,D] / [Tk,D], idx int32
    [B,Sq,K] / [Tq,K], topk_length int32 [B,Sq] / [Tq] or None, scores fp32 like idx, stat fp32 [B,Sq] / [Tq]."""

    def __init__(self, names, q, k, idx, topk_length, scores, stat, cu_seqlens_q, cu_seqlens_k):
        q_name, k_name, s_name, stat_name = names
        self.names = names
        self.varlen = cu_seqlens_q is not None
        if self.varlen != (cu_seqlens_k is not None):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
        at = {q_name: arg_tensor(q, q_name), k_name: arg_tensor(k, k_name), "topk_indices": arg_tensor(idx, "topk_indices"),
              s_name: arg_tensor(scores, s_name), stat_name: arg_tensor(stat, stat_name)}
        if topk_length is not None:
            at["topk_length"] = arg_tensor(topk_length, "topk_length")
        self.at = at
        qa, ka, ia, sa, ta = at[q_name], at[k_name], at["topk_indices"], at[s_name], at[stat_name]
        ia.require_dtype("int32")
        sa.require_dtype("float32")
        ta.require_dtype("float32")
        self.heads, self.head_dim, self.rows, self.batch = _query_key(at, q_name, k_name, self.varlen, cu_seqlens_q,
                                                                      cu_seqlens_k)
        if len(ia.shape) != len(self.rows) + 1 or ia.shape[:-1] != self.rows:
            raise ValueError(f"topk_indices: expected shape {self.rows} + (K,), got {ia.shape}")
        if sa.shape != ia.shape:
            raise ValueError(f"{s_name}: expected shape {ia.shape}, got {sa.shape}")
        if ta.shape != self.rows:
            raise ValueError(f"{stat_name}: expected shape {self.rows}, got {ta.shape}")
        if topk_length is not None:
            tl = at["topk_length"]
            if tl.dtype != "int32" or tl.shape != self.rows:
                raise ValueError(f"topk_length: expected int32 {self.rows}, got {tl.dtype} {tl.shape}")
            tl.require_inner_contiguous(4)
        self.empty = 0 in self.rows or ia.shape[-1] == 0
        self.no_keys = ka.shape[0] == 0 or (not self.varlen and ka.shape[1] == 0)
        if self.empty:
            return
        if self.no_keys:
            raise ValueError(f"{k_name}: zero keys (the caller writes the empty-key result: every slot invalid)")
        qa.require_tma()
        if ka.strides[-1] != 1 or any((s * 2) % 16 for s in ka.strides[:-1]) or ka.ptr % 16:
            raise ValueError(f"{k_name}: rows must be 16-byte aligned with a unit inner stride (16-byte cp.async "
                             f"gathers), got strides {ka.strides}")
        _require_mergeable(qa, self.heads)
        for t in (ia, sa, ta):
            t.require_inner_contiguous(4)

    def launch(self, fn, col, scale, stream):
        q_name, k_name, s_name, stat_name = self.names
        opt = lambda n: self.at[n].ffi if n in self.at else None  # noqa: E731
        fn(self.at[q_name].ffi, self.at[k_name].ffi, col.ffi, self.at["topk_indices"].ffi, opt("topk_length"),
           self.at[s_name].ffi, self.at[stat_name].ffi, opt("cu_seqlens_q"), opt("cu_seqlens_k"), float(scale),
           stream_handle(stream))


def sparse_fake_args(head_dim, heads, varlen, col_dtype, col_shape, has_length):
    """Stand-in arguments for SparseHeadSumSm90 under the layout rules SparseHeadSumCall checks."""
    import cutlass
    from cutlass.cute.runtime import make_fake_stream
    f32, i32 = cutlass.Float32, cutlass.Int32
    lead, q, k, col, cu = _fake_common(head_dim, heads, varlen, col_dtype, col_shape)
    idx = fake_tensor(i32, lead + (None,), 1, 4)
    length = fake_tensor(i32, lead, 1, 4) if has_length else None
    s = fake_tensor(f32, lead + (None,), 1, 4)
    stat = fake_tensor(f32, lead, 1, 4)
    return (q, k, col, idx, length, s, stat, cu(), cu(), f32(1.0), make_fake_stream())
