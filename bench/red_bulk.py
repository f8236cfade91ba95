"""L2 fp32 reduction throughput of TMA bulk tensor reduces (cp.reduce.async.bulk.tensor add.f32) into random rows,
against bench/red_lines.py's red.global.add.v4.f32 (H200 / H100 microbenchmark).

Question it answers: both sparse backwards (sparse attention dkv, indexer d_index_k) are bound by the L2's fp32
reduction rate: red_lines.py measured ~246 G v4 requests/s (~31 G 128-byte lines/s, 3.9 TB/s) at its best layout,
and the sparse attention backward's 1.21 G requests at H 64 need ~4.9 ms of its 7.5. Would a kernel that stages its
fp32 tile in shared memory and hands whole rows to the TMA unit (one bulk reduce a kv row, 128 .. 1024 bytes) get
more lines added per second? If not, the staging (16 KiB of shared memory the Dqk 576 kernels do not have) is not
worth building.

Each warp issues `iters` bulk reduces of one (1 x C) fp32 box (C = 32 .. 256 columns, 128 .. 1024 bytes) from its own
shared-memory row (all ones) to a row drawn by a hash from a [rows, 576] fp32 buffer (the sparse attention backward's
dkv at Skv 8K, 18.9 MB, L2 resident; --rows 65536 for 151 MB, past the L2), its column window drawn too; a bulk group
is committed every `batch` reduces and at most `depth` groups stay in flight (cp.async.bulk.wait_group.read). Output:
GB/s, G 128-byte lines/s and G rows/s per C; the buffer's sum is checked against the number of adds.

    python3 bench/red_bulk.py [--rows 8192] [--iters 512] [--cols 32 64 128 256]   (device; --compile-only on the CPU)
"""
import argparse
import os
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync
from cutlass.memory import SmemAllocator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from red_harness import Launcher, compile_only, mix  # noqa: E402

COLS = 576
THREADS = 256
WARPS = THREADS // 32


class RedBulk:
    def __init__(self, cols: int, rows: int, batch: int = 4, depth: int = 8):
        assert cols in (32, 64, 128, 256) and rows & (rows - 1) == 0
        self.C, self.rows, self.batch, self.depth = cols, rows, batch, depth
        self.nwin = (COLS - cols) // 32 + 1      # windows of C columns a row, at 32-column (128-byte) offsets

    @cute.jit
    def __call__(self, buf: cute.Tensor, iters: Int32, ctas: Int32, stream):
        g = cute.make_tensor(buf.iterator, cute.make_layout((self.rows, COLS), stride=(COLS, 1)))
        s_layout = cute.make_layout((1, self.C), stride=(self.C, 1))
        tma, gt = cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(cute.ReductionKind.ADD), g,
                                              s_layout, (1, self.C))

        @cute.struct
        class Storage:
            s: cute.struct.Align[cute.struct.MemRange[Float32, WARPS * self.C], 128]

        self.storage = Storage
        self.kernel(tma, gt, iters).launch(grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, tma: cute.CopyAtom, gt: cute.Tensor, iters: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        storage = SmemAllocator().allocate(self.storage)
        s_all = storage.s.get_tensor(cute.make_layout((WARPS, self.C), stride=(self.C, 1)))
        for i in cutlass.range(tidx, WARPS * self.C, THREADS):
            s_all[i // self.C, i % self.C] = Float32(1.0)
        cute.arch.fence_proxy("async.shared", space="cta")      # every writer's stores -> the TMA unit's reads
        cute.arch.sync_threads()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        s_row = cute.local_tile(s_all, (1, self.C), (warp, 0))
        key = bidx * WARPS + warp
        for it in cutlass.range(iters, unroll=1):
            h = mix(it, key)
            row = h & (self.rows - 1)
            win = ((h >> 20) & 1023) % self.nwin
            g_box = cute.local_tile(cute.domain_offset((0, win * 32), gt), (1, self.C), (row, 0))
            ts, tg = cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(s_row, 0, 2),
                                           cute.group_modes(g_box, 0, 2))
            cute.copy(tma, ts, tg)
            if (it + 1) % self.batch == 0:
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(self.depth, read=True)
        cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=512)
    ap.add_argument("--cols", type=int, nargs="*", default=[32, 64, 128, 256])
    ap.add_argument("--ctas-per-sm", type=int, default=4)
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.compile_only:       # CPU: every width assembles for sm_90a
        compile_only([RedBulk(c, a.rows) for c in a.cols], 16)
        print("compiled", a.cols)
        return
    run = Launcher(a.rows * COLS, a.ctas_per_sm)
    boxes = run.ctas * WARPS * a.iters
    print(f"rows {a.rows} x {COLS} fp32 ({a.rows * COLS * 4 / 1e6:.1f} MB), {run.ctas} CTAs x {WARPS} warps x "
          f"{a.iters} bulk reduces = {boxes / 1e6:.1f} M boxes a launch")
    print(f"{'bytes/box':>10} {'ms':>8} {'GB/s':>8} {'G lines/s':>10} {'G boxes/s':>10}  check")
    for c in a.cols:
        sec, ok = run.measure(RedBulk(c, a.rows), a.iters, boxes * float(c))
        nbytes = boxes * c * 4
        print(f"{c * 4:>10} {sec * 1e3:8.3f} {nbytes / sec / 1e9:8.0f} {nbytes / 128 / sec / 1e9:10.2f} "
              f"{boxes / sec / 1e9:10.2f}  {'ok' if ok else 'SUM MISMATCH'}")

if __name__ == "__main__":
    main()
