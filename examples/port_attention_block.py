"""Porting a PaddleFormers-style attention block to paddle_dsa by changing one import.

The block below is written the way Paddle model code calls attention (Paddle 3.3's
paddle.nn.functional.scaled_dot_product_attention, [batch, seq, heads, head_dim], causal). Run as a script it
trains the block for a few steps twice from the same weights and data: once with Paddle's own function, once
with paddle_dsa.compat's (the one-line switch below), and prints both losses and their difference (CPU: the
reference path; on an H200 with a CUDA Paddle: the kernels).

    python examples/port_attention_block.py
"""
import numpy as np
import paddle

import paddle_dsa.compat as dsa_compat

# The switch: Paddle's own ...
PADDLE_SDPA = paddle.nn.functional.scaled_dot_product_attention
# ... or paddle_dsa's, with the same signature:   from paddle_dsa.compat import scaled_dot_product_attention
DSA_SDPA = dsa_compat.scaled_dot_product_attention


class AttentionBlock(paddle.nn.Layer):
    """q/k/v projections, causal GQA attention, output projection (PaddleFormers-style, [b, s, h, d] layout)."""

    def __init__(self, hidden=64, heads=4, kv_heads=2, sdpa=PADDLE_SDPA):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, hidden // heads
        self.q = paddle.nn.Linear(hidden, heads * self.d)
        self.kv = paddle.nn.Linear(hidden, 2 * kv_heads * self.d)
        self.o = paddle.nn.Linear(heads * self.d, hidden)
        self.sdpa = sdpa

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).reshape([b, s, self.h, self.d])
        k, v = self.kv(x).reshape([b, s, 2, self.hkv, self.d]).unbind(2)
        out = self.sdpa(q, k, v, is_causal=True)
        return self.o(out.reshape([b, s, self.h * self.d]))


def train(sdpa, steps=3, seed=0):
    paddle.seed(seed)
    block = AttentionBlock(sdpa=sdpa)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=block.parameters())
    rng = np.random.default_rng(seed)
    x = paddle.to_tensor(rng.standard_normal((2, 16, 64)).astype(np.float32))
    y = paddle.to_tensor(rng.standard_normal((2, 16, 64)).astype(np.float32))
    losses = []
    for _ in range(steps):
        loss = ((block(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    return losses


def main():
    ours, theirs = train(DSA_SDPA), train(PADDLE_SDPA)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        print(f"step {i}: paddle_dsa {a:.7f}  paddle {b:.7f}  |diff| {abs(a - b):.2e}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print("OK" if worst < 1e-5 else f"MISMATCH (relative {worst:.2e})")
    return worst


if __name__ == "__main__":
    main()
