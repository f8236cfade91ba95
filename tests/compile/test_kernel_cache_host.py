"""CPU tests of the on-disk kernel store (ops/common/kernel_cache.py): an entry written by one compile is what a later
compile of the same traced kernel loads, a changed kernel misses, an unusable entry is compiled over, and the loaded
entry function checks its arguments exactly as the JIT-compiled one does (calls with wrong arguments only: nothing is
launched on this machine). The other processes (a test run, compute-sanitizer) are modelled by subprocesses.
"""
import json
import os
import re
import shutil
import subprocess
import sys

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("cutlass")
tvm_ffi = pytest.importorskip("tvm_ffi")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from cuda_labelled import cuda  # noqa: E402
from ops.common import fill_sm90, kernel_cache  # noqa: E402


def compile_fill(rank=1):
    from cutlass import Float32, Int32
    from cutlass.cute.runtime import make_fake_stream
    from ops.common.head_sum_host import fake_tensor
    return kernel_cache.compile(fill_sm90.FillSm90(), fake_tensor(Float32, (None,) * rank, 1, 4), Float32(0.0),
                                Int32(1), make_fake_stream(), variant=("ops.common.fill_sm90", "compile_fill", [rank]))


def entries(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".o"))


def error_of(fn, *args):
    with pytest.raises(Exception) as e:
        fn(*args)
    return type(e.value), str(e.value)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    return tmp_path


def test_off_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    before = dict(kernel_cache.STATS)
    fn = compile_fill()
    assert type(fn).__name__.startswith("TVMFFIJitCompiled")
    assert kernel_cache.STATS == before


def test_store_then_hit(store):
    before = dict(kernel_cache.STATS)
    jit = compile_fill()
    assert type(jit).__name__.startswith("TVMFFIJitCompiled")
    (name,) = entries(store)
    assert kernel_cache.STATS["stored"] == before["stored"] + 1
    lines = [json.loads(x) for x in (store / kernel_cache.MANIFEST).read_text().splitlines()]
    assert lines == [{"module": "ops.common.fill_sm90", "function": "compile_fill", "args": [1]}]
    # the entry's body is the object code the DSL links for the JIT function (deterministic)
    fn_name, body = kernel_cache._read_entry(store / name)
    assert body == kernel_cache._object_code(jit)
    loaded = compile_fill()
    assert kernel_cache.STATS["hits"] == before["hits"] + 1
    assert type(loaded) is tvm_ffi.Function and entries(store) == [name]
    # both entry functions reject the same wrong calls with the same errors, before any launch
    wrong_dtype = (cuda(np.zeros(8, np.int32)), 0.0, 8, 0)
    wrong_rank = (cuda(np.zeros((2, 4), np.float32)), 0.0, 8, 0)
    host = (np.zeros(8, np.float32), 0.0, 8, 0)
    for args in (wrong_dtype, wrong_rank, host):
        assert error_of(loaded, *args) == error_of(jit, *args)
    # a missing argument: a TypeError from both (the JIT function's keyword wrapper words it its own way)
    assert error_of(loaded, *host[:3])[0] is error_of(jit, *host[:3])[0] is TypeError


def test_changed_kernel_misses(store, monkeypatch):
    compile_fill()
    monkeypatch.setattr(fill_sm90, "THREADS", 128)       # a trace-time constant: other IR, other key
    compile_fill()
    assert len(entries(store)) == 2
    compile_fill(rank=2)
    assert len(entries(store)) == 3


def test_unusable_entry_is_compiled_over(store):
    compile_fill()
    (name,) = entries(store)
    path = store / name
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF                                    # a flipped byte in the object code
    path.write_bytes(bytes(data))
    before = dict(kernel_cache.STATS)
    with pytest.warns(RuntimeWarning, match="unusable"):
        fn = compile_fill()
    assert type(fn).__name__.startswith("TVMFFIJitCompiled")
    assert kernel_cache.STATS["compiled"] == before["compiled"] + 1
    kernel_cache._read_entry(path)                       # rewritten whole
    assert type(compile_fill()) is tvm_ffi.Function


def test_entry_from_another_cpu(store):
    """An entry whose build CPU had a feature this one lacks is not loaded: compiled here, the entry replaced."""
    compile_fill()
    (name,) = entries(store)
    path = store / name
    magic, fn_name, features, rest = path.read_bytes().split(b"\n", 3)
    path.write_bytes(b"\n".join([magic, fn_name, features + b" zz_feature_of_another_cpu", rest]))
    before = dict(kernel_cache.STATS)
    with pytest.warns(RuntimeWarning, match="another CPU"):
        assert type(compile_fill()).__name__.startswith("TVMFFIJitCompiled")
    assert kernel_cache.STATS["compiled"] == before["compiled"] + 1
    assert b"zz_feature" not in path.read_bytes()
    assert type(compile_fill()) is tvm_ffi.Function
    # an entry built on a CPU with fewer features is used
    magic, fn_name, features, rest = path.read_bytes().split(b"\n", 3)
    path.write_bytes(b"\n".join([magic, fn_name, b" ".join(features.split()[:5]), rest]))
    assert type(compile_fill()) is tvm_ffi.Function


# what x86-64-v3 host code never holds: AVX-512 registers and embedded broadcasts, and AMD-only instructions (SSE4A,
# TBM's bit operations, CLZERO)
NOT_V3 = re.compile(r"%zmm|%k[0-7]\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|\{1to|\b(extrq|insertq|movnts[sd]|clzero|blcfill|blsfill|"
                    r"blcmsk|blcs|blsic|t1mskc|tzmsk)\b")


