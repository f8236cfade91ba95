"""CPU tests of the DSA kernel seams' argument checks (ops/common/head_sum_host.py and the seams of ops/dsa/indexer
and ops/dsa/attn_score): every bad call ends in a ValueError naming the argument, before any compile or launch.
"CUDA" tensors are host arrays relabelled through DLPack (cuda_labelled.py); only invalid calls are made.
"""
import os
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from cuda_labelled import bf16, bf16_view, cuda  # noqa: E402
from ops.dsa.attn_score.dense import dense_attn_score_fwd  # noqa: E402
from ops.dsa.attn_score.sparse import sparse_attn_score_fwd  # noqa: E402
from ops.dsa.indexer.fwd import indexer_fwd  # noqa: E402
from ops.dsa.indexer.sparse import sparse_indexer_fwd  # noqa: E402
from ops.dsa.sparse_attn.fwd import sparse_attn_fwd  # noqa: E402


def f32(*s):
    return cuda(np.zeros(s, np.float32))


def i32(*s):
    return cuda(np.zeros(s, np.int32))


def idx_args(B=2, S=16, Sk=20, H=64, D=128):
    return dict(index_q=bf16(B, S, H, D), index_k=bf16(B, Sk, D), weights=f32(B, S, H), scores=f32(B, S, Sk),
                lse=f32(B, S))


def call_indexer(**over):
    a = idx_args()
    kw = {k: over.pop(k) for k in list(over) if k in ("causal", "ratio", "q_offsets", "cu_seqlens_q", "cu_seqlens_k",
                                                     "max_seqlen_q")}
    a.update(over)
    indexer_fwd(a["index_q"], a["index_k"], a["weights"], a["scores"], a["lse"], **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(index_q=cuda(np.zeros((2, 16, 64, 128), np.float16))), "index_q: dtype float16 not supported"),
    (dict(index_q=bf16(2, 16, 64, 96)), "index_k: head_dim 128 differs"),
    (dict(index_q=bf16(2, 16, 48, 128), weights=f32(2, 16, 48)), "48 index heads not supported"),
    (dict(index_q=bf16(2, 16, 64, 96), index_k=bf16(2, 20, 96)), "head_dim 96 not supported"),
    (dict(weights=f32(2, 16, 32)), r"weights: expected shape \(2, 16, 64\)"),
    (dict(weights=cuda(np.zeros((2, 16, 64), np.float16))), "weights: dtype float16 not supported"),
    (dict(scores=f32(2, 16, 21)), r"scores: expected shape \(2, 16, 20\)"),
    (dict(scores=cuda(np.zeros((2, 16, 20), np.float16))), "scores: dtype float16"),
    (dict(lse=f32(2, 15)), r"lse: expected shape \(2, 16\)"),
    (dict(index_k=bf16(3, 20, 128)), "index_k: batch 3 differs"),
    (dict(index_k=bf16(2, 0, 128), scores=f32(2, 16, 0)), None),         # nothing to write: returns
    (dict(q_offsets=cuda(np.zeros(2, np.int64))), "q_offsets: expected int32"),
    (dict(ratio=0), "ratio must be >= 1"),
    (dict(index_q=bf16_view(np.zeros((2, 64, 16, 128), np.uint16).transpose(0, 2, 1, 3))), "mergeable"),
    (dict(index_k=bf16_view(np.zeros((2, 20, 130), np.uint16)[..., :128])), "multiple of 16 bytes"),
])
def test_indexer_rejects(over, msg):
    if msg is None:
        call_indexer(**over)
        return
    with pytest.raises(ValueError, match=msg):
        call_indexer(**over)


def test_indexer_zero_keys_with_columns():
    """THD with no keys at all but a score width: the caller writes that result (TMA cannot describe it)."""
    with pytest.raises(ValueError, match="zero keys"):
        indexer_fwd(bf16(10, 64, 128), bf16(0, 128), f32(10, 64), f32(10, 4), f32(10),
                    cu_seqlens_q=i32(2), cu_seqlens_k=i32(2), max_seqlen_q=10)


def test_indexer_thd_checks():
    q, k, w = bf16(10, 64, 128), bf16(12, 128), f32(10, 64)
    with pytest.raises(ValueError, match=r"scores: expected shape \(10, W\)"):
        indexer_fwd(q, k, w, f32(9, 4), f32(10), cu_seqlens_q=i32(3), cu_seqlens_k=i32(3), max_seqlen_q=5)
    with pytest.raises(ValueError, match="same length|batch\\+1"):
        indexer_fwd(q, k, w, f32(10, 4), f32(10), cu_seqlens_q=i32(3), cu_seqlens_k=i32(4), max_seqlen_q=5)
    with pytest.raises(ValueError, match="given together"):
        indexer_fwd(q, k, w, f32(10, 4), f32(10), cu_seqlens_q=i32(3))
    with pytest.raises(ValueError, match="max_seqlen_q must be >= 0"):
        indexer_fwd(q, k, w, f32(10, 4), f32(10), cu_seqlens_q=i32(3), cu_seqlens_k=i32(3), max_seqlen_q=-1)


