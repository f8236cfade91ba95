"""Validation and parsing of the DSA ops' arguments into the reference path's token-major layout.

BSHD tensors become [B * S, ...] views and THD tensors stay [T, ...]; a reference._common.Layout holds
the per-sequence offsets (host ints). Every check runs before any work and raises through
validation.fail (TypeError for a kind or dtype, ValueError for a shape or value). cu_seqlens values are read
on the host (host_ints, the one host-read helper) by validation.check_cu_seqlens when
config.check_cu_seqlens_values is on, and otherwise only on demand (Seq.host: the reference path, or a THD
extent the caller did not give), so the kernel path can run without a device-to-host copy.
"""
import warnings

import numpy as np
import paddle

from ... import validation as V
from ..._port import PORT
from ...ops.dsa import supported as SUPPORTED
from ...reference.dsa import _common as C

REF_DTYPES = ("bfloat16", "float16", "float32", "float64")
STAT_DTYPES = ("float32", "float64")
_warned = set()


def gpu_fallback_note(op, reason):
    """One warning per (op, reason): a GPU-place call that runs the reference path, and why."""
    if (op, reason) not in _warned:
        _warned.add((op, reason))
        warnings.warn(f"paddle_dsa.{op}: {reason}; running the pure-Paddle reference path on the GPU")


def host_ints(t):
    """The one host read of a small int tensor (cu_seqlens, q_offsets): a device-to-host copy on a GPU."""
    return np.asarray(PORT.to_numpy(t), dtype=np.int64)


def check_max_seqlen(op, thd, max_seqlen_q, max_seqlen_k):
    """The optional THD extents of the dense score ops: None or ints >= 0, only with cu_seqlens."""
    if not thd and (max_seqlen_q is not None or max_seqlen_k is not None):
        V.fail(op, "`max_seqlen_q` / `max_seqlen_k` describe THD inputs; pass them with `cu_seqlens_q` / "
                   "`cu_seqlens_k` (BSHD takes them from the shapes)")
    return tuple(None if v is None else V.check_int(op, name, v, minimum=0)
                 for name, v in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)))


class Seq:
    """The sequence structure of a call: BSHD (batch, sq, sk) or THD (cu_seqlens); built by parse_seq.

    THD values are read on the host only on demand (host(): the reference path, or an extent the caller did not
    give), so a kernel call with max_seqlen_q / max_seqlen_k given and config.check_cu_seqlens_values off makes no
    device-to-host copy."""

    def __init__(self, op, thd, batch, tq, tk, sq=None, sk=None, cu_q_t=None, cu_k_t=None, max_q=None, max_k=None):
        self.op, self.thd, self.batch, self.tq, self.tk = op, thd, batch, tq, tk
        self.sq, self.sk = sq, sk
        self.cu_tensors = (cu_q_t, cu_k_t)
        self.max_q, self.max_k = max_q, max_k      # THD extents given by the caller (None: from the values)
        self._host = None

    def host(self):
        """(cu_q, cu_k) host int64 arrays, read and validated once (whatever config.check_cu_seqlens_values says:
        the values are on the host anyway)."""
        if self._host is None:
            cu_q, cu_k = (host_ints(t) for t in self.cu_tensors)
            for name, cu, total, mx in (("cu_seqlens_q", cu_q, self.tq, self.max_q),
                                        ("cu_seqlens_k", cu_k, self.tk, self.max_k)):
                if cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] > total:
                    V.fail(self.op, f"`{name}` = {cu.tolist()} must start at 0, be non-decreasing and end within "
                                    f"the {total} tokens of its tensor")
                if mx is not None and np.diff(cu).max() > mx:
                    V.fail(self.op, f"`max_seqlen_{name[-1]}` = {mx} is smaller than the longest segment of "
                                    f"`{name}` ({int(np.diff(cu).max())})")
            self._host = (cu_q, cu_k)
        return self._host

    def width(self):
        """Score columns: Sk (BSHD); THD max_seqlen_k if given, else the longest key sequence (a host read)."""
        if not self.thd:
            return self.sk
        return self.max_k if self.max_k is not None else int(np.diff(self.host()[1]).max())

    def grid_q(self):
        """Query rows a THD kernel grid covers per sequence: max_seqlen_q if given, else the longest (host read)."""
        return self.max_q if self.max_q is not None else int(np.diff(self.host()[0]).max())

    def layout(self, q_offsets=None):
        offs = None if q_offsets is None else host_ints(q_offsets)
        if self.thd:
            cu_q, cu_k = self.host()
            return C.Layout.thd(self.tq, self.tk, cu_q, cu_k, offs, width=self.width())
        return C.Layout.bshd(self.batch, self.sq, self.sk, offs)

    def rows(self):
        """Shape prefix of per-row tensors: (B, Sq) or (Tq,)."""
        return (self.tq,) if self.thd else (self.batch, self.sq)

    def row_layout(self):
        return "[total_q]" if self.thd else "[batch, seq_q]"


