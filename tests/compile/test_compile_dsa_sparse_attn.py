"""CPU CI: every variant of the sparse MLA attention forward and backward (ops/dsa/sparse_attn/fwd.py, bwd.py) and the
fill kernel compiles for sm_90a; one variant of each checked in its PTX (warpgroup MMAs, 16-byte cp.async gathers, no
local memory; the backward's fp32 reductions); the seams' argument checks raise ValueError naming the argument before
any compile or launch ("CUDA" tensors are host arrays relabelled through DLPack, cuda_labelled.py; only invalid calls
are made)."""
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

from cuda_labelled import bf16, bf16_view, cuda  # noqa: E402
from ops.dsa.sparse_attn import bwd, fwd  # noqa: E402


@pytest.mark.parametrize("key", fwd.all_variant_keys(), ids=lambda k: "-".join(str(v) for v in k))
def test_compile_variant(key):
    assert fwd.compile_variant(key) is not None


@pytest.mark.parametrize("key", bwd.all_variant_keys(), ids=lambda k: "-".join(str(v) for v in k))
def test_compile_bwd_variant(key):
    assert bwd.compile_variant(key) is not None


@pytest.mark.parametrize("rank", __import__("ops.common.fill_sm90", fromlist=["x"]).RANKS)
def test_compile_fill(rank):
    from ops.common.fill_sm90 import compile_fill
    assert compile_fill(rank) is not None


