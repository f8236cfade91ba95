"""CuTe DSL kernels of paddle_dsa, framework-agnostic.

Tensors come in through DLPack (any object with ``__dlpack__`` / ``__dlpack_device__``), the launch
stream as an integer CUDA stream handle. Nothing here imports Paddle or torch: the same seam functions
are called by ``paddle_dsa`` (through a port's tensor export) and by the GPU test harness (torch tensors).

Installed as ``paddle_dsa.ops``; inside this tree use relative imports only, so it imports as ``ops``
from the repository root too (the H200 machine has no Paddle and no install).
"""
