"""DeepSeek Sparse Attention ops: public API, validation, PyLayer autograd, dispatch.

Semantics, clamps and masked-row conventions: docs/dsa.md. Layouts: BSHD (batch and sequence axes) or
THD (packed: the two merged into one token axis, with cu_seqlens_q / cu_seqlens_k int32 [batch + 1];
top-k indices and score columns are local to each sequence). On a CUDA place the shapes are checked
against ops/dsa/supported.py (ValueError outside it), then (_route):
- an empty problem (no row, no key, zero score columns or slots) gets its documented result built in Paddle (scores
  -inf / 0, lse and l1norm 0, top-k -1; sparse attention out 0, lse -inf), no launch;
- indexer_score, dense_indexer_score_recompute, indexer_topk (k <= 2048), sparse_indexer_score_recompute, the
  two attention-score recomputes and the sparse_attention forward call their ops.dsa seam (paddle_dsa/kernels/dsa.py)
  when it imports and is routed (kernels/dsa.py ROUTED); otherwise, and for every
  other op, the pure-Paddle reference path (paddle_dsa.reference.dsa) runs on the GPU with a one-time warning naming
  what is missing. sparse_attention's backward: after a kernel-route forward, its own seam (sparse_attention_bwd)
  when that is routed (not yet), else the reference path with the warning; after a reference-route forward, the
  reference path. sparse_indexer_backward: its seam (sparse_indexer_bwd) when routed (not yet); the sparse stage
  of indexer_kl_loss: the statistics seams (sparse_indexer, sparse_attn_score) in its forward and backward and
  sparse_indexer_bwd in its backward when all three are routed (not yet: sparse_indexer_bwd); otherwise both on
  the reference path with the warning naming the first seam missing. grad_scale = loss_coeff * grad_loss / N is
  computed on the device there (THD: N = cu_seqlens_q[-1] read by a device op).
The kernel path reads nothing on the host except THD extents it was not given (max_seqlen_q / max_seqlen_k) and,
with config.check_cu_seqlens_values on, the cu_seqlens it validates (sparse_attention: in its forward; its backward
on the reference path reads cu_seqlens to build the slot table, on the backward seam nothing); the reference path
reads cu_seqlens and q_offsets.
"""
import math

import paddle

from ... import config
from ... import validation as V
from ..._port import PORT
from ...kernels import dsa as gpu
from ...ops.dsa import supported as SUPPORTED
from ...reference.dsa import _common as C
from ...reference.dsa import attn_score as ref_attn
from ...reference.dsa import indexer as ref_index
from ...reference.dsa import indexer_loss as ref_loss
from ...reference.dsa import sparse_attention as ref_sparse
from ...reference.dsa import topk as ref_topk
from . import _dsa_inputs as I
from . import _saved as S
from ._empty import empty_attention, empty_loss

__all__ = [
    "indexer_score",
    "indexer_topk",
    "sparse_attention",
    "dense_indexer_score_recompute",
    "dense_attn_score_recompute",
    "dense_indexer_backward",
    "sparse_indexer_score_recompute",
    "sparse_attn_score_recompute",
    "sparse_indexer_backward",
    "indexer_kl_loss",
]

_F32 = paddle.float32


def _start(op):
    V.require_dynamic_mode(op)


def _gpu(op, on_gpu):
    """An op with no kernel yet: the reference path, with the one-time warning on a GPU place."""
    if on_gpu:
        I.gpu_fallback_note(op, "no GPU kernel exists for this op yet")


def _route(op, on_gpu, which, empty=False, why_not=None):
    """How a call of a kernel-backed op runs: "empty" (any place, an empty axis: nothing to compute, Paddle builds the
    documented result; no launch, and no zero-size tensor reaches the reference path, whose reshapes Paddle 2.6
    reads differently), "kernel" (GPU place, the ops.dsa seam `which` serves it) or "reference" (a CPU place; or a
    GPU place where the seam does not serve it, with the one-time warning saying why)."""
    if empty:
        return "empty"
    if not on_gpu:
        return "reference"
    reason = why_not or gpu.missing(which)
    if reason is None:
        return "kernel"
    I.gpu_fallback_note(op, reason)
    return "reference"


def _dense_empty(seq):
    """A dense score problem with nothing to compute: no query row, no key, or zero score columns (BSHD: B, Sq or
    Sk is 0). The THD width may need a host read: only when the caller gave no max_seqlen_k."""
    return seq.tq == 0 or seq.tk == 0 or seq.width() == 0


def _filled(shape, value, dtype=_F32):
    return paddle.full(list(shape), value, dtype=dtype)


def _empty_scores(seq, cols, score_fill):
    """The documented result of an empty problem: scores [rows, cols] all score_fill (-inf: index, 0: attention)
    and the row statistic 0 (index_lse, attn_l1norm)."""
    return _filled(seq.rows() + (cols,), score_fill), _filled(seq.rows(), 0.0)


def _ref_layout(seq, q_offsets, causal, ratio):
    """The reference path's layout and per-row causal limits (reads cu_seqlens and q_offsets on the host)."""
    layout = seq.layout(q_offsets)
    return layout, C.row_limits(layout, causal, ratio)


