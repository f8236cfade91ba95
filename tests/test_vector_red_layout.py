"""CPU: the lane exchanges of ops/common/vector_red_sm90.py deliver what their docstrings promise, simulated over the
32 lanes of a warp (a shuffle reads the partner lane's value, selects act lane by lane). A wrong lane bit or value
index in line_rows / partner_rows would add gradient values to the wrong (row, column) on the GPU; here it fails
without one. The m64 accumulator layout assumed: thread lane holds row lane // 4 + 8 r of its warp's 16 and columns
8 j + 2 (lane % 4) + e."""
import numpy as np
import pytest

vr = pytest.importorskip("ops.common.vector_red_sm90")

LANES = np.arange(32)


class Lanes:
    """Stand-ins for the DSL calls swap_lane_bit makes, acting on arrays of 32 lane values."""

    @staticmethod
    def shuffle_sync_bfly(x, offset):
        return np.asarray(x)[LANES ^ offset]

    @staticmethod
    def select_(c, a, b):
        return np.where(c, a, b)


@pytest.fixture
def lanes(monkeypatch):
    monkeypatch.setattr(vr.cute.arch, "shuffle_sync_bfly", Lanes.shuffle_sync_bfly)
    monkeypatch.setattr(vr.cutlass, "select_", Lanes.select_)
    monkeypatch.setattr(vr, "Float32", lambda x: x)


def tag(row, col):
    return row * 1000 + col


def test_line_rows_gives_four_rows_of_whole_lines(lanes):
    m = LANES >> 2
    q = LANES & 3
    for ln in range(2):                    # the two 32-column lines of a 64-column tile
        v = []
        for i in range(16):
            r, j, e = i >> 3, 4 * ln + ((i >> 1) & 3), i & 1
            v.append(tag(m + 8 * r, 8 * j + 2 * q + e))
        w = vr.line_rows(v, LANES)
        col = 32 * ln + 16 * ((LANES >> 2) & 1) + 8 * (LANES & 1) + 4 * ((LANES >> 1) & 1)
        seen = set()
        for r in range(2):
            for b in range(2):
                row = ((m & ~1) | b) + 8 * r
                rows_this_instr = set()
                for i in range(4):
                    np.testing.assert_array_equal(w[8 * r + 4 * b + i], tag(row, col + i))
                    seen.update(zip(row.tolist(), (col + i).tolist()))
                    rows_this_instr.update(row.tolist())
                assert len(rows_this_instr) == 4          # one instruction: 4 rows x 32 columns (128 bytes)
        assert seen == {(rr, 32 * ln + c) for rr in range(16) for c in range(32)}


def test_partner_rows_match_line_rows(lanes):
    """partner_rows hands each lane the destination rows of the tile rows line_rows gives it: row (lane >> 2 with
    bit 0 = b) + 8 r, taken from the lane that owns it (lane or lane ^ 4)."""
    m = LANES >> 2
    dest = lambda tile_row: 7000 + 3 * tile_row        # noqa: E731  any injective map of tile rows
    krow_b = np.zeros((2, 2, 32), dtype=np.int64)
    vr.partner_rows(krow_b, dest(m), dest(m + 8), LANES)
    for r in range(2):
        for b in range(2):
            np.testing.assert_array_equal(krow_b[b, r], dest(((m & ~1) | b) + 8 * r))

