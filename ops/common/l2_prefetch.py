"""L2 prefetch of a contiguous span of global memory (Hopper sm_90a): cp.async.bulk.prefetch.L2.

One instruction asks the TMA unit to bring `nbytes` at a 16-byte aligned global address into L2. It writes no shared
memory and has no completion to wait for: a later ordinary load of those bytes hits L2 if they are still there. The
streaming top-k (ops/dsa/topk/stream_sm90.py, L2_START / L2_AHEAD) uses it to keep its row's DRAM reads in flight
two tiles ahead while its threads work on the tile before.
"""
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm


def prefetch_l2_bulk(g, nbytes):
    """Prefetch nbytes (Int32, a positive multiple of 16) of global memory at byte address g (Int64, 16-byte aligned)
    into L2. The caller keeps the span inside the tensor it belongs to."""
    llvm.inline_asm(None, [Int64(g).ir_value(), Int32(nbytes).ir_value()],
                    "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", has_side_effects=True)
