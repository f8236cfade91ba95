"""Paddle release ports: one sub-package per supported release line.

``PORT`` is the interface module of the running Paddle's line, chosen once at import by the release
number (a develop build, ``0.0.0``, counts as the newest line). Every port module exposes the same
functions (see ports/PORT_INTERFACE.md); the rest of paddle_dsa calls only those and never branches on
versions.
"""
import importlib
import importlib.metadata as _metadata

# (release line, first version, last version inclusive as (major, minor), module)
LINES = (
    ("2.6", (2, 6), (2, 6), "paddle_2_6"),
    ("3.0-3.2", (3, 0), (3, 2), "paddle_3_0"),
    ("3.3", (3, 3), (3, 3), "paddle_3_3"),
)
NEWEST = "paddle_3_3"


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


def _select():
    version = _installed_version()
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


PORT = _select()
