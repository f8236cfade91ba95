"""CPU model of ops/common/exp2.exp2_fma (the flash forward's EXP2_EMU: part of the softmax's exponentials on the FMA
pipe): the same float32 steps in numpy (fma emulated exactly in float64) with the module's own constants. Checks the
accuracy the forward relies on (no worse than the hardware ex2.approx's 2^-22 relative), the exact zero for masked
scores (-inf, and every x <= -127), 2^0 = 1 exactly, and NaN kept; a wrong constant or a dropped clamp fails it."""
import numpy as np
import pytest

from ops.common import exp2 as e

F32 = np.float32


def exp2_fma_model(x, coeffs=e._CF, clamp=True):
    x = np.asarray(x, F32)
    xc = np.where(np.isnan(x), x, np.maximum(x, F32(-127.0))) if clamp else x      # max.NaN
    with np.errstate(invalid="ignore", over="ignore"):
        t = (xc + F32(e._ROUND)).astype(F32)
        j = (t - F32(e._ROUND)).astype(F32)
        f = (xc - j).astype(F32)
        p = np.full_like(f, F32(coeffs[4]))
        for c in reversed(coeffs[:4]):
            p = (p.astype(np.float64) * f + np.float64(F32(c))).astype(F32)
        p = (p.astype(np.float64) * f + 1.0).astype(F32)
        bits = ((t.view(np.int32).astype(np.int64) << 23) + 0x3F800000) & 0xFFFFFFFF
        return (p * bits.astype(np.uint32).view(F32)).astype(F32)


def test_accuracy_against_float64():
    x = np.random.default_rng(1).uniform(-126.0, 20.0, 1_000_000).astype(F32)
    rel = exp2_fma_model(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1.0
    assert np.abs(rel).max() < 2.0 ** -22
    assert abs(rel.mean()) < 1e-7


def test_special_values():
    y = exp2_fma_model(np.array([-np.inf, -1e30, -127.0, 0.0, 1.0, -1.0, 15.0, np.nan], F32))
    assert y[0] == 0.0 and y[1] == 0.0 and y[2] == 0.0           # masked scores add exactly nothing
    assert y[3] == 1.0 and y[4] == 2.0 and y[5] == 0.5 and y[6] == 32768.0
    assert np.isnan(y[7])


@pytest.mark.parametrize("broken", ["coeff", "clamp"])
def test_model_can_fail(broken):
    if broken == "coeff":
        c = list(e._CF)
        c[1] *= 1.001
        x = np.linspace(-3, 3, 10001, dtype=F32)
        rel = exp2_fma_model(x, coeffs=c).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1.0
        assert np.abs(rel).max() > 2.0 ** -22
    else:
        y = exp2_fma_model(np.array([-np.inf], F32), clamp=False)
        assert not (y == 0.0).all()