def test_dense_attn_checks():
    q, kv = bf16(1, 8, 64, 576), bf16(1, 9, 576)
    a, l1, lse = f32(1, 8, 9), f32(1, 8), f32(1, 64, 8)
    with pytest.raises(ValueError, match=r"softmax_lse: expected shape \(1, 64, 8\)"):
        dense_attn_score_fwd(q, kv, f32(1, 8, 64), a, l1, softmax_scale=0.1)
    with pytest.raises(ValueError, match="head_dim 128 not supported"):
        dense_attn_score_fwd(bf16(1, 8, 64, 128), bf16(1, 9, 128), lse, a, l1, softmax_scale=0.1)
    with pytest.raises(ValueError, match="32 heads not supported"):
        dense_attn_score_fwd(bf16(1, 8, 32, 576), kv, f32(1, 32, 8), a, l1, softmax_scale=0.1)
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        dense_attn_score_fwd(q, kv, lse, a, l1, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match=r"l1norm: expected shape \(1, 8\)"):
        dense_attn_score_fwd(q, kv, lse, a, f32(8), softmax_scale=0.1)


def test_sparse_checks():
    q, k, w = bf16(1, 8, 64, 128), bf16(1, 30, 128), f32(1, 8, 64)
    idx, s, lse = i32(1, 8, 64), f32(1, 8, 64), f32(1, 8)
    with pytest.raises(ValueError, match="topk_indices: dtype int64|topk_indices"):
        sparse_indexer_fwd(q, k, w, cuda(np.zeros((1, 8, 64), np.int64)), s, lse)
    with pytest.raises(ValueError, match=r"scores: expected shape \(1, 8, 64\)"):
        sparse_indexer_fwd(q, k, w, idx, f32(1, 8, 63), lse)
    with pytest.raises(ValueError, match=r"topk_indices: expected shape"):
        sparse_indexer_fwd(q, k, w, i32(1, 7, 64), f32(1, 7, 64), lse)
    with pytest.raises(ValueError, match="topk_length: expected int32"):
        sparse_indexer_fwd(q, k, w, idx, s, lse, topk_length=i32(1, 9))
    with pytest.raises(ValueError, match="16-byte aligned"):
        sparse_indexer_fwd(q, bf16_view(np.zeros((1, 30, 132), np.uint16)[..., :128]), w, idx, s, lse)
    qa, kva = bf16(1, 8, 128, 576), bf16(1, 30, 576)
    with pytest.raises(ValueError, match=r"softmax_lse: expected shape \(1, 128, 8\)"):
        sparse_attn_score_fwd(qa, kva, f32(1, 8, 128), idx, s, lse, softmax_scale=0.1)
    with pytest.raises(ValueError, match="zero keys"):
        sparse_attn_score_fwd(qa, bf16(1, 0, 576), f32(1, 128, 8), idx, s, lse, softmax_scale=0.1)


def zero_stride_batch(a, B):
    """`a` (leading axis 1) seen as B copies along that axis with stride 0: a batch with no memory behind it."""
    return np.lib.stride_tricks.as_strided(a, shape=(B,) + a.shape[1:], strides=(0,) + a.strides[1:])


def test_grid_yz_limit():
    """Batch rows (BSHD), and THD sequences + 1 where the kernel gives each sequence (and the rows past
    cu_seqlens_q[-1]) a grid slice, go into the launch grid's y / z dimension, at most 65535: more is a ValueError
    naming the argument, before any compile or launch."""
    B = 65536
    zb = lambda a: zero_stride_batch(a, B)  # noqa: E731
    q = bf16_view(zb(np.zeros((1, 1, 64, 128), np.uint16)))
    k = bf16_view(zb(np.zeros((1, 1, 128), np.uint16)))
    w, s, st = cuda(zb(np.zeros((1, 1, 64), np.float32))), cuda(zb(np.zeros((1, 1, 1), np.float32))), \
        cuda(zb(np.zeros((1, 1), np.float32)))
    with pytest.raises(ValueError, match="index_q: 65536 batch rows, more than one kernel launch takes"):
        indexer_fwd(q, k, w, s, st)
    idx = cuda(zb(np.zeros((1, 1, 1), np.int32)))
    with pytest.raises(ValueError, match="index_q: 65536 batch rows"):
        sparse_indexer_fwd(q, k, w, idx, s, st)
    qa = bf16_view(zb(np.zeros((1, 1, 64, 576), np.uint16)))
    kva = bf16_view(zb(np.zeros((1, 1, 576), np.uint16)))
    out = bf16_view(zb(np.zeros((1, 1, 64, 512), np.uint16)))
    with pytest.raises(ValueError, match="query: 65536 batch rows"):
        sparse_attn_fwd(qa, kva, idx, out, cuda(zb(np.zeros((1, 64, 1), np.float32))), softmax_scale=0.1)
    cu = cuda(np.arange(65536, dtype=np.int32))   # 65535 sequences: 65536 grid slices (one for the tail rows)
    with pytest.raises(ValueError, match="cu_seqlens_q: 65536 sequences \\+ 1"):
        indexer_fwd(bf16(65535, 64, 128), bf16(65535, 128), f32(65535, 64), f32(65535, 1), f32(65535),
                    cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1)
