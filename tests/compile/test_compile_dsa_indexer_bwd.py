"""CPU CI: every variant of the sparse indexer backward (ops/dsa/indexer/sparse_bwd.py) compiles for sm_90a; one
variant checked in its PTX (warpgroup MMAs: X^T, dq^T, dk per chunk; 16-byte cp.async gathers; the fp32 reductions;
no local memory); the seam's checks raise ValueError naming the argument before any compile or launch ("CUDA"
tensors are host arrays relabelled through DLPack, cuda_labelled.py; only invalid calls are made)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from cuda_labelled import bf16, cuda  # noqa: E402
from ops.dsa.indexer import sparse_bwd  # noqa: E402


@pytest.mark.parametrize("key", sparse_bwd.all_variant_keys(), ids=lambda k: "-".join(str(v) for v in k))
def test_compile_variant(key):
    assert sparse_bwd.compile_variant(key) is not None


@pytest.mark.parametrize("module,key", [("sparse_bwd", "128, 64, 'float32', False, False"),
                                        ("sparse_bwd", "128, 64, 'float32', True, True, True"),
                                        ("dense_bwd", "128, 64, 'float32', True, True"),
                                        ("dense_bwd", "128, 64, 'bfloat16', True, True, True")])
def test_ptx(tmp_path, module, key):
    """Both indexer backwards (the dense one is the sparse kernel with another slot source): X^T, dq^T and dk
    wgmmas, 16-byte gathers, dA stored by stmatrix, relu by max.NaN, no local memory; d_index_k by red.v4, or in the
    deterministic variant (key ends in True) stored to its staging rows as the tile lies in the registers
    (st.global.v2: 2 rows x 8 column pairs a thread, 2 chunks), no reduction at all."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from ops.dsa.indexer import {module} as m; "
            f"m.compile_variant(m.variant_key({key}))")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    text = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"][0].read_text()
    assert text.count("wgmma.mma_async") == 2 * 4 + 2 * 4 + 2 * 4          # X^T, dq^T, dk: 2 chunks each
    assert text.count("cp.async.cg.shared.global") + text.count("cp.async.ca.shared.global") == 2 * 4
    # dA to shared memory by stmatrix (32 values a thread, 8 a x4), none element by element; relu by max.NaN
    assert len(re.findall(r"stmatrix\.sync\.aligned\.(?:m8n8\.)?x4", text)) == 4, "dA by 4 stmatrix x4"
    assert not re.search(r"st\.shared\.(?:b16|u16)", text)
    assert text.count("max.NaN.f32") == 32
    if key.count(",") == 5:
        assert not re.search(r"\b(red|atom)\.", text)
        assert text.count("st.global.v2.") == 2 * 2 * 8
    else:
        assert text.count("red.relaxed.gpu.global.add.v4.f32") == 2 * 8     # 32 values a tile, 4 a request
        assert text.count("red.relaxed.gpu.global.add.f32") == 0
    assert "st.local" not in text and "ld.local" not in text


def f32(*s):
    return cuda(np.zeros(s, np.float32))


def i32(*s):
    return cuda(np.zeros(s, np.int32))


def call(**over):
    B, S, Sk, H, D, K = 2, 4, 30, 64, 128, 64
    a = dict(index_q=bf16(B, S, H, D), index_k=bf16(B, Sk, D), weights=f32(B, S, H), topk_indices=i32(B, S, K),
             index_score=f32(B, S, K), index_lse=f32(B, S), attn_score=f32(B, S, K), attn_l1norm=f32(B, S),
             grad_scale=f32(1), d_index_q=bf16(B, S, H, D), d_index_k=f32(B, Sk, D), d_weights=f32(B, S, H))
    kw = {k: over.pop(k) for k in list(over) if k in ("topk_length", "cu_seqlens_q", "cu_seqlens_k", "deterministic",
                                                      "workspace", "workspace_bytes")}
    a.update(over)
    sparse_bwd.sparse_indexer_bwd(*a.values(), **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(index_q=bf16(2, 4, 48, 128), weights=f32(2, 4, 48), d_index_q=bf16(2, 4, 48, 128),
          d_weights=f32(2, 4, 48)), "48 index heads not supported"),
    (dict(attn_score=f32(2, 4, 63)), r"attn_score: expected shape \(2, 4, 64\)"),
    (dict(attn_l1norm=f32(2, 5)), r"attn_l1norm: expected shape \(2, 4\)"),
    (dict(grad_scale=f32(2)), "grad_scale: expected a one-element float32 tensor"),
    (dict(d_index_q=bf16(2, 4, 64, 64)), r"d_index_q: expected shape \(2, 4, 64, 128\)"),
    (dict(d_index_k=bf16(2, 30, 128)), "d_index_k: dtype bfloat16 not supported"),
    (dict(d_index_k=cuda(np.zeros((2, 60, 128), np.float32)[:, ::2])), "d_index_k: must be contiguous"),
    (dict(d_weights=f32(2, 4, 32)), r"d_weights: expected shape \(2, 4, 64\)"),
    (dict(index_score=f32(2, 4, 65)), r"index_score: expected shape"),
    (dict(weights=cuda(np.zeros((2, 4, 64), np.float16))), "weights: dtype float16"),
    (dict(deterministic=True), "workspace: deterministic=True needs an object with alloc, export and sort_keys"),
    (dict(deterministic=True, workspace=__import__("types").SimpleNamespace(alloc=len, export=len, sort_keys=len),
          workspace_bytes=-1), "workspace_bytes: expected an int >= 0"),
])
def test_seam_rejects(over, msg):
    with pytest.raises(ValueError, match=msg):
        call(**over)
