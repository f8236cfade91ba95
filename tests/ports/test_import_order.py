"""Import order, in fresh interpreters (pytest itself imports zlib early, which would hide the 2.6 bug).

Paddle 2.6 crashes Python's zlib, and so nvidia-cutlass-dsl, when zlib is first loaded after paddle;
paddle_dsa's port step loads it first. Every core import path must go through that step before paddle.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

import paddle_dsa  # noqa: F401
from paddle_dsa.ports import PORT

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
ZLIB_AND_DSL = (
    "import zlib\n"
    "assert len(zlib.decompress(zlib.compress(b'x' * 100000))) == 100000\n"
    "import cutlass, cutlass.cute\n"
    "from cutlass.cute.runtime import from_dlpack\n"
    "print('OK')\n"
)


def _run(code):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("entry", [
    "import paddle_dsa.nn.functional",
    "from paddle_dsa import flash_attention",
    "import paddle_dsa.reference.flash_attention",
    "import paddle_dsa.kernels.flash_attention",
    "from paddle_dsa.ports import PORT",
])
def test_core_entry_then_dsl(entry):
    """paddle_dsa's modules import paddle; zlib and cutlass must still work afterwards."""
    if not HAS_CUTLASS:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    r = _run(entry + "\nimport paddle\n" + ZLIB_AND_DSL)
    assert r.returncode == 0 and "OK" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


def test_import_paddle_dsa_imports_no_paddle():
    r = _run("import sys, paddle_dsa, paddle_dsa.ops\nassert 'paddle' not in sys.modules, 'paddle imported'\nprint('OK')")
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-4000:]


def test_paddle_imported_first():
    """The user imported paddle before paddle_dsa: on 2.6 the port reports it and refuses to load the DSL
    (ImportError instead of a crash); on 3.x nothing is wrong."""
    if not HAS_CUTLASS:
        pytest.skip("nvidia-cutlass-dsl is not installed")
    r = _run(
        "import paddle\nimport paddle_dsa\nfrom paddle_dsa.ports import PORT\n"
        "print('ERR', PORT.dsl_import_error() is not None)\n"
        "try:\n    import cutlass.cute\n    print('DSL loaded')\nexcept ImportError as e:\n    print('DSL refused:', e)\n"
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-4000:])
    if PORT.NAME == "2.6":
        assert "ERR True" in r.stdout and "DSL refused" in r.stdout and "before paddle" in r.stdout, r.stdout
    else:
        assert "ERR False" in r.stdout and "DSL loaded" in r.stdout, r.stdout
