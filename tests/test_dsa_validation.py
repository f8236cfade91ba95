"""Every validation error of the DSA ops, and the GPU supported-table check (before any work)."""
import inspect
import warnings

import numpy as np
import paddle
import pytest

import paddle_dsa as P
from paddle_dsa._port import PORT
from paddle_dsa.nn.functional import _dsa_inputs
from paddle_dsa.ops.dsa import supported as SUPPORTED
from paddle_dsa.reference.dsa import attn_score, indexer, sparse_attention


def T(shape, dtype="float32", fill=None):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape) if fill is None else np.full(shape, fill)
    return paddle.to_tensor(a.astype("float32" if dtype == "bfloat16" else dtype)).astype(dtype)


def I32(a, dtype="int32"):
    return paddle.to_tensor(np.asarray(a), dtype=dtype)


B, SQ, SK, HI, DI, H, DQK = 1, 3, 4, 16, 64, 16, 64
IQ, IK, W = T((B, SQ, HI, DI)), T((B, SK, DI)), T((B, SQ, HI))
Q, KV = T((B, SQ, H, DQK)), T((B, SK, DQK))
LSE = T((B, H, SQ))
IDX = I32(np.zeros((B, SQ, 2)))
SC = T((B, SQ, SK))
ROW = T((B, SQ))


def expect(exc, pattern, fn, *a, **kw):
    with pytest.raises(exc, match=pattern):
        fn(*a, **kw)


INDEXER_ERRORS = [
    (TypeError, "index_q.*paddle.Tensor", lambda f: f(np.zeros((1, 3, 16, 64)), IK, W)),
    (ValueError, "index_q.*rank 4", lambda f: f(T((3, 16, 64)), IK, W)),
    (ValueError, "index_k.*rank 3", lambda f: f(IQ, T((1, 4, 1, 64)), W)),
    (ValueError, "batch 1 != `index_k` batch 2", lambda f: f(IQ, T((2, SK, DI)), W)),
    (ValueError, "head_dim 64 != `index_k` head_dim 32", lambda f: f(IQ, T((B, SK, 32)), W)),
    (ValueError, "weights.*shape \\[1, 3, 16\\]", lambda f: f(IQ, IK, T((B, SQ, 8)))),
    (ValueError, "empty axis", lambda f: f(T((B, SQ, HI, 0)), T((B, SK, 0)), W)),     # head_dim 0 (B, S may be 0)
    (TypeError, "index_q.*dtype int32", lambda f: f(I32(np.zeros((B, SQ, HI, DI))), IK, W)),
    (TypeError, "share one dtype", lambda f: f(IQ, T((B, SK, DI), "float64"), W)),
    (TypeError, "weights.*dtype int64", lambda f: f(IQ, IK, I32(np.zeros((B, SQ, HI)), "int64"))),
    (ValueError, "given together", lambda f: f(IQ, IK, W, cu_seqlens_q=I32([0, 3]))),
]


@pytest.mark.parametrize("exc,pattern,call", INDEXER_ERRORS)
@pytest.mark.parametrize("fn", [P.indexer_score, P.dense_indexer_score_recompute])
def test_indexer_input_errors(fn, exc, pattern, call):
    expect(exc, pattern, call, fn)


def thd(**kw):
    args = dict(cu_seqlens_q=I32([0, 2, 3]), cu_seqlens_k=I32([0, 2, 4]))
    args.update(kw)
    return P.indexer_score(T((3, HI, DI)), T((4, DI)), T((3, HI)), **args)


