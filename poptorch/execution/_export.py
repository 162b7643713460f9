"""Precompilation: the file of ``compileAndExport``/``save``, read by ``loadExecutable`` and
``poptorch.load`` (poptorch reference §5.2).

ipupod compiles nothing, so an export holds what a model needs to be made again: the
PopTorch version, whether it trains, its options, the user's model (``export_model``), the
optimizer and its state, and the replicas' random state. It is written with ``torch.save``
(pickle, as PopTorch's own exports; load only files you trust). A loaded model compiles on
its first call.
"""

from __future__ import annotations

import torch

from poptorch._errors import createPoptorchError
from poptorch.execution._info import rng_state
from poptorch._version import __version__

__all__ = ["write_export", "read_export", "check_export", "EXPORT_KIND"]

#: the marker of an ipupod PopTorch export
EXPORT_KIND = "ipupod-poptorch-export"


def write_export(filename: str, exe, user_model: torch.nn.Module, optimizer, *,
                 export_model: bool = True, save_rng_state: bool = True) -> None:
    """Write the export of compiled ``exe`` (module docstring) to ``filename``;
    ``user_model`` and ``optimizer``: the user's."""
    torch.save({
        "kind": EXPORT_KIND, "poptorch_version": __version__, "training": exe.training,
        "options": exe.options, "model": user_model if export_model else None,
        "optimizer": optimizer if exe.training and export_model else None,
        "optimizer_state": optimizer.state_dict() if exe.training else None,
        "rng_state": rng_state(exe) if save_rng_state else None,
    }, filename)


def check_export(filename: str, training: bool) -> None:
    """Check that ``filename`` is an export of this kind of model (``training`` or
    inference).

    Raises:
        poptorch.Error: not an export, or one of the other kind of model.
    """
    data = read_export(filename)
    if data["training"] != training:
        kind = "a training" if data["training"] else "an inference"
        raise createPoptorchError(f"{filename} is the export of {kind} model")


def read_export(filename: str) -> dict:
    """The contents of an export file.

    Raises:
        poptorch.Error: not an export of ipupod's.
    """
    data = torch.load(filename, weights_only=False)
    if not isinstance(data, dict) or data.get("kind") != EXPORT_KIND:
        raise createPoptorchError(f"{filename} is not a PopTorch export of ipupod")
    return data
