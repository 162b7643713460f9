"""``CrossReplicaOptimizer`` (TFI ``ipu/optimizers/cross_replica_optimizer.py``)."""

from __future__ import annotations

from typing import Any, Iterable

from ipu_tensorflow.ipu.optimizers.ipu_optimizer import IpuOptimizer

__all__ = ["CrossReplicaOptimizer", "cross_replica_mean_of"]


def cross_replica_mean_of(grads: list, name: str) -> list:
    """The cross-replica mean of every tensor of ``grads`` as ONE fused collective call
    (``cross_replica_ops.cross_replica_mean`` on the list: one exchange per dtype, the
    canonical tree order, bit-identical to a call per tensor). Must run in a replica
    function (``strategy.run``)."""
    if not grads:
        return []
    from ipu_tensorflow.ipu.ops.cross_replica_ops import cross_replica_mean
    return list(cross_replica_mean(list(grads), name=name))


class CrossReplicaOptimizer(IpuOptimizer):
    """``CrossReplicaOptimizer(opt, name='CrossReplicaOptimizer')``: every gradient
    becomes its **mean** over all replicas, then ``opt`` applies it.

    TF-IPU's code takes the mean (``cross_replica_mean``) where its docstring says sum
    (reference §9 #4; execution-model.md §1.4); ipupod follows the code. All gradients of a
    step travel in one fused call. Shapes and dtypes are unchanged.

    Raises:
        TypeError: ``opt`` has no ``apply_gradients``.
        NotInReplicaError, the collectives' errors (on every replica): applied outside a
            replica function, or replicas that disagree.
    """

    def __init__(self, opt: Any, name: str = "CrossReplicaOptimizer"):
        super().__init__(opt, name)

    def apply_gradients(self, grads_and_vars: Iterable, global_step=None,
                        name: str | None = None):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        means = cross_replica_mean_of([g for g, _ in pairs], self._name)
        return self._apply_inner(list(zip(means, [v for _, v in pairs])), global_step, name)
