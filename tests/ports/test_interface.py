"""Unit tests of the port interface (ports/PORT_INTERFACE.md) on the running Paddle release."""
import importlib.metadata as metadata
import os
import re

import numpy as np
import pytest

import paddle_dsa  # noqa: F401  (port import-order step before paddle)
from paddle_dsa import ports
from paddle_dsa.ports import PORT

import paddle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERFACE = ("NAME", "RELEASES", "FEATURES", "dtype_name", "dtype_from_name", "is_tensor", "shape", "is_gpu",
             "needs_grad", "saved_tensors", "grad_wanted", "input_grads", "in_dynamic_mode", "to_numpy",
             "export", "to_cute", "stream_handle", "dsl_import_error")
FEATURE_KEYS = {"dlpack_export", "strided_views", "fp8", "stream", "pylayer", "to_static"}


# ---- selection ---------------------------------------------------------------------------------------

def test_selected_port_matches_installed_release():
    version = metadata.version("paddlepaddle")
    assert paddle.__version__ == version
    assert PORT.__name__.rsplit(".", 1)[1] == ports.module_name_for(version)
    assert any(version.startswith(r.rsplit(".", 1)[0]) for r in PORT.RELEASES) or PORT.NAME == "3.0-3.2"


@pytest.mark.parametrize("version,module", [
    ("2.6.0", "paddle_2_6"), ("2.6.2", "paddle_2_6"), ("3.0.0", "paddle_3_0"), ("3.1.1", "paddle_3_0"),
    ("3.2.2", "paddle_3_0"), ("3.3.0", "paddle_3_3"), ("3.3.1", "paddle_3_3"), ("0.0.0", "paddle_3_3"),
    ("0.0.0.dev20251201", "paddle_3_3"), ("3.0.0rc1", "paddle_3_0"), ("3.3.1.post1", "paddle_3_3"),
])
def test_module_name_for(version, module):
    assert ports.module_name_for(version) == module


def test_unsupported_installed_release_fails_port_selection(monkeypatch):
    monkeypatch.setitem(ports.EARLY, "version", "2.5.2")
    with pytest.raises(ImportError, match=r"supports Paddle release lines 2\.6, 3\.0-3\.2, 3\.3.*2\.5\.2"):
        ports._select()


@pytest.mark.parametrize("version", ["2.5.2", "2.4.0", "1.8.5", "3.4.0", "4.0.0"])
def test_unsupported_release_is_a_clear_import_error(version):
    with pytest.raises(ImportError) as info:
        ports.module_name_for(version)
    msg = str(info.value)
    assert version in msg
    for line, *_ in ports.LINES:
        assert line in msg


def test_every_port_has_the_whole_interface():
    """The running port here; the others by source (they import only on their own release)."""
    for name in INTERFACE:
        assert hasattr(PORT, name), name
    assert set(PORT.FEATURES) == FEATURE_KEYS
    for _, _, _, mod in ports.LINES:
        src = open(os.path.join(ROOT, "ports", mod, "__init__.py")).read()
        for name in INTERFACE:
            assert re.search(rf"^(def {name}\(|{name} = )", src, re.M), (mod, name)


