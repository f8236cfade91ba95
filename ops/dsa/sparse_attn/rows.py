"""What the sparse attention kernels (fwd_sm90.py, bwd_sm90.py) share besides the gather producer: coordinates of a
query row's tensors in the dense [B, Sq, ...] and THD [Tq, ...] layouts, a slot's validity, and the two-slot chunk
pipeline's states. A mixin: the kernel class has `varlen`, `stages` and `NC`."""
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32


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

    @cute.jit
    def slot_row(self, mIdx: cute.Tensor, batch: Int32, row: Int32, j: Int32, row_len: Int32, seqlen_k: Int32):
        """(valid, key row within the sequence) of slot j: j < the row's slot count and 0 <= idx < seqlen_k."""
        kidx = Int32(0)
        valid = j < row_len
        if valid:
            kidx = mIdx[self.idx_coord(batch, row, j)]
            valid = kidx >= 0 and kidx < seqlen_k
        return valid, kidx

    def state(self, n, c, producer):
        """Pipeline state of chunk c of block n: stage (n % 2) * NC + c, one fill every other block (two slots)."""
        lap = (n // 2) % 2
        return pipeline.PipelineState(self.stages, n * self.NC + c, (n % 2) * self.NC + c,
                                      lap ^ 1 if producer else lap)

    def gather_lag(self):
        return self.LAG
