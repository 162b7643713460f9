"""Weights and optimizer of a ``PoplarExecutor``: PopTorch's copies between host and device
and ``setOptimizer`` (a mixin of :class:`poptorch.execution._executor.PoplarExecutor`; reference
§5.5,
§6.3)."""

from __future__ import annotations

import torch

from poptorch import enums
from poptorch.execution._device_optim import (check_constants, load_state, native_class,
                                              needs_running_mean)
from poptorch._errors import createPoptorchError

__all__ = ["ExecutorWeights", "NO_EXECUTABLE_ERR"]

NO_EXECUTABLE_ERR = "Model has not been compiled or has been destroyed."


class ExecutorWeights:
    """PopTorch's weight and optimizer methods of a model."""

    def copyWeightsToDevice(self) -> None:
        """Host weights (and optimizer state) to every replica. Replica 0's weights are the
        host's; the others get copies.

        Raises:
            poptorch.Error: not compiled.
        """
        if not self._compiled:
            raise createPoptorchError(NO_EXECUTABLE_ERR)
        self._replicas.upload()
        for r in range(1, len(self._optimizers)):
            load_state(self._optimizers[r], self._optimizer, self._replicas.mapping(r))

    def copyWeightsToHost(self) -> None:
        """Device weights to the host: nothing to copy, the host's weights are replica 0's
        (always up to date after a call).

        Raises:
            poptorch.Error: not compiled.
        """
        if not self._compiled:
            raise createPoptorchError(NO_EXECUTABLE_ERR)

    def copyWeightsToHostIfNeeded(self) -> bool:
        """False: the host weights are never out of date (see :meth:`copyWeightsToHost`)."""
        return False

    def copyNamedBuffersToDevice(self) -> None:
        """Copy the buffers named by ``updatableNamedBuffers`` from host to the replicas.

        Raises:
            poptorch.Error: no buffers were named.
        """
        if not self._options.exists("updatable_named_buffers"):
            raise createPoptorchError("No named buffers marked as updatable via "
                                      "updatableNamedBuffers option")
        if self._replicas is None:
            return
        names = set(self._options.updatable_named_buffers)
        host = dict(self._replicas.modules[0].named_buffers())
        with torch.no_grad():
            for module in self._replicas.modules[1:]:
                for name, buffer in module.named_buffers():
                    if name in names:
                        buffer.copy_(host[name])

    def load_state_dict(self, state_dict: dict, strict: bool = True):
        """Load into the user's model, then into the replicas when attached."""
        result = self._user_model.load_state_dict(state_dict, strict)
        if self.isAttachedToDevice():
            self.copyWeightsToDevice()
        return result

    def state_dict(self, *args, **kwargs) -> dict:
        return self._user_model.state_dict(*args, **kwargs)

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Take ``optimizer``'s hyper-parameters (the only way a change of them, e.g. by an
        LR scheduler, reaches the device).

        Raises:
            poptorch.Error: a hyper-parameter compiled as a constant changed.
            ValueError: the optimizer needs the Running mean strategy after compiling.
        """
        native_class(optimizer)
        strategy = self._options.Training.meanAccumulationAndReplicationReductionStrategy
        if needs_running_mean(optimizer) and strategy != enums.MeanReductionStrategy.Running:
            if self._compiled:
                raise ValueError(
                    "Invalid optimizer: the new optimizer would require changing "
                    "options.Training.meanAccumulationAndReplicationReductionStrategy to "
                    "poptorch.MeanReductionStrategy.Running but the executable is already "
                    "compiled.")
            self._options.Training._values["meanAccumulationAndReplicationReductionStrategy"] \
                = enums.MeanReductionStrategy.Running
        if not self._compiled:
            self._optimizer = optimizer
            return
        check_constants(self._constants, optimizer)
        if type(optimizer) is type(self._optimizer) and optimizer is self._optimizer:
            for replica in self._optimizers:
                replica.refresh(optimizer)
            return
        old = self._optimizer
        if not optimizer.state and type(optimizer) is type(old):
            optimizer.state.update(old.state)  # carry the device state over
        self._optimizer = optimizer
        self._make_optimizers()
