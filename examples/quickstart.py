"""A real paddle_dsa example: one training step of a tiny causal self-attention block.

Runs on the GPU kernels when Paddle has a CUDA place and the kernels support the shape, else on the
pure-Paddle reference path (CPU). Prints the loss, the gradient norms and a check against naive
attention computed with plain Paddle ops.
"""
import math

import numpy as np
import paddle

import paddle_dsa
from paddle_dsa.nn import functional as F


def naive_attention(q, k, v, causal):
    """[B, S, H, D] attention with plain Paddle ops (GQA by repeating key/value heads)."""
    h, hkv = q.shape[2], k.shape[2]
    k = paddle.repeat_interleave(k, h // hkv, axis=2)
    v = paddle.repeat_interleave(v, h // hkv, axis=2)
    q, k, v = (x.astype("float32").transpose([0, 2, 1, 3]) for x in (q, k, v))
    s = paddle.matmul(q, k, transpose_y=True) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s + paddle.triu(paddle.full([n, n], float("-inf")), diagonal=1)
    return paddle.matmul(paddle.nn.functional.softmax(s, axis=-1), v).transpose([0, 2, 1, 3])


def main():
    paddle.seed(0)
    use_gpu = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
    paddle.set_device("gpu" if use_gpu else "cpu")
    dtype = "bfloat16"
    batch, seq, heads, kv_heads, head_dim, model = 2, 256, 8, 2, 64, 512

    x = paddle.randn([batch, seq, model])
    wq = paddle.create_parameter([model, heads * head_dim], "float32")
    wkv = paddle.create_parameter([model, 2 * kv_heads * head_dim], "float32")
    q = paddle.matmul(x, wq).reshape([batch, seq, heads, head_dim]).astype(dtype)
    k, v = paddle.matmul(x, wkv).reshape([batch, seq, 2, kv_heads, head_dim]).astype(dtype).unbind(axis=2)

    out, lse = F.flash_attention(q, k, v, causal=True, return_softmax_lse=True)
    loss = out.astype("float32").square().mean()
    loss.backward()

    ref = naive_attention(q, k, v, causal=True)
    err = float((out.astype("float32") - ref).abs().max())
    print(f"paddle_dsa {paddle_dsa.__version__} on {'GPU' if use_gpu else 'CPU (reference path)'}, paddle {paddle.__version__}")
    print(f"out {list(out.shape)} {out.dtype}, softmax_lse {list(lse.shape)} {lse.dtype}")
    print(f"loss {float(loss):.6f}; |grad wq| {float(wq.grad.norm()):.4f}; |grad wkv| {float(wkv.grad.norm()):.4f}")
    bound = float(ref.abs().max()) * 2.0**-8  # one bf16 ulp at the largest output
    print(f"max |out - naive attention| = {err:.2e} (one bf16 ulp of max |out|: {bound:.2e})")
    assert np.isfinite(err) and err <= bound, "flash_attention disagrees with naive attention"
    print("OK")


if __name__ == "__main__":
    main()
