"""Fake ops.dsa seams for the CPU tests of the Paddle side (tests/test_dsa_kernel_seam.py).

Each fake has the keyword signature of its ops.dsa module (test_seam_signatures_match_ops_modules checks it), reads
its inputs back through DLPack, computes with the reference path, checks the shape contract the real seam checks
(scores width >= the longest key sequence, max_seqlen_q >= the longest query sequence) and writes every output
element through the raw DLPack pointer, as a kernel would. ``install`` puts them in place of the modules.
"""
import types

import numpy as np
import paddle

from paddle_dsa._port import PORT
from paddle_dsa.kernels import dsa as seam
from paddle_dsa.reference.dsa import _common as C
from paddle_dsa.reference.dsa import attn_score as ref_attn
from paddle_dsa.reference.dsa import indexer as ref_index
from paddle_dsa.reference.dsa import indexer_loss as ref_loss
from paddle_dsa.reference.dsa import sparse_attention as ref_sparse
from paddle_dsa.reference.dsa import topk as ref_topk

from dlpack_io import read, write

STREAM = 4321
SEAMS = {"indexer": ("indexer/fwd.py", "indexer_fwd"), "topk": ("topk/fwd.py", "topk_fwd"),
         "sparse_indexer": ("indexer/sparse.py", "sparse_indexer_fwd"),
         "attn_score": ("attn_score/dense.py", "dense_attn_score_fwd"),
         "sparse_attn_score": ("attn_score/sparse.py", "sparse_attn_score_fwd"),
         "sparse_attention": ("sparse_attn/fwd.py", "sparse_attn_fwd"),
         "sparse_attention_bwd": ("sparse_attn/bwd.py", "sparse_attn_bwd"),
         "sparse_indexer_bwd": ("indexer/sparse_bwd.py", "sparse_indexer_bwd"),
         "dense_indexer_bwd": ("indexer/dense_bwd.py", "dense_indexer_bwd")}


def _layout(q, k, q_offsets, cq, ck, width=None):
    """The reference Layout of a call, THD width taken from the output buffer (the seam's contract)."""
    offs = None if q_offsets is None else q_offsets.numpy()
    if cq is None:
        return C.Layout.bshd(q.shape[0], q.shape[1], k.shape[1], offs)
    cq, ck = cq.numpy(), ck.numpy()
    if width is not None:    # dense: the scores buffer's width
        assert width >= np.diff(ck).max(), ("scores narrower than the longest key sequence", width, ck)
    return C.Layout.thd(q.shape[0], k.shape[0], cq, ck, offs, width=width)


def _index_bwd_inputs(index_q, index_k, weights, grad_scale, index_score, index_lse, attn_score, attn_l1norm,
                      d_index_q, d_index_k, d_weights):
    """The indexer backward seams' inputs read back, with the dtype / shape contract both real seams check."""
    q, k, w, c = read(index_q), read(index_k), read(weights), read(grad_scale)
    s, lse, a, l1 = (read(x) for x in (index_score, index_lse, attn_score, attn_l1norm))
    gq, gk, gw = read(d_index_q), read(d_index_k), read(d_weights)
    assert q.dtype == k.dtype == gq.dtype == paddle.bfloat16 and gq.shape == q.shape, "bf16 index_q, d_index_q"
    assert w.dtype in (paddle.bfloat16, paddle.float32), "weights bf16 or fp32"
    assert gk.dtype == paddle.float32 and gk.shape == k.shape, "d_index_k: a float32 accumulator like index_k"
    assert gw.dtype == paddle.float32 and gw.shape == w.shape, "d_weights: float32 shaped like weights"
    assert c.dtype == paddle.float32 and int(np.prod(c.shape)) == 1, "grad_scale: a one-element float32 tensor"
    assert all(x.dtype == paddle.float32 for x in (s, lse, a, l1)), "float32 statistics"
    return q, k, w, c, s, lse, a, l1


def _rows(x, thd):
    return x if thd else x.reshape([x.shape[0] * x.shape[1]] + list(x.shape[2:]))


