"""What the sparse attention kernels (fwd_sm90.py, bwd_sm90.py) share besides the gather producer: coordinates of a
query row's tensors in the dense [B, Sq, ...] and THD [Tq, ...] layouts and the two-slot chunk pipeline's states
(a slot's validity comes from the producer: gather_sm90.publish_rows). A mixin: the kernel class has `varlen`,
`stages` and `NC`."""
import cutlass
import cutlass.pipeline as pipeline


class SlotRows:
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
