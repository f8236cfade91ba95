"""exp2 on CUDA cores (CuTe DSL device helpers): exp2_accurate (under one float32 ulp) and exp2_fma (the FMA pipe
only, as accurate as the hardware ex2.approx: for moving part of a softmax's exponentials off the MUFU pipe).

The hardware ex2.approx (MUFU) is off by up to 2^-22 relative and biased, so a sum of many of its results (the
attention-score recompute's head sum and l1 norm) drifts measurably past a float32 implementation. exp2_accurate
splits x = n + f (n = floor(x), f in [0, 1)), evaluates 2^f with a degree-6 polynomial (least-squares fit of the
relative error on [0, 1]: max 9.5e-8, RMS 3.0e-8, bias 5e-9 in a float32 emulation over [-126, 120]) and adds n to
the exponent bits.
Domain: x <= 120 (callers clamp; 2^120 * 128 heads < FLT_MAX); x < -126 gives exactly 0 (no denormals, the
reference's flush); NaN stays NaN.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

_C = (1.0, 0.6931470036506653, 0.2402298003435135, 0.05548352748155594, 0.009678470902144909,
      0.0012443086598068476, 0.00021690614812541753)


@cute.jit
def exp2_accurate(x: Float32) -> Float32:
    xc = cute.arch.fmax(x, Float32(-127.0))            # keeps n in int range; below -126 the result is replaced
    n = cute.math.floor(xc)
    f = xc - n
    p = Float32(_C[6])
    for i in cutlass.range_constexpr(5, -1, -1):
        p = p * f + Float32(_C[i])
    y = (p.bitcast(Int32) + (Int32(n) << 23)).bitcast(Float32)
    y = Float32(cutlass.select_(x < Float32(-126.0), Float32(0.0), y))
    return Float32(cutlass.select_(x == x, y, x))      # NaN in, NaN out


# 2^f on [-0.5, 0.5] with the constant term 1 (so 2^0 = 1 exactly): relative error max 9.1e-8 (fit), 1.6e-7 in a
# float32 emulation of exp2_fma over [-126, 20] (ex2.approx: 2^-22 = 2.4e-7), bias -2e-8
_CF = (0.69314698, 0.24022242, 0.05550734, 0.00967151, 0.00132647)
_ROUND = 12582912.0          # 1.5 * 2^23: x + _ROUND holds round(x) in its low mantissa bits


@cute.jit
def exp2_fma(x: Float32) -> Float32:
    """2^x without MUFU or conversion instructions (11 FMA / ALU instructions): x = j + f with j = round(x) by the
    1.5 * 2^23 trick, f in [-0.5, 0.5], a degree-5 polynomial for 2^f, times 2^j built in the exponent bits.
    x = -inf or <= -127 gives exactly 0 (2^j's bits wrap to +0); NaN stays NaN (a NaN-keeping max, then a product
    with the NaN polynomial); for x <= 127 only."""
    xc = cute.arch.fmax(x, Float32(-127.0), nan=True)
    t = xc + Float32(_ROUND)
    j = t - Float32(_ROUND)
    f = xc - j
    p = Float32(_CF[4])
    for i in cutlass.range_constexpr(3, -1, -1):
        p = p * f + Float32(_CF[i])
    p = p * f + Float32(1.0)
    two_j = ((t.bitcast(Int32) << 23) + Int32(0x3F800000)).bitcast(Float32)
    return p * two_j
