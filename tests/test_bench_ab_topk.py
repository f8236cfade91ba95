"""CPU: bench/ab_topk.py --prepare writes a base kernel whose classes come from the base copies only (stream ->
topk -> sort), never from the working tree's modules, so that the device A/B times the revision's kernel whole."""
import importlib
import os
import subprocess
import sys

import pytest

pytest.importorskip("cutlass")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_prepare_builds_the_base_from_its_own_copies():
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        ab = importlib.import_module("ab_topk")
    finally:
        sys.path.pop(0)
    names = [ab.base_name(m) for m in ab.FILES]
    if any(os.path.exists(os.path.join(ab.PKG, n + ".py")) for n in names):
        pytest.skip("base files of a prepared A/B are present; not overwriting them")
    try:
        ab.prepare("HEAD")
        base = importlib.import_module(f"ops.dsa.topk.{ab.base_name('stream_sm90')}")
        mods = {c.__module__ for c in base.TopkStreamSm90.__mro__ if c.__module__.startswith("ops.")}
        assert mods == {f"ops.dsa.topk.{n}" for n in names}, mods
        from ops.dsa.topk import stream_sm90
        assert base.TopkStreamSm90 is not stream_sm90.TopkStreamSm90
    finally:
        ab.clean()
        for n in names:
            sys.modules.pop(f"ops.dsa.topk.{n}", None)
