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


def cudnn_dsa():
    """cuDNN frontend's DSA module (cudnn.deepseek_sparse_attention, unpacked by .device/extra/unpack.sh), or None
    with the reason printed."""
    try:
        import importlib
        return importlib.import_module("cudnn.deepseek_sparse_attention")
    except Exception as e:  # noqa: BLE001
        print(f"# cuDNN frontend: {type(e).__name__}: {str(e)[:200]}")
        return None


def profile_launches(runs):
    """runs: [(name, fn)]. Each fn once to warm up (compiles, plans), then each once between cudaProfilerStart and
    Stop: the launches `ncu --profile-from-start off` profiles (tests/gpu/profile_pair.sh)."""
    for _, fn in runs:
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in runs:
        fn()
        torch.cuda.synchronize()
        print(f"# profiled: {name}", flush=True)
    torch.cuda.profiler.stop()
