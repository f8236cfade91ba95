"""CPU test of the deterministic backwards' host loop (ops/common/deterministic_rows.py run_in_chunks) with the kernels
emulated in numpy on host memory relabelled as CUDA (cuda_labelled.py): the staging kernel writes the contract's
entries (e = ((row - row0) B + batch) K + slot, its `groups` rows e G + g, its key or -1), the sort is the workspace's,
the segment sums are float32 adds in the sorted order. Checks: the chunking (chunk count and sizes from
workspace_bytes, at least one row a chunk, whole waves of rows above one wave), every key's sum equal to float32 sums in (row, slot, group) order, bit
for bit, for every chunk size (the order does not depend on it), keys outside [0, n_out) never summed, stage rows of
entries without a key never read (they hold NaN)."""
import ctypes
import os
import sys

import numpy as np
import pytest

os.environ["CUTE_DSL_ARCH"] = "sm_90a"
pytest.importorskip("cutlass")
pytest.importorskip("tvm_ffi")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from cuda_labelled import cuda  # noqa: E402
from ops.common import deterministic_rows, segment_sum_sm90  # noqa: E402


def host(t, dtype):
    """The numpy array behind a tvm_ffi tensor made from host memory (contiguous)."""
    n = int(np.prod(t.shape))
    buf = (ctypes.c_byte * (n * np.dtype(dtype).itemsize)).from_address(int(t.data_ptr()))
    return np.frombuffer(buf, dtype=dtype).reshape(tuple(t.shape))


class HostWorkspace:
    def __init__(self):
        self.chunks = []

    def alloc(self, shape, dtype):
        if dtype == "int32":
            self.chunks.append(shape[0])
            return cuda(np.zeros(shape, np.int32))
        return cuda(np.full(shape, np.nan, np.float32))

    @staticmethod
    def export(t):
        return t

    @staticmethod
    def sort_keys(keys, n_out):
        k = np.where(keys.a < 0, n_out, keys.a).astype(np.int64)
        order = np.argsort(k * k.size + np.arange(k.size))
        return cuda(k[order].astype(np.int32)), cuda(order.astype(np.int32))


def emulated_segment_sum(stage, sorted_keys, order, out, *, width, rank, n_out, groups, stream):
    st, sk, od = host(stage, np.float32), host(sorted_keys, np.int32), host(order, np.int32)
    o = host(out, np.float32).reshape(-1, width)
    for key in range(n_out):
        lo, hi = np.searchsorted(sk, key), np.searchsorted(sk, key + 1)
        acc = o[key].copy()
        for i in range(lo, hi):
            for g in range(groups):
                acc = acc + st[od[i] * groups + g]          # float32 adds, in order
        o[key] = acc


@pytest.mark.parametrize("n_batch,groups", [(1, 1), (3, 2)])
def test_run_in_chunks(monkeypatch, n_batch, groups):
    rng = np.random.default_rng(5)
    n_rows, n_slots, width, skv = 13, 7, 8, 5
    n_out = n_batch * skv
    # the model: each (row, batch, slot) a key (local index, invalid ones -1) and `groups` gradient rows
    idx = rng.integers(-1, skv + 1, size=(n_rows, n_batch, n_slots))
    idx[2, 0, :] = 1                                    # one row adds to one key many times
    grads = rng.standard_normal((n_rows, n_batch, n_slots, groups, width)).astype(np.float32) * 1e3

    def launch(stage, keys, row0):
        st, ks = host(stage, np.float32), host(keys, np.int32)
        rc = ks.shape[0] // (n_batch * n_slots)
        for rel in range(rc):
            for b in range(n_batch):
                for s in range(n_slots):
                    e = (rel * n_batch + b) * n_slots + s
                    i = idx[row0 + rel, b, s]
                    ok = 0 <= i < skv
                    ks[e] = b * skv + i if ok else -1
                    if ok:
                        st[e * groups:(e + 1) * groups] = grads[row0 + rel, b, s]

    monkeypatch.setattr(segment_sum_sm90, "segment_sum", emulated_segment_sum)
    want = np.zeros((n_out, width), np.float32)
    for r in range(n_rows):
        for b in range(n_batch):
            for s in range(n_slots):
                i = idx[r, b, s]
                if 0 <= i < skv:
                    for g in range(groups):
                        want[b * skv + i] = want[b * skv + i] + grads[r, b, s, g]
    row_bytes = n_batch * n_slots * groups * width * 4
    from ops.common.tensors import arg_tensor
    monkeypatch.setattr(deterministic_rows, "SMS", 4 * groups * n_batch)     # a wave: 4 rows
    for wb, chunks in ((0, [1] * n_rows), (3 * row_bytes + 5, [3, 3, 3, 3, 1]), (6 * row_bytes, [4, 4, 4, 1]),
                       (1 << 30, [n_rows])):
        out = cuda(np.zeros((n_batch, skv, width), np.float32))
        ws = HostWorkspace()
        deterministic_rows.run_in_chunks(launch, n_rows=n_rows, n_batch=n_batch, n_slots=n_slots, groups=groups,
                                         width=width, out=arg_tensor(out, "out").ffi, out_rank=3, n_out=n_out,
                                         workspace=ws, workspace_bytes=wb, stream=0)
        assert ws.chunks == [c * n_batch * n_slots for c in chunks], (wb, ws.chunks)
        np.testing.assert_array_equal(out.a.reshape(n_out, width), want)


@pytest.mark.parametrize("bad,msg", [(None, "workspace: deterministic=True needs"),
                                     (object(), "workspace: deterministic=True needs")])
def test_check_workspace(bad, msg):
    with pytest.raises(ValueError, match=msg):
        deterministic_rows.check_workspace(bad, 1 << 20)
    with pytest.raises(ValueError, match="workspace_bytes"):
        deterministic_rows.check_workspace(HostWorkspace(), True)


def test_check_row():
    """One query row's staging must fit int32 element offsets; the seams check it before any launch."""
    assert deterministic_rows.check_row(1, 2048, 2, 576) == (2 ** 31 - 1) // (2048 * 2 * 576)
    with pytest.raises(ValueError, match="deterministic=True: one query row stages"):
        deterministic_rows.check_row(8, 2 ** 20, 2, 576)