def test_thd_and_causal_errors():
    thd()  # valid
    expect(TypeError, "cu_seqlens_q.*dtype int64", thd, cu_seqlens_q=I32([0, 2, 3], "int64"))
    expect(ValueError, "cu_seqlens_k.*non-decreasing", thd, cu_seqlens_k=I32([0, 3, 2]))
    expect(ValueError, "cu_seqlens_q.*start at 0", thd, cu_seqlens_q=I32([1, 2, 3]))
    expect(ValueError, "exceeds the 4 tokens", thd, cu_seqlens_k=I32([0, 2, 5]))
    expect(ValueError, "same batch", thd, cu_seqlens_k=I32([0, 4]))
    expect(ValueError, "index_q.*rank 3", P.indexer_score, IQ, T((4, DI)), T((3, HI)),
           cu_seqlens_q=I32([0, 3]), cu_seqlens_k=I32([0, 4]))
    expect(TypeError, "causal.*bool", P.indexer_score, IQ, IK, W, causal=1)
    expect(ValueError, "ratio.*>= 1", P.indexer_score, IQ, IK, W, ratio=0)
    expect(TypeError, "ratio.*int", P.indexer_score, IQ, IK, W, ratio=2.0)
    expect(ValueError, "q_offsets.*shape \\[1\\]", P.indexer_score, IQ, IK, W, q_offsets=I32([0, 1]))
    expect(TypeError, "q_offsets.*dtype int64", P.indexer_score, IQ, IK, W, q_offsets=I32([0], "int64"))
    expect(ValueError, "q_offsets.*shape \\[2\\]", thd, q_offsets=I32([0]))