# The ops whose BSHD batch / sequence axes may be 0: they return the documented empty result without a launch
# (nn/functional/dsa.py: the "empty" route; sparse_attention: _empty.empty_attention). The backward pieces and the
# loss still require every axis >= 1.
EMPTY_BSHD_OK = frozenset({"indexer_score", "dense_indexer_score_recompute", "dense_attn_score_recompute",
                           "sparse_indexer_score_recompute", "sparse_attn_score_recompute", "sparse_attention"})


def parse_seq(op, q_name, q, k_name, k, q_rank_bshd, k_rank_bshd, cu_seqlens_q, cu_seqlens_k, max_q=None,
              max_k=None):
    """Ranks of the query-side and key-side tensors, and the cu_seqlens pair; returns (Seq, qs, ks). cu_seqlens
    values are read here only when config.check_cu_seqlens_values is on (else on demand: Seq.host)."""
    V.check_tensor(op, q_name, q)
    V.check_tensor(op, k_name, k)
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        V.fail(op, "`cu_seqlens_q` and `cu_seqlens_k` must be given together (THD) or both left None (BSHD)")
    max_q, max_k = check_max_seqlen(op, cu_seqlens_q is not None, max_q, max_k)
    if cu_seqlens_q is None:
        qs = V.check_rank(op, q_name, q, q_rank_bshd, "BSHD")
        ks = V.check_rank(op, k_name, k, k_rank_bshd, "BSHD")
        first = 2 if op in EMPTY_BSHD_OK else 0     # batch / sequence axes may be 0 where the op handles it
        V.check_positive_dims(op, q_name, qs, range(first, q_rank_bshd))
        V.check_positive_dims(op, k_name, ks, range(first, k_rank_bshd))
        if qs[0] != ks[0]:
            V.fail(op, f"`{q_name}` batch {qs[0]} != `{k_name}` batch {ks[0]}")
        seq = Seq(op, False, qs[0], qs[0] * qs[1], ks[0] * ks[1], sq=qs[1], sk=ks[1])
        seq.q_ref, seq.k_ref = q, k
        return seq, qs[2:], ks[2:]
    qs = V.check_rank(op, q_name, q, q_rank_bshd - 1, "THD: batch and sequence merged into one token axis")
    ks = V.check_rank(op, k_name, k, k_rank_bshd - 1, "THD: batch and sequence merged into one token axis")
    V.check_positive_dims(op, q_name, qs, range(1, len(qs)))
    V.check_positive_dims(op, k_name, ks, range(1, len(ks)))
    bq = V.check_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, qs[0], *_max_arg("q", max_q, qs[0]))
    bk = V.check_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, ks[0], *_max_arg("k", max_k, ks[0]))
    if bq != bk:
        V.fail(op, f"`cu_seqlens_q` and `cu_seqlens_k` must describe the same batch, got {bq} and {bk} sequences")
    V.check_same_place(op, (q_name, "cu_seqlens_q", "cu_seqlens_k"), (q, cu_seqlens_q, cu_seqlens_k))
    seq = Seq(op, True, bq, qs[0], ks[0], cu_q_t=cu_seqlens_q, cu_k_t=cu_seqlens_k, max_q=max_q, max_k=max_k)
    seq.q_ref, seq.k_ref = q, k
    return seq, qs[1:], ks[1:]


def _max_arg(side, given, tokens):
    """(name, bound) of the segment-length check of validation.check_cu_seqlens."""
    return (f"max_seqlen_{side}", given) if given is not None else ("the token count", tokens)


def flat_rows(seq, x):
    """[B, S, ...] -> [B * S, ...] (BSHD); THD unchanged."""
    if seq.thd:
        return x
    shp = PORT.shape(x)
    flat = [shp[0] * shp[1]] + list(shp[2:])
    if 0 in shp:     # only top-k indices with K = 0 (BSHD axes are checked positive): nothing to carry, and Paddle
        return paddle.zeros(flat, dtype=x.dtype)    # 2.6 reads a 0 in a reshape target as "keep that axis"
    return x.reshape(flat)


def check_causal(op, seq, causal, ratio, q_offsets):
    causal = V.check_bool(op, "causal", causal)
    ratio = V.check_int(op, "ratio", ratio, minimum=1)
    V.check_optional_int_tensor(op, "q_offsets", q_offsets, (seq.batch,), "int32 [batch]")
    return causal, ratio


