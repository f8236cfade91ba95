"""L2 fp32 reduction throughput against the bytes one warp instruction adds to each row (H200 microbenchmark).

Question it answers: the sparse backward kernels scatter-add fp32 gradient rows with red.global.add.v4.f32 (16 bytes a
lane). Is the L2's reduction rate set by the 16-byte requests (then the layout of a warp's 32 requests does not
matter), or by the 128-byte lines a warp instruction touches (then 4 rows x 128 B a warp instruction beats 8 rows x
64 B or 16 rows x 32 B)?

Each warp issues `iters` v4 reductions a lane; in one instruction the warp covers 512 / W rows of W contiguous bytes
(W = 16 .. 512, W-aligned), rows drawn by a hash from a [rows, 576] fp32 buffer (the shape of the sparse attention
backward's dkv at Skv 8K, 18.9 MB: L2 resident). Output: GB/s and G requests/s per W; the buffer's sum is checked
against the number of adds (every request landed).

    python3 bench/red_lines.py [--rows 8192] [--iters 2048]          (device; --compile-only on the CPU)
"""
import argparse
import os
import sys

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ops.common.vector_red_sm90 import red_add_v4  # noqa: E402
from red_harness import Launcher, compile_only, mix  # noqa: E402

COLS = 576
THREADS = 256


class RedLines:
    def __init__(self, width_bytes: int, rows: int):
        assert width_bytes in (16, 32, 64, 128, 256, 512) and rows & (rows - 1) == 0
        self.W, self.rows = width_bytes, rows
        self.nwin = max(1, (COLS * 4) // width_bytes) if width_bytes <= 256 else 4

    @cute.jit
    def __call__(self, buf: cute.Tensor, iters: Int32, ctas: Int32, stream):
        self.kernel(buf, iters).launch(grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, buf: cute.Tensor, iters: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        lanes_per_row = self.W // 16
        grp = lane // lanes_per_row
        sub = lane % lanes_per_row
        key = (bidx * (THREADS // 32) + tidx // 32) * 32 + grp
        one = Float32(1.0)
        for it in cutlass.range(iters, unroll=4):
            h = mix(it, key)
            row = h & (self.rows - 1)
            win = (it * 7 + grp) % self.nwin
            off = row * COLS + win * (self.W // 4) + sub * 4
            red_add_v4(buf.iterator + off, one, one, one, one)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=2048)
    ap.add_argument("--widths", type=int, nargs="*", default=[16, 32, 64, 128, 256, 512])
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    if a.compile_only:       # CPU: every width assembles for sm_90a
        compile_only([RedLines(w, a.rows) for w in a.widths], 4)
        print("compiled", a.widths)
        return
    run = Launcher(a.rows * COLS, 8)
    requests = run.ctas * THREADS * a.iters
    print(f"rows {a.rows} x {COLS} fp32 ({a.rows * COLS * 4 / 1e6:.1f} MB), {run.ctas} CTAs x {THREADS} threads x "
          f"{a.iters} v4 reductions = {requests / 1e6:.0f} M requests a launch")
    print(f"{'bytes/row/instr':>16} {'rows/instr':>10} {'ms':>8} {'GB/s':>8} {'G req/s':>8}  check")
    for w in a.widths:
        sec, ok = run.measure(RedLines(w, a.rows), a.iters, requests * 4.0)
        print(f"{w:>16} {512 // w:>10} {sec * 1e3:8.3f} {requests * 16 / sec / 1e9:8.0f} {requests / sec / 1e9:8.1f}  "
              f"{'ok' if ok else 'SUM MISMATCH'}")

if __name__ == "__main__":
    main()
