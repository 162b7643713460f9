"""``trainingModel``, ``inferenceModel`` (poptorch reference §5.1) and ``poptorch.load``.

Both wrap ``copy.copy(model)`` (shares the user's submodules, parameters and buffers, not
the top-level ``training`` flag). A module may be wrapped by one training model at a time
(until ``destroy()``), and by any number of inference models.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from poptorch.execution._executor import PoplarExecutor
from poptorch.execution._export import read_export
from poptorch.options._options import Options
from poptorch._wrapped import is_wrapped, mark_wrapped

__all__ = ["trainingModel", "inferenceModel", "load"]


def trainingModel(model: torch.nn.Module | PoplarExecutor, options: Options | None = None,
                  optimizer: torch.optim.Optimizer | None = None) -> PoplarExecutor:
    """A training model: each call runs ``deviceIterations`` optimizer steps on every
    replica (default optimizer ``poptorch.optim.SGD(lr=0.01)``).

    Raises:
        RuntimeError: ``model`` is wrapped by a training model already.
        poptorch.Error: ``options`` is not a ``poptorch.Options``.
        AssertionError: an unsupported optimizer.
    """
    if isinstance(model, PoplarExecutor):
        model = model._user_model
    if is_wrapped(model):
        raise RuntimeError("Model has already been wrapped in 'poptorch.trainingModel'. Call "
                           "model.destroy() on the model to unwrap before wrapping again.")
    _check_buffers(model)
    executor = PoplarExecutor(copy.copy(model), options, True, optimizer, user_model=model)
    mark_wrapped(model)
    return executor


def inferenceModel(model: torch.nn.Module | PoplarExecutor,
                   options: Options | None = None) -> PoplarExecutor:
    """An inference model: each call runs ``deviceIterations`` batches on every replica.
    Built from a module that a training model trains, it sees the trained weights.

    Raises:
        poptorch.Error: ``options`` is not a ``poptorch.Options``, or gradient accumulation
            is not 1.
    """
    if isinstance(model, PoplarExecutor):
        model = model._user_model
    return PoplarExecutor(copy.copy(model), options, False, user_model=model)


def _check_buffers(model: torch.nn.Module) -> None:
    for _, buffer in model.named_buffers():
        if buffer is not None and not isinstance(buffer, torch.Tensor):
            raise RuntimeError("All buffers must be an instance of torch.Tensor")


def load(filename: str, edit_opts_fn: Callable | None = None):
    """The model exported in ``filename``, ready to run (``poptorch.load``).

    Args:
        edit_opts_fn: called with the loaded options before the model is made.

    Raises:
        AssertionError: the export holds no model (``export_model=False``): make the model
            and call ``loadExecutable`` on it.
        poptorch.Error: not an export.
    """
    data = read_export(filename)
    if data["model"] is None:
        raise AssertionError("The model was not exported (export_model=False): the model "
                             "must be re-created by the user and loadExecutable() called on "
                             "its PopTorch wrapper")
    options = data["options"].clone()
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    if data["training"]:
        optimizer = data["optimizer"]
        if optimizer is not None and data["optimizer_state"] is not None:
            optimizer.load_state_dict(data["optimizer_state"])
        executor = trainingModel(data["model"], options, optimizer)
    else:
        executor = inferenceModel(data["model"], options)
    executor._set_loaded_rng_state(data["rng_state"])
    return executor
