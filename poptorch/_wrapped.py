"""Which user modules a training model wraps now (one at a time per module, until
``destroy()``; PopTorch re-classes the module, ipupod keeps a weak set)."""

from __future__ import annotations

import weakref

import torch

__all__ = ["is_wrapped", "mark_wrapped", "unwrap"]

_wrapped: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def is_wrapped(model: torch.nn.Module) -> bool:
    return model in _wrapped


def mark_wrapped(model: torch.nn.Module) -> None:
    _wrapped.add(model)


def unwrap(model: torch.nn.Module) -> None:
    """Forget that ``model`` is wrapped by a training model.

    Raises:
        RuntimeError: it is not ("model was never wrapped").
    """
    if model not in _wrapped:
        raise RuntimeError("model was never wrapped")
    _wrapped.discard(model)
