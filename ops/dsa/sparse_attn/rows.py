"""What the sparse attention kernels (fwd_sm90.py, bwd_sm90.py) share besides the gather producer: coordinates of a
query row's tensors in the dense [B, Sq, ...] and THD [Tq, ...] layouts and the two-slot chunk pipeline's states
(a slot's validity comes from the producer: gather_sm90.publish_rows), and the launch grid: one CTA a query row and
head group of 64 heads. A mixin: the kernel class has `varlen`, `stages`, `NC` and `H`."""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32

HEAD_GROUP = 64      # heads per CTA in both kernels (one wgmma M)


class SlotRows:
    # ---- the grid: x = query rows x head groups, a row's head-group CTAs adjacent in launch order (as FlashMLA
    # launches), so the second CTA gathers the rows the first has just brought into L2. Same run on an H100 against
    # grid y = head group (2026-12-05, perf/launch_order_2026-12-05T1920.txt; Sq 4K, top-k 2048, 576/512, H 128; outputs
    # bitwise equal): forward 523 -> 551 TFLOP/s at Skv 8K, 478 -> 491 at 32K, 429 -> 480 at 64K; backward 14.90 ->
    # 15.03 ms at Skv 8K, 40.0 -> 28.0 ms at 64K.
    def launch_grid(self, rows, batch):
        """(x, y, z) of the launch: `rows` query rows x H / 64 head groups (x), 1, `batch` (z)."""
        return (rows * (self.H // HEAD_GROUP), 1, batch)

    def grid_coords(self):
        """(row, head group, batch) of this CTA (the row relative to the launch's first row)."""
        bx, _, bz = cute.arch.block_idx()
        groups = self.H // HEAD_GROUP
        if cutlass.const_expr(groups == 1):
            return bx, Int32(0), bz
        return bx // groups, bx % groups, bz

    def idx_coord(self, batch, row, j):
        return (row, j) if cutlass.const_expr(self.varlen) else (batch, row, j)

    def row_coord(self, batch, row):
        return row if cutlass.const_expr(self.varlen) else (batch, row)

    def head_coord(self, batch, row, h):
        return (row, h) if cutlass.const_expr(self.varlen) else (batch, row, h)

    def vec_coord(self, batch, row, h, c):
        return (row, h, c) if cutlass.const_expr(self.varlen) else (batch, row, h, c)

    def lse_coord(self, batch, row, h):
        return (h, row) if cutlass.const_expr(self.varlen) else (batch, h, row)

    def state(self, n, g, producer):
        """Pipeline state of stage unit g of block n (a chunk group: gather_groups(), G of them a block): stage
        (n % 2) * G + g, one fill every other block (two slots; the backward, with one slot, overrides it)."""
        lap = (n // 2) % 2
        return pipeline.PipelineState(self.stages, n * self.G + g, (n % 2) * self.G + g,
                                      lap ^ 1 if producer else lap)

    def gather_lag(self):
        return self.LAG
