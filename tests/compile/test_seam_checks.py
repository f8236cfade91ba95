"""CPU tests of the kernel seams' argument checks (ops/common/tensors.py, ops/flash_attention/{fwd,bwd}.py).

No GPU here, so "CUDA" tensors are host numpy arrays whose DLPack capsule is relabelled as CUDA memory
(``CudaLabelled``): the seams read shape/stride/dtype/pointer metadata from them exactly as from real device
tensors. Only invalid calls are made, so every test must end in the seam's ValueError before any compile or
launch (a valid call would try to launch and fail differently), except test_bwd_det_kernel_choice, which replaces
compile_variant with a recorder.
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

from cuda_labelled import CudaLabelled, cuda  # noqa: E402
from ops.common import tensors  # noqa: E402
from ops.flash_attention import bwd, fwd  # noqa: E402


def h16(*shape):
    return np.zeros(shape, dtype=np.float16)


def f32(*shape):
    return np.zeros(shape, dtype=np.float32)


def dense(B=2, S=64, H=4, Hkv=4, D=64):
    return dict(q=cuda(h16(B, S, H, D)), k=cuda(h16(B, S, Hkv, D)), v=cuda(h16(B, S, Hkv, D)),
                out=cuda(h16(B, S, H, D)), lse=cuda(f32(B, H, S)))


def call_fwd(**over):
    a = dense()
    a.update(over)
    fwd.flash_attn_fwd(a["q"], a["k"], a["v"], a["out"], a["lse"], softmax_scale=0.125, causal=False,
                       window=(-1, -1))


# ------------------------------------------------------------------------------------------------ ArgTensor
def test_arg_tensor_reads_metadata():
    a = np.zeros((2, 3, 4, 8), dtype=np.float16)[:, 1:]
    t = tensors.arg_tensor(cuda(a), "q")
    assert t.shape == (2, 2, 4, 8) and t.strides == (96, 32, 8, 1)
    assert t.dtype == "float16" and t.bits == 16 and t.device_type == 2
    assert t.ptr == a.ctypes.data


def test_arg_tensor_rejects_host_and_non_dlpack():
    with pytest.raises(ValueError, match=r"q: must be on a CUDA device"):
        tensors.arg_tensor(h16(2, 2), "q")
    with pytest.raises(ValueError, match=r"k: expected a DLPack tensor, got list"):
        tensors.arg_tensor([1, 2], "k")


def test_require_tma():
    base = np.zeros(4096, dtype=np.float16)
    off = (-base.ctypes.data // 2) % 8  # element offset to a 16-byte boundary
    good = base[off:off + 2 * 8 * 64].reshape(2, 8, 64)
    tensors.arg_tensor(cuda(good), "q").require_tma()
    with pytest.raises(ValueError, match="q: base address must be 16-byte aligned"):
        tensors.arg_tensor(cuda(base[off + 1:off + 1 + 64].reshape(1, 64)), "q").require_tma()
    with pytest.raises(ValueError, match="innermost"):
        tensors.arg_tensor(cuda(good.transpose(0, 2, 1)), "q").require_tma()
    odd = base[off:off + 4 * 68].reshape(4, 68)[:, :64]        # row stride 68 elements = 136 bytes
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        tensors.arg_tensor(cuda(odd), "k").require_tma()
    unit = np.lib.stride_tricks.as_strided(good, shape=(1, 8, 64), strides=(2, 128, 2))  # size-1 axis, stride 1
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        tensors.arg_tensor(cuda(unit), "v").require_tma()


def test_stream_handle():
    assert tensors.stream_handle(None) == 0
    assert tensors.stream_handle(0) == 0
    assert tensors.stream_handle(0x1234) == 0x1234

    class S:
        def __int__(self):
            return 77
    assert tensors.stream_handle(S()) == 77


# ------------------------------------------------------------------------------------------------ forward seam
def test_fwd_block_m_matches_kernel():
    """Every variant's kernel takes the row tile the seam sizes its grid by (supported.fwd_block_m): 192 rows and
    three consumer warpgroups at D 64 without a bounded mask unless PADDLE_DSA_FWD_BM64 says otherwise, 128 elsewhere;
    pingpong only with two warpgroups."""
    import cutlass
    from ops.flash_attention import forward_sm90, supported
    for d, dv in supported.FWD_HEAD_DIMS:
        for bounded in (False, True):
            kern = forward_sm90.FlashFwdSm90(cutlass.BFloat16, d, bounded, False, v_head_dim=dv, pingpong=True)
            assert kern.BM == supported.fwd_block_m(d, dv, bounded)
            assert kern.threads == 128 * (1 + kern.BM // 64)
            # setmaxnreg draws on the registers the CTA was launched with: at most 64 K / threads a thread, rounded
            # down to a multiple of 8 (384 threads: 168, a pool of 3 x 168 = 504 per 128 threads; 512 threads: 512)
            pool = kern.threads // 128 * (65536 // kern.threads // 8 * 8)
            assert 24 + kern.BM // 64 * kern.consumer_regs <= pool, (d, dv, bounded, kern.consumer_regs, pool)
            assert kern.pingpong == (kern.BM == 128)
    if "PADDLE_DSA_FWD_BM64" not in __import__("os").environ:
        assert supported.fwd_block_m(64, 64, False) == 192 and supported.fwd_block_m(64, 64, True) == 192
        assert supported.fwd_block_m(128, 128, True) == 128


def test_fwd_grid_follows_the_row_tile(monkeypatch):
    """The seam launches ceil(rows / BM) query blocks with the variant's BM (dense: Sq; varlen: max_seqlen_q), for
    either setting of the D 64 table; a bad PADDLE_DSA_FWD_BM64 is a ValueError naming it. Launches recorded, not
    run."""
    from ops.flash_attention import supported
    seen = []
    monkeypatch.setattr(fwd, "compile_variant", lambda key: (lambda *a: seen.append((key[1], key[3], a[10]))))
    monkeypatch.setattr(supported, "FWD_BLOCK_M", None)
    monkeypatch.setattr(supported, "_BM64", "192/192")

    def run(D, S, causal, varlen=False):
        if varlen:
            q, k = cuda(h16(S + 7, 4, D)), cuda(h16(S + 7, 4, D))
            cu = cuda(np.array([0, 7, S + 7], np.int32))
            fwd.flash_attn_fwd(q, k, cuda(h16(S + 7, 4, D)), cuda(h16(S + 7, 4, D)), cuda(f32(4, S + 7)),
                               softmax_scale=0.1, causal=causal, window=(-1, -1), cu_seqlens_q=cu, cu_seqlens_k=cu,
                               max_seqlen_q=S, max_seqlen_k=S)
        else:
            a = dense(B=1, S=S, D=D)
            fwd.flash_attn_fwd(a["q"], a["k"], a["v"], a["out"], a["lse"], softmax_scale=0.1, causal=causal,
                               window=(-1, -1))
        return seen[-1][2]

    assert [run(64, 400, c) for c in (False, True)] == [3, 3]          # ceil(400 / 192)
    assert run(64, 384, True) == 2 and run(64, 385, False, varlen=True) == 3
    assert [run(128, 400, c) for c in (False, True)] == [4, 4]        # ceil(400 / 128)
    monkeypatch.setattr(supported, "FWD_BLOCK_M", None)
    monkeypatch.setattr(supported, "_BM64", "192/128")
    assert [run(64, 400, c) for c in (False, True)] == [3, 4]
    monkeypatch.setattr(supported, "FWD_BLOCK_M", None)
    monkeypatch.setattr(supported, "_BM64", "256/192")
    with pytest.raises(ValueError, match="PADDLE_DSA_FWD_BM64 must be"):
        run(64, 400, False)


@pytest.mark.parametrize("over, msg", [
    (dict(q=h16(2, 64, 4, 64)), "q: must be on a CUDA device"),
    (dict(q=cuda(np.zeros((2, 64, 4, 64), np.float32))), "q: dtype float32 not supported"),
    (dict(k=cuda(np.zeros((2, 64, 4, 64), np.float32))), "k: dtype float32 differs"),
    (dict(q=cuda(h16(2, 64, 4, 96)), out=cuda(h16(2, 64, 4, 96))), r"k: head_dim must equal q's 96"),
    (dict(q=cuda(h16(2, 64, 4, 80)), k=cuda(h16(2, 64, 4, 80)), v=cuda(h16(2, 64, 4, 80)),
          out=cuda(h16(2, 64, 4, 80))), r"\(80, 80\) not supported"),
    (dict(q=cuda(h16(2, 64, 4, 192)), k=cuda(h16(2, 64, 4, 192)), out=cuda(h16(2, 64, 4, 64))),
     r"\(192, 64\) not supported"),
    (dict(q=cuda(h16(2, 64, 4, 192)), k=cuda(h16(2, 64, 4, 192)), v=cuda(h16(2, 64, 4, 128)),
          out=cuda(h16(2, 64, 4, 192))), r"out: shape .* must be q's with v's head_dim"),
    (dict(q=cuda(h16(64, 4, 64))), r"q: expected 4 dims"),
    (dict(k=cuda(h16(2, 64, 3, 64)), v=cuda(h16(2, 64, 3, 64))), r"multiple of k/v heads"),
    (dict(lse=cuda(f32(2, 64, 4))), r"lse: expected shape \(2, 4, 64\)"),
    (dict(lse=cuda(np.zeros((2, 4, 64), np.float16))), "lse: must be float32"),
    (dict(out=cuda(h16(2, 32, 4, 64))), "out: shape"),
])
def test_fwd_rejects(over, msg):
    with pytest.raises(ValueError, match=msg):
        call_fwd(**over)


def test_fwd_rejects_bad_strides():
    k = h16(2, 64, 4, 68)[..., :64]  # head stride 68 elements: 136 bytes, not a multiple of 16
    with pytest.raises(ValueError, match="k: every stride must be a multiple of 16 bytes"):
        call_fwd(k=cuda(k), v=cuda(h16(2, 64, 4, 68)[..., :64]))


def test_fwd_rejects_non_finite_scale():
    a = dense()
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        fwd.flash_attn_fwd(a["q"], a["k"], a["v"], a["out"], a["lse"], softmax_scale=float("nan"), causal=False,
                           window=(-1, -1))


def test_fwd_varlen_checks():
    q, kv, out = cuda(h16(40, 4, 64)), cuda(h16(50, 4, 64)), cuda(h16(40, 4, 64))
    cu = cuda(np.array([0, 10, 40], np.int32))
    with pytest.raises(ValueError, match="given together"):
        fwd.flash_attn_fwd(q, kv, kv, out, cuda(f32(4, 40)), softmax_scale=0.1, causal=False, window=(-1, -1),
                           cu_seqlens_q=cu)
    with pytest.raises(ValueError, match="cu_seqlens_k: must be a contiguous int32 vector"):
        fwd.flash_attn_fwd(q, kv, kv, out, cuda(f32(4, 40)), softmax_scale=0.1, causal=False, window=(-1, -1),
                           cu_seqlens_q=cu, cu_seqlens_k=cuda(np.array([0, 10, 50], np.int64)), max_seqlen_q=30)
    with pytest.raises(ValueError, match="both have batch\\+1 entries"):
        fwd.flash_attn_fwd(q, kv, kv, out, cuda(f32(4, 40)), softmax_scale=0.1, causal=False, window=(-1, -1),
                           cu_seqlens_q=cu, cu_seqlens_k=cuda(np.array([0, 50], np.int32)), max_seqlen_q=30)
    with pytest.raises(ValueError, match=r"lse: expected shape \(4, 40\)"):
        fwd.flash_attn_fwd(q, kv, kv, out, cuda(f32(40, 4)), softmax_scale=0.1, causal=False, window=(-1, -1),
                           cu_seqlens_q=cu, cu_seqlens_k=cuda(np.array([0, 20, 50], np.int32)), max_seqlen_q=30)


# ------------------------------------------------------------------------------------------------ backward seam
def call_bwd(**over):
    a = dense()
    a.update(dout=cuda(h16(2, 64, 4, 64)), dq=cuda(h16(2, 64, 4, 64)), dk=cuda(h16(2, 64, 4, 64)),
             dv=cuda(h16(2, 64, 4, 64)))
    a.update(over)

    def alloc(shape, dtype):
        raise AssertionError("a rejected call must not allocate workspaces")
    bwd.flash_attn_bwd(a["q"], a["k"], a["v"], a["out"], a["dout"], a["lse"], a["dq"], a["dk"], a["dv"],
                       softmax_scale=0.125, causal=True, window=(-1, -1), alloc=alloc)


@pytest.mark.parametrize("over, msg", [
    (dict(dq=h16(2, 64, 4, 64)), "dq: must be on a CUDA device"),
    (dict(dout=cuda(np.zeros((2, 64, 4, 64), np.float32))), "dout: dtype float32 differs"),
    (dict(dk=cuda(h16(2, 32, 4, 64))), "dk: shape"),
    (dict(lse=cuda(f32(2, 64, 4))), r"lse: expected float32 \(2, 4, 64\)"),
    (dict(dv=cuda(h16(2, 64, 4, 68)[..., :64])), "dv: every stride must be a multiple of 16 bytes"),
    (dict(k=cuda(h16(2, 64, 3, 64)), v=cuda(h16(2, 64, 3, 64)), dk=cuda(h16(2, 64, 3, 64)),
          dv=cuda(h16(2, 64, 3, 64))), "kv heads do not divide"),
    # value head_dim: the pair must have a backward kernel, and out / dout / dv must follow v
    (dict(v=cuda(h16(2, 64, 4, 128)), dv=cuda(h16(2, 64, 4, 128))), r"\(64, 128\) has no backward kernel"),
    (dict(q=cuda(h16(2, 64, 4, 192)), k=cuda(h16(2, 64, 4, 192)), v=cuda(h16(2, 64, 4, 128)),
          dq=cuda(h16(2, 64, 4, 192)), dk=cuda(h16(2, 64, 4, 192)), dv=cuda(h16(2, 64, 4, 128)),
          out=cuda(h16(2, 64, 4, 128))), r"dout: shape \(2, 64, 4, 64\) must be \(2, 64, 4, 128\)"),
    (dict(q=cuda(h16(2, 64, 4, 192)), k=cuda(h16(2, 64, 4, 192)), v=cuda(h16(2, 64, 4, 128)),
          dq=cuda(h16(2, 64, 4, 192)), dk=cuda(h16(2, 64, 4, 192)), dv=cuda(h16(2, 64, 4, 192)),
          out=cuda(h16(2, 64, 4, 128)), dout=cuda(h16(2, 64, 4, 128))), r"dv: shape"),
    (dict(k=cuda(h16(2, 64, 4, 128))), r"k: head_dim 128 differs from q's 64"),
])
def test_bwd_rejects(over, msg):
    with pytest.raises(ValueError, match=msg):
        call_bwd(**over)


def test_arg_tensor_names_fp8_carried_as_bytes():
    """An export that carries fp8 as uint8 bytes (Paddle 3.0-3.2) is reported as fp8, never as uint8."""
    class Fp8Bytes(CudaLabelled):
        element_type_name = "Float8E4M3FN"

    t = tensors.arg_tensor(Fp8Bytes(np.zeros((4, 64), np.uint8)), "q")
    assert t.dtype == "float8_e4m3fn" and t.bits == 8
    a = dense()
    with pytest.raises(ValueError, match="q: dtype float8_e4m3fn not supported"):
        fwd.flash_attn_fwd(Fp8Bytes(np.zeros((2, 64, 4, 64), np.uint8)), a["k"], a["v"], a["out"], a["lse"],
                           softmax_scale=0.1, causal=False, window=(-1, -1))


def test_bwd_empty_and_degenerate_shapes():
    """B = 0: nothing to write, no allocation, no launch. Zero query or key rows (dense or varlen) and a varlen
    batch of no segments are rejected before any allocation (no kernel would write dk/dv or dq)."""
    def no_alloc(shape, dtype):
        raise AssertionError("must not allocate")

    def run(q_shape, k_shape, lse_shape, **kw):
        q, k = cuda(h16(*q_shape)), cuda(h16(*k_shape))
        bwd.flash_attn_bwd(q, k, cuda(h16(*k_shape)), cuda(h16(*q_shape)), cuda(h16(*q_shape)),
                           cuda(f32(*lse_shape)), cuda(h16(*q_shape)), cuda(h16(*k_shape)), cuda(h16(*k_shape)),
                           softmax_scale=0.1, causal=False, window=(-1, -1), alloc=no_alloc, **kw)

    run((0, 64, 4, 64), (0, 64, 4, 64), (0, 4, 64))  # returns
    with pytest.raises(ValueError, match="zero query rows"):
        run((2, 0, 4, 64), (2, 64, 4, 64), (2, 4, 0))
    with pytest.raises(ValueError, match="zero key rows"):
        run((2, 64, 4, 64), (2, 0, 4, 64), (2, 4, 64))
    cu1 = cuda(np.array([0], np.int32))
    with pytest.raises(ValueError, match="at least one segment"):
        run((40, 4, 64), (50, 4, 64), (4, 40), cu_seqlens_q=cu1, cu_seqlens_k=cu1, max_seqlen_q=1, max_seqlen_k=1)
    cu = cuda(np.array([0, 0], np.int32))
    with pytest.raises(ValueError, match="zero query rows"):
        run((0, 4, 64), (50, 4, 64), (4, 0), cu_seqlens_q=cu, cu_seqlens_k=cuda(np.array([0, 50], np.int32)),
            max_seqlen_q=0, max_seqlen_k=50)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k must both have batch\\+1 entries"):
        run((40, 4, 64), (50, 4, 64), (4, 40), cu_seqlens_q=cuda(np.array([0, 40], np.int32)),
            cu_seqlens_k=cuda(np.array([0, 20, 50], np.int32)), max_seqlen_q=40, max_seqlen_k=30)


def test_bwd_rejects_zero_query_heads():
    q, k = cuda(h16(2, 64, 0, 64)), cuda(h16(2, 64, 2, 64))
    with pytest.raises(ValueError, match="zero query heads"):
        bwd.flash_attn_bwd(q, k, k, q, q, cuda(f32(2, 0, 64)), q, k, k, softmax_scale=0.1, causal=False,
                           window=(-1, -1), alloc=None)


def test_bwd_det_kernel_choice(monkeypatch):
    """deterministic=True routes by det / PADDLE_DSA_BWD_DET: "recompute" the simple kernels, "ordered" the pipelined
    kernel (mode 2 at D = 64 and 128, mode 1 at D = 96), "auto" (the default) ordered at D = 64 and 128 with an int32
    turn workspace of one counter per dQ tile (segment, query head, query block of 64); a bad value is a ValueError
    before anything is allocated. Compile and launch are recorded, not run."""
    seen = []

    def fake_compile(dtype, D, varlen, deterministic, fast, v_head_dim=None, ordered=False):
        def launch(*args):
            seen.append(dict(D=D, deterministic=deterministic, fast=fast, ordered=ordered, sem=args[15]))
        return launch

    monkeypatch.setattr(bwd, "compile_variant", fake_compile)
    allocs = []

    def alloc(shape, dtype):
        allocs.append((tuple(shape), dtype))
        return cuda(np.zeros(shape, dtype={"float32": np.float32, "int32": np.int32}[dtype]))

    def run(D, S=200, H=4, Hkv=2, B=2, **kw):
        q, k = cuda(h16(B, S, H, D)), cuda(h16(B, S, Hkv, D))
        bwd.flash_attn_bwd(q, k, cuda(h16(B, S, Hkv, D)), cuda(h16(B, S, H, D)), cuda(h16(B, S, H, D)),
                           cuda(f32(B, H, S)), cuda(h16(B, S, H, D)), cuda(h16(B, S, Hkv, D)),
                           cuda(h16(B, S, Hkv, D)), softmax_scale=0.1, causal=True, window=(-1, -1), alloc=alloc, **kw)

    with pytest.raises(ValueError, match="det must be one of"):
        run(128, deterministic=True, det="fast")
    assert not allocs and not seen
    run(128, deterministic=True, det="ordered")
    assert seen[-1]["ordered"] and seen[-1]["fast"] == 2 and seen[-1]["sem"] is not None
    assert allocs[-1] == ((4 * (2 + 7),), "int32")        # 4 heads x (batch 2 + ceil(2 x 200 rows / 64))
    run(64, deterministic=True, det="ordered")
    assert seen[-1]["ordered"] and seen[-1]["fast"] == 2
    run(96, deterministic=True, det="ordered")
    assert seen[-1]["ordered"] and seen[-1]["fast"] == 1
    run(96, deterministic=True, det="recompute")
    assert not seen[-1]["ordered"] and seen[-1]["fast"] == 0 and seen[-1]["sem"] is None
    run(128, deterministic=False, det="ordered")         # det only matters in the deterministic mode
    assert not seen[-1]["ordered"] and seen[-1]["fast"] == bwd.FAST and seen[-1]["sem"] is None
    monkeypatch.setattr(bwd, "DET", "ordered")           # the module default (env PADDLE_DSA_BWD_DET)
    run(128, deterministic=True)
    assert seen[-1]["ordered"]
    run(64, deterministic=True)
    assert seen[-1]["ordered"] and seen[-1]["fast"] == 2
    monkeypatch.setattr(bwd, "DET", "auto")              # the default: ordered at D 64 and 128, recompute at D 96
    run(128, deterministic=True)
    assert seen[-1]["ordered"] and seen[-1]["fast"] == 2
    run(64, deterministic=True)
    assert seen[-1]["ordered"] and seen[-1]["fast"] == 2
    run(96, deterministic=True, det="auto")
    assert not seen[-1]["ordered"] and seen[-1]["fast"] == 0
    n = len(allocs)
    run(192, deterministic=True)                         # a wide pair: its split kernels, never ordered
    assert not seen[-1]["ordered"] and seen[-1]["fast"] == 0
    assert all(dt == "float32" for _, dt in allocs[n:])


# ------------------------------------------------------------------------------------------------ grid limits
def zero_stride_batch(a, B):
    """`a` (leading axis 1) seen as B copies along that axis with stride 0: a 'batch' with no memory behind it."""
    return np.lib.stride_tricks.as_strided(a, shape=(B,) + a.shape[1:], strides=(0,) + a.strides[1:])


def test_grid_yz_limit():
    """Batch rows (BSHD) and THD sequences go into the launch grid's y / z dimension, at most 65535: more is a
    ValueError naming the argument, before any compile or launch (65535 itself passes the check)."""
    B = 65536
    q = cuda(zero_stride_batch(h16(1, 1, 1, 64), B))
    lse = cuda(zero_stride_batch(f32(1, 1, 1), B))
    with pytest.raises(ValueError, match="q: 65536 batch rows, more than one kernel launch takes"):
        fwd.flash_attn_fwd(q, q, q, q, lse, softmax_scale=0.1, causal=False, window=(-1, -1))

    def no_alloc(shape, dtype):
        raise AssertionError("must not allocate")
    with pytest.raises(ValueError, match="q: 65536 batch rows"):
        bwd.flash_attn_bwd(q, q, q, q, q, lse, q, q, q, softmax_scale=0.1, causal=False, window=(-1, -1),
                           alloc=no_alloc)
    t = cuda(h16(65536, 1, 64))
    tl = cuda(f32(1, 65536))
    cu = cuda(np.arange(65536, dtype=np.int32))              # 65535 sequences: 65536 grid slices in the forward
    with pytest.raises(ValueError, match="cu_seqlens_q: 65536 sequences \\+ 1"):
        fwd.flash_attn_fwd(t, t, t, t, tl, softmax_scale=0.1, causal=False, window=(-1, -1), cu_seqlens_q=cu,
                           cu_seqlens_k=cu, max_seqlen_q=1)
    cu = cuda(np.arange(65537, dtype=np.int32))              # 65536 sequences
    t, tl = cuda(h16(65536, 1, 64)), cuda(f32(1, 65536))
    with pytest.raises(ValueError, match="cu_seqlens_q: 65536 sequences, more than"):
        bwd.flash_attn_bwd(t, t, t, t, t, tl, t, t, t, softmax_scale=0.1, causal=False, window=(-1, -1),
                           cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=1, max_seqlen_k=1, alloc=no_alloc)
    tensors.check_grid_yz(65535, "q", "batch rows")