def _thd_args(seq):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q) for a dense kernel seam: tensors and a host int, no host read when
    the caller gave max_seqlen_q."""
    if not seq.thd:
        return None, None, 0
    return seq.cu_tensors + (seq.grid_q(),)


# ----------------------------------------------------------------------------------------------------
# Lightning indexer
# ----------------------------------------------------------------------------------------------------
def _dense_index(op, index_q, index_k, weights, causal, ratio, q_offsets, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                 max_seqlen_k=None, kernel=None):
    """Checked arguments of a dense indexer op: (seq, causal, ratio, route). kernel: the ops.dsa seam that serves this
    op on a GPU place (None: the reference path, with the fallback warning)."""
    seq, hi, di, on_gpu = I.check_indexer(op, index_q, index_k, weights, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                          max_seqlen_k)
    causal, ratio = I.check_causal(op, seq, causal, ratio, q_offsets)
    V.check_same_place(op, ("index_q", "q_offsets"), (index_q, index_q if q_offsets is None else q_offsets))
    if kernel is None:
        _gpu(op, on_gpu)
        return seq, causal, ratio, "reference"
    return seq, causal, ratio, _route(op, on_gpu, kernel, _dense_empty(seq))


def _dense_index_scores(seq, route, index_q, index_k, weights, causal, ratio, q_offsets, with_lse):
    """(scores, lse) in the public shapes, lse None unless with_lse."""
    if route == "empty":
        s, lse = _empty_scores(seq, seq.width(), C.NEG_INF)
    elif route == "kernel":
        cu_q, cu_k, max_q = _thd_args(seq)
        s, lse = gpu.indexer_scores(index_q, index_k, weights, causal=causal, ratio=ratio, q_offsets=q_offsets,
                                    cu_q=cu_q, cu_k=cu_k, max_q=max_q, width=seq.width(), with_lse=with_lse)
    else:
        layout, limits = _ref_layout(seq, q_offsets, causal, ratio)
        out = ref_index.dense_scores(*_index_rows(seq, index_q, index_k, weights), layout, limits, _F32,
                                     with_lse=with_lse)
        s, lse = _public_rows(layout, *out) if with_lse else (layout.rows_to_public(out), None)
    return s, (lse if with_lse else None)


def _index_rows(seq, index_q, index_k, weights):
    return I.flat_rows(seq, index_q), I.flat_rows(seq, index_k), I.flat_rows(seq, weights)


def indexer_score(index_q, index_k, weights, *, causal=True, ratio=1, q_offsets=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """Lightning-indexer scores S[b,i,j] = sum_h weights[b,i,h] * relu(index_q[b,i,h,:] . index_k[b,j,:]).

    Args:
        index_q: [B, Sq, Hi, Di] (THD: [Tq, Hi, Di]); index_k: [B, Sk, Di] (THD: [Tk, Di]), one key head
            shared by all index heads; weights: [B, Sq, Hi] (THD: [Tq, Hi]).
        causal: key j visible iff j < clamp((q_offsets[b] + i + 1) // ratio, 0, Sk); without causal every
            key of the row's sequence is visible (ratio then has no effect).
        ratio: key compression ratio (int >= 1). q_offsets: int32 [batch], absolute position of each
            sequence's first local query (default 0).
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] for THD.
        max_seqlen_q, max_seqlen_k: THD only, optional host ints >= the longest query / key sequence:
            max_seqlen_k is the output width, max_seqlen_q sizes the kernel grid. With both given and
            config.check_cu_seqlens_values off, the GPU path reads nothing on the host (CUDA-graph safe).
    Returns:
        float32 [B, Sq, Sk] (THD: [Tq, max_seqlen_k], columns local to each row's sequence, -inf past
        its length; rows at or past cu_seqlens_q[-1] all -inf); invisible entries -inf. No gradient
        (train the indexer through indexer_kl_loss).
    """
    op = "indexer_score"
    _start(op)
    seq, causal, ratio, route = _dense_index(op, index_q, index_k, weights, causal, ratio, q_offsets, cu_seqlens_q,
                                             cu_seqlens_k, max_seqlen_q, max_seqlen_k, kernel="indexer")
    with paddle.no_grad():
        return _dense_index_scores(seq, route, index_q, index_k, weights, causal, ratio, q_offsets, False)[0]


def indexer_topk(scores, k, *, lengths=None, sorted=True):
    """Indices of the k largest finite scores of each row, by descending score.

    Args:
        scores: float [B, Sq, Sk] (or THD [Tq, W]), e.g. from indexer_score; -inf / non-finite entries are
            never selected. k: int >= 1 (any size; k > Sk pads with -1).
        lengths: optional int32 [B, Sq] (THD [Tq]): row r considers only its first lengths[r] columns. For
            causal scores, pass each row's visible key count: the selection is the same and the kernel reads about
            half of the bytes (docs/dsa.md, "Pass lengths for causal scores").
        sorted: True (default): by descending score, ties lower column first. False: the same columns in
            ascending column order, -1 padding last (deterministic; sparse attention does not depend on the
            slot order).
    Returns:
        int32 [B, Sq, k] (THD [Tq, k]); -1 where a row has fewer than k selectable scores. Ties at the k-th
        score keep the lower columns.
    """
    op = "indexer_topk"
    _start(op)
    by_score = V.check_bool(op, "sorted", sorted)
    V.check_tensor(op, "scores", scores)
    shp = PORT.shape(scores)
    if len(shp) not in (2, 3):
        V.fail(op, f"`scores` must have rank 3 ([batch, seq_q, seq_k]) or 2 (THD [total_q, width]), got shape {list(shp)}")
    V.check_dtype(op, "scores", scores, I.REF_DTYPES)
    k = V.check_int(op, "k", k, minimum=1)
    V.check_optional_int_tensor(op, "lengths", lengths, shp[:-1], "int32 " + ("[batch, seq_q]" if len(shp) == 3 else "[total_q]"))
    if lengths is not None:
        V.check_same_place(op, ("scores", "lengths"), (scores, lengths))
    on_gpu = PORT.is_gpu(scores)
    if on_gpu:
        dt = PORT.dtype_name(scores.dtype)
        if dt not in SUPPORTED.TOPK_SCORE_DTYPES:
            V.fail(op, f"`scores` dtype {dt} is not supported on a GPU place; supported: "
                       f"{', '.join(SUPPORTED.TOPK_SCORE_DTYPES)}", TypeError)
    rows = 1
    for d in shp[:-1]:
        rows *= d
    if rows == 0 or shp[-1] == 0:           # no row, or no column to select: -1 everywhere, on every place
        return _filled(list(shp[:-1]) + [k], -1, paddle.int32)
    too_wide = f"k = {k} > {SUPPORTED.TOPK_MAX_K}, the top-k kernel's limit" if k > SUPPORTED.TOPK_MAX_K else None
    route = _route(op, on_gpu, "topk", False, too_wide)
    with paddle.no_grad():
        if route == "kernel":
            return gpu.topk(scores, k, lengths, order="score" if by_score else "column")
        idx = ref_topk.topk(scores.reshape([rows, shp[-1]]), k,
                            None if lengths is None else lengths.reshape([rows])).reshape(list(shp[:-1]) + [k])
        return idx if by_score else ref_topk.by_column(idx)


# ----------------------------------------------------------------------------------------------------
# Sparse MLA attention
# ----------------------------------------------------------------------------------------------------
class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class _SparseAttention(paddle.autograd.PyLayer):
    """apply(query, kv, [attn_sink,] cfg) -> (out, softmax_lse).

    Reference route (cfg.kernel False): query / kv are the token-major rows [Tq,H,Dqk] / [Tk,Dqk] and cfg holds the
    slot table (gidx, valid) the caller built; returns out_rows [Tq,H,Dv] and lse_rows float32 [Tq,H] (the caller
    puts them in the public layout; the lse saved for the backward stays in the compute dtype, float64 for float64).
    Kernel route (cfg.kernel True): query / kv as the caller passed them; the forward is the ops.dsa seam
    (kernels/dsa.py sparse_attention: no host read, no device-to-host sync) and returns out and softmax_lse in the
    public layout. Its backward is the backward seam (kernels/dsa.py sparse_attention_bwd, on the saved public-layout
    tensors: no host read, no device-to-host sync) when that seam is routed (kernels/dsa.py ROUTED: it is), else
    the reference path's: it flattens to rows and builds the slot table lazily, there (for THD that reads cu_seqlens
    on the host: a device-to-host copy in the backward), with the one-time warning naming why. The tensors the
    slots come from (topk_indices, topk_length, cu_seqlens) are saved with the rest, so an in-place change to them
    between forward and backward raises instead of giving wrong gradients.
    Reference route: the reference backward, on the rows.
    """

    @staticmethod
    def forward(ctx, query, kv, *rest):
        cfg = rest[-1]
        sink = rest[0] if len(rest) == 2 else None
        ctx.cfg = cfg
        ctx.has_sink = sink is not None
        ctx.want = tuple(PORT.needs_grad(t) for t in ((query, kv, sink) if sink is not None else (query, kv)))
        ctx.set_materialize_grads(False)
        if cfg.kernel:
            out, lse = gpu.sparse_attention(query, kv, cfg.topk_indices, scale=cfg.scale, v_dim=cfg.v_dim,
                                            attn_sink=None if sink is None else _f32(sink),
                                            topk_length=cfg.topk_length, cu_q=cfg.cu_q, cu_k=cfg.cu_k)
            lse_out = lse
        else:
            out, lse = ref_sparse.forward(query, kv, cfg.gidx, cfg.valid, cfg.scale, cfg.v_dim, sink)
            out = out.astype(query.dtype)
            lse_out = lse.astype(_F32)
        names, tensors = ["query", "kv", "out", "softmax_lse"], [query, kv, out, lse]
        if sink is not None:
            names.append("attn_sink")
            tensors.append(sink)
        if cfg.kernel:
            slots = [(n, t) for n, t in (("topk_indices", cfg.topk_indices), ("topk_length", cfg.topk_length),
                                         ("cu_seqlens_q", cfg.cu_q), ("cu_seqlens_k", cfg.cu_k)) if t is not None]
            ctx.slot_names = tuple(n for n, _ in slots)
            names += ctx.slot_names
            tensors += [t for _, t in slots]
        S.save(ctx, "sparse_attention", tuple(names), tuple(tensors))
        return out, lse_out

    @staticmethod
    def backward(ctx, dout, dlse):
        saved = S.load(ctx)
        query, kv, out, lse = saved[:4]
        sink = saved[4] if ctx.has_sink else None
        cfg = ctx.cfg
        if dout is None:
            dout = paddle.zeros_like(out)
        if cfg.kernel:
            slots = dict(zip(ctx.slot_names, saved[4 + ctx.has_sink:]))
            # the forward ran on the kernel route (a GPU place, a non-empty problem): the backward seam when it is
            # routed, else the reference path below, with the one-time warning saying why
            if _route("sparse_attention", True, "sparse_attention_bwd") == "kernel":
                return _kernel_backward(ctx, cfg, query, kv, out, dout, lse, dlse, sink, slots)
            # public layout -> rows, and the slot table (host read of cu_seqlens for THD)
            seq = cfg.seq
            gidx, valid = _kernel_slots(seq, slots["topk_indices"], slots.get("topk_length"), query)
            q, k = I.flat_rows(seq, query), I.flat_rows(seq, kv)
            o, do = (t.reshape([seq.tq] + list(PORT.shape(t))[-2:]) for t in (out, dout))
            lse, dlse = (None if t is None else _lse_to_rows(seq, t) for t in (lse, dlse))
        else:
            gidx, valid, q, k, o, do = cfg.gidx, cfg.valid, query, kv, out, dout
        dq, dkv, dsink = ref_sparse.backward(q, k, gidx, valid, o, do, lse, dlse, cfg.scale, cfg.v_dim, sink)
        shp = lambda t: list(PORT.shape(t))  # noqa: E731
        grads = [dq.astype(query.dtype).reshape(shp(query)), dkv.astype(kv.dtype).reshape(shp(kv))]
        if sink is not None:
            grads.append(dsink.astype(sink.dtype))
        return tuple(g if w else None for g, w in zip(grads, ctx.want))


def _kernel_backward(ctx, cfg, query, kv, out, dout, lse, dlse, sink, slots):
    """The backward seam (kernels/dsa.py sparse_attention_bwd) on the saved public-layout tensors: no host read, no
    device-to-host sync. dkv comes back float32 (the kernel accumulates it with fp32 atomics) and d_sink float32:
    both are cast to their input's dtype, as the reference path casts its compute-dtype gradients."""
    dq, dkv, dsink = gpu.sparse_attention_bwd(
        query, kv, slots["topk_indices"], out, dout, lse, scale=cfg.scale,
        attn_sink=None if sink is None else _f32(sink), dlse=None if dlse is None else _f32(dlse),
        topk_length=slots.get("topk_length"), cu_q=slots.get("cu_seqlens_q"), cu_k=slots.get("cu_seqlens_k"))
    grads = [dq.astype(query.dtype), dkv.astype(kv.dtype)]
    if sink is not None:
        grads.append(dsink.astype(sink.dtype))
    return tuple(g if w else None for g, w in zip(grads, ctx.want))


