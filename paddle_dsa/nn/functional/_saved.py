"""Tensors saved by the package's PyLayers, guarded against in-place changes between forward and backward.

Paddle's own ops raise when a tensor they saved for the backward pass was modified in place; a PyLayer does not,
and its backward would compute gradients from the modified values without a word (flash_attention with its query
scaled in place after the forward: gradients off by more than the largest true gradient). save() records the
inplace version of every tensor it saves (PORT.inplace_version, shared with views); load() returns them and raises
RuntimeError naming the op and the argument when one has changed.
"""
from ..._port import PORT


def save(ctx, op, names, tensors):
    """ctx.save_for_backward(*tensors), remembering each one's name and inplace version."""
    tensors = tuple(tensors)
    assert len(names) == len(tensors), (names, len(tensors))
    ctx.save_for_backward(*tensors)
    ctx.dsa_saved = (op, tuple(names), tuple(PORT.inplace_version(t) for t in tensors))


def load(ctx):
    """The saved tensors, after checking that none was modified in place since the forward."""
    saved = PORT.saved_tensors(ctx)
    op, names, versions = ctx.dsa_saved
    for name, t, seen in zip(names, saved, versions):
        now = PORT.inplace_version(t)
        if now != seen:
            raise RuntimeError(
                f"paddle_dsa.{op}: `{name}`, saved for the backward pass, was modified by an inplace operation "
                f"after the forward (its inplace version is {now}, the forward saw {seen}); the gradients would "
                f"come from the modified values. Modify a copy (x.clone()) instead, or call the op after the "
                f"in-place change.")
    return saved
