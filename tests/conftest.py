"""Shared pytest fixtures: fresh random inputs each run, the seed reported on failure."""
import os

# Kernels compile for Hopper everywhere (a GPU-less host would otherwise target sm_100a); must be set
# before anything imports cutlass.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    # Fresh inputs each run; PADDLE_DSA_TEST_SEED=N replays a reported failure.
    seed = int(os.environ.get("PADDLE_DSA_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    request.node.user_properties.append(("seed", seed))
    gen = np.random.default_rng(seed)
    return gen


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        for key, value in item.user_properties:
            if key == "seed":
                item.add_report_section("call", "seed", f"numpy seed of this test: {value}")
