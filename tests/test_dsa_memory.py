"""Working memory of the dense DSA reference path (docs/dsa.md, "Memory").

The dense ops work row chunk by row chunk, with temporaries of at most dense_budget() elements
(DENSE_ELEMENTS_CPU = 2^20 on CPU, 4 MiB in float32) and a small constant number of them alive at a
time; indexer_kl_loss's dense path never holds a [Sq, Sk] tensor. Each phase runs in a fresh
interpreter and reports its peak RSS growth over the RSS after the inputs are built (the peak is reset
through /proc/self/clear_refs). At B=1, Sq=Sk=2048, Hi=16, Di=64, H=16, Dqk=64, float32, causal
(2-core CPU, Paddle 3.3.1):

    phase                                            before     after (4 runs)
    loss:   dense indexer_kl_loss forward + backward  256 MiB    50-56 MiB
    pieces: both dense recomputes + the backward      245 MiB    78-85 MiB

The bounds follow from the design, not from the measurement plus slack alone ([Sq, Sk] float32 is
16 MiB here, d_index_q 8 MiB, one dense temporary at most 4 MiB):
    loss:   gradients (d_index_q, up to three copies alive: the PyLayer's result, its cast, the
            accumulated .grad) 24 MiB + 16 dense temporaries 64 MiB = 88 MiB  -> bound 96 MiB.
            The former path (tiles of 1024 rows x 16 heads x 256 keys = 16 MiB each plus several
            [Sq, Sk] intermediates, some float64) needed 256 MiB; any path that keeps a few [Sq, Sk]
            float32/float64 tensors per call breaks the bound.
    pieces: the two [Sq, Sk] outputs 32 MiB + 24 MiB gradients + 64 MiB temporaries -> bound 128 MiB.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r"""
    import gc, json, resource, sys
    import numpy as np
    import paddle
    import paddle_dsa as P

    def status():
        d = {}
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    d[k] = int(v.split()[0]) * 1024
        return d

    def reset_peak():
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def measure(fn):
        gc.collect()
        base = status()["VmRSS"]
        exact = reset_peak()
        fn()
        gc.collect()
        # without clear_refs the process-lifetime peak can only overstate the growth, never hide it
        peak = status()["VmHWM"] if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return (peak - base) / 2 ** 20

    S, HI, DI, H, DQK = 2048, 16, 64, 16, 64
    rng = np.random.default_rng(0)

    def t(shape, scale=1.0, grad=False):
        x = paddle.to_tensor((rng.standard_normal(shape) * scale).astype("float32"))
        x.stop_gradient = not grad
        return x

    iq, ik, w = t([1, S, HI, DI], DI ** -0.5, True), t([1, S, DI], 1.0, True), t([1, S, HI], HI ** -0.5, True)
    q, kv = t([1, S, H, DQK]), t([1, S, DQK])
    lse = paddle.full([1, H, S], float(np.log(S)) + 3.0, dtype="float32")
    small = [t([1, 8, HI, DI], grad=True), t([1, 8, DI], grad=True), t([1, 8, HI], grad=True), t([1, 8, H, DQK]),
             t([1, 8, DQK]), paddle.zeros([1, H, 8])]
    P.indexer_kl_loss(*small).backward()          # warm up kernels and allocator pools

    out = {}

    def loss():
        v = P.indexer_kl_loss(iq, ik, w, q, kv, lse)
        v.backward()
        out["loss"] = float(v)
        out["grad_finite"] = bool(np.isfinite(iq.grad.numpy()).all())

    def pieces():
        s, il = P.dense_indexer_score_recompute(iq, ik, w)
        a, l1 = P.dense_attn_score_recompute(q, kv, lse)
        g = P.dense_indexer_backward(iq, ik, w, s, il, a, l1, 1.0)
        out["pieces_finite"] = bool(np.isfinite(g[0].numpy()).all())

    which = sys.argv[1]
    out[which + "_mib"] = measure(loss if which == "loss" else pieces)
    print(json.dumps(out))
""")


def run_phase(which):
    """Run SCRIPT for one phase in a fresh interpreter (this checkout first on the path)."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SCRIPT, which], capture_output=True, text=True, env=env, cwd=root,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc for RSS")
def test_dense_indexer_kl_loss_working_memory_is_bounded():
    out = run_phase("loss")
    assert out["grad_finite"] and 0 < out["loss"] < 10
    assert out["loss_mib"] < 96, out


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc for RSS")
def test_dense_pieces_working_memory_is_bounded():
    out = run_phase("pieces")
    assert out["pieces_finite"]
    assert out["pieces_mib"] < 128, out