def test_static_mode_is_refused():
    paddle.enable_static()
    try:
        for fn in (P.indexer_score, P.indexer_topk, P.sparse_attention, P.indexer_kl_loss,
                   P.dense_attn_score_recompute, P.sparse_indexer_backward):
            n = sum(1 for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty
                    and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
            expect(NotImplementedError, "static graph", fn, *([None] * n))
    finally:
        paddle.disable_static()


def test_topk_errors():
    expect(TypeError, "scores.*paddle.Tensor", P.indexer_topk, [1.0, 2.0], 1)
    expect(ValueError, "scores.*rank 3", P.indexer_topk, T((5,)), 1)
    expect(TypeError, "scores.*dtype int32", P.indexer_topk, I32(np.zeros((2, 3))), 1)
    expect(ValueError, "k.*>= 1", P.indexer_topk, SC, 0)
    expect(TypeError, "k.*int", P.indexer_topk, SC, 2.5)
    expect(TypeError, "sorted.*bool", P.indexer_topk, SC, 2, sorted="yes")
    expect(ValueError, "lengths.*shape \\[1, 3\\]", P.indexer_topk, SC, 2, lengths=I32(np.zeros((1, 4))))
    expect(TypeError, "lengths.*dtype int64", P.indexer_topk, SC, 2, lengths=I32(np.zeros((1, 3)), "int64"))


def test_sparse_attention_errors():
    f = P.sparse_attention
    f(Q, KV, IDX, v_head_dim=32)  # valid
    expect(ValueError, "v_head_dim.*exceeds", f, Q, KV, IDX, v_head_dim=65)
    expect(ValueError, "v_head_dim.*>= 1", f, Q, KV, IDX, v_head_dim=0)
    expect(TypeError, "v_head_dim.*int", f, Q, KV, IDX, v_head_dim=None)
    expect(ValueError, "softmax_scale.*finite", f, Q, KV, IDX, v_head_dim=32, softmax_scale=float("inf"))
    expect(TypeError, "softmax_scale.*real", f, Q, KV, IDX, v_head_dim=32, softmax_scale="0.1")
    expect(TypeError, "return_softmax_lse.*bool", f, Q, KV, IDX, v_head_dim=32, return_softmax_lse=None)
    expect(TypeError, "topk_indices.*dtype int64", f, Q, KV, I32(np.zeros((B, SQ, 2)), "int64"), v_head_dim=32)
    expect(TypeError, "topk_indices.*paddle.Tensor", f, Q, KV, [[0]], v_head_dim=32)
    expect(ValueError, "topk_indices.*rank 3", f, Q, KV, I32(np.zeros((SQ, 2))), v_head_dim=32)
    expect(ValueError, "topk_indices` rows \\[1, 2\\]", f, Q, KV, I32(np.zeros((B, 2, 2))), v_head_dim=32)
    expect(ValueError, "topk_length.*shape \\[1, 3\\]", f, Q, KV, IDX, v_head_dim=32, topk_length=I32(np.zeros((B, 2))))
    expect(TypeError, "topk_length.*dtype", f, Q, KV, IDX, v_head_dim=32, topk_length=I32(np.zeros((B, SQ)), "int64"))
    expect(ValueError, "attn_sink.*shape \\[16\\]", f, Q, KV, IDX, v_head_dim=32, attn_sink=T((8,)))
    expect(TypeError, "attn_sink.*dtype bfloat16", f, Q, KV, IDX, v_head_dim=32, attn_sink=T((16,), "bfloat16"))
    expect(TypeError, "share one dtype", f, Q, T((B, SK, DQK), "float64"), IDX, v_head_dim=32)
    expect(ValueError, "query` head_dim 64 != `kv` head_dim 32", f, Q, T((B, SK, 32)), IDX, v_head_dim=32)
    expect(ValueError, "query.*rank 4", f, T((SQ, H, DQK)), KV, IDX, v_head_dim=32)
    expect(ValueError, "query.*rank 3", f, Q, T((SK, DQK)), IDX, v_head_dim=32,
           cu_seqlens_q=I32([0, 3]), cu_seqlens_k=I32([0, 4]))


def test_recompute_and_backward_errors():
    expect(ValueError, "softmax_lse.*shape \\[1, 16, 3\\]", P.dense_attn_score_recompute, Q, KV, T((B, SQ, H)))
    expect(TypeError, "softmax_lse.*dtype bfloat16", P.dense_attn_score_recompute, Q, KV, T((B, H, SQ), "bfloat16"))
    expect(ValueError, "softmax_lse.*shape \\[16, 3\\]", P.sparse_attn_score_recompute, T((3, H, DQK)), T((4, DQK)),
           T((3, H)), I32(np.zeros((3, 2))), cu_seqlens_q=I32([0, 3]), cu_seqlens_k=I32([0, 4]))
    expect(ValueError, "topk_indices.*rank 3", P.sparse_indexer_score_recompute, IQ, IK, W, I32(np.zeros((SQ, 2))))
    db = P.dense_indexer_backward
    db(IQ, IK, W, SC, ROW, SC, ROW, 1.0)  # valid
    expect(ValueError, "index_score.*shape \\[1, 3, 4\\]", db, IQ, IK, W, T((B, SQ, 5)), ROW, SC, ROW, 1.0)
    expect(ValueError, "attn_l1norm.*shape \\[1, 3\\]", db, IQ, IK, W, SC, ROW, SC, T((B, 4)), 1.0)
    expect(TypeError, "index_lse.*dtype bfloat16", db, IQ, IK, W, SC, T((B, SQ), "bfloat16"), SC, ROW, 1.0)
    expect(ValueError, "grad_loss.*one element", db, IQ, IK, W, SC, ROW, SC, ROW, T((2,)))
    expect(TypeError, "grad_loss", db, IQ, IK, W, SC, ROW, SC, ROW, "1")
    expect(TypeError, "grad_loss", db, IQ, IK, W, SC, ROW, SC, ROW, float("nan"))
    expect(ValueError, "loss_coeff.*finite", db, IQ, IK, W, SC, ROW, SC, ROW, 1.0, loss_coeff=float("nan"))
    sb = P.sparse_indexer_backward
    sc2, row = T((B, SQ, 2)), ROW
    sb(IQ, IK, W, IDX, sc2, row, sc2, row, 1.0)  # valid
    expect(ValueError, "index_score.*shape \\[1, 3, 2\\]", sb, IQ, IK, W, IDX, SC, row, sc2, row, 1.0)


def test_indexer_kl_loss_errors():
    f = P.indexer_kl_loss
    f(IQ, IK, W, Q, KV, LSE)  # valid
    expect(ValueError, "query` rows \\[1, 2\\].*must match", f, IQ, IK, W, T((B, 2, H, DQK)), KV, LSE)
    expect(ValueError, "kv` keys \\[1, 5\\].*must match", f, IQ, IK, W, Q, T((B, 5, DQK)), LSE)
    expect(ValueError, "topk_length.*needs `topk_indices`", f, IQ, IK, W, Q, KV, LSE, topk_length=I32(np.zeros((B, SQ))))
    expect(ValueError, "softmax_lse.*shape", f, IQ, IK, W, Q, KV, T((B, SQ, H)))
    expect(ValueError, "loss_coeff.*finite", f, IQ, IK, W, Q, KV, LSE, loss_coeff=float("inf"))


# ------------------------------------------------------------------------------ GPU supported table
@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend every tensor sits on a CUDA place; any reference work before the check would fail loudly."""
    monkeypatch.setattr(PORT, "is_gpu", lambda t: True)
    monkeypatch.setattr(_dsa_inputs, "_warned", set())
    # no DSA kernel installed: GPU-place calls that pass the table run the reference path (the kernel route is
    # tests/test_dsa_kernel_seam.py)
    from paddle_dsa.kernels import dsa as dsa_seam
    monkeypatch.setattr(dsa_seam, "_MODULES", {name: None for name in dsa_seam._NAMES})
    called = []

    def spy(mod, name):
        real = getattr(mod, name)

        def wrapped(*a, **k):
            called.append(name)
            return real(*a, **k)
        monkeypatch.setattr(mod, name, wrapped)

    for mod, name in ((indexer, "dense_scores"), (indexer, "sparse_scores"), (sparse_attention, "forward"),
                      (attn_score, "dense"), (attn_score, "sparse")):
        spy(mod, name)
    return called


def bf(shape):
    return T(shape, "bfloat16")


def test_gpu_table_rejects_before_any_work(fake_gpu):
    iq, ik, w = bf((1, 2, 8, 64)), bf((1, 3, 64)), bf((1, 2, 8))
    expect(ValueError, "index head count 8 is not supported on a GPU place; supported: 16, 32, 64", P.indexer_score, iq, ik, w)
    expect(ValueError, "index head_dim 96 is not supported on a GPU place; supported: 64, 128",
           P.dense_indexer_score_recompute, bf((1, 2, 16, 96)), bf((1, 3, 96)), bf((1, 2, 16)))
    expect(TypeError, "index_q` dtype float32 is not supported on a GPU place", P.indexer_score,
           T((1, 2, 16, 64)), T((1, 3, 64)), T((1, 2, 16)))
    q, kv, idx = bf((1, 2, 16, 64)), bf((1, 3, 64)), I32(np.zeros((1, 2, 2)))
    expect(ValueError, "\\(Dqk, v_head_dim\\) \\(64, 32\\) is not supported on a GPU place", P.sparse_attention,
           q, kv, idx, v_head_dim=32)
    expect(ValueError, "query head count 16 is not supported", P.sparse_attention, bf((1, 2, 16, 576)), bf((1, 3, 576)),
           idx, v_head_dim=512)
    expect(ValueError, "query head_dim \\(Dqk\\) 64 is not supported", P.dense_attn_score_recompute, bf((1, 2, 64, 64)),
           bf((1, 3, 64)), T((1, 64, 2)))
    expect(TypeError, "scores` dtype float64 is not supported on a GPU place", P.indexer_topk, T((1, 2, 3), "float64"), 2)
    expect(ValueError, "query head count 16", P.indexer_kl_loss, bf((1, 2, 16, 64)), bf((1, 3, 64)), bf((1, 2, 16)),
           bf((1, 2, 16, 576)), bf((1, 3, 576)), T((1, 16, 2)))
    assert fake_gpu == []                 # nothing ran


def test_gpu_table_accepts_supported_shapes_and_runs_reference(fake_gpu):
    q, kv = bf((1, 2, 64, 576)), bf((1, 3, 576))
    idx = I32([[[0, 1], [2, -1]]])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = P.sparse_attention(q, kv, idx, v_head_dim=512)
        s = P.indexer_score(bf((1, 2, 16, 128)), bf((1, 3, 128)), T((1, 2, 16)))
    assert out.dtype == paddle.bfloat16 and list(out.shape) == [1, 2, 64, 512]
    assert list(s.shape) == [1, 2, 3] and fake_gpu == ["forward", "dense_scores"]
    assert 64 in SUPPORTED.QUERY_HEADS and (576, 512) in SUPPORTED.QK_V_HEAD_DIMS
    assert all(np.isfinite(out.astype("float32").numpy()).ravel())
    msgs = [str(r.message) for r in rec if "reference path on the GPU" in str(r.message)]
    assert len(msgs) == 2 and "sparse_attention" in msgs[0] and "indexer_score" in msgs[1]


def test_top_level_reexports_match_functional():
    from paddle_dsa.nn import functional as F
    assert sorted(P._FUNCTIONAL) == sorted(F.__all__), "paddle_dsa._FUNCTIONAL and functional.__all__ differ"
    for name in P._FUNCTIONAL:
        assert getattr(P, name) is getattr(F, name)