def _lse_rows(lse, thd):
    """softmax_lse [B,H,Sq] / [H,Tq] as the public API takes it -> [Tq, H]."""
    if thd:
        return lse.transpose([1, 0])
    b, h, sq = lse.shape
    return lse.transpose([0, 2, 1]).reshape([b * sq, h])


def _lse_public(lse, thd, lead):
    """[Tq, H] rows -> softmax_lse as the public API returns it: [H, Tq] (THD) or [B, H, Sq] (lead = (B, Sq))."""
    if thd:
        return lse.transpose([1, 0])
    return lse.reshape(list(lead) + [lse.shape[-1]]).transpose([0, 2, 1])


def _put(dst, src):
    write(dst, src.astype("float32").reshape(read(dst).shape))


class FakeKernels:
    def __init__(self):
        self.calls = []
        self.deterministic = []      # (seam, workspace_bytes) of each deterministic backward call

    def _deterministic(self, name, workspace, workspace_bytes, keys, n_kv):
        """What the real seams do with the framework's workspace (ops/common/deterministic_rows.py): the entries'
        keys (int32 [E], -1: no contribution) go through workspace.alloc / export into a framework tensor, and
        workspace.sort_keys must return them ascending (-1 as n_kv), equal keys by entry (numpy's lexsort here)."""
        self.deterministic.append((name, workspace_bytes))
        keys = np.asarray(keys, np.int32).reshape(-1)
        keys_t = workspace.alloc((keys.shape[0],), "int32")
        write(workspace.export(keys_t), paddle.to_tensor(keys))
        sk, order = (read(workspace.export(t)).numpy() for t in workspace.sort_keys(keys_t, n_kv))
        k = np.where(keys < 0, n_kv, keys)
        want = np.lexsort((np.arange(keys.shape[0]), k))
        assert (order == want).all() and (sk == k[want]).all(), "workspace.sort_keys"

    def _dense_call(self, name, q, k, q_offsets, cu_q, cu_k, max_seqlen_q, scores, causal, ratio, stream):
        self.calls.append((name, stream))
        # the real seams write nothing for an empty problem and refuse zero keys: the caller must not send them
        assert q.shape[0] > 0 and q.shape[1] > 0 and read(scores).shape[-1] > 0, "empty problem sent to a kernel"
        assert k.shape[0] > 0 and (cu_q is not None or k.shape[1] > 0), "zero keys sent to a kernel"
        cq, ck = read(cu_q), read(cu_k)
        thd = cq is not None
        layout = _layout(q, k, read(q_offsets), cq, ck, read(scores).shape[-1] if thd else None)
        if thd:
            assert max_seqlen_q >= max(seg[1] for seg in layout.segments), "max_seqlen_q below the longest query"
        return thd, layout, C.row_limits(layout, causal, ratio)

    def indexer_fwd(self, index_q, index_k, weights, scores, lse=None, *, causal=True, ratio=1, q_offsets=None,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0):
        q, k, w = read(index_q), read(index_k), read(weights)
        thd, layout, limits = self._dense_call("indexer", q, k, q_offsets, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                               scores, causal, ratio, stream)
        self.calls[-1] += (lse is not None,)
        s, l = ref_index.dense_scores(_rows(q, thd), _rows(k, thd), _rows(w, thd), layout, limits, paddle.float32,
                                      with_lse=True)
        _put(scores, s)
        if lse is not None:
            _put(lse, l)

    def topk_fwd(self, scores, out, *, lengths=None, order="score", stream=0):
        self.calls.append(("topk", stream))
        s, ln = read(scores), read(lengths)
        k = read(out).shape[-1]
        rows = int(np.prod(s.shape[:-1]))
        assert rows > 0 and s.shape[-1] > 0, "the real seam refuses an empty problem"
        idx = ref_topk.topk(s.reshape([rows, s.shape[-1]]), k, None if ln is None else ln.reshape([rows]))
        if order == "column":
            idx = ref_topk.by_column(idx)
        write(out, idx.reshape(read(out).shape))

    def _slots(self, name, q, k, topk_indices, topk_length, cu_q, cu_k, stream):
        self.calls.append((name, stream))
        idx, tl, cq, ck = (read(x) for x in (topk_indices, topk_length, cu_q, cu_k))
        assert 0 not in idx.shape, "empty problem sent to a kernel"
        assert k.shape[0] > 0 and (cq is not None or k.shape[1] > 0), "zero keys sent to a kernel"
        thd = cq is not None
        layout = _layout(q, k, None, cq, ck)
        kk = idx.shape[-1]
        gidx, valid = C.slot_validity(layout, idx.reshape([layout.tq, kk]), None if tl is None else tl.reshape([-1]),
                                      q.place)
        return thd, gidx, valid

    def sparse_indexer_fwd(self, index_q, index_k, weights, topk_indices, scores, lse, *, topk_length=None,
                           cu_seqlens_q=None, cu_seqlens_k=None, stream=0):
        q, k, w = read(index_q), read(index_k), read(weights)
        thd, gidx, valid = self._slots("sparse_indexer", q, k, topk_indices, topk_length, cu_seqlens_q, cu_seqlens_k,
                                       stream)
        s = ref_index.sparse_scores(_rows(q, thd), _rows(k, thd), _rows(w, thd), gidx, valid)
        _put(scores, s)
        _put(lse, ref_index.index_lse(s, valid))

    def dense_attn_score_fwd(self, query, kv, softmax_lse, scores, l1norm, *, softmax_scale, causal=True, ratio=1,
                             q_offsets=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, stream=0):
        q, k, lse = read(query), read(kv), read(softmax_lse)
        assert lse.dtype == paddle.float32
        thd, layout, limits = self._dense_call("attn_score", q, k, q_offsets, cu_seqlens_q, cu_seqlens_k,
                                               max_seqlen_q, scores, causal, ratio, stream)
        a, l1 = ref_attn.dense(_rows(q, thd), _rows(k, thd), _lse_rows(lse, thd), softmax_scale, layout, limits)
        _put(scores, a)
        _put(l1norm, l1)

    def sparse_attn_score_fwd(self, query, kv, softmax_lse, topk_indices, scores, l1norm, *, softmax_scale,
                              topk_length=None, cu_seqlens_q=None, cu_seqlens_k=None, stream=0):
        q, k, lse = read(query), read(kv), read(softmax_lse)
        assert lse.dtype == paddle.float32
        thd, gidx, valid = self._slots("sparse_attn_score", q, k, topk_indices, topk_length, cu_seqlens_q,
                                       cu_seqlens_k, stream)
        a, l1 = ref_attn.sparse(_rows(q, thd), _rows(k, thd), _lse_rows(lse, thd), softmax_scale, gidx, valid)
        _put(scores, a)
        _put(l1norm, l1)

    def sparse_attn_fwd(self, query, kv, topk_indices, out, softmax_lse, *, softmax_scale, attn_sink=None,
                        topk_length=None, cu_seqlens_q=None, cu_seqlens_k=None, stream=0):
        q, k, sink = read(query), read(kv), read(attn_sink)
        assert q.dtype == k.dtype == read(out).dtype == paddle.bfloat16 and read(softmax_lse).dtype == paddle.float32
        assert sink is None or sink.dtype == paddle.float32, "the seam takes a float32 attn_sink"
        thd, gidx, valid = self._slots("sparse_attention", q, k, topk_indices, topk_length, cu_seqlens_q,
                                       cu_seqlens_k, stream)
        self.calls[-1] += (sink is not None, topk_length is not None)
        o, lse = ref_sparse.forward(_rows(q, thd), _rows(k, thd), gidx, valid, softmax_scale, read(out).shape[-1],
                                    sink)
        lse = _lse_public(lse, thd, q.shape[:2])
        assert read(out).shape == q.shape[:-1] + [o.shape[-1]] and read(softmax_lse).shape == lse.shape, "shapes"
        write(out, o.reshape(read(out).shape))          # float32 -> bfloat16, as the reference path casts
        write(softmax_lse, lse)

    def sparse_attn_bwd(self, query, kv, topk_indices, out, dout, softmax_lse, dq, dkv, *, softmax_scale,
                        attn_sink=None, d_sink_rows=None, dlse=None, topk_length=None, cu_seqlens_q=None,
                        cu_seqlens_k=None, deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0):
        q, k, o, do, lse, sink, dl = (read(x) for x in (query, kv, out, dout, softmax_lse, attn_sink, dlse))
        gq, gkv, gsink = read(dq), read(dkv), read(d_sink_rows)
        assert q.dtype == k.dtype == o.dtype == do.dtype == gq.dtype == paddle.bfloat16, "bf16 tensors"
        assert do.shape == o.shape and gq.shape == q.shape, "dout as out, dq as query"
        assert gkv.dtype == paddle.float32 and gkv.shape == k.shape, "dkv: a float32 accumulator shaped like kv"
        assert lse.dtype == paddle.float32 and (dl is None or (dl.dtype == paddle.float32 and dl.shape == lse.shape))
        assert (sink is None) == (gsink is None), "attn_sink and d_sink_rows come together"
        assert sink is None or (sink.dtype == gsink.dtype == paddle.float32 and gsink.shape == q.shape[:-1])
        thd, gidx, valid = self._slots("sparse_attention_bwd", q, k, topk_indices, topk_length, cu_seqlens_q,
                                       cu_seqlens_k, stream)
        self.calls[-1] += (sink is not None, topk_length is not None, dl is not None)
        if deterministic:
            self._deterministic("sparse_attention_bwd", workspace, workspace_bytes,
                                np.where(valid.numpy(), gidx.numpy(), -1), k.shape[0] * (1 if thd else k.shape[1]))
        qr, kr, orow, dorow = (_rows(t, thd) for t in (q, k, o, do))
        lr, dlr = _lse_rows(lse, thd), None if dl is None else _lse_rows(dl, thd)
        dv = o.shape[-1]
        g_q, g_kv, _ = ref_sparse.backward(qr, kr, gidx, valid, orow, dorow, lr, dlr, softmax_scale, dv, sink)
        write(dq, g_q.reshape(q.shape))         # float32 -> bfloat16, as the reference path casts
        # the whole accumulator: the seam zeroes dkv, then the kernel adds every slot's part into it
        write(dkv, g_kv.reshape(k.shape))
        if gsink is not None:                   # per row: the reference backward of that row alone
            per_row = [ref_sparse.backward(qr[r:r + 1], kr, gidx[r:r + 1], valid[r:r + 1], orow[r:r + 1],
                                           dorow[r:r + 1], lr[r:r + 1], None if dlr is None else dlr[r:r + 1],
                                           softmax_scale, dv, sink)[2] for r in range(qr.shape[0])]
            write(d_sink_rows, paddle.stack(per_row).reshape(gsink.shape))

    def sparse_indexer_bwd(self, index_q, index_k, weights, topk_indices, index_score, index_lse, attn_score,
                           attn_l1norm, grad_scale, d_index_q, d_index_k, d_weights, *, topk_length=None,
                           cu_seqlens_q=None, cu_seqlens_k=None, deterministic=False, workspace=None,
                           workspace_bytes=1 << 30, stream=0):
        q, k, w, c, s, lse, a, l1 = _index_bwd_inputs(index_q, index_k, weights, grad_scale, index_score, index_lse,
                                                      attn_score, attn_l1norm, d_index_q, d_index_k, d_weights)
        assert s.shape == a.shape == read(topk_indices).shape and lse.shape == l1.shape == s.shape[:-1], "shapes"
        thd, gidx, valid = self._slots("sparse_indexer_bwd", q, k, topk_indices, topk_length, cu_seqlens_q,
                                       cu_seqlens_k, stream)
        self.calls[-1] += (topk_length is not None, w.dtype == paddle.float32)
        if deterministic:
            self._deterministic("sparse_indexer_bwd", workspace, workspace_bytes,
                                np.where(valid.numpy(), gidx.numpy(), -1), k.shape[0] * (1 if thd else k.shape[1]))
        tq, kk = gidx.shape
        g = ref_loss.grad_signal(s.reshape([tq, kk]), lse.reshape([tq]), a.reshape([tq, kk]), l1.reshape([tq]),
                                 valid, c.reshape([]))
        dq, dk, dw = ref_loss.sparse_backward(_rows(q, thd), _rows(k, thd), _rows(w, thd), g, gidx, valid)
        write(d_index_q, dq.reshape(q.shape))   # float32 -> bfloat16, as the reference path casts
        write(d_index_k, dk.reshape(k.shape))   # the whole accumulator (the seam zeroes it, the kernel adds into it)
        write(d_weights, dw.reshape(w.shape))


    def dense_indexer_bwd(self, index_q, index_k, weights, index_score, index_lse, attn_score, attn_l1norm, grad_scale,
                          d_index_q, d_index_k, d_weights, *, causal=True, ratio=1, q_offsets=None, cu_seqlens_q=None,
                          cu_seqlens_k=None, deterministic=False, workspace=None, workspace_bytes=1 << 30, stream=0):
        q, k, w, c, s, lse, a, l1 = _index_bwd_inputs(index_q, index_k, weights, grad_scale, index_score, index_lse,
                                                      attn_score, attn_l1norm, d_index_q, d_index_k, d_weights)
        assert s.shape == a.shape and lse.shape == l1.shape == s.shape[:-1], "statistics shapes"
        assert isinstance(causal, bool) and isinstance(ratio, int), "causal bool, ratio int"
        thd, layout, limits = self._dense_call("dense_indexer_bwd", q, k, q_offsets, cu_seqlens_q, cu_seqlens_k,
                                               max(q.shape[0], 1), index_score, causal, ratio, stream)
        self.calls[-1] += (w.dtype == paddle.float32,)
        tq, width = (s.shape[0], s.shape[1]) if thd else (s.shape[0] * s.shape[1], s.shape[2])
        if deterministic:       # entry (row, j) is key j of the row's sequence, below the row's limit
            j = np.arange(width)[None, :]
            lim = np.minimum(np.asarray(limits).reshape(-1, 1), width)
            self._deterministic("dense_indexer_bwd", workspace, workspace_bytes,
                                np.where(j < lim, layout.row_arrays()[0][:, None] + j, -1),
                                k.shape[0] * (1 if thd else k.shape[1]))
        dq, dk, dw = ref_loss.dense_backward(_rows(q, thd), _rows(k, thd), _rows(w, thd), s.reshape([tq, width]),
                                             lse.reshape([tq]), a.reshape([tq, width]), l1.reshape([tq]), layout,
                                             limits, c.reshape([]))
        write(d_index_q, dq.reshape(q.shape))   # float32 -> bfloat16, as the reference path casts
        write(d_index_k, dk.reshape(k.shape))
        write(d_weights, dw.reshape(w.shape))


