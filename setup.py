"""paddle_dsa: flash attention and DeepSeek Sparse Attention kernels for PaddlePaddle (CuTe DSL, sm90).

Install (CPU reference path + tests):   pip install -e .[test]
Paddle itself is not pinned by distribution name (paddlepaddle or paddlepaddle-gpu both work); the
`paddle-*` extras pull the CPU wheel and the pins of one release line (see ports/).
"""
from setuptools import setup

PACKAGES = {
    "paddle_dsa": "paddle_dsa",
    "paddle_dsa.nn": "paddle_dsa/nn",
    "paddle_dsa.nn.functional": "paddle_dsa/nn/functional",
    "paddle_dsa.reference": "paddle_dsa/reference",
    "paddle_dsa.reference.dsa": "paddle_dsa/reference/dsa",
    "paddle_dsa.kernels": "paddle_dsa/kernels",
    "paddle_dsa.ops": "ops",
    "paddle_dsa.ops.common": "ops/common",
    "paddle_dsa.ops.flash_attention": "ops/flash_attention",
    "paddle_dsa.ops.dsa": "ops/dsa",
    "paddle_dsa.ports": "ports",
    "paddle_dsa.ports.paddle_2_6": "ports/paddle_2_6",
    "paddle_dsa.ports.paddle_3_0": "ports/paddle_3_0",
    "paddle_dsa.ports.paddle_3_3": "ports/paddle_3_3",
}

# The CuTe DSL compiles the kernels at first use; its CUDA 13 libraries come with the `cu13` extra
# (the default wheel set targets CUDA 12 drivers).
DSL = "nvidia-cutlass-dsl==4.8.1"
DSL_CU13 = "nvidia-cutlass-dsl[cu13]==4.8.1"
# Kernels are compiled with the DSL's TVM-FFI entry (--enable-tvm-ffi) and called with tvm_ffi tensors: a launch
# costs microseconds of host time instead of the DSL's Python argument marshalling (ops/common/tensors.py).
TVM_FFI = "apache-tvm-ffi>=0.1.15,<0.2"

setup(
    name="paddle_dsa",
    version="0.1.0",
    description="Flash attention and DeepSeek Sparse Attention for PaddlePaddle (CuTe DSL, Hopper)",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    install_requires=["numpy", DSL, TVM_FFI],
    extras_require={
        "cu13": [DSL_CU13],
        "test": ["pytest>=7", "pytest-xdist>=3", "paddlepaddle==3.3.1", DSL_CU13],
        "paddle-3.3": ["paddlepaddle==3.3.1"],
        "paddle-3.0": ["paddlepaddle==3.0.0"],
        "paddle-3.2": ["paddlepaddle==3.2.2"],
        "paddle-2.6": ["paddlepaddle==2.6.2", "protobuf>=4.21.12,<5", "numpy<2"],
        # optional: the PaddleFormers registry test against the real library (tests/test_integrations_paddleformers.py)
        "paddleformers": ["paddleformers==1.2.0"],
    },
)
