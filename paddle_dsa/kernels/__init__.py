"""Seams between paddle_dsa and the CuTe DSL kernels in paddle_dsa.ops.

One thin function per kernel entry: export the Paddle tensors through the port (DLPack, no host
sync), take Paddle's current stream, allocate outputs in Paddle, call the ops seam. The GPU test
harness calls the same ops seam with torch tensors, so what the H200 tests run is what Paddle calls.
"""