@pytest.mark.parametrize("det", [False, True], ids=["atomics", "deterministic"])
def test_bwd_ptx(tmp_path, det):
    """Default variant (BSHD, H 64): dkv by red.v4 whole lines. Deterministic variant (THD, H 128, topk_length, sink,
    dlse): the same wgmmas and gathers, no reduction at all: each dkv tile stored to its staging rows as it lies in
    the registers (st.global.v2, no shuffle)."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    key = "576, 512, 128, True, True, True, True, True" if det else "576, 512, 64, False, False, False, False"
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from ops.dsa.sparse_attn import bwd; "
            f"bwd.compile_variant(bwd.variant_key({key}))")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    text = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"][0].read_text()
    # consumer A: S (9 chunks x 4 k16), dP (8 x 4), dq chunks 0-3 (4 x 4 k16 over 64 keys), dkv tiles 7 (4 + 4) and
    # 8 (4: no V columns); consumer B: dq chunks 4-8 (5 x 4), dkv tiles 0-6 (7 x 8)
    assert text.count("wgmma.mma_async") == (36 + 32 + 4 * 4 + 8 + 4) + (5 * 4 + 7 * 8)
    assert text.count("cp.async.cg.shared.global") + text.count("cp.async.ca.shared.global") == 9 * 4
    if det:     # a 64 x 64 tile: 2 rows x 8 column pairs a thread; 9 tiles
        assert not re.search(r"\b(red|atom)\.", text)
        assert text.count("st.global.v2.") == 9 * 2 * 8
    else:       # a 64 x 64 dkv tile: 2 lines of 32 columns, 4 (row pair, row) red.v4 instructions a line; 9 tiles
        assert text.count("red.relaxed.gpu.global.add.v4.f32") == 9 * 2 * 4
        assert text.count("red.relaxed.gpu.global.add.f32") == 0
    assert "st.local" not in text and "ld.local" not in text


@pytest.mark.parametrize("key", __import__("ops.common.segment_sum_sm90", fromlist=["x"]).variant_keys())
def test_compile_segment_sum(key):
    from ops.common import segment_sum_sm90
    assert segment_sum_sm90.compile_variant(*key) is not None


def test_ptx(tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); from ops.dsa.sparse_attn import fwd; "
            f"fwd.compile_variant((576, 512, 128, True, True, True))")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    text = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"][0].read_text()
    # each consumer: Q K^T of its own block (9 chunks x 4 k16 at N = 64), P V on its own P (RS) and on the other's
    # (SS), 4 k16 each at N = 256
    assert text.count("wgmma.mma_async") == 2 * (9 * 4 + 4 + 4)
    assert text.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 2 * 9 * 4
    assert text.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") == 2 * 8
    # the ping-pong handoffs (m0, m1, sS1, sS0) are mbarriers: no named barrier is arrived on without a wait
    # (racecheck took none of those arrivals as ordering: H100 / H200 2026-12-05); SUM and OUT are waited by both
    assert not re.search(r"\bbar\.arrive\b|\bbarrier\.arrive\b", text)
    for bar in (7, 8):
        assert len(re.findall(rf"bar.sync\s+{bar}, 256;", text)) == 2
    # the producer's period: 2 blocks x 9 chunks x 4 pieces
    assert text.count("cp.async.cg.shared.global") + text.count("cp.async.ca.shared.global") == 2 * 9 * 4
    assert "st.local" not in text and "ld.local" not in text
    assert "fence.proxy.async.shared::cta" in text
    store = ".global.shared::cta.tile.bulk_group"     # out: 4 TMA boxes of 64 columns, in each consumer's epilogue
    assert text.count(store) == 2 * 4
    for m in re.finditer(re.escape(store), text):                     # each issued by one elected lane, not 32
        assert "elect.sync" in text[text.rindex("bar.sync", 0, m.start()):m.start()]


def f32(*s):
    return cuda(np.zeros(s, np.float32))


def i32(*s):
    return cuda(np.zeros(s, np.int32))


def call(**over):
    B, S, Sk, H, D, K = 2, 4, 30, 64, 576, 64
    a = dict(query=bf16(B, S, H, D), kv=bf16(B, Sk, D), topk_indices=i32(B, S, K), out=bf16(B, S, H, 512),
             softmax_lse=f32(B, H, S))
    kw = {k: over.pop(k) for k in list(over) if k in ("attn_sink", "topk_length", "cu_seqlens_q", "cu_seqlens_k",
                                                     "softmax_scale")}
    kw.setdefault("softmax_scale", 0.1)
    a.update(over)
    fwd.sparse_attn_fwd(a["query"], a["kv"], a["topk_indices"], a["out"], a["softmax_lse"], **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(query=cuda(np.zeros((2, 4, 64, 576), np.float16))), "query: dtype float16"),
    (dict(query=bf16(2, 4, 32, 576), out=bf16(2, 4, 32, 512), softmax_lse=f32(2, 32, 4)), "32 heads not supported"),
    (dict(query=bf16(2, 4, 64, 192), kv=bf16(2, 30, 192)), "head_dim 192 not supported"),
    (dict(kv=bf16(2, 30, 512)), "kv: head_dim 512 differs"),
    (dict(kv=bf16(3, 30, 576)), "kv: batch 3 differs"),
    (dict(out=bf16(2, 4, 64, 576)), r"\(Dqk, Dv\) = \(576, 576\) not supported"),
    (dict(out=bf16(2, 4, 32, 512)), "out: expected shape"),
    (dict(out=bf16_view(np.zeros((2, 64, 4, 512), np.uint16).transpose(0, 2, 1, 3))),
     r"out: the \(row, head\) axes must be mergeable"),                 # the forward stores out by TMA
    (dict(out=bf16_view(np.zeros((2, 4, 64, 1032), np.uint16)[..., 3:515])), "out: base address must be 16-byte"),
    (dict(softmax_lse=f32(2, 4, 64)), r"softmax_lse: expected shape \(2, 64, 4\)"),
    (dict(topk_indices=cuda(np.zeros((2, 4, 64), np.int64))), "topk_indices: dtype int64"),
    (dict(topk_indices=i32(2, 5, 64)), "topk_indices: expected shape"),
    (dict(attn_sink=f32(63)), r"attn_sink: expected shape \(64,\)"),
    (dict(topk_length=i32(2, 5)), "topk_length: expected int32"),
    (dict(softmax_scale=float("inf")), "softmax_scale must be finite"),
    (dict(cu_seqlens_q=i32(3)), "must be given together"),
    (dict(query=bf16(0, 4, 64, 576), kv=bf16(0, 30, 576), topk_indices=i32(0, 4, 64), out=bf16(0, 4, 64, 512),
          softmax_lse=f32(0, 64, 4)), None),                           # nothing to write: returns
])
def test_seam_rejects(over, msg):
    if msg is None:
        call(**over)
        return
    with pytest.raises(ValueError, match=msg):
        call(**over)


def call_bwd(**over):
    B, S, Sk, H, D, K = 2, 4, 30, 64, 576, 64
    a = dict(query=bf16(B, S, H, D), kv=bf16(B, Sk, D), topk_indices=i32(B, S, K), out=bf16(B, S, H, 512),
             dout=bf16(B, S, H, 512), softmax_lse=f32(B, H, S), dq=bf16(B, S, H, D), dkv=f32(B, Sk, D))
    kw = {k: over.pop(k) for k in list(over) if k in ("attn_sink", "d_sink_rows", "dlse", "topk_length",
                                                     "softmax_scale", "deterministic", "workspace",
                                                     "workspace_bytes")}
    kw.setdefault("softmax_scale", 0.1)
    a.update(over)
    bwd.sparse_attn_bwd(a["query"], a["kv"], a["topk_indices"], a["out"], a["dout"], a["softmax_lse"], a["dq"],
                        a["dkv"], **kw)


@pytest.mark.parametrize("over,msg", [
    (dict(dout=bf16(2, 4, 64, 256)), r"dout: expected shape \(2, 4, 64, 512\)"),
    (dict(dout=cuda(np.zeros((2, 4, 64, 512), np.float16))), "dout: dtype float16"),
    (dict(dq=bf16(2, 4, 64, 512)), r"dq: expected shape \(2, 4, 64, 576\)"),
    (dict(dkv=bf16(2, 30, 576)), "dkv: dtype bfloat16 not supported"),
    (dict(dkv=f32(2, 31, 576)), r"dkv: expected shape \(2, 30, 576\)"),
    (dict(dkv=cuda(np.zeros((2, 60, 576), np.float32)[:, ::2])), "dkv: must be contiguous"),
    (dict(attn_sink=f32(64)), "attn_sink and d_sink_rows must be given together"),
    (dict(attn_sink=f32(64), d_sink_rows=f32(2, 4, 63)), r"d_sink_rows: expected shape \(2, 4, 64\)"),
    (dict(dlse=f32(2, 4, 64)), r"dlse: expected shape \(2, 64, 4\)"),
    (dict(out=bf16(2, 4, 64, 576), dout=bf16(2, 4, 64, 576)), r"\(Dqk, Dv\) = \(576, 576\) not supported"),
    (dict(softmax_scale=float("nan")), "softmax_scale must be finite"),
    (dict(deterministic=True), "workspace: deterministic=True needs an object with alloc, export and sort_keys"),
    (dict(deterministic=True, workspace=__import__("types").SimpleNamespace(alloc=len, export=len, sort_keys=len),
          workspace_bytes=2.5), "workspace_bytes: expected an int >= 0"),
])
def test_bwd_seam_rejects(over, msg):
    with pytest.raises(ValueError, match=msg):
        call_bwd(**over)
