"""GPU tests of the top-k kernel (ops/dsa/topk/fwd.py) against torch: the semantics are a total order (descending
score, ties lower column first, -0.0 == +0.0), so the kernel's indices must EQUAL the reference's: a stable
descending sort of the selectable scores (finite, within the row's length), -1 past their count. out is poisoned
with -7 before each run. Every test runs twice: with the streaming kernel allowed (fwd.STREAM: 16-byte aligned rows
take stream_sm90.TopkStreamSm90) and with every call on topk_sm90.TopkSm90.
Run: python -m pytest -q tests/gpu/test_dsa_topk.py
   (TOPK_KNOBS="NAME=VALUE,...": TopkStreamSm90 knobs on trial: ints, strings, a:b tuples)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ops.dsa.topk.fwd import topk_fwd  # noqa: E402

DEV = "cuda"


_CACHES = {}


@pytest.fixture(autouse=True, params=["stream", "cached"])
def kernel(request, monkeypatch):
    """stream: aligned rows on the streaming kernel (as shipped), cached: TopkSm90 for every call. Each mode keeps
    its own compiled variants."""
    from ops.dsa.topk import fwd, stream_sm90
    monkeypatch.setattr(fwd, "STREAM", request.param != "cached")
    monkeypatch.setattr(fwd, "_CACHE", _CACHES.setdefault(request.param, {}))
    from ops.common.switches import knob_specs
    for name, value in knob_specs(os.environ.get("TOPK_KNOBS", "")).items():    # knobs on trial, e.g. SAMPLE=0
        assert hasattr(stream_sm90.TopkStreamSm90, name), f"TOPK_KNOBS: no knob {name}"
        monkeypatch.setattr(stream_sm90.TopkStreamSm90, name, value)
    return request.param


def reference(s, k, lengths=None):
    lead, W = s.shape[:-1], s.shape[-1]
    x = s.reshape(-1, W).double().clone()
    x = x + 0.0                                            # -0.0 -> +0.0: equal scores tie
    bad = ~torch.isfinite(x)
    if lengths is not None:
        bad |= torch.arange(W, device=DEV)[None, :] >= lengths.reshape(-1, 1)
    x[bad] = float("-inf")
    v, i = torch.sort(x, dim=-1, descending=True, stable=True)
    kk = min(k, W)
    out = torch.full((x.shape[0], k), -1, dtype=torch.int32, device=DEV)
    out[:, :kk] = torch.where(torch.isneginf(v[:, :kk]), torch.full_like(i[:, :kk], -1), i[:, :kk]).int()
    return out.reshape(*lead, k)


def run(s, k, lengths=None, stream=None, order="score"):
    out = torch.full((*s.shape[:-1], k), -7, dtype=torch.int32, device=DEV)
    topk_fwd(s, out, lengths=lengths, order=order, stream=(stream or torch.cuda.current_stream()).cuda_stream)
    return out


def check(s, k, lengths=None):
    out = run(s, k, lengths)
    ref = reference(s, k, lengths)
    torch.cuda.synchronize()
    assert not (out == -7).any(), "unwritten output elements"
    bad = (out != ref).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} mismatches, first at {bad[0].tolist()}: {out[tuple(bad[0])]} vs " \
                             f"{ref[tuple(bad[0])]}"
    return out


@pytest.mark.parametrize("W", [1, 17, 255, 4097, 32768])
@pytest.mark.parametrize("k", [1, 7, 64, 2048])
def test_random(W, k):
    torch.manual_seed(W * 3 + k)
    check(torch.randn(40, W, device=DEV), k)


def test_long_rows_uncached():
    """W beyond the shared-memory cache (40960 columns): the passes re-read global memory."""
    torch.manual_seed(1)
    check(torch.randn(3, 131072, device=DEV), 2048)
    check(torch.randn(2, 50001, device=DEV).round(), 300)


@pytest.mark.parametrize("k", [64, 2048])
def test_crowded_top_digit(k):
    """Cached rows whose first (11-bit) key digit holds more than the candidate buffer (4096): scores in [1, 2)
    fill 4 such digits (~5000 each), so pass 0 cannot narrow the row and passes 1-3 sweep it whole; with and without
    exact ties at the threshold."""
    torch.manual_seed(k + 1)
    s = 1.0 + torch.rand(6, 20000, device=DEV)
    s[3:] = 1.0 + (torch.rand(3, 20000, device=DEV) * 256).floor() / 256
    check(s, k)


@pytest.mark.parametrize("k", [5, 100, 2048])
def test_ties_and_special_values(k):
    torch.manual_seed(k)
    s = (torch.randn(24, 3000, device=DEV) * 3).round()     # many exact ties at the threshold
    s[0] = 1.5                                             # all equal
    s[1] = float("-inf")                                   # nothing selectable
    s[2, ::3] = float("nan")
    s[3, ::5] = float("inf")
    s[4, :1000] = -0.0
    s[4, 1000:] = 0.0
    s[5, 7] = float("nan")
    s[6] = torch.where(torch.rand(3000, device=DEV) < 0.99, torch.full_like(s[6], float("-inf")), s[6])
    check(s, k)


def test_lengths_and_rank3():
    torch.manual_seed(2)
    s = torch.randn(3, 50, 700, device=DEV)
    lengths = torch.randint(-3, 800, (3, 50), dtype=torch.int32, device=DEV)
    lengths[0, 0] = 0
    check(s, 256, lengths)
    check(s, 1000, lengths)                                 # k > many rows' lengths: -1 padding
    check(s[:, :, :512], 64)                                # strided rows (W 512 inside a 700-wide buffer)


def test_deterministic_reruns():
    torch.manual_seed(3)
    s = (torch.randn(64, 8192, device=DEV) * 2).round()
    first = run(s, 2048)
    for _ in range(20):
        assert torch.equal(run(s, 2048), first)


def test_cuda_graph_capture():
    torch.manual_seed(4)
    s = torch.randn(16, 5000, device=DEV)
    out = torch.full((16, 512), -7, dtype=torch.int32, device=DEV)
    topk_fwd(s, out, stream=torch.cuda.current_stream().cuda_stream)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            topk_fwd(s, out, stream=side.cuda_stream)
    s.copy_(torch.randn(16, 5000, device=DEV))
    out.fill_(-7)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference(s, 512))


@pytest.mark.parametrize("sort", ["bucket", "key", "regs", "smem"])
@pytest.mark.parametrize("k", [64, 300, 1000, 2048])
def test_sort_paths(monkeypatch, k, sort):
    """The orderings of the selected set (sort_sm90.SelectionSort.SORT): "bucket" (the default: a counting sort by
    key range and a rank inside each bucket; a bucket over BUCKET_MAX handed to "key", or "smem" below P 512), "key"
    (a key-only network, slots by rank, equal-key runs ordered in place, runs longer than GROUP_MAX handed to
    "regs"), "regs" (the pair network in registers / shuffles) and "smem" (the pair network in shared memory; every
    sort below P 512 but "bucket"): same indices as the stable sort, with ties (runs of 2..GROUP_MAX equal keys,
    exactly GROUP_MAX and GROUP_MAX + 1, BUCKET_MAX and BUCKET_MAX + 1, many equal keys, one key for a whole row,
    -0.0 and +0.0), an outlier that squeezes every other key into a few buckets, selections that cross zero (the
    value-linear buckets; with a sink too: both mappings fail; of tiny scores), padding, a row narrower than a warp's
    keys and rows of 70000 columns."""
    from ops.dsa.topk import fwd, sort_sm90
    monkeypatch.setattr(sort_sm90.SelectionSort, "SORT", sort)
    monkeypatch.setattr(fwd, "_CACHE", {})
    torch.manual_seed(k)
    check(torch.randn(16, 32768, device=DEV), k)
    t = (torch.randn(12, 32768, device=DEV) * 4000).round()  # the top k hold runs of 2..5 equal scores
    g = sort_sm90.GROUP_MAX
    t[8, :g] = 20000.0                                      # a run of exactly GROUP_MAX at the top
    t[9, 5:6 + g] = 20000.0                                 # GROUP_MAX + 1: the row goes to the pair network
    t[10, ::4096] = 9000.0                                  # a run of GROUP_MAX spread over the row
    t[11, 3::3000] = 9000.0                                 # 11 equal keys spread over the row
    check(t, k)
    b = sort_sm90.BUCKET_MAX
    o = torch.randn(4, 32768, device=DEV)
    o[0, 77] = 3e38                                         # the range stretched: the others share a few buckets
    o[1, 100:100 + b] = 50.0                                # a run of exactly BUCKET_MAX at the top
    o[2, 3::900] = 7.0                                      # 37 equal keys spread (BUCKET_MAX + 5): the fallback
    o[3, :] = o[3, :] * 1e-40                               # denormal scores (ties among them)
    check(o, k)
    z = torch.randn(3, 2500, device=DEV)                    # k 2048: selections that cross zero (value buckets)
    z[1, 5] = 1e6                                           # ... with a sink: both bucket mappings fail
    z[2, :] = z[2, :] * 1e-32                               # ... of tiny scores (a span under 1e-30: one bucket)
    check(z, k)
    check(torch.randn(2, 4096, device=DEV), k)              # the top half of a row of 4096
    s = (torch.randn(8, 3000, device=DEV) * 3).round()
    s[0, :] = 1.5
    s[1, 100:] = float("-inf")                              # fewer selectable than k: padding sorts last
    s[2, :] = -0.0
    s[2, ::7] = 0.0                                         # -0.0 ties with +0.0: column order decides
    check(s, k)
    check(torch.randn(4, 200, device=DEV), k)
    w = torch.randn(3, 70000, device=DEV)
    w[1, ::30] = 5.0                                        # 2334 equal keys spread over the row
    w[2, 66000:] = 9.0                                      # ties past column 65535
    check(w, k)


def by_column(idx):
    big = torch.full_like(idx, 2 ** 31 - 1)
    srt = torch.sort(torch.where(idx < 0, big, idx), dim=-1).values
    return torch.where(srt == big, torch.full_like(srt, -1), srt)


@pytest.mark.parametrize("k", [1, 64, 300, 2048])
def test_column_order(k):
    """order="column": the reference's selection in ascending column order, -1 padding last: through the bitmap
    (W <= 131072: W 1, 17, 255, 4097, 32768, 131072) and through the key sorts on ~column (W 140000); ties at the
    threshold, lengths (0 and past W), rank 3, padding, and the score order unchanged."""
    torch.manual_seed(k)
    for W in (1, 17, 255, 4097, 32768, 131072, 140000):
        s = torch.randn(6, W, device=DEV)
        s[1] = (s[1] * 2).round()                          # ties at the threshold: the lower columns
        s[2, W // 2:] = float("-inf")                      # fewer selectable than k: padding
        out = run(s, k, order="column")
        torch.cuda.synchronize()
        assert not (out == -7).any(), "unwritten output elements"
        assert torch.equal(out, by_column(reference(s, k))), W
    s = torch.randn(2, 3, 5000, device=DEV)
    ln = torch.tensor([[5000, 0, 17], [4999, 6000, 2500]], dtype=torch.int32, device=DEV)
    out = run(s, k, ln, order="column")
    assert torch.equal(out, by_column(reference(s, k, ln)))
    assert torch.equal(run(s, k, ln), reference(s, k, ln))


def test_column_order_reruns_and_graph():
    s = torch.randn(64, 32768, device=DEV)
    first = run(s, 2048, order="column")
    for _ in range(5):
        assert torch.equal(run(s, 2048, order="column"), first)
    out = torch.full((64, 2048), -7, dtype=torch.int32, device=DEV)
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with torch.cuda.graph(g, stream=side):
            topk_fwd(s, out, order="column", stream=side.cuda_stream)
    out.fill_(-7)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)


def test_rank3_rows_of_any_strides():
    """[B, 1, W] and [B, Sq, W] views whose batch stride is not Sq x the row stride (the rows do not merge into one
    axis): the kernel reads each (batch, query row) through its own strides, lengths too."""
    torch.manual_seed(5)
    base = torch.randn(3, 4, 700, device=DEV)
    lens = torch.randint(0, 800, (3, 4), dtype=torch.int32, device=DEV)
    check(base[:, 1:2, :], 100, lens[:, 1:2])
    check(base[:, ::2, :], 300, lens[:, 1:3])           # lengths: inner stride 1 (the seam requires it)
    check(base[:, 1:3, :640], 64)


def test_stream_and_cached_kernels_agree(kernel):
    """The same scores through both kernels (aligned and 4-byte-offset rows, the latter always TopkSm90): equal bits,
    with ties, -inf runs, a crowded first digit (the streaming kernel's whole-row fallback) and long rows."""
    from ops.common.tensors import arg_tensor
    from ops.dsa.topk import fwd
    if kernel == "cached":
        pytest.skip("the stream runs cover both kernels")
    torch.manual_seed(6)
    rows = [torch.randn(4, 40000, device=DEV), (torch.randn(4, 40000, device=DEV) * 3).round(),
            1.0 + torch.rand(4, 40000, device=DEV)]
    rows[1][:, 30000:] = float("-inf")
    s = torch.cat(rows)
    buf = torch.empty(s.shape[0], s.shape[1] + 4, device=DEV)
    for k in (17, 2048):
        aligned = run(s, k)
        buf[:, 1:s.shape[1] + 1] = s
        assert fwd.streamable(arg_tensor(s, "scores"))
        assert not fwd.streamable(arg_tensor(buf[:, 1:s.shape[1] + 1], "scores"))
        offset = run(buf[:, 1:s.shape[1] + 1], k)
        torch.cuda.synchronize()
        assert torch.equal(aligned, offset)
        assert torch.equal(aligned, reference(s, k))


def test_sampled_and_two_pass_agree(kernel, monkeypatch):
    """The one-read select (stream_sm90.TopkStreamSm90.SAMPLE = 1, here for every k: SAMPLE_SCORE_MAX_P = 2048)
    against the two passes (SAMPLE = 0) on the same rows, both equal to the reference: random rows (the one-read
    path), rows whose sampled columns hold
    large scores (the sample misleads: too few scores above its threshold, so the row falls back to the two passes),
    rows of more than 4096 equal scores (the candidate buffer overflows: fallback, then the passes sweep the row),
    causal rows (few finite scores: every finite score a candidate), in score and column order."""
    from ops.dsa.topk import fwd, stream_sm90
    if kernel == "cached":
        pytest.skip("the stream runs cover the streaming kernel's two selects")
    torch.manual_seed(9)
    W, NT, V = 32768, 512, 4
    s = torch.randn(16, W, device=DEV)
    sampled = torch.tensor([((t * (W // V)) // NT) * V for t in range(0, NT, 2)], device=DEV)
    s[4:8, sampled] = 100.0 + torch.rand(4, sampled.numel(), device=DEV)
    s[8:10] = 1.5
    s[10:12, 3000:] = float("-inf")
    s[12:14, 1:] = float("-inf")
    s[14:16] = (s[14:16] * 3).round()
    cls = stream_sm90.TopkStreamSm90
    default_max_p = cls.SAMPLE_SCORE_MAX_P
    for k in (64, 2048):
        monkeypatch.setattr(cls, "SAMPLE_SCORE_MAX_P", 2048)
        monkeypatch.setattr(fwd, "_CACHE", {})
        one_read = check(s, k)
        col_one = run(s, k, order="column")
        monkeypatch.setattr(cls, "SAMPLE", 0)
        monkeypatch.setattr(fwd, "_CACHE", {})
        two_pass = check(s, k)
        col_two = run(s, k, order="column")
        monkeypatch.setattr(cls, "SAMPLE", 1)
        monkeypatch.setattr(cls, "SAMPLE_SCORE_MAX_P", default_max_p)
        monkeypatch.setattr(fwd, "_CACHE", _CACHES["stream"])
        torch.cuda.synchronize()
        assert torch.equal(one_read, two_pass)
        assert torch.equal(col_one, col_two)
        assert torch.equal(col_one, by_column(reference(s, k)))
