"""Weights of a compiled model between the host and its replicas: PopTorch's
``copyWeightsToDevice`` and ``copyNamedBuffersToDevice`` as functions of the
:class:`~poptorch.execution._executable.Executable` (poptorch reference §5.5, §6.3)."""

from __future__ import annotations

import torch

from poptorch.execution._device_optim import load_state

__all__ = ["copy_weights_to_device", "copy_named_buffers", "NO_EXECUTABLE_ERR"]

NO_EXECUTABLE_ERR = "Model has not been compiled or has been destroyed."


def copy_weights_to_device(exe, optimizer) -> None:
    """Host weights (and the state of the user's ``optimizer``, training) to every replica
    of ``exe``. Replica 0's weights are the host's; the others get copies."""
    exe.replicas.upload()
    for r in range(1, len(exe.optimizers)):
        load_state(exe.optimizers[r], optimizer, exe.replicas.mapping(r))


def copy_named_buffers(exe, names: set[str]) -> None:
    """Replica 0's buffers named in ``names`` to the other replicas of ``exe``."""
    host = dict(exe.replicas.modules[0].named_buffers())
    with torch.no_grad():
        for module in exe.replicas.modules[1:]:
            for name, buffer in module.named_buffers():
                if name in names:
                    buffer.copy_(host[name])
