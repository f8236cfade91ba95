"""Paddle release ports: one sub-package per supported release line.

``PORT`` is the interface module of the running Paddle's line (see ports/PORT_INTERFACE.md); the rest
of paddle_dsa calls only its functions and never branches on versions.

Selection happens in two steps so that nothing of paddle_dsa imports Paddle before the port has had
its say about import order:

1. At import of this package (``import paddle_dsa`` imports it): the installed release is read from the
   package metadata (no ``import paddle``) and the line's ``BEFORE_PADDLE`` modules are imported. This
   step never imports Paddle and never raises, so ``import paddle_dsa.ops`` works without Paddle.
2. On first access of ``PORT`` (``from paddle_dsa.ports import PORT``): the port module is imported
   (it imports Paddle). A release outside ``LINES`` raises ImportError naming the supported lines; a
   develop build (``0.0.0``) counts as the newest line.
"""
import importlib
import importlib.metadata as _metadata
import sys

# (release line, first version, last version inclusive as (major, minor), module)
LINES = (
    ("2.6", (2, 6), (2, 6), "paddle_2_6"),
    ("3.0-3.2", (3, 0), (3, 2), "paddle_3_0"),
    ("3.3", (3, 3), (3, 3), "paddle_3_3"),
)
NEWEST = "paddle_3_3"

# Modules a line needs imported before Paddle is (imported here, in step 1). 2.6: Paddle's core library
# carries its own zlib symbols; a Python zlib module loaded after `import paddle` binds to them and
# crashes (zlib.error "inconsistent stream state", or SIGSEGV in inflateReset2). cutlass imports zlib
# (through cuda.bindings), which is why `import paddle; import cutlass` dies on 2.6.
BEFORE_PADDLE = {"paddle_2_6": ("zlib",)}

# What step 1 found: the Paddle modules that were already imported when it ran, before the
# BEFORE_PADDLE modules were (the port reports the import-order problem; see dsl_import_error()).
EARLY = {"version": None, "module": None, "late": ()}


def _installed_version():
    for dist in ("paddlepaddle", "paddlepaddle-gpu"):
        try:
            return _metadata.version(dist)
        except _metadata.PackageNotFoundError:
            continue
    return None


def _parse(version):
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def module_name_for(version):
    """The port sub-module for a Paddle version string; ImportError if no line supports it."""
    if version is None or version.startswith("0.0.0"):
        return NEWEST
    mm = _parse(version)
    for _, lo, hi, mod in LINES:
        if lo <= mm <= hi:
            return mod
    supported = ", ".join(line for line, *_ in LINES)
    raise ImportError(
        f"paddle_dsa supports Paddle release lines {supported}; the installed Paddle is {version}. "
        "Install a supported release, e.g. `pip install -e .[paddle-3.3]`."
    )


def _prepare():
    """Step 1: the line's imports that must precede Paddle's. Imports no Paddle, raises nothing."""
    version = _installed_version()
    EARLY["version"] = version
    if version is None:
        return
    try:
        mod = module_name_for(version)
    except ImportError:
        return  # reported in step 2
    EARLY["module"] = mod
    needed = BEFORE_PADDLE.get(mod, ())
    EARLY["late"] = tuple(m for m in needed if _loaded_after_paddle(m))
    for name in needed:
        if name not in EARLY["late"]:
            importlib.import_module(name)


def _loaded_after_paddle(name):
    """Whether importing `name` now, or its earlier import, comes after Paddle's core library was loaded.

    sys.modules keeps insertion order, and a module is inserted when its import starts: compare positions.
    (Paddle's own import pulls in zlib after its core library, so presence alone says nothing.)
    """
    order = {m: i for i, m in enumerate(sys.modules)}
    core = next((order[m] for m in ("paddle.base.libpaddle", "paddle.base.core", "paddle") if m in order), None)
    if core is None:
        return False
    return order.get(name, len(order)) > core


def _select():
    version = EARLY["version"] if EARLY["version"] is not None else _installed_version()
    if version is None:
        # Paddle may still be importable (a source build without metadata): ask it.
        try:
            import paddle  # noqa: F401

            version = paddle.__version__
        except ImportError as exc:
            raise ImportError(
                "paddle_dsa needs PaddlePaddle. Install `paddlepaddle==3.3.1` (CPU) or a "
                "`paddlepaddle-gpu` wheel for your CUDA version; `pip install -e .[paddle-3.3]` "
                "installs the CPU wheel with its pins."
            ) from exc
    return importlib.import_module(f".{module_name_for(version)}", __name__)


def __getattr__(name):
    if name == "PORT":
        port = _select()
        globals()["PORT"] = port
        return port
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_prepare()
