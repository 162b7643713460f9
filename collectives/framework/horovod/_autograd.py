"""horovod.torch's collectives as autograd functions: when a torch tensor that requires a
gradient goes into ``allreduce``, ``grouped_allreduce``, ``allgather`` or ``broadcast``,
the result is part of the graph and its gradient flows back through the collective
horovod.torch uses for it (an allreduce of the gradient with the same op; the allreduce,
averaged, of an allgather's or a broadcast's gradient, sliced or zeroed as horovod.torch
does). Built on first use from ``sys.modules["torch"]`` (this module imports no torch).
"""

from __future__ import annotations

from typing import Callable, Sequence

from collectives.framework.horovod._tensors import is_torch, torch_module

_FUNCTION: list = []  # the torch.autograd.Function class, made once


def wants_graph(tensors: Sequence) -> bool:
    """Whether a torch input requires a gradient while gradients are recorded."""
    return any(is_torch(t) and t.requires_grad for t in tensors) and \
        torch_module().is_grad_enabled()


def _function():
    if not _FUNCTION:
        torch = torch_module()

        class HorovodCollective(torch.autograd.Function):
            """A collective in the autograd graph (module docstring)."""

            @staticmethod
            def forward(ctx, spec, *tensors):
                ctx.backward_of = spec[1]
                out = spec[0](*tensors)
                return tuple(out) if isinstance(out, list) else out

            @staticmethod
            def backward(ctx, *grads):
                return (None, *ctx.backward_of(*grads))

        _FUNCTION.append(HorovodCollective)
    return _FUNCTION[0]


def apply(forward: Callable, backward: Callable, tensors: Sequence):
    """``forward(*tensors)`` (a tensor, or a list of them) recorded in the graph, with
    ``backward(*grads)`` returning the gradients of ``tensors`` (a tuple)."""
    out = _function().apply((forward, backward), *tensors)
    return list(out) if isinstance(out, tuple) else out
