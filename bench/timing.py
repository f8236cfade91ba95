"""Device timing shared by the benchmarks (torch CUDA events; no import of the package under test)."""
import time

import torch


def device_time(fn, iters, warmup=2):
    """Median device seconds of one ``fn()`` and whether the host fell behind the GPU while queueing.

    The first call compiles / plans and is not timed; ``warmup`` more calls estimate the host cost per call, which
    sizes the GPU spin that keeps the stream busy while the timed calls are queued."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    host = (time.perf_counter() - t0) / max(1, warmup)
    torch.cuda.synchronize()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    gate = torch.cuda.Event()
    spin_s = min(0.5, 2.0 * host * iters + 2e-3)
    torch.cuda._sleep(int(spin_s * 2.0e9))  # cycles; ~2 GHz SM clock (a lower clock only spins longer)
    gate.record()
    for a, b in evs:
        a.record()
        fn()
        b.record()
    host_bound = bool(gate.query())  # the spin ended before the host had queued every call
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in evs)
    return ts[len(ts) // 2] * 1e-3, host_bound
