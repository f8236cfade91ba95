"""GPU tests of the kernel store (ops/common/kernel_cache.py): a kernel loaded from the store runs as the compiled one.

For the top-k kernel and the sparse MLA attention forward (TMA, wgmma, cp.async gathers, mbarriers): a fresh store,
the variant compiled (and stored), run; the in-process cache dropped, the variant loaded (a hit), run on the same
inputs. Outputs NaN-poisoned (-7 for indices) before each run; the loaded kernel's outputs must be bitwise equal to
the compiled one's, and the top-k must equal torch's stable sort (its semantics are a total order).
Run: python -m pytest -q tests/gpu/test_kernel_cache.py
"""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from ops.common import kernel_cache  # noqa: E402  (repo root on sys.path: tests/gpu/conftest.py)

DEV = "cuda"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    return tmp_path


def compiled_then_loaded(module, key, monkeypatch, run):
    """run(fn-holder) with the variant compiled into an empty store, then with it loaded from the store."""
    outs = []
    for expect in ("compiled", "hits"):
        monkeypatch.setattr(module, "_CACHE", {})
        before = dict(kernel_cache.STATS)
        outs.append(run())
        torch.cuda.synchronize()
        assert kernel_cache.STATS[expect] == before[expect] + 1, (expect, before, kernel_cache.STATS)
    assert type(module._CACHE[key]).__name__ == "Function"      # the loaded entry function
    return outs


def test_topk_loaded_equals_compiled(store, monkeypatch):
    from ops.dsa.topk import fwd
    s = torch.randn(300, 5000, device=DEV)
    s[7, :] = float("-inf")
    s[9, 100:] = float("nan")
    k = 256

    def run():
        out = torch.full((300, k), -7, dtype=torch.int32, device=DEV)
        fwd.topk_fwd(s, out, stream=torch.cuda.current_stream().cuda_stream)
        return out
    first, loaded = compiled_then_loaded(fwd, fwd.variant_key(256, False, False, fwd.STREAM, False),
                                         monkeypatch, run)
    x = torch.where(torch.isfinite(s), s.double() + 0.0, torch.full_like(s.double(), float("-inf")))
    v, i = torch.sort(x, dim=-1, descending=True, stable=True)
    ref = torch.where(torch.isneginf(v[:, :k]), torch.full_like(i[:, :k], -1), i[:, :k]).int()
    assert torch.equal(first, ref)
    assert torch.equal(loaded, first)


def test_sparse_attention_loaded_equals_compiled(store, monkeypatch):
    from ops.dsa.sparse_attn import fwd
    H, D, DV, Sq, Skv, K = 64, 576, 512, 37, 700, 192
    q = torch.randn(1, Sq, H, D, device=DEV).bfloat16()
    kv = torch.randn(1, Skv, D, device=DEV).bfloat16()
    idx = torch.randint(-3, Skv + 5, (1, Sq, K), device=DEV, dtype=torch.int32)

    def run():
        out = torch.full((1, Sq, H, DV), float("nan"), device=DEV, dtype=torch.bfloat16)
        lse = torch.full((1, H, Sq), float("nan"), device=DEV)
        fwd.sparse_attn_fwd(q, kv, idx, out, lse, softmax_scale=D ** -0.5,
                            stream=torch.cuda.current_stream().cuda_stream)
        return out, lse
    (o1, l1), (o2, l2) = compiled_then_loaded(fwd, fwd.variant_key(D, DV, H, False, False, False), monkeypatch, run)
    assert not torch.isnan(o1).any() and not torch.isnan(l1).any()
    assert torch.equal(o2, o1) and torch.equal(l2, l1)
