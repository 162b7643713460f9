"""Cross-replica optimizers: TF-IPU's ``CrossReplicaOptimizer`` and
``CrossReplicaGradientAccumulationOptimizerV2`` over ipupod's collectives.

They live here, not in :mod:`ipu_node.optimizers`, because they call collectives
(``ipu_node`` imports no other ipupod package; reference execution-model.md §4).

* :class:`CrossReplicaOptimizer` ``(opt)``: every gradient becomes its cross-replica
  **mean** (TF-IPU's ``cross_replica_optimizer.py`` applies ``cross_replica_mean``;
  reference §1.4), then ``opt`` applies it. All gradients of one dtype travel as ONE
  buffer (concatenated in ``grads_and_vars`` order, one :func:`cross_replica_mean`, split
  back): one exchange per dtype per step. The mean is elementwise in the canonical tree
  order, so the result is bit-identical to one ``cross_replica_mean`` per tensor.
* :class:`CrossReplicaGradientAccumulationOptimizerV2` ``(opt, num_mini_batches)``: sums
  ``num_mini_batches`` calls locally, then one fused cross-replica mean and ``opt``: one
  exchange per ``num_mini_batches``.

Both must be called inside replica functions (the collectives' rule).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
from ipu_node.execution.optimizers import (GradientAccumulationOptimizerV2, Optimizer,
                                           OptimizerWrapper, check_grads_and_vars)

from collectives.ops import cross_replica_mean

__all__ = ["CrossReplicaOptimizer", "CrossReplicaGradientAccumulationOptimizerV2",
           "fused_cross_replica_mean"]


def fused_cross_replica_mean(grads: list[np.ndarray], name: str = "gradients"
                             ) -> list[np.ndarray]:
    """The cross-replica mean of every array of ``grads``: one
    :func:`~collectives.cross_replica_mean` on the list, which the collectives move as one
    fused buffer per dtype (``IPUConfig.optimizations.maximum_cross_replica_sum_buffer_size``
    bounds it, as GCL's fusion does).

    Returns:
        arrays of the same shapes and dtypes, bit-identical to a mean per array.
    """
    if not grads:
        return []
    return list(cross_replica_mean(list(grads), name=name))


class CrossReplicaOptimizer(OptimizerWrapper):
    """Averages the gradients over all replicas, then applies them with ``opt``.

    Args:
        opt: the :class:`~ipu_node.optimizers.Optimizer` that applies the mean gradients.

    Raises:
        TypeError: ``opt`` is not an Optimizer.
        The collectives' errors, raised on every replica (e.g. replicas that disagree on
        the gradients' shapes).
    """

    def __init__(self, opt: Optimizer, name: str = "CrossReplicaOptimizer"):
        super().__init__(opt, name)

    def apply_gradients(self, grads_and_vars: Iterable, global_step=None, name=None) -> None:
        pairs = [(g, v) for g, v in check_grads_and_vars(grads_and_vars, self._name)
                 if g is not None]
        means = fused_cross_replica_mean([g for g, _ in pairs], name=self._name)
        self._opt.apply_gradients(list(zip(means, (v for _, v in pairs))), global_step, name)


class CrossReplicaGradientAccumulationOptimizerV2(GradientAccumulationOptimizerV2):
    """Accumulates ``num_mini_batches`` gradients locally (sum, scale 1), then applies their
    cross-replica mean with ``opt``: one fused exchange per ``num_mini_batches`` calls.

    Same arguments, loop rule and errors as
    :class:`~ipu_node.optimizers.GradientAccumulationOptimizerV2`.
    """

    def __init__(self, opt: Optimizer, num_mini_batches: int,
                 offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding: bool = False, dtype=None,
                 name: str = "CrossReplicaGradientAccumulationOptimizerV2"):
        super().__init__(CrossReplicaOptimizer(opt) if isinstance(opt, Optimizer) else opt,
                         num_mini_batches, offload_weight_update_variables,
                         replicated_optimizer_state_sharding, dtype, name)