def _f32(t):
    """A float32 input of a kernel seam (softmax_lse, attn_sink): a float64 one is rounded to float32, as the reference
    path's float32 arithmetic for bfloat16 inputs does. An input conversion, never an output."""
    return t if t.dtype == _F32 else t.astype(_F32)


def _lse_to_rows(seq, lse):
    """softmax_lse (or its gradient) in the public layout [B,H,Sq] / [H,Tq] -> the reference path's rows [Tq,H]."""
    if seq.thd:
        return lse.transpose([1, 0])
    return lse.transpose([0, 2, 1]).reshape([seq.tq, PORT.shape(lse)[1]])


def _kernel_slots(seq, topk_indices, topk_length, place_tensor):
    """The reference path's (gidx, valid) of a kernel-route call, built in its backward (reads cu_seqlens for THD)."""
    k = PORT.shape(topk_indices)[-1]
    tl = None if topk_length is None else topk_length.reshape([seq.tq])
    return C.slot_validity(seq.layout(), topk_indices.reshape([seq.tq, k]), tl, place_tensor.place)


def sparse_attention(query, kv, topk_indices, *, v_head_dim=512, softmax_scale=None, attn_sink=None,
                     topk_length=None, return_softmax_lse=False, cu_seqlens_q=None, cu_seqlens_k=None):
    """Sparse MLA attention in MQA mode over each row's top-k keys.

    Args:
        query: [B, Sq, H, Dqk] (THD [Tq, H, Dqk]); kv: [B, Skv, Dqk] (THD [Tkv, Dqk]), one latent row per
            key shared by all heads: K = kv, V = kv[..., :v_head_dim].
        topk_indices: int32 [B, Sq, K] (THD [Tq, K], local to each sequence); entries < 0 or >= Skv (of the
            row's sequence) are skipped; with topk_length int32 [B, Sq] (THD [Tq]) only the first
            topk_length entries count. A duplicated index counts once per slot.
        v_head_dim: Dv, 1 <= Dv <= Dqk. softmax_scale: defaults to 1/sqrt(Dqk).
        attn_sink: optional float32 [H]; adds exp(attn_sink[h]) to each row's softmax denominator.
        cu_seqlens_q, cu_seqlens_k: int32 [batch + 1] for THD.
    Returns:
        out [B, Sq, H, Dv] in query's dtype, or (out, softmax_lse) with softmax_lse float32 [B, H, Sq]
        (THD [H, Tq]) over the selected keys only (sink not included; its gradient is honoured). A row
        with no valid index: out 0, softmax_lse -inf, zero gradient. Gradients: query, kv (the V part
        added into the first Dv columns), attn_sink.
    """
    op = "sparse_attention"
    _start(op)
    seq, h, dqk = I.check_attention(op, query, kv, None, cu_seqlens_q, cu_seqlens_k)
    dv = V.check_int(op, "v_head_dim", v_head_dim, minimum=1)
    if dv > dqk:
        V.fail(op, f"`v_head_dim` = {dv} exceeds the query/kv head_dim {dqk}; V is kv[..., :v_head_dim]")
    scale = V.check_scale(op, "softmax_scale", softmax_scale, 1.0 / math.sqrt(dqk))
    V.check_bool(op, "return_softmax_lse", return_softmax_lse)
    idx, tl, k = I.check_topk_indices(op, seq, topk_indices, topk_length, query)
    if attn_sink is not None:
        V.check_tensor(op, "attn_sink", attn_sink)
        V.check_dtype(op, "attn_sink", attn_sink, I.STAT_DTYPES)
        V.check_shape(op, "attn_sink", attn_sink, (h,), "[heads]")
        V.check_same_place(op, ("query", "attn_sink"), (query, attn_sink))
    on_gpu = PORT.is_gpu(query)
    if on_gpu:
        I.check_attention_table(op, query, h, dqk, dv)
    sink_arg = () if attn_sink is None else (attn_sink,)
    # no query row, no key or no top-k slot: out 0, lse -inf, zero gradients, built in Paddle; no launch
    route = _route(op, on_gpu, "sparse_attention", seq.tq == 0 or seq.tk == 0 or k == 0)
    if route == "empty":
        lse_shape = (h, seq.tq) if seq.thd else (seq.batch, h, seq.sq)
        out, lse = empty_attention((query, kv) + sink_arg, seq.rows() + (h, dv), lse_shape)
        return (out, lse) if return_softmax_lse else out
    if route == "kernel":   # the seam finds each row's sequence and slots on the device: no host read
        cu_q, cu_k = seq.cu_tensors
        cfg = _Cfg(kernel=True, seq=seq, scale=scale, v_dim=dv, topk_indices=topk_indices, topk_length=topk_length,
                   cu_q=cu_q, cu_k=cu_k)
        out, lse = _SparseAttention.apply(query, kv, *sink_arg, cfg)
        return (out, lse) if return_softmax_lse else out
    layout = seq.layout()
    gidx, valid = C.slot_validity(layout, idx, tl, query.place)
    cfg = _Cfg(kernel=False, gidx=gidx, valid=valid, scale=scale, v_dim=dv)
    q_rows, kv_rows = I.flat_rows(seq, query), I.flat_rows(seq, kv)
    out, lse = _SparseAttention.apply(q_rows, kv_rows, *sink_arg, cfg)
    if seq.thd:
        lse = lse.transpose([1, 0])
    else:
        out = out.reshape([seq.batch, seq.sq, h, dv])
        lse = lse.reshape([seq.batch, seq.sq, h]).transpose([0, 2, 1])
    return (out, lse) if return_softmax_lse else out


