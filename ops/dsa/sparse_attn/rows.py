"""What the sparse attention kernels (fwd_sm90.py, bwd_sm90.py) share besides the gather producer: coordinates of a
query row's tensors in the dense [B, Sq, ...] and THD [Tq, ...] layouts and the two-slot chunk pipeline's states
(a slot's validity comes from the producer: gather_sm90.publish_rows), and the launch grid: one CTA a query row and
head group of 64 heads. A mixin: the kernel class has `varlen`, `stages`, `NC` and `H`."""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline

HEAD_GROUP = 64      # heads per CTA in both kernels (one wgmma M)


class SlotRows:
    # 1: a row's head-group CTAs are adjacent in launch order (grid x = rows x groups, as FlashMLA launches), so the
    # second CTA gathers rows the first has just brought into L2; 0: grid y = head group (the second CTA of a row
    # runs about rows / SMs waves later). A same-run A/B decides (bench/ab_sparse_attn.py --knob GROUPS_ADJACENT).
    GROUPS_ADJACENT = 0

    # ---- the grid
    def launch_grid(self, rows, batch):
        """(x, y, z) of the launch: `rows` query rows (x), H / 64 head groups, `batch` (z)."""
        groups = self.H // HEAD_GROUP
        if cutlass.const_expr(self.GROUPS_ADJACENT):
            return (rows * groups, 1, batch)
        return (rows, groups, batch)

    def grid_coords(self):
        """(row, head group, batch) of this CTA (the row relative to the launch's first row)."""
        bx, by, bz = cute.arch.block_idx()
        groups = self.H // HEAD_GROUP
        if cutlass.const_expr(self.GROUPS_ADJACENT and groups > 1):
            return bx // groups, bx % groups, bz
        return bx, by, bz

    # ---- addressing (dense: batch, row; THD: the flat row)
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