def poisoned_empty(shape, dtype):
    """_empty for the tests: NaN (int32: -7), so an element the kernel did not write, or a buffer the seam did not
    hand to the kernel (a copy), shows up in the results."""
    return paddle.full(list(shape), -7 if dtype == paddle.int32 else float("nan"), dtype=dtype)


_inside = [0]


def in_fake():
    """True while a fake seam runs (its host reads stand for the kernel's device reads, not the Paddle side's)."""
    return _inside[0] > 0


def _entered(fn):
    def call(*args, **kw):
        _inside[0] += 1
        try:
            return fn(*args, **kw)
        finally:
            _inside[0] -= 1
    return call


def install(monkeypatch, routed=True):
    """Fake modules for every seam, PORT.is_gpu True, a fixed stream, a poisoned _empty. routed: also route the
    seams that kernels/dsa.py keeps off (ROUTED), so their Paddle side runs too."""
    kernels = FakeKernels()
    mod = types.SimpleNamespace(**{fn: _entered(getattr(kernels, fn)) for _, fn in SEAMS.values()})
    monkeypatch.setattr(seam, "_MODULES", {name: mod for name in seam._NAMES})
    if routed:
        monkeypatch.setattr(seam, "ROUTED", frozenset(seam._NAMES))
    monkeypatch.setattr(PORT, "is_gpu", lambda t: True)
    monkeypatch.setattr(PORT, "stream_handle", lambda t: STREAM)
    monkeypatch.setattr(seam, "_empty", poisoned_empty)
    return kernels
