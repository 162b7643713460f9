"""Precompilation: ``compileAndExport``, ``save``, ``loadExecutable`` and ``poptorch.load``
(poptorch reference §5.2; a mixin of :class:`poptorch.execution._executor.PoplarExecutor`).

ipupod compiles nothing, so an export holds what a model needs to be made again: the
PopTorch version, whether it trains, its options, the user's model (``export_model``), the
optimizer and its state, and the replicas' random state. It is written with ``torch.save``
(pickle, as PopTorch's own exports; load only files you trust). A loaded model compiles on
its first call.
"""

from __future__ import annotations

import torch

from poptorch._errors import createPoptorchError
from poptorch.execution._executor_weights import NO_EXECUTABLE_ERR
from poptorch._version import __version__

__all__ = ["ExecutorExport", "read_export", "EXPORT_KIND"]

#: the marker of an ipupod PopTorch export
EXPORT_KIND = "ipupod-poptorch-export"


class ExecutorExport:
    """PopTorch's precompilation methods of a model."""

    def compileAndExport(self, filename: str, *args, export_model: bool = True,
                         **kwargs) -> None:
        """Compile for ``args``/``kwargs`` (without running) and :meth:`save` to ``filename``."""
        if not self.isCompiled():
            self.compile(*args, **kwargs)
        self.save(filename, export_model=export_model)

    def save(self, filename: str, export_model: bool = True,
             save_rng_state: bool = True) -> None:
        """Write the model's export to ``filename`` (module docstring).

        Raises:
            poptorch.Error: not compiled.
        """
        if not self.isCompiled():
            raise createPoptorchError(NO_EXECUTABLE_ERR)
        torch.save({
            "kind": EXPORT_KIND, "poptorch_version": __version__, "training": self._training,
            "options": self._options, "model": self._user_model if export_model else None,
            "optimizer": self._optimizer if self._training and export_model else None,
            "optimizer_state": self._optimizer.state_dict() if self._training else None,
            "rng_state": self.rng_state if save_rng_state else None,
        }, filename)

    def loadExecutable(self, filename: str) -> None:
        """Check that ``filename`` is an export of this kind of model (training or
        inference); the emulation has no executable to load and compiles at the first call.

        Raises:
            poptorch.Error: not an export, or one of the other kind of model.
        """
        data = read_export(filename)
        if data["training"] != self._training:
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