def check_indexer(op, index_q, index_k, weights, cu_seqlens_q, cu_seqlens_k, max_q=None, max_k=None):
    """index_q [B,Sq,Hi,Di] / [Tq,Hi,Di], index_k [B,Sk,Di] / [Tk,Di], weights [B,Sq,Hi] / [Tq,Hi]."""
    seq, (hi, di), (dk,) = parse_seq(op, "index_q", index_q, "index_k", index_k, 4, 3, cu_seqlens_q, cu_seqlens_k,
                                     max_q, max_k)
    V.check_tensor(op, "weights", weights)
    V.check_dtype(op, "index_q", index_q, REF_DTYPES)
    V.check_same_dtype(op, ("index_q", "index_k"), (index_q, index_k))
    V.check_dtype(op, "weights", weights, REF_DTYPES)
    if dk != di:
        V.fail(op, f"`index_q` head_dim {di} != `index_k` head_dim {dk}; they must match")
    V.check_shape(op, "weights", weights, seq.rows() + (hi,), "[batch, seq_q, index_heads]" if not seq.thd
                  else "[total_q, index_heads]")
    V.check_same_place(op, ("index_q", "index_k", "weights"), (index_q, index_k, weights))
    on_gpu = PORT.is_gpu(index_q)
    if on_gpu:
        check_indexer_table(op, index_q, weights, hi, di)
    return seq, hi, di, on_gpu


def check_indexer_table(op, index_q, weights, hi, di):
    dt = PORT.dtype_name(index_q.dtype)
    if dt not in SUPPORTED.INDEX_DTYPES:
        V.fail(op, f"`index_q` dtype {dt} is not supported on a GPU place; supported: "
                   f"{', '.join(SUPPORTED.INDEX_DTYPES)}", TypeError)
    wt = PORT.dtype_name(weights.dtype)
    if wt not in SUPPORTED.WEIGHT_DTYPES:
        V.fail(op, f"`weights` dtype {wt} is not supported on a GPU place; supported: "
                   f"{', '.join(SUPPORTED.WEIGHT_DTYPES)}", TypeError)
    V.check_in_table(op, "index head_dim", di, SUPPORTED.INDEX_HEAD_DIMS)
    V.check_in_table(op, "index head count", hi, SUPPORTED.INDEX_HEADS)