# ----------------------------------------------------------------------------------------------------
# Indexer training pieces (no autograd: the building blocks of indexer_kl_loss)
# ----------------------------------------------------------------------------------------------------
def _slots(seq, idx, tl, place_tensor):
    """The reference path's (layout, global slot index, slot validity) of checked [Tq, K] top-k indices."""
    layout = seq.layout()
    return (layout,) + C.slot_validity(layout, idx, tl, place_tensor.place)


def _public_rows(layout, *tensors):
    return tuple(layout.rows_to_public(t.astype(_F32)) for t in tensors)


def dense_indexer_score_recompute(index_q, index_k, weights, *, causal=True, ratio=1, q_offsets=None,
                                  cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """(index_score float32 [B, Sq, Sk] as indexer_score (-inf where masked), index_lse float32 [B, Sq]).

    index_lse = logsumexp of the row's visible scores (natural log); 0 for a row with no visible key,
    including THD rows at or past cu_seqlens_q[-1], so exp(index_score - index_lse) is 0 there.
    THD: scores [Tq, max_seqlen_k], index_lse [Tq]; max_seqlen_q / max_seqlen_k as in indexer_score.
    """
    op = "dense_indexer_score_recompute"
    _start(op)
    seq, causal, ratio, route = _dense_index(op, index_q, index_k, weights, causal, ratio, q_offsets, cu_seqlens_q,
                                             cu_seqlens_k, max_seqlen_q, max_seqlen_k, kernel="indexer")
    with paddle.no_grad():
        return _dense_index_scores(seq, route, index_q, index_k, weights, causal, ratio, q_offsets, True)


def _attn_inputs(op, query, kv, softmax_lse, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_q=None, max_k=None):
    """Checked arguments of an attention-score recompute: (seq, heads, scale, on_gpu)."""
    seq, h, dqk = I.check_attention(op, query, kv, None, cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    scale = V.check_scale(op, "softmax_scale", softmax_scale, 1.0 / math.sqrt(dqk))
    I.check_lse(op, seq, softmax_lse, h, query)
    on_gpu = PORT.is_gpu(query)
    if on_gpu:
        I.check_attention_table(op, query, h, dqk)
    return seq, h, scale, on_gpu


def dense_attn_score_recompute(query, kv, softmax_lse, *, softmax_scale=None, causal=True, ratio=1, q_offsets=None,
                               cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """(attn_score float32 [B, Sq, Sk], attn_l1norm float32 [B, Sq]).

    attn_score[b,i,j] = sum_h exp(clamp(softmax_scale * query[b,i,h] . kv[b,j] - softmax_lse[b,h,i])) over
    the keys the indexer sees (same causal / ratio / q_offsets rule), 0 elsewhere; attn_l1norm = row
    sums. softmax_lse: float32 [B, H, Sq] (THD [H, Tq]) as sparse_attention returns it. The exp argument
    is clamped to at most 120 ln 2 and flushed to 0 below -126 ln 2; values saturate at FLT_MAX.
    THD rows at or past cu_seqlens_q[-1]: score 0, l1norm 0. THD: [Tq, max_seqlen_k] and [Tq]; max_seqlen_q /
    max_seqlen_k as in indexer_score.
    """
    op = "dense_attn_score_recompute"
    _start(op)
    seq, h, scale, on_gpu = _attn_inputs(op, query, kv, softmax_lse, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                                         max_seqlen_q, max_seqlen_k)
    causal, ratio = I.check_causal(op, seq, causal, ratio, q_offsets)
    V.check_same_place(op, ("query", "q_offsets"), (query, query if q_offsets is None else q_offsets))
    route = _route(op, on_gpu, "attn_score", _dense_empty(seq))
    with paddle.no_grad():
        if route == "empty":
            return _empty_scores(seq, seq.width(), 0.0)
        if route == "kernel":
            cu_q, cu_k, max_q = _thd_args(seq)
            return gpu.dense_attn_scores(query, kv, _f32(softmax_lse), scale=scale, causal=causal, ratio=ratio,
                                         q_offsets=q_offsets, cu_q=cu_q, cu_k=cu_k, max_q=max_q, width=seq.width())
        layout, limits = _ref_layout(seq, q_offsets, causal, ratio)
        lse = I.lse_rows(op, seq, softmax_lse, h, query)
        a, l1 = ref_attn.dense(I.flat_rows(seq, query), I.flat_rows(seq, kv), lse, scale, layout, limits, _F32)
        return _public_rows(layout, a, l1)


def _grad_scale(loss_coeff, grad_loss, norm_rows, dtype):
    if norm_rows == 0:
        return paddle.zeros([], dtype=dtype)
    return grad_loss.astype(dtype) * (loss_coeff / norm_rows)


def _public_grads(seq, index_q, index_k, weights, dq, dk, dw):
    shp = lambda t: list(PORT.shape(t))  # noqa: E731
    return (dq.astype(index_q.dtype).reshape(shp(index_q)), dk.astype(index_k.dtype).reshape(shp(index_k)),
            dw.astype(weights.dtype).reshape(shp(weights)))


def _cast_grads(inputs, grads):
    """Kernel-route gradients (d_index_k / d_weights float32 from the seam) in their inputs' dtypes, as the
    reference path casts its float32 gradients; a gradient already in that dtype is returned as it is."""
    return tuple(g if g.dtype == x.dtype else g.astype(x.dtype) for x, g in zip(inputs, grads))


def _device_norm(seq, value, loss_coeff):
    """value (a float32 [1] device tensor: the loss sum, or grad_loss) * loss_coeff / N, float32 [1], with no host
    read: N = B * Sq (BSHD: from the shapes) or cu_seqlens_q[-1] (THD: a device slice); 0 where N = 0. The same
    float32 product as the reference's value * (loss_coeff / N) (the ratio rounded once from float64)."""
    if not seq.thd:
        return value * (float(loss_coeff) / seq.tq)
    n = seq.cu_tensors[0][-1:].astype(paddle.float64)
    has = n > 0
    ratio = (float(loss_coeff) / paddle.where(has, n, paddle.ones_like(n))).astype(_F32)
    return paddle.where(has, value * ratio, paddle.zeros_like(value))


def _device_grad_scale(loss_coeff, grad_loss, seq):
    """The seams' grad_scale: float32 [1] = loss_coeff * grad_loss / N on the device (grad_loss a device tensor)."""
    return _device_norm(seq, grad_loss.astype(_F32).reshape([1]), loss_coeff)


def dense_indexer_backward(index_q, index_k, weights, index_score, index_lse, attn_score, attn_l1norm, grad_loss, *,
                           loss_coeff=1.0, causal=True, ratio=1, q_offsets=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Gradients of the dense indexer KL loss: (d_index_q, d_index_k, d_weights) in the inputs' dtypes.

    index_score / index_lse from dense_indexer_score_recompute, attn_score / attn_l1norm from
    dense_attn_score_recompute (same causal / ratio / q_offsets / cu_seqlens; THD: any width >= the longest key
    sequence, as a max_seqlen_k given to them makes it), grad_loss: the incoming
    gradient of the loss (one-element tensor, or a number). With c = loss_coeff * grad_loss / N (N = B*Sq,
    THD cu_seqlens_q[-1]), P = exp(index_score - index_lse), T = max(attn_score / max(attn_l1norm, 1e-10),
    e^-100): G = g - P * sum(g), g = -c * T * 1[index_score - index_lse >= -100], and G flows through
    sum_h weights * relu(index_q . index_k).
    On a CUDA place with the dense_indexer_bwd seam routed: that kernel (public-layout statistics, grad_scale on
    the device; THD: the scores' width is checked against the longest key sequence on the host only with
    config.check_cu_seqlens_values on, and the kernel never reads past it); no query row, key or score column: zero
    gradients built in Paddle.
    """
    op = "dense_indexer_backward"
    _start(op)
    seq, hi, di, on_gpu = I.check_indexer(op, index_q, index_k, weights, cu_seqlens_q, cu_seqlens_k)
    causal, ratio = I.check_causal(op, seq, causal, ratio, q_offsets)
    V.check_same_place(op, ("index_q", "q_offsets"), (index_q, index_q if q_offsets is None else q_offsets))
    thd_width = (PORT.shape(index_score)[1] if seq.thd and PORT.is_tensor(index_score)
                 and len(PORT.shape(index_score)) == 2 else None)
    route = _route(op, on_gpu, "dense_indexer_bwd", seq.tq == 0 or seq.tk == 0 or thd_width == 0)
    if route != "reference":
        width = thd_width if seq.thd else seq.sk
        s, lse, a, l1 = I.check_row_stats(op, seq, ("index_score", "index_lse", "attn_score", "attn_l1norm"),
                                          (index_score, index_lse, attn_score, attn_l1norm), width)
        V.check_same_place(op, ("index_q", "index_score", "attn_score"), (index_q, index_score, attn_score))
        gl = I.check_grad_loss(op, grad_loss, index_q)
        coeff = I.check_loss_coeff(op, loss_coeff)
        with paddle.no_grad():
            if route == "empty":            # no row, no key, or no score column: zero gradients
                return tuple(paddle.zeros(list(PORT.shape(t)), dtype=t.dtype) for t in (index_q, index_k, weights))
            if seq.thd and config.check_cu_seqlens_values:
                longest = seq.width()       # the longest key sequence (host values, read by the checks already)
                if width < longest:
                    V.fail(op, f"`index_score` has {width} columns, fewer than the longest key sequence ({longest})")
            cu_q, cu_k = seq.cu_tensors
            dq, dk, dw = gpu.dense_indexer_bwd(
                index_q, index_k, weights, _f32(index_score), _f32(index_lse), _f32(attn_score), _f32(attn_l1norm),
                _device_grad_scale(coeff, gl, seq), causal=causal, ratio=ratio, q_offsets=q_offsets, cu_q=cu_q,
                cu_k=cu_k)
            return _cast_grads((index_q, index_k, weights), (dq, dk, dw))
    layout, limits = _ref_layout(seq, q_offsets, causal, ratio)
    if seq.thd and PORT.is_tensor(index_score) and len(PORT.shape(index_score)) == 2:
        # scores of a recompute given max_seqlen_k are wider than the longest key sequence: any width >= it
        layout.width = max(layout.width, PORT.shape(index_score)[1])
    s, lse, a, l1 = I.check_row_stats(op, seq, ("index_score", "index_lse", "attn_score", "attn_l1norm"),
                                      (index_score, index_lse, attn_score, attn_l1norm), layout.width)
    V.check_same_place(op, ("index_q", "index_score", "attn_score"), (index_q, index_score, attn_score))
    gl = I.check_grad_loss(op, grad_loss, index_q)
    coeff = I.check_loss_coeff(op, loss_coeff)
    with paddle.no_grad():
        iq, ik, w = _index_rows(seq, index_q, index_k, weights)
        ct = C.compute_dtype(index_q)
        grads = ref_loss.dense_backward(iq, ik, w, s, lse, a, l1, layout, limits,
                                        _grad_scale(coeff, gl, layout.norm_rows, ct))
        return _public_grads(seq, index_q, index_k, weights, *grads)


def sparse_indexer_score_recompute(index_q, index_k, weights, topk_indices, *, topk_length=None, cu_seqlens_q=None,
                                   cu_seqlens_k=None):
    """(index_score float32 [B, Sq, K], index_lse float32 [B, Sq]) over each row's top-k slots.

    index_score[b,i,s] = sum_h weights * relu(index_q[b,i,h] . index_k[b, topk_indices[b,i,s]]) at valid
    slots (0 <= idx < Sk, position < topk_length), -inf at the others; index_lse = logsumexp over the
    valid slots, 0 for a row with none. A duplicated index is scored once per slot.
    """
    op = "sparse_indexer_score_recompute"
    _start(op)
    seq, _, _, on_gpu = I.check_indexer(op, index_q, index_k, weights, cu_seqlens_q, cu_seqlens_k)
    idx, tl, k = I.check_topk_indices(op, seq, topk_indices, topk_length, index_q, "index_q")
    route = _route(op, on_gpu, "sparse_indexer", seq.tq == 0 or seq.tk == 0 or k == 0)
    with paddle.no_grad():
        if route == "empty":                # no row, no slot, or no key (every slot invalid)
            return _empty_scores(seq, k, C.NEG_INF)
        if route == "kernel":               # the seam finds each row's sequence on the device: no host read
            cu_q, cu_k = seq.cu_tensors
            return gpu.sparse_indexer_scores(index_q, index_k, weights, topk_indices, topk_length, cu_q, cu_k)
        layout, gidx, valid = _slots(seq, idx, tl, index_q)
        s = ref_index.sparse_scores(*_index_rows(seq, index_q, index_k, weights), gidx, valid)
        return _public_rows(layout, s, ref_index.index_lse(s, valid))


def sparse_attn_score_recompute(query, kv, softmax_lse, topk_indices, *, softmax_scale=None, topk_length=None,
                                cu_seqlens_q=None, cu_seqlens_k=None):
    """(attn_score float32 [B, Sq, K], attn_l1norm float32 [B, Sq]) over each row's top-k slots: the dense
    recompute's formula and clamps at the valid slots, 0 at invalid ones."""
    op = "sparse_attn_score_recompute"
    _start(op)
    seq, h, scale, on_gpu = _attn_inputs(op, query, kv, softmax_lse, softmax_scale, cu_seqlens_q, cu_seqlens_k)
    idx, tl, k = I.check_topk_indices(op, seq, topk_indices, topk_length, query)
    route = _route(op, on_gpu, "sparse_attn_score", seq.tq == 0 or seq.tk == 0 or k == 0)
    with paddle.no_grad():
        if route == "empty":
            return _empty_scores(seq, k, 0.0)
        if route == "kernel":
            cu_q, cu_k = seq.cu_tensors
            return gpu.sparse_attn_scores(query, kv, _f32(softmax_lse), topk_indices, scale=scale,
                                          topk_length=topk_length, cu_q=cu_q, cu_k=cu_k)
        layout, gidx, valid = _slots(seq, idx, tl, query)
        lse = I.lse_rows(op, seq, softmax_lse, h, query)
        a, l1 = ref_attn.sparse(I.flat_rows(seq, query), I.flat_rows(seq, kv), lse, scale, gidx, valid)
        return _public_rows(layout, a, l1)


def sparse_indexer_backward(index_q, index_k, weights, topk_indices, index_score, index_lse, attn_score, attn_l1norm,
                            grad_loss, *, loss_coeff=1.0, topk_length=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Gradients of the sparse-stage indexer KL loss: dense_indexer_backward restricted to each row's valid
    top-k slots (index_score etc. [B, Sq, K] from the sparse recompute pieces); d_index_k is scatter-added
    (once per slot). On a CUDA place with the sparse_indexer_bwd seam routed: that kernel, grad_scale computed on
    the device (no host read); no query row, key or slot: zero gradients built in Paddle."""
    op = "sparse_indexer_backward"
    _start(op)
    seq, _, _, on_gpu = I.check_indexer(op, index_q, index_k, weights, cu_seqlens_q, cu_seqlens_k)
    idx, tl, k = I.check_topk_indices(op, seq, topk_indices, topk_length, index_q, "index_q")
    s, lse, a, l1 = I.check_row_stats(op, seq, ("index_score", "index_lse", "attn_score", "attn_l1norm"),
                                      (index_score, index_lse, attn_score, attn_l1norm), k)
    V.check_same_place(op, ("index_q", "index_score", "attn_score"), (index_q, index_score, attn_score))
    gl = I.check_grad_loss(op, grad_loss, index_q)
    coeff = I.check_loss_coeff(op, loss_coeff)
    route = _route(op, on_gpu, "sparse_indexer_bwd", seq.tq == 0 or seq.tk == 0 or k == 0)
    with paddle.no_grad():
        if route == "empty":                # no row, no slot, or no key (every slot invalid): zero gradients
            return tuple(paddle.zeros(list(PORT.shape(t)), dtype=t.dtype) for t in (index_q, index_k, weights))
        if route == "kernel":               # public-layout tensors, grad_scale on the device: no host read
            cu_q, cu_k = seq.cu_tensors
            dq, dk, dw = gpu.sparse_indexer_bwd(
                index_q, index_k, weights, topk_indices, _f32(index_score), _f32(index_lse), _f32(attn_score),
                _f32(attn_l1norm), _device_grad_scale(coeff, gl, seq), topk_length=topk_length, cu_q=cu_q, cu_k=cu_k)
            return _cast_grads((index_q, index_k, weights), (dq, dk, dw))
        layout, gidx, valid = _slots(seq, idx, tl, index_q)
        iq, ik, w = _index_rows(seq, index_q, index_k, weights)
        ct = C.compute_dtype(index_q)
        g = ref_loss.grad_signal(s.astype(ct), lse, a, l1, valid, _grad_scale(coeff, gl, layout.norm_rows, ct))
        return _public_grads(seq, index_q, index_k, weights, *ref_loss.sparse_backward(iq, ik, w, g, gidx, valid))


# ----------------------------------------------------------------------------------------------------
# The indexer KL loss (PyLayer: gradients to index_q, index_k, weights only)
# ----------------------------------------------------------------------------------------------------
def _sparse_kl_pieces(cfg, iq, ik, w, q, kv, lse):
    """(index_score, index_lse, attn_score, attn_l1norm) [Tq, K] / [Tq] in the compute dtype."""
    s = ref_index.sparse_scores(iq, ik, w, cfg.gidx, cfg.valid)
    a, l1 = ref_attn.sparse(q, kv, lse, cfg.scale, cfg.gidx, cfg.valid)
    return s, ref_index.index_lse(s, cfg.valid), a, l1


def _kernel_kl_stats(cfg, slots, iq, ik, w, q, kv, lse):
    """(index_score, index_lse, attn_score, attn_l1norm) float32 in the public layout, from the routed statistics
    seams (kernels/dsa.py sparse_indexer_scores, sparse_attn_scores): no host read."""
    idx, tl = slots["topk_indices"], slots.get("topk_length")
    cu_q, cu_k = slots.get("cu_seqlens_q"), slots.get("cu_seqlens_k")
    s, ilse = gpu.sparse_indexer_scores(iq, ik, w, idx, tl, cu_q, cu_k)
    a, l1 = gpu.sparse_attn_scores(q, kv, lse, idx, scale=cfg.scale, topk_length=tl, cu_q=cu_q, cu_k=cu_k)
    return s, ilse, a, l1


def _row_sequences(seq, cu_q, cu_k):
    """THD, on the device: (b [Tq], the row's sequence clamped to a valid one; keys [Tq], that sequence's key count,
    0 for a row at or past cu_seqlens_q[-1]), in cu_q's / cu_k's dtype."""
    rows = paddle.arange(seq.tq, dtype=cu_q.dtype)
    b = paddle.searchsorted(cu_q[1:], rows, right=True)    # cu_q[b] <= row < cu_q[b + 1]; b = batch past the last
    lens = paddle.concat([cu_k[1:] - cu_k[:-1], paddle.zeros([1], dtype=cu_k.dtype)])
    return paddle.clip(b, 0, max(seq.batch - 1, 0)), paddle.gather(lens, b)


def _device_valid(seq, topk_indices, topk_length, cu_q, cu_k):
    """bool [Tq, K]: reference._common.slot_validity's `valid` computed on the device (no host read): 0 <= index <
    the key count of the row's sequence (BSHD Sk; THD from cu_seqlens_k, 0 for rows at or past
    cu_seqlens_q[-1]) and, with topk_length, position < topk_length."""
    k = PORT.shape(topk_indices)[-1]
    idx = topk_indices.reshape([seq.tq, k])
    if seq.thd:
        length = _row_sequences(seq, cu_q, cu_k)[1].reshape([seq.tq, 1])
    else:
        length = seq.sk
    valid = paddle.logical_and(idx >= 0, idx < length)
    if topk_length is not None:
        pos = paddle.arange(k, dtype=topk_length.dtype).unsqueeze(0)
        valid = paddle.logical_and(valid, pos < topk_length.reshape([seq.tq, 1]))
    return valid


_KL_SLOTS = ("topk_indices", "topk_length", "cu_seqlens_q", "cu_seqlens_k")
_KL_DENSE = ("q_offsets", "cu_seqlens_q", "cu_seqlens_k")

# The dense stage's kernel route works in query-row chunks (BSHD) so that one [B, R, Sk] float32 statistic stays
# within this many elements (docs/dsa.md: what it allocates); THD is one chunk, [Tq, W] (W: the longest key sequence).
DENSE_KL_ELEMS = 1 << 26


def _dense_kl_chunks(seq):
    """(r0, r1) query-row chunks of the dense stage's kernel route."""
    if seq.thd:
        return [(0, seq.tq)]
    rows = max(1, min(seq.sq, DENSE_KL_ELEMS // max(1, seq.batch * seq.sk)))
    return [(r0, min(seq.sq, r0 + rows)) for r0 in range(0, seq.sq, rows)]


def _dense_kl_stats(cfg, t, iq, ik, w, q, kv, lse, r0, r1):
    """(index_score, index_lse, attn_score, attn_l1norm, q_offsets of the chunk) float32 for query rows [r0, r1)
    (BSHD; THD: all rows) from the routed dense seams (kernels/dsa.py indexer_scores, dense_attn_scores)."""
    seq, offs = cfg.seq, t.get("q_offsets")
    if seq.thd:
        kw = dict(causal=cfg.causal, ratio=cfg.ratio, q_offsets=offs, cu_q=t["cu_seqlens_q"], cu_k=t["cu_seqlens_k"],
                  max_q=cfg.max_q, width=cfg.width)
    else:
        if r0 > 0:      # the chunk's rows are rows r0.. of each batch: their mask is the whole problem's
            base = offs if offs is not None else paddle.zeros([seq.batch], dtype=paddle.int32)
            offs = base + r0
        kw = dict(causal=cfg.causal, ratio=cfg.ratio, q_offsets=offs, cu_q=None, cu_k=None, max_q=0, width=seq.sk)
        iq, w, q, lse = iq[:, r0:r1], w[:, r0:r1], q[:, r0:r1], lse[:, :, r0:r1]
    s, ilse = gpu.indexer_scores(iq, ik, w, with_lse=True, **kw)
    a, l1 = gpu.dense_attn_scores(q, kv, lse, scale=cfg.scale, **kw)
    return s, ilse, a, l1, offs


def _dense_kl_valid(cfg, t, offs, r0, r1, width):
    """bool [rows, width]: the chunk's visible (row, key) entries, j < lim(t), computed on the device."""
    seq = cfg.seq
    j = paddle.arange(width, dtype=paddle.int64).unsqueeze(0)
    if seq.thd:         # a row past the last sequence has no key (sk 0), so its limit is 0
        cu_q, cu_k = t["cu_seqlens_q"].astype(paddle.int64), t["cu_seqlens_k"].astype(paddle.int64)
        b, sk = _row_sequences(seq, cu_q, cu_k)
        pos = paddle.arange(seq.tq, dtype=paddle.int64) - paddle.gather(cu_q, b)
        off = paddle.gather(offs.astype(paddle.int64), b) if offs is not None and seq.batch else paddle.zeros_like(pos)
    else:               # the chunk's local rows 0..R-1 of every batch, with the chunk's q_offsets (offs)
        pos = paddle.arange(r1 - r0, dtype=paddle.int64).unsqueeze(0).expand([seq.batch, r1 - r0]).reshape([-1])
        sk = paddle.full_like(pos, seq.sk)
        off = paddle.zeros_like(pos) if offs is None else \
            offs.astype(paddle.int64).unsqueeze(1).expand([seq.batch, r1 - r0]).reshape([-1])
    lim = sk
    if cfg.causal:
        lim = paddle.minimum(paddle.maximum(paddle.floor_divide(off + pos + 1, paddle.full_like(pos, cfg.ratio)),
                                            paddle.zeros_like(pos)), sk)
    return j < lim.unsqueeze(1)


class _IndexerKLLoss(paddle.autograd.PyLayer):
    """apply(index_q, index_k, weights, query, kv, softmax_lse, cfg) -> f32 scalar.

    Reference route (cfg.kernel False): token-major rows (softmax_lse [Tq, H]); cfg holds the layout and, for the
    sparse stage, the slot table. Kernel route (cfg.kernel True): the tensors in the public layout (softmax_lse
    float32 [B,H,Sq] / [H,Tq]); the forward takes the statistics from the routed seams and reduces them to the loss
    in Paddle (slot or visible-key mask and N on the device), the backward recomputes them through the same seams
    and calls sparse_indexer_bwd / dense_indexer_bwd with grad_scale computed on the device. Sparse stage: no host
    read, no device-to-host sync; dense stage: BSHD in query-row chunks (DENSE_KL_ELEMS), no host read; THD one
    chunk, its grid and width from the host cu_seqlens. The slot / mask tensors (topk_indices, topk_length,
    q_offsets, cu_seqlens) are saved with the rest (in-place guard)."""

    @staticmethod
    def forward(ctx, iq, ik, w, q, kv, lse, cfg):
        names, tensors = ["index_q", "index_k", "weights", "query", "kv", "softmax_lse"], [iq, ik, w, q, kv, lse]
        if cfg.kernel and not cfg.sparse:
            t = {n: x for n, x in zip(_KL_DENSE, cfg.slots) if x is not None}
            seq, total = cfg.seq, paddle.zeros([], dtype=_F32)
            for r0, r1 in _dense_kl_chunks(seq):
                s, ilse, a, l1, offs = _dense_kl_stats(cfg, t, iq, ik, w, q, kv, lse, r0, r1)
                width = PORT.shape(s)[-1]
                n = math.prod(PORT.shape(ilse))
                valid = _dense_kl_valid(cfg, t, offs, r0, r1, width)
                total = total + ref_loss.loss_total(s.reshape([n, width]), ilse.reshape([n]),
                                                    a.reshape([n, width]), l1.reshape([n]), valid)
                del s, a, valid
            loss = _device_norm(seq, total.reshape([1]), cfg.loss_coeff).reshape([])
            ctx.slot_names = tuple(t)
            names += list(t)
            tensors += list(t.values())
        elif cfg.kernel:
            slots = {n: t for n, t in zip(_KL_SLOTS, cfg.slots) if t is not None}
            s, ilse, a, l1 = _kernel_kl_stats(cfg, slots, iq, ik, w, q, kv, lse)
            seq, kk = cfg.seq, PORT.shape(s)[-1]
            valid = _device_valid(seq, slots["topk_indices"], slots.get("topk_length"), slots.get("cu_seqlens_q"),
                                  slots.get("cu_seqlens_k"))
            total = ref_loss.loss_total(s.reshape([seq.tq, kk]), ilse.reshape([seq.tq]), a.reshape([seq.tq, kk]),
                                        l1.reshape([seq.tq]), valid)
            loss = _device_norm(seq, total.reshape([1]), cfg.loss_coeff).reshape([])
            ctx.slot_names = tuple(slots)
            names += list(slots)
            tensors += list(slots.values())
        elif cfg.sparse:
            s, ilse, a, l1 = _sparse_kl_pieces(cfg, iq, ik, w, q, kv, lse)
            loss = ref_loss.loss_value(s, ilse, a, l1, cfg.valid, cfg.loss_coeff, cfg.layout.norm_rows)
        else:   # dense: row chunk by row chunk, no [Tq, width] intermediate
            loss = ref_loss.dense_loss(iq, ik, w, q, kv, lse, cfg.scale, cfg.layout, cfg.limits, cfg.loss_coeff)
        ctx.cfg = cfg
        ctx.want = tuple(PORT.needs_grad(t) for t in (iq, ik, w))
        S.save(ctx, "indexer_kl_loss", tuple(names), tuple(tensors))
        return loss.astype(_F32)

    @staticmethod
    def backward(ctx, dloss):
        saved = S.load(ctx)
        iq, ik, w, q, kv, lse = saved[:6]
        cfg = ctx.cfg
        if cfg.kernel and not cfg.sparse:
            t = dict(zip(ctx.slot_names, saved[6:]))
            c = _device_grad_scale(cfg.loss_coeff, dloss, cfg.seq)
            dqs, dws, dk = [], [], None
            for r0, r1 in _dense_kl_chunks(cfg.seq):
                s, ilse, a, l1, offs = _dense_kl_stats(cfg, t, iq, ik, w, q, kv, lse, r0, r1)
                iq_c, w_c = (iq, w) if cfg.seq.thd else (iq[:, r0:r1], w[:, r0:r1])
                dq_c, dk_c, dw_c = gpu.dense_indexer_bwd(iq_c, ik, w_c, s, ilse, a, l1, c, causal=cfg.causal,
                                                         ratio=cfg.ratio, q_offsets=offs,
                                                         cu_q=t.get("cu_seqlens_q"), cu_k=t.get("cu_seqlens_k"))
                del s, a
                dqs.append(dq_c)
                dws.append(dw_c)
                dk = dk_c if dk is None else dk + dk_c      # fixed order: the chunks in turn
            cat = (lambda xs: xs[0] if len(xs) == 1 else paddle.concat(xs, axis=1))  # noqa: E731
            grads = _cast_grads((iq, ik, w), (cat(dqs), dk, cat(dws)))
            return tuple(gr if want else None for gr, want in zip(grads, ctx.want)) + (None, None, None)
        if cfg.kernel:
            slots = dict(zip(ctx.slot_names, saved[6:]))
            stats = _kernel_kl_stats(cfg, slots, iq, ik, w, q, kv, lse)
            c = _device_grad_scale(cfg.loss_coeff, dloss, cfg.seq)
            dq, dk, dw = gpu.sparse_indexer_bwd(iq, ik, w, slots["topk_indices"], *stats, c,
                                                topk_length=slots.get("topk_length"),
                                                cu_q=slots.get("cu_seqlens_q"), cu_k=slots.get("cu_seqlens_k"))
            del stats               # the [Tq, K] statistics are not needed for the casts
            grads = _cast_grads((iq, ik, w), (dq, dk, dw))
            return tuple(gr if want else None for gr, want in zip(grads, ctx.want)) + (None, None, None)
        ct = C.compute_dtype(iq)
        c = _grad_scale(cfg.loss_coeff, dloss.reshape([]), cfg.layout.norm_rows, ct)
        if cfg.sparse:
            s, ilse, a, l1 = _sparse_kl_pieces(cfg, iq, ik, w, q, kv, lse)
            g = ref_loss.grad_signal(s, ilse, a, l1, cfg.valid, c)
            dq, dk, dw = ref_loss.sparse_backward(iq, ik, w, g, cfg.gidx, cfg.valid)
        else:   # the dense recompute + backward pieces, fused row chunk by row chunk
            dq, dk, dw = ref_loss.dense_loss_backward(iq, ik, w, q, kv, lse, cfg.scale, cfg.layout, cfg.limits, c)
        grads = (dq.astype(iq.dtype), dk.astype(ik.dtype), dw.astype(w.dtype))
        return tuple(gr if want else None for gr, want in zip(grads, ctx.want)) + (None, None, None)


def _kl_route(op, on_gpu, sparse, empty):
    """indexer_kl_loss's route: "kernel" on a GPU place when the stage's three seams all serve it (sparse:
    sparse_indexer, sparse_attn_score, sparse_indexer_bwd; dense: indexer, attn_score, dense_indexer_bwd), else the
    reference path, warning with the first reason; "empty" for a problem with no row or key (sparse: or no slot;
    any place, no warning: loss 0 and zero gradients built in Paddle)."""
    if empty:
        return "empty"
    if not on_gpu:
        return "reference"
    seams = ("sparse_indexer", "sparse_attn_score", "sparse_indexer_bwd") if sparse else \
        ("indexer", "attn_score", "dense_indexer_bwd")
    why = next(filter(None, (gpu.missing(w) for w in seams)), None)
    return _route(op, on_gpu, seams[-1], why_not=why)


def indexer_kl_loss(index_q, index_k, weights, query, kv, softmax_lse, *, topk_indices=None, topk_length=None,
                    softmax_scale=None, causal=True, ratio=1, q_offsets=None, loss_coeff=1.0, cu_seqlens_q=None,
                    cu_seqlens_k=None):
    """The lightning indexer's KL training loss (float32 scalar).

    loss = loss_coeff / N * sum over rows of KL(p || softmax(I)), N = B * Sq (THD: cu_seqlens_q[-1]);
    I: the indexer score row, over the valid entries of topk_indices when given (sparse stage; causal,
    ratio and q_offsets are then not used) or over the causally visible keys (dense warm-up); p: the
    L1-normalised head-summed attention probability exp(softmax_scale * query . kv - softmax_lse) over
    the same keys. Clamps: target >= e^-100, log softmax(I) >= -100, L1 norm >= 1e-10, the attention
    exp argument <= 120 ln 2 (flushed to 0 below -126 ln 2).
    The attention side (query, kv, softmax_lse) is a constant; gradients flow to index_q, index_k and
    weights only (the backward calls the recompute and backward pieces).
    Shapes: as indexer_score for index_q/index_k/weights, as sparse_attention for query/kv/topk_indices,
    softmax_lse float32 [B, H, Sq] (THD [H, Tq]); query/kv must have the rows/keys of index_q/index_k.
    """
    op = "indexer_kl_loss"
    _start(op)
    seq, _, _, on_gpu = I.check_indexer(op, index_q, index_k, weights, cu_seqlens_q, cu_seqlens_k)
    _, h, dqk = I.check_attention(op, query, kv, seq, cu_seqlens_q, cu_seqlens_k)
    V.check_same_place(op, ("index_q", "query"), (index_q, query))
    scale = V.check_scale(op, "softmax_scale", softmax_scale, 1.0 / math.sqrt(dqk))
    I.check_lse(op, seq, softmax_lse, h, query)
    causal, ratio = I.check_causal(op, seq, causal, ratio, q_offsets)
    coeff = I.check_loss_coeff(op, loss_coeff)
    if topk_indices is None and topk_length is not None:
        V.fail(op, "`topk_length` needs `topk_indices` (it limits the top-k slots of the sparse stage)")
    if on_gpu:
        I.check_attention_table(op, query, h, dqk)
    cfg = _Cfg(scale=scale, loss_coeff=coeff, sparse=topk_indices is not None, kernel=False)
    if cfg.sparse:
        idx, tl, k = I.check_topk_indices(op, seq, topk_indices, topk_length, index_q, "index_q")
    empty = seq.tq == 0 or seq.tk == 0 or (cfg.sparse and k == 0)
    route = _kl_route(op, on_gpu, cfg.sparse, empty)
    if route == "empty":    # nothing to sum: the reference path's 0 and zero gradients, without its arithmetic
        return empty_loss((index_q, index_k, weights))
    if route == "kernel":   # public-layout tensors; the attention side a detached constant, as below
        cfg.kernel, cfg.seq = True, seq
        if cfg.sparse:
            cfg.slots = (topk_indices, topk_length) + seq.cu_tensors
        else:   # THD: the grid and the score width from the cu_seqlens values (a host read)
            cfg.causal, cfg.ratio, cfg.slots = causal, ratio, (q_offsets,) + seq.cu_tensors
            cfg.max_q, cfg.width = (seq.grid_q(), seq.width()) if seq.thd else (0, seq.sk)
        const = (query.detach(), kv.detach(), _f32(softmax_lse).detach())
        return _IndexerKLLoss.apply(index_q, index_k, weights, *const, cfg)
    if cfg.sparse:
        cfg.layout, cfg.gidx, cfg.valid = _slots(seq, idx, tl, index_q)
    else:
        cfg.layout = seq.layout(q_offsets)
        cfg.limits = C.row_limits(cfg.layout, causal, ratio)
    iq, ik, w = _index_rows(seq, index_q, index_k, weights)
    # The attention side is a constant: detached, so no gradient node is ever asked for it.
    lse = I.lse_rows(op, seq, softmax_lse, h, query)
    const = (I.flat_rows(seq, query).detach(), I.flat_rows(seq, kv).detach(), lse.detach())
    return _IndexerKLLoss.apply(iq, ik, w, *const, cfg)
