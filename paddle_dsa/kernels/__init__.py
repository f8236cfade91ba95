"""Seams between paddle_dsa and the CuTe DSL kernels in paddle_dsa.ops.

One thin function per kernel entry: export the Paddle tensors through the port (DLPack, no host
sync), take Paddle's current stream, allocate outputs in Paddle, call the ops seam. The GPU test
harness calls the same ops seam with torch tensors, so what the H200 tests run is what Paddle calls.
"""
import importlib


def import_kernel(cache, which, module):
    """cache[which]: the ops seam module `module` (e.g. "paddle_dsa.ops.dsa.topk.fwd") if the DSL and that kernel
    import, else None (the op then runs the reference path). Each seam keeps its own cache (tests replace it)."""
    if which not in cache:
        try:
            cache[which] = importlib.import_module(module)
        except ImportError:
            cache[which] = None
    return cache[which]
