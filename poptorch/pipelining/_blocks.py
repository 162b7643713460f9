"""Block annotations: which IPU of a replica each part of a model runs on (poptorch reference
§7.1, PT python/ops.py ``Block``, ``BeginBlock``, ``BlockFunction``, ``removeBlocks``).

A block begins when a ``with poptorch.Block(...)`` is entered, when ``Block.start`` is
called, or when a module given to ``BeginBlock`` is called (a forward pre-hook); the
operations that follow belong to it until the next block begins (leaving a ``with Block``
keeps them there: PopART places an operation without a block with its inputs'). Blocks
without a ``user_id`` get automatic ids "0", "1", ... in the order they begin in each forward
pass (``Block.useAutoId()`` starts again from "0"). The strategy of the options
(:mod:`poptorch.pipelining._strategies`) maps each block to a stage and an IPU.

Outside a PopTorch model's forward pass (plain CPU PyTorch) the annotations do nothing, as in
PopTorch. Inside one, the forward pass running in this thread (a
:class:`poptorch.pipelining._stage_trace.StageTrace`, the trace of the thread's
:func:`poptorch._forward_pass.current_pass`) is told of each block.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import torch

from poptorch._errors import createPoptorchError
from poptorch._forward_pass import current_pass

__all__ = ["Block", "BeginBlock", "BlockFunction", "removeBlocks", "LegacyBeginBlockFn",
           "current_forward"]


def current_forward():
    """The forward pass of a PopTorch model that follows the blocks in this thread (a
    :class:`~poptorch.pipelining._stage_trace.StageTrace`), or None."""
    forward = current_pass()
    return forward.forward if forward is not None else None


def _begin(user_id: str | None, ipu_id: int | None) -> None:
    forward = current_forward()
    if forward is not None:
        forward.begin_block(forward.next_auto_id() if user_id is None else user_id, ipu_id)


def _begin_module(user_id: str | None, ipu_id: int | None, inputs: tuple) -> tuple | None:
    """A block begins with a call of its module: the inputs the module gets (None: its
    own), those of earlier stages as their copies in a pipelined training forward."""
    forward = current_forward()
    if forward is None:
        return None
    return forward.begin_module(forward.next_auto_id() if user_id is None else user_id,
                                ipu_id, inputs)


class Block(torch.nn.Module):
    """A context manager: the operations inside run in block ``user_id`` on IPU ``ipu_id``
    of the replica (an index within the replica, not a gc-info device id).

    >>> with poptorch.Block("Encoder", ipu_id=1):
    ...     x = self.encoder(x)
    """

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None):
        super().__init__()
        self._user_id = user_id
        self._ipu_id = ipu_id

    @staticmethod
    def useAutoId() -> None:
        """Start the automatic block ids again from "0" (call it at the start of
        ``forward``)."""
        forward = current_forward()
        if forward is not None:
            forward.reset_auto_id()

    @staticmethod
    def start(user_id: str | None = None, ipu_id: int | None = None) -> None:
        """Begin a block without a ``with`` statement."""
        _begin(user_id, ipu_id)

    def __enter__(self) -> None:
        Block.start(self._user_id, self._ipu_id)

    def __exit__(self, *exc) -> None:
        return None


class LegacyBeginBlockFn(torch.nn.Module):
    """``BeginBlock`` of a callable that is not a module: calling it begins the block, then
    calls it."""

    def __init__(self, layer_to_call: Callable, user_id: str | None = None,
                 ipu_id: int | None = None):
        super().__init__()
        self._layer_to_call = layer_to_call
        self._user_id, self._ipu_id = user_id, ipu_id

    def __call__(self, *args, **kwargs) -> Any:
        _begin(self._user_id, self._ipu_id)
        return self._layer_to_call(*args, **kwargs)


class _BlockHook:
    """The forward pre-hook of ``BeginBlock``: the block begins, and the module gets the
    tensors of earlier stages as the stage's copies of them (the cut between the stages'
    autograd graphs, :class:`~poptorch.pipelining._stage_trace.StageTrace`)."""

    def __init__(self, user_id: str | None, ipu_id: int | None) -> None:
        self._user_id, self._ipu_id = user_id, ipu_id

    def __call__(self, module: torch.nn.Module, inputs: tuple) -> tuple | None:
        return _begin_module(self._user_id, self._ipu_id, inputs)

    def __repr__(self) -> str:
        return f"BeginBlock(user_id={self._user_id}, ipu_id={self._ipu_id})"


def BeginBlock(layer_to_call: Any, user_id: str | None = None,
               ipu_id: int | None = None) -> Any:
    """Put ``layer_to_call`` and every later layer, up to the next block, in block
    ``user_id`` on IPU ``ipu_id``. Returns the module (a callable that is not a module comes
    back wrapped in :class:`LegacyBeginBlockFn`).

    Raises:
        poptorch.Error: "module has already been assigned to a block." or "module is not an
            instance of torch.nn.Module or function."
    """
    if not isinstance(layer_to_call, torch.nn.Module):
        if callable(layer_to_call):
            return LegacyBeginBlockFn(layer_to_call, user_id, ipu_id)
        raise createPoptorchError("module is not an instance of torch.nn.Module or function.")
    if any(isinstance(h, _BlockHook) for h in layer_to_call._forward_pre_hooks.values()):
        raise createPoptorchError("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def BlockFunction(user_id: str | None = None, ipu_id: int | None = None) -> Callable:
    """A decorator: the decorated function runs in block ``user_id`` on IPU ``ipu_id``."""
    def decorator(func: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            with Block(user_id, ipu_id):
                return func(*args, **kwargs)
        wrapper.__name__ = getattr(func, "__name__", "wrapper")
        wrapper.__doc__ = getattr(func, "__doc__", None)
        return wrapper
    return decorator


def removeBlocks(module: torch.nn.Module) -> None:
    """Remove the ``BeginBlock`` annotations of ``module`` and its submodules.

    Raises:
        AssertionError: ``module`` is not a module.
    """
    if not isinstance(module, torch.nn.Module):
        raise AssertionError("removeBlocks expects a torch.nn.Module")
    for m in module.modules():
        m._forward_pre_hooks = OrderedDict(
            (k, h) for k, h in m._forward_pre_hooks.items() if not isinstance(h, _BlockHook))