def test_no_version_checks_outside_ports():
    """Core code never branches on the Paddle release: only ports/ looks at versions."""
    pattern = re.compile(r"paddle\.__version__|version\.(parse|Version)|metadata\.version\(|"
                         r"PORT\.NAME|hasattr\(paddle")
    offenders = []
    for top in ("paddle_dsa", "ops"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    for i, line in enumerate(open(path, encoding="utf-8"), 1):
                        if pattern.search(line):
                            offenders.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _extras():
    """setup.py's extras as installed metadata: {extra: [requirement, ...]}."""
    out = {}
    for req in metadata.requires("paddle_dsa") or ():
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if m:
            out.setdefault(m.group(1), []).append(req.split(";")[0].replace(" ", ""))
    return out


@pytest.mark.parametrize("extra,mod,release", [
    ("paddle-2-6", "paddle_2_6", "2.6.2"), ("paddle-3-0", "paddle_3_0", "3.0.0"),
    ("paddle-3-2", "paddle_3_0", "3.2.2"), ("paddle-3-3", "paddle_3_3", "3.3.1"),
])
def test_extras_pin_the_line(extra, mod, release):
    """`pip install -e .[paddle-X]` pulls the tested release and every pin of the port's requirements."""
    extras = {k.replace(".", "-"): v for k, v in _extras().items()}
    assert extra in extras, sorted(extras)
    from packaging.requirements import Requirement

    reqs = {(r.name, r.specifier) for r in map(Requirement, extras[extra])}
    assert ("paddlepaddle", Requirement(f"paddlepaddle=={release}").specifier) in reqs
    assert ports.module_name_for(release) == mod
    for ln in open(os.path.join(ROOT, "ports", mod, "requirements.txt")):
        ln = ln.split("#")[0].strip()
        if not ln:
            continue
        pin = Requirement(ln)
        if pin.name == "paddlepaddle":
            assert pin.specifier.contains(release), (mod, ln, release)
        else:
            assert (pin.name, pin.specifier) in reqs, (extra, ln, extras[extra])


def test_running_venv_honours_the_pins():
    mod = PORT.__name__.rsplit(".", 1)[1]
    from packaging.requirements import Requirement  # pip's vendored copy is not importable; pytest has it

    for ln in open(os.path.join(ROOT, "ports", mod, "requirements.txt")):
        ln = ln.split("#")[0].strip()
        if ln:
            req = Requirement(ln)
            assert req.specifier.contains(metadata.version(req.name), prereleases=True), (ln, metadata.version(req.name))


# ---- dtypes ------------------------------------------------------------------------------------------

NAMES = ("bfloat16", "float16", "float32", "float64", "int32", "int64", "bool", "uint8", "int8")


@pytest.mark.parametrize("name", NAMES)
def test_dtype_round_trip(name):
    dt = getattr(paddle, name)
    assert PORT.dtype_name(dt) == name
    assert PORT.dtype_from_name(name) == dt
    t = paddle.zeros([2], dtype=dt)
    assert PORT.dtype_name(t.dtype) == name


def test_dtype_name_compares_dtype_objects_not_strings():
    # distinct dtypes never collapse
    names = {PORT.dtype_name(getattr(paddle, n)) for n in NAMES}
    assert len(names) == len(NAMES)
    # a non-dtype gets its repr, not a wrong name
    assert PORT.dtype_name(object) == str(object)


def test_fp8_dtypes_follow_the_release():
    has = hasattr(paddle, "float8_e4m3fn")
    assert has == (PORT.FEATURES["fp8"].split()[0] != "none")
    if has:
        assert PORT.dtype_name(paddle.float8_e4m3fn) == "float8_e4m3fn"
        assert PORT.dtype_from_name("float8_e5m2") == paddle.float8_e5m2
    else:
        with pytest.raises(TypeError, match=f"not available on Paddle {re.escape(PORT.NAME)}"):
            PORT.dtype_from_name("float8_e4m3fn")


def test_unknown_dtype_name_is_a_clear_error():
    with pytest.raises(TypeError, match="'float7'.*bfloat16"):
        PORT.dtype_from_name("float7")


# ---- tensor facts ------------------------------------------------------------------------------------

def test_shape_is_a_hashable_tuple_of_ints():
    t = paddle.zeros([2, 3, 4])
    s = PORT.shape(t)
    assert type(s) is tuple and s == (2, 3, 4) and all(type(d) is int for d in s)
    assert {s: 1}[(2, 3, 4)] == 1


def test_tensor_kind_place_and_mode():
    t = paddle.zeros([2])
    assert PORT.is_tensor(t) and not PORT.is_tensor(np.zeros(2)) and not PORT.is_tensor([1.0])
    assert PORT.is_gpu(t) is False
    assert PORT.in_dynamic_mode() is True
    np.testing.assert_array_equal(PORT.to_numpy(paddle.to_tensor([0, 3, 5], dtype="int32")), [0, 3, 5])


def test_needs_grad():
    a, b = paddle.zeros([2]), paddle.zeros([2])
    b.stop_gradient = False
    assert PORT.needs_grad(a) is False and PORT.needs_grad(b) is True
    assert PORT.grad_wanted((a, b)) == (False, True)


def test_stream_handle_on_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA place"):
        PORT.stream_handle(paddle.zeros([2]))


def test_dsl_import_error_is_none_in_a_correct_process():
    assert PORT.dsl_import_error() is None


# ---- PyLayer helpers ---------------------------------------------------------------------------------

class _Scale(paddle.autograd.PyLayer):
    """y = a * x + b * w with a non-tensor argument between tensor ones and a keyword tensor."""

    @staticmethod
    def forward(ctx, x, alpha, w, *, beta):
        ctx.want = PORT.grad_wanted((x, w, beta))
        ctx.alpha = alpha
        ctx.save_for_backward(x, w, beta)
        return alpha * x + beta * w

    @staticmethod
    def backward(ctx, dy):
        x, w, beta = PORT.saved_tensors(ctx)
        grads = (ctx.alpha * dy, beta * dy, (dy * w).sum().reshape(beta.shape))
        return PORT.input_grads(ctx.want, grads)


@pytest.mark.parametrize("mask", [(True, True, True), (True, False, True), (False, True, False),
                                  (False, False, True), (True, False, False)])
def test_pylayer_one_grad_per_tensor_input(mask):
    x = paddle.to_tensor([1.0, 2.0, 3.0])
    w = paddle.to_tensor([0.5, -1.0, 4.0])
    beta = paddle.to_tensor([2.0])
    for t, m in zip((x, w, beta), mask):
        t.stop_gradient = not m
    y = _Scale.apply(x, 3.0, w, beta=beta)
    assert y.stop_gradient is (not any(mask))
    if not any(mask):
        return
    y.sum().backward()
    expect = (np.full(3, 3.0), np.full(3, 2.0), np.array([w.numpy().sum()]))
    for t, m, e in zip((x, w, beta), mask, expect):
        if m:
            np.testing.assert_allclose(t.grad.numpy(), e, rtol=1e-6)
        else:
            assert t.grad is None


def test_saved_tensors_is_a_tuple():
    seen = {}

    class _Id(paddle.autograd.PyLayer):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, x * 2)
            return x * 1

        @staticmethod
        def backward(ctx, dy):
            saved = PORT.saved_tensors(ctx)
            seen["saved"] = saved
            return dy

    x = paddle.ones([2])
    x.stop_gradient = False
    _Id.apply(x).sum().backward()
    assert type(seen["saved"]) is tuple and len(seen["saved"]) == 2
    np.testing.assert_array_equal(seen["saved"][1].numpy(), [2.0, 2.0])


def test_input_grads_checks_the_count():
    with pytest.raises(ValueError, match="exactly one per tensor input"):
        PORT.input_grads((True, False), (paddle.ones([1]),))
    g = paddle.ones([1])
    assert PORT.input_grads((True, False), (g, g)) == (g, None)


def test_jit_registration_worked_on_this_release():
    """keep_jit_out() uses SOT's skip list (internal, same in 2.6.2-3.3.1) and jit.ignore_module."""
    from paddle_dsa.ports import _common

    sot = _common.JIT_STATUS["sot_skip"]
    assert isinstance(sot, tuple), sot
    assert any(d.rstrip(os.sep).endswith("paddle_dsa") for d in sot) and any("ports" in d for d in sot)
    assert isinstance(_common.JIT_STATUS["ast_ignore"], tuple), _common.JIT_STATUS["ast_ignore"]
