"""Attention over an empty problem (no batch, no query row or no key): the documented result, built in Paddle on
every place, with no kernel launch and no reference-path arithmetic on zero-size tensors. Also the sparse-stage
indexer KL loss over nothing (no query row, no key or no top-k slot): 0, zero gradients (empty_loss).

    out = 0 (shape out_shape, the query's dtype), softmax_lse = -inf (lse_shape, float32): a row that sees no key
    gradients: zeros for every input that wants one (a zero-size tensor where the input is empty)
An empty axis gives empty outputs; Sk = 0 with rows present gives those rows out 0 and lse -inf, the rule of rows
that see no key.
"""
import paddle

from ..._port import PORT


class EmptyAttention(paddle.autograd.PyLayer):
    """apply(*tensor_inputs, out_shape, lse_shape) -> (out, lse)."""

    @staticmethod
    def forward(ctx, *args):
        out_shape, lse_shape = args[-2], args[-1]
        inputs = args[:-2]
        ctx.shapes = [(list(PORT.shape(t)), t.dtype) for t in inputs]
        ctx.want = PORT.grad_wanted(inputs)
        ctx.set_materialize_grads(False)
        out = paddle.zeros(list(out_shape), dtype=inputs[0].dtype)
        lse = paddle.full(list(lse_shape), float("-inf"), dtype=paddle.float32)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        grads = [paddle.zeros(shape, dtype=dtype) for shape, dtype in ctx.shapes]
        return PORT.input_grads(ctx.want, grads)


def empty_attention(inputs, out_shape, lse_shape):
    """(out, lse) of an empty problem, differentiable into `inputs` (zeros)."""
    return EmptyAttention.apply(*inputs, tuple(out_shape), tuple(lse_shape))


class EmptyLoss(paddle.autograd.PyLayer):
    """apply(*tensor_inputs) -> float32 scalar 0 (a loss over no entry); zero gradients."""

    @staticmethod
    def forward(ctx, *inputs):
        ctx.shapes = [(list(PORT.shape(t)), t.dtype) for t in inputs]
        ctx.want = PORT.grad_wanted(inputs)
        ctx.set_materialize_grads(False)
        return paddle.zeros([], dtype=paddle.float32)

    @staticmethod
    def backward(ctx, dloss):
        return PORT.input_grads(ctx.want, [paddle.zeros(shape, dtype=dtype) for shape, dtype in ctx.shapes])


def empty_loss(inputs):
    """The float32 scalar 0 of a loss over no entry, differentiable into `inputs` (zeros)."""
    return EmptyLoss.apply(*inputs)