def check_attention(op, query, kv, seq=None, cu_seqlens_q=None, cu_seqlens_k=None, max_q=None, max_k=None):
    """query [B,Sq,H,Dqk] / [Tq,H,Dqk], kv [B,Skv,Dqk] / [Tkv,Dqk]. With seq given (the indexer's),
    query and kv must share its sequence structure (same rows and keys)."""
    s2, (h, dqk), (dkv,) = parse_seq(op, "query", query, "kv", kv, 4, 3, cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    V.check_dtype(op, "query", query, REF_DTYPES)
    V.check_same_dtype(op, ("query", "kv"), (query, kv))
    if dkv != dqk:
        V.fail(op, f"`query` head_dim {dqk} != `kv` head_dim {dkv}; kv holds the keys in all Dqk columns")
    V.check_same_place(op, ("query", "kv"), (query, kv))
    if seq is not None:
        if (s2.tq, s2.tk, s2.batch) != (seq.tq, seq.tk, seq.batch) or s2.sq != seq.sq or s2.sk != seq.sk:
            n = 1 if seq.thd else 2
            V.fail(op, f"`query` rows {list(PORT.shape(query))[:n]} and `kv` keys {list(PORT.shape(kv))[:n]} must "
                       f"match `index_q` rows {list(PORT.shape(seq.q_ref))[:n]} and `index_k` keys "
                       f"{list(PORT.shape(seq.k_ref))[:n]} (the indexer scores the attention's keys)")
    return s2, h, dqk


def check_attention_table(op, query, h, dqk, dv=None):
    dt = PORT.dtype_name(query.dtype)
    if dt not in SUPPORTED.ATTN_DTYPES:
        V.fail(op, f"`query` dtype {dt} is not supported on a GPU place; supported: "
                   f"{', '.join(SUPPORTED.ATTN_DTYPES)}", TypeError)
    dims = [p[0] for p in SUPPORTED.QK_V_HEAD_DIMS]
    if dv is None:
        V.check_in_table(op, "query head_dim (Dqk)", dqk, tuple(sorted(set(dims))))
    else:
        V.check_in_table(op, "(Dqk, v_head_dim)", (dqk, dv), SUPPORTED.QK_V_HEAD_DIMS)
    V.check_in_table(op, "query head count", h, SUPPORTED.QUERY_HEADS)


def check_lse(op, seq, softmax_lse, h, place_ref):
    """softmax_lse float32 (or float64) [B, H, Sq] (BSHD) or [H, Tq] (THD), as sparse_attention returns it."""
    V.check_tensor(op, "softmax_lse", softmax_lse)
    V.check_dtype(op, "softmax_lse", softmax_lse, STAT_DTYPES)
    if seq.thd:
        V.check_shape(op, "softmax_lse", softmax_lse, (h, seq.tq), "[heads, total_q]")
    else:
        V.check_shape(op, "softmax_lse", softmax_lse, (seq.batch, h, seq.sq), "[batch, heads, seq_q]")
    V.check_same_place(op, ("query", "softmax_lse"), (place_ref, softmax_lse))


def lse_rows(op, seq, softmax_lse, h, place_ref):
    """check_lse, then the reference path's token-major view [Tq, H]."""
    check_lse(op, seq, softmax_lse, h, place_ref)
    if seq.thd:
        return softmax_lse.transpose([1, 0])
    return softmax_lse.transpose([0, 2, 1]).reshape([seq.tq, h])


def check_topk_indices(op, seq, topk_indices, topk_length, place_ref, ref_name="query"):
    """topk_indices int32 [B,Sq,K] / [Tq,K] (local to each sequence), topk_length int32 [B,Sq] / [Tq]."""
    V.check_tensor(op, "topk_indices", topk_indices)
    V.check_dtype(op, "topk_indices", topk_indices, ("int32",))
    shp = V.check_rank(op, "topk_indices", topk_indices, len(seq.rows()) + 1,
                       "[batch, seq_q, topk]" if not seq.thd else "[total_q, topk]")
    if tuple(shp[:-1]) != seq.rows():
        V.fail(op, f"`topk_indices` rows {list(shp[:-1])} must match the query rows {list(seq.rows())}")
    V.check_optional_int_tensor(op, "topk_length", topk_length, seq.rows(), f"int32 {seq.row_layout()}")
    tensors = [place_ref, topk_indices] + ([] if topk_length is None else [topk_length])
    V.check_same_place(op, (ref_name, "topk_indices", "topk_length")[:len(tensors)], tensors)
    k = shp[-1]
    idx = flat_rows(seq, topk_indices) if not seq.thd else topk_indices
    idx = idx.reshape([seq.tq, k])
    tl = None if topk_length is None else topk_length.reshape([seq.tq])
    return idx, tl, k


def check_row_stats(op, seq, names, tensors, width):
    """Score tensors [B,Sq,W] / [Tq,W] and row statistics [B,Sq] / [Tq], float32 (or float64)."""
    out = []
    for name, t in zip(names, tensors):
        V.check_tensor(op, name, t)
        V.check_dtype(op, name, t, STAT_DTYPES)
        is_score = name.endswith("score")
        expected = seq.rows() + ((width,) if is_score else ())
        lay = seq.row_layout()[:-1] + (", width]" if is_score else "]")
        V.check_shape(op, name, t, expected, lay)
        shape = [seq.tq, width] if is_score else [seq.tq]
        # zero slots (width 0): zeros, as flat_rows, since Paddle 2.6 reads a 0 in a reshape target as "keep that axis"
        out.append(paddle.zeros(shape, dtype=t.dtype) if 0 in shape else t.reshape(shape))
    return out


def check_grad_loss(op, grad_loss, place_ref):
    """A one-element float tensor (stays on its device) or a real number."""
    import numbers

    import paddle

    if PORT.is_tensor(grad_loss):
        V.check_dtype(op, "grad_loss", grad_loss, REF_DTYPES)
        if int(np.prod(PORT.shape(grad_loss))) != 1:
            V.fail(op, f"`grad_loss` must hold one element, got shape {list(PORT.shape(grad_loss))}")
        V.check_same_place(op, ("index_q", "grad_loss"), (place_ref, grad_loss))
        return grad_loss.reshape([])
    if isinstance(grad_loss, bool) or not isinstance(grad_loss, numbers.Real) or not np.isfinite(float(grad_loss)):
        V.fail(op, f"`grad_loss` must be a one-element Tensor or a finite real number, got {grad_loss!r}", TypeError)
    return paddle.to_tensor(float(grad_loss), dtype=paddle.float64, place=place_ref.place)


def check_loss_coeff(op, loss_coeff):
    return V.check_scale(op, "loss_coeff", loss_coeff, 1.0)
