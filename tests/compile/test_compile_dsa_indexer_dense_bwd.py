"""CPU CI: every variant of the dense indexer backward (ops/dsa/indexer/dense_bwd.py) compiles for sm_90a (two of
them are checked in their PTX by test_compile_dsa_indexer_bwd.py test_ptx); the seam's checks raise ValueError naming the argument before any compile or launch
("CUDA" tensors are host arrays relabelled through DLPack, cuda_labelled.py; only invalid calls are made)."""
import os
import sys

import numpy as np
import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from cuda_labelled import bf16, cuda  # noqa: E402
from ops.dsa.indexer import dense_bwd  # noqa: E402


@pytest.mark.parametrize("key", dense_bwd.all_variant_keys(), ids=lambda k: "-".join(str(v) for v in k))
def test_compile_variant(key):
    assert dense_bwd.compile_variant(key) is not None


def f32(*s):
    return cuda(np.zeros(s, np.float32))


def i32(*s):
    return cuda(np.zeros(s, np.int32))


def call(**over):
    B, S, Sk, H, D = 2, 4, 30, 64, 128
    a = dict(index_q=bf16(B, S, H, D), index_k=bf16(B, Sk, D), weights=f32(B, S, H), index_score=f32(B, S, Sk),
             index_lse=f32(B, S), attn_score=f32(B, S, Sk), attn_l1norm=f32(B, S), grad_scale=f32(1),
             d_index_q=bf16(B, S, H, D), d_index_k=f32(B, Sk, D), d_weights=f32(B, S, H))
    kw = {k: over.pop(k) for k in list(over) if k in ("causal", "ratio", "q_offsets", "cu_seqlens_q",
                                                      "cu_seqlens_k", "deterministic",
                                                      "workspace", "workspace_bytes")}
    a.update(over)
    dense_bwd.dense_indexer_bwd(*a.values(), **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(index_q=bf16(2, 4, 48, 128), weights=f32(2, 4, 48), d_index_q=bf16(2, 4, 48, 128),
          d_weights=f32(2, 4, 48)), "48 index heads not supported"),
    (dict(index_score=f32(2, 4, 31)), r"index_score: expected shape \(2, 4, 30\)"),
    (dict(attn_score=f32(2, 4, 29)), r"attn_score: expected shape \(2, 4, 30\)"),
    (dict(index_lse=None), "index_lse: required"),
    (dict(index_lse=f32(2, 5)), r"index_lse: expected shape \(2, 4\)"),
    (dict(attn_l1norm=f32(2, 5)), r"attn_l1norm: expected shape \(2, 4\)"),
    (dict(grad_scale=f32(2)), "grad_scale: expected a one-element float32 tensor"),
    (dict(d_index_k=cuda(np.zeros((2, 60, 128), np.float32)[:, ::2])), "d_index_k: must be contiguous"),
    (dict(d_weights=f32(2, 4, 32)), r"d_weights: expected shape \(2, 4, 64\)"),
    (dict(ratio=0), "ratio must be >= 1"),
    (dict(q_offsets=i32(3)), r"q_offsets: expected int32 \[2\]"),
    (dict(cu_seqlens_q=i32(3)), "cu_seqlens_q and cu_seqlens_k must be given together"),
    (dict(weights=cuda(np.zeros((2, 4, 64), np.float16))), "weights: dtype float16"),
    (dict(deterministic=True), "workspace: deterministic=True needs an object with alloc, export and sort_keys"),
    (dict(deterministic=True, workspace=__import__("types").SimpleNamespace(alloc=len, export=len, sort_keys=len),
          workspace_bytes=-1), "workspace_bytes: expected an int >= 0"),
])
def test_seam_rejects(over, msg):
    with pytest.raises(ValueError, match=msg):
        call(**over)
