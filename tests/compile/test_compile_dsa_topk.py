"""CPU CI: compile every variant of the top-k kernel (ops/dsa/topk/fwd.py) for sm_90a: k padded to a power of two
(32 .. 2048) x with lengths x rank-3 input; and check its PTX has no local memory."""
import os
import subprocess
import sys

import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ops.dsa.topk import fwd  # noqa: E402
from ops.dsa.topk.topk_sm90 import pad_k  # noqa: E402


@pytest.mark.parametrize("key", fwd.all_variant_keys(), ids=lambda k: "-".join(str(x) for x in k))
def test_compile_topk_variant(key):
    assert fwd.compile_variant(key) is not None


def test_pad_k_covers_every_k():
    assert {pad_k(k) for k in range(1, fwd.MAX_K + 1)} == {k[0] for k in fwd.all_variant_keys()}
    assert all(pad_k(k) >= k for k in range(1, fwd.MAX_K + 1))


@pytest.mark.parametrize("stream", [False, True])
def test_topk_ptx(tmp_path, stream):
    """No local memory; the streaming kernel reads scores with 16-byte loads and asks for its MIN_BLOCKS CTAs an SM."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path),
               CUTE_DSL_CACHE_DIR=str(tmp_path / "cache"))
    code = ("import sys; sys.path.insert(0, %r); from ops.dsa.topk import fwd; "
            "fwd.compile_variant(fwd.variant_key(2048, True, True, %r))" % (ROOT, stream))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    ptx = [p for p in tmp_path.iterdir() if p.suffix == ".ptx"]
    assert ptx, "no PTX dumped"
    text = ptx[0].read_text()
    assert "atom.shared" in text or "red.shared" in text       # shared-memory histogram
    assert "st.local" not in text and "ld.local" not in text
    if stream:
        from ops.dsa.topk.stream_sm90 import TopkStreamSm90
        assert "ld.global.v4" in text and f".minnctapersm {TopkStreamSm90.MIN_BLOCKS}" in text


@pytest.mark.parametrize("u,mb", [(4, 2), (1, 4)])
def test_compile_stream_launch_shapes(monkeypatch, u, mb):
    """The streaming kernel's other launch shapes (bench/topk_breakdown.py --sweep) compile."""
    from ops.dsa.topk import stream_sm90
    monkeypatch.setattr(stream_sm90.TopkStreamSm90, "U", u)
    monkeypatch.setattr(stream_sm90.TopkStreamSm90, "MIN_BLOCKS", mb)
    monkeypatch.setattr(fwd, "_CACHE", {})
    assert fwd.compile_variant(fwd.variant_key(2048, True, True, True)) is not None


@pytest.mark.parametrize("sort", ["key", "regs", "smem"])
@pytest.mark.parametrize("p", [512, 1024, 2048])
def test_compile_other_sorts(monkeypatch, p, sort):
    """The other orderings of the selection (sort_sm90.SelectionSort.SORT; the default "bucket" is compiled above):
    the key-only network, the (key, column) pair network in registers / shuffles and in shared memory."""
    from ops.dsa.topk import sort_sm90
    monkeypatch.setattr(sort_sm90.SelectionSort, "SORT", sort)
    monkeypatch.setattr(fwd, "_CACHE", {})
    assert fwd.compile_variant(fwd.variant_key(p, True, True)) is not None
    assert fwd.compile_variant(fwd.variant_key(p, False, False, True)) is not None


@pytest.mark.parametrize("stop", ["A", "threshold", "selection"])
def test_compile_stream_stops(monkeypatch, stop):
    """The streaming kernel's timing stops (bench/topk_breakdown.py --stages) compile, in both orders."""
    from ops.dsa.topk import stream_sm90
    monkeypatch.setattr(stream_sm90.TopkStreamSm90, "STOP", stop)
    monkeypatch.setattr(fwd, "_CACHE", {})
    assert fwd.compile_variant(fwd.variant_key(2048, False, False, True)) is not None
    assert fwd.compile_variant(fwd.variant_key(2048, True, True, True, True)) is not None


@pytest.mark.parametrize("by_column", [False, True])
def test_compile_two_pass_select(monkeypatch, by_column):
    """The streaming kernel with its one-read select off (TopkStreamSm90.SAMPLE = 0: the two passes only, which
    tests/gpu/test_dsa_topk.py compares against the default bit for bit)."""
    from ops.dsa.topk import stream_sm90
    monkeypatch.setattr(stream_sm90.TopkStreamSm90, "SAMPLE", 0)
    monkeypatch.setattr(fwd, "_CACHE", {})
    assert fwd.compile_variant(fwd.variant_key(2048, False, False, True, by_column)) is not None


@pytest.mark.parametrize("p", [1024, 2048])
def test_compile_bucket_ratio(monkeypatch, p):
    """The bucket sort at 4 buckets a key (sort_sm90.SelectionSort.BUCKETS_PER_KEY, a trial knob): P 2048 needs 8192
    counters, so the streaming kernel lends cand_u and cand_c as one scratch (wide_scratch); P 1024 fits cand_u.
    Both orders compile; the row-caching kernel's scratch is cand_u alone, so it stays at 2."""
    from ops.dsa.topk import stream_sm90
    monkeypatch.setattr(stream_sm90.TopkStreamSm90, "BUCKETS_PER_KEY", 4)
    monkeypatch.setattr(fwd, "_CACHE", {})
    assert stream_sm90.TopkStreamSm90(p, True, False).wide_scratch() == (p == 2048)
    assert fwd.compile_variant(fwd.variant_key(p, True, False, True)) is not None
    assert fwd.compile_variant(fwd.variant_key(p, False, False, True, True)) is not None
