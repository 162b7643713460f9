"""The copies of a model on its local replicas, and keeping them in sync with the host
(poptorch reference §5.5).

Replica 0 *is* the executor's shallow copy of the user's module (PopTorch's
``copy.copy(model)``): it shares the user's parameters and buffers, so after a training
call the user's module holds the trained weights with no copy, and an ``inferenceModel`` of
the same module sees them. Replicas 1..R-1 are deep copies; :meth:`Replicas.upload` copies
replica 0's weights into them (PopTorch's ``copyWeightsToDevice``). A change of the host
weights made outside the model (their identity or ``_version`` counters differ from the
last upload or call) is uploaded before the next call: PopTorch needs an explicit
``copyWeightsToDevice()`` there; the emulation, where replica 0 is the host copy, does it
so that replicas never diverge.

The ``training`` flags of every submodule are those the model had when compiled (PopTorch
compiles the mode in); they are set around each call and restored after.
"""

from __future__ import annotations

import copy
from typing import Iterator

import torch

__all__ = ["Replicas"]


class Replicas:
    """``count`` copies of ``module`` (replica 0 is ``module`` itself)."""

    def __init__(self, module: torch.nn.Module, count: int):
        self.modules = [module] + [copy.deepcopy(module) for _ in range(count - 1)]
        self.flags = [m.training for m in module.modules()]
        for replica in self.modules[1:]:
            self._apply_flags(replica, self.flags)
        self._signature = self.host_signature()

    def tensors(self, r: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Named parameters then buffers of replica r (every replica in the same order)."""
        module = self.modules[r]
        yield from module.named_parameters()
        yield from ((name, b) for name, b in module.named_buffers() if b is not None)

    def mapping(self, r: int) -> dict[int, torch.Tensor]:
        """The host's parameter (by ``id``) -> replica r's parameter."""
        host = [p for _, p in self.modules[0].named_parameters()]
        mine = [p for _, p in self.modules[r].named_parameters()]
        return {id(h): m for h, m in zip(host, mine)}

    def host_signature(self) -> tuple:
        return tuple((id(t), t._version) for _, t in self.tensors(0))

    def host_changed(self) -> bool:
        """Whether the host weights changed since the last :meth:`mark_synced`."""
        return self.host_signature() != self._signature

    def mark_synced(self) -> None:
        self._signature = self.host_signature()

    @torch.no_grad()
    def upload(self) -> None:
        """Copy replica 0's parameters and buffers into the other replicas."""
        host = [t for _, t in self.tensors(0)]
        for r in range(1, len(self.modules)):
            for mine, theirs in zip((t for _, t in self.tensors(r)), host):
                mine.copy_(theirs)
        self.mark_synced()

    @staticmethod
    def _apply_flags(module: torch.nn.Module, flags: list[bool]) -> None:
        for m, flag in zip(module.modules(), flags):
            m.training = flag

    def enter_compiled_mode(self) -> list[bool]:
        """Set replica 0's flags to the compiled ones; returns the user's to restore."""
        saved = [m.training for m in self.modules[0].modules()]
        if saved != self.flags:
            self._apply_flags(self.modules[0], self.flags)
        return saved

    def restore_mode(self, saved: list[bool]) -> None:
        if saved != self.flags:
            self._apply_flags(self.modules[0], saved)

    def changed_buffers(self, before: tuple) -> list[str]:
        """Names of replica 0's buffers the model's own code modified in place since
        ``before`` (:meth:`buffer_versions`): PopTorch's "does not support broadcasting
        buffers" rule. The running statistics of batch and instance norms are not among
        them: the norm operation updates them itself, and each replica keeps its own, as on
        the IPU (Graphcore's CNN application trains BatchNorm ResNets on 16 replicas with the
        default ``broadcastBuffers(True)``). The host copy of the model is replica 0
        (module docstring), so its running statistics are replica 0's: those of the
        instance's first local replica (global replica ``popdist.getReplicaIndexOffset()``),
        as PopTorch's ``copyWeightsToHost`` reads the first replica's copy of a tensor
        that is not kept in sync."""
        now = self.buffer_versions()
        norm = _norm_statistics(self.modules[0])
        return [name for (name, v0), (_, v1) in zip(before, now) if v0 != v1 and name not in norm]

    def buffer_versions(self) -> tuple:
        return tuple((name, b._version) for name, b in self.modules[0].named_buffers()
                     if b is not None)


def _norm_statistics(module: torch.nn.Module) -> set[str]:
    """The names of the running statistics (``running_mean``, ``running_var``,
    ``num_batches_tracked``) of the batch and instance norms in ``module``."""
    found = set()
    for prefix, m in module.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats:
            found.update(f"{prefix}.{b}" if prefix else b
                         for b in ("running_mean", "running_var", "num_batches_tracked"))
    return found