@pytest.mark.skipif(not kernel_cache.portable() or shutil.which("objdump") is None,
                    reason="an x86-64 host with the x86-64-v3 baseline and objdump")
def test_entry_host_code_is_portable(store):
    """An entry's host code is built for x86-64-v3 whatever CPU builds it (so a store built on an AMD EPYC with
    AVX-512 loads on an Intel Xeon): the header records the baseline's features, the object has no instruction past
    it; the native export of the same module may (this test's point is the difference where the host has more)."""
    from ops.dsa.topk import fwd
    key = fwd.variant_key(2048, True, False, True, False)
    fwd._CACHE.pop(key, None)
    fwd.compile_variant(key)
    (name,) = entries(store)
    magic, fn_name, features, rest = (store / name).read_bytes().split(b"\n", 3)
    assert set(features.decode().split()) == kernel_cache.PORTABLE_FEATURES
    _, body = kernel_cache._read_entry(store / name)
    obj = store / "body.o"
    obj.write_bytes(body)
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    assert asm.count("\n") > 500                        # the entry function and the launch code are there
    past = sorted({m.group(0) for m in NOT_V3.finditer(asm)})
    assert not past, past[:10]


PROCESS = """
import os, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
from test_kernel_cache_host import compile_fill
from ops.common import kernel_cache
compile_fill()
print(kernel_cache.STATS["hits"], kernel_cache.STATS["compiled"])
"""


def test_other_processes(tmp_path):
    env = dict(os.environ, **{kernel_cache.ENV: str(tmp_path / "store"), "CUTE_DSL_ARCH": "sm_90a"})
    code = PROCESS.format(root=ROOT, here=os.path.dirname(os.path.abspath(__file__)))
    run = lambda e: subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,  # noqa: E731
                                   check=True, cwd=tmp_path).stdout.split()
    assert run(env) == ["0", "1"]          # the first process compiles and stores
    assert run(env) == ["1", "0"]          # a later one loads
    dump = tmp_path / "dump"
    dump.mkdir()
    keep = dict(env, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump))
    assert run(keep) == ["0", "1"]         # a PTX dump bypasses the store: a real compile, its PTX written
    assert any(n.endswith(".ptx") for n in os.listdir(dump))


def test_prebuild_replays_a_manifest(tmp_path):
    """tests/gpu/prebuild_kernels.py compiles a manifest's variants into the store in worker processes; the seam's
    compile afterwards loads them; a second prebuild finds them all."""
    store = tmp_path / "store"
    manifest = tmp_path / "m.jsonl"
    lines = [{"module": "ops.common.fill_sm90", "function": "compile_fill", "args": [r]} for r in (2, 3)]
    lines += [{"module": "ops.common.segment_sum_sm90", "function": "compile_variant", "args": [64, 1, 2]}]
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines + lines[:1]))   # a repeated line runs once
    env = dict(os.environ, **{kernel_cache.ENV: str(store), "CUTE_DSL_ARCH": "sm_90a"})
    script = os.path.join(ROOT, "tests", "gpu", "prebuild_kernels.py")
    run = lambda: subprocess.run([sys.executable, script, "--jobs", "2", str(manifest)], env=env,  # noqa: E731
                                 capture_output=True, text=True, check=True).stdout
    assert "3 variants, 3 compiled, 0 in the store, 0 failed" in run()
    assert len(entries(store)) == 3
    assert "3 variants, 0 compiled, 3 in the store, 0 failed" in run()
    check = subprocess.run([sys.executable, script, "--check"], env=env, capture_output=True, text=True, check=True)
    assert "3 entries, 3 loadable here" in check.stdout
    seen = {json.dumps(json.loads(x), sort_keys=True) for x in (store / kernel_cache.MANIFEST).read_text().splitlines()}
    assert seen == {json.dumps(x, sort_keys=True) for x in lines}


def test_all_variants_listing():
    """--all names every seam's compile function with arguments it accepts (the count: each seam's own listing)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
    import importlib
    import prebuild_kernels
    variants = prebuild_kernels.all_variants()
    for module, function, listing in prebuild_kernels.SEAMS:
        mod = importlib.import_module(module)
        assert callable(getattr(mod, function))
        items = getattr(mod, listing)
        n = len(items() if callable(items) else items)
        assert n > 0 and sum(1 for v in variants if v[0] == module) == n


def test_seam_manifest_line_replays(store, monkeypatch):
    """A seam's own manifest line (here the top-k seam's) replays through prebuild_kernels' worker into a hit."""
    from ops.dsa.topk import fwd
    monkeypatch.setattr(fwd, "_CACHE", {})
    key = fwd.variant_key(64, True, False, True, False)
    fwd.compile_variant(key)
    (line,) = [json.loads(x) for x in (store / kernel_cache.MANIFEST).read_text().splitlines()]
    assert line == {"module": "ops.dsa.topk.fwd", "function": "compile_variant", "args": [list(key)]}
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
    import prebuild_kernels
    monkeypatch.setattr(fwd, "_CACHE", {})
    hits = kernel_cache.STATS["hits"]
    assert prebuild_kernels._work([(line["module"], line["function"], line["args"])])[2] == []
    assert kernel_cache.STATS["hits"] == hits + 1 and type(fwd._CACHE[key]).__name__ == "Function"
