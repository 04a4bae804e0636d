"""A backward whose gradients are not themselves differentiable, and say so when differentiated.

The Triton kernels compute gradients, not a graph of them. ``torch.autograd.function.once_differentiable``
raises on a second derivative only when the incoming gradient requires grad; in
``torch.autograd.grad(out.sum(), q, create_graph=True)`` it does not (the gradient of a sum is a constant), so
the returned ``dq`` would simply not require grad, and a gradient penalty built from it would read as zero and be
dropped without a word. :func:`differentiable_once` raises in that case too.
"""

from __future__ import annotations

import functools

import torch

FORWARD_MODE_MESSAGE = ("mta's fused kernels have no forward-mode derivative (torch.func.jvp, jacfwd, "
                        "torch.autograd.forward_ad): use reverse mode (backward, torch.func.grad, vjp, jacrev), or "
                        "mta.conv_attention_reference or mta.naive_attention")

MESSAGE = ("mta's fused kernels are differentiable once: trying to differentiate twice (a derivative of their "
           "gradients, e.g. a gradient penalty) is not supported; use mta.conv_attention_reference or "
           "mta.naive_attention for that")


class _RaisesWhenDifferentiated(torch.autograd.Function):
    """Identity on its first ``n`` inputs (copies: a view made inside a Function could not be modified in place,
    as a gradient may be), its outputs differentiable where any input is; its backward raises. The other inputs
    (the forward's, requiring grad) only tie the outputs to the graph: ``requires_grad_()`` on a gradient instead
    would be refused under ``torch.func.grad``."""

    generate_vmap_rule = True  # clones: under torch.func.vmap too

    @staticmethod
    def forward(n, *tensors):
        return tuple(g.clone() for g in tensors[:n])

    @staticmethod
    def setup_context(ctx, inputs, output):  # apart from forward: what torch.func's transforms need
        pass

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(MESSAGE)


def differentiable_once(backward):
    """Decorates an ``autograd.Function.backward``: it runs without building a graph and, when autograd is asked
    for a graph of the gradients (``create_graph=True``), its tensor outputs come back requiring grad through a
    node that raises :data:`MESSAGE` if anything differentiates them."""

    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        if not torch.is_grad_enabled():  # the usual backward: no graph is being built
            return backward(ctx, *grad_outputs)
        with torch.no_grad():
            grads = backward(ctx, *grad_outputs)
        tensors = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
        inputs = [t for t in ctx.saved_tensors if t.requires_grad]  # a gradient is wanted: one at least
        marked = _RaisesWhenDifferentiated.apply(len(tensors), *(grads[i] for i in tensors), *inputs)
        out = list(grads)
        for i, g in zip(tensors, marked):
            out[i] = g
        return tuple(out)

    return wrapper


__all__ = ["FORWARD_MODE_MESSAGE", "MESSAGE", "differentiable_once"]
