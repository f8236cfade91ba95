"""What the L2 reduction microbenchmarks (red_lines.py: red.v4 from registers, red_bulk.py: TMA bulk reduces) share:
a kernel object called as kernel(buf, iters, ctas, stream) on a flat fp32 buffer. compile_only assembles each for
sm_90a on the CPU; Launcher owns the device buffer and stream and runs one kernel: compile, one checked launch (the
buffer's sum against the adds it must hold), then the median device time; mix, the hash that scatters the adds."""
import os
import sys

import cutlass.cute as cute
from cutlass import Float32, Int32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


@cute.jit
def mix(it: Int32, key: Int32) -> Int32:
    """A 32-bit hash of (iteration, issuer): the pseudo-random row a reduction goes to (its low bits) and, in
    red_bulk.py, the column window (bits 20..29)."""
    h = it * Int32(-1640531535) + key * Int32(-2048144777)
    h = h ^ (h >> 15)
    h = h * Int32(-1028477379)
    return h ^ (h >> 13)


def compile_only(kernels, align):
    from cutlass.cute.runtime import make_fake_stream
    from ops.common.head_sum_host import fake_tensor
    for k in kernels:
        cute.compile(k, fake_tensor(Float32, (None,), 1, align), Int32(1), Int32(1), make_fake_stream())


class Launcher:
    def __init__(self, elems: int, ctas_per_sm: int):
        import torch
        import cuda.bindings.driver as cuda
        from cutlass.cute.runtime import from_dlpack
        self.torch = torch
        self.buf = torch.zeros(elems, dtype=torch.float32, device="cuda")
        self.ctas = torch.cuda.get_device_properties(0).multi_processor_count * ctas_per_sm
        self.stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        self.t = from_dlpack(self.buf, assumed_align=16)

    def measure(self, kernel, iters: int, expected_sum: float):
        """(seconds a launch, whether one launch added exactly expected_sum)."""
        from timing import device_time
        args = (self.t, Int32(iters), Int32(self.ctas), self.stream)
        fn = cute.compile(kernel, *args)
        self.buf.zero_()
        fn(*args)
        self.torch.cuda.synchronize()
        ok = float(self.buf.double().sum()) == expected_sum
        sec, _ = device_time(lambda: fn(*args), iters=10)
        return sec, ok
