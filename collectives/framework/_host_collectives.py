"""The host collectives of a strategy (:class:`~collectives.strategies.IPUStrategyBase`):
``strategy.broadcast`` and ``strategy.reduce`` of TF's ``tf.distribute`` API, and the host
sum of gradients held by host code; each combines the local replicas in host memory and goes
between the instances through the engine's host plans (``host broadcast`` / ``host reduce``
in the call records).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from ipu_node import clock, host_transfer_time_s, nest

from collectives._engine.dispatch import host_plan
from collectives.operators import CollectiveOperator
from collectives.ops import as_collective_array

__all__ = ["HostCollectives", "PerReplica", "ReduceOp"]


class ReduceOp(enum.Enum):
    """``tf.distribute.ReduceOp``: the reductions a strategy offers on the host."""

    SUM = "SUM"
    MEAN = "MEAN"


@dataclass(frozen=True)
class PerReplica:
    """One value per local replica (local replica order), for :meth:`run`'s arguments."""

    values: tuple

    def __init__(self, values: Sequence[Any]):
        object.__setattr__(self, "values", tuple(values))


class HostCollectives:
    """``broadcast``, ``reduce`` and the host sum of a strategy. The strategy that takes them
    gives ``_system`` (the configured IPU system), ``_engine`` (its collectives engine) and
    ``num_local_replicas``."""

    def _host_sum(self, grads: list[np.ndarray]) -> list[np.ndarray]:
        """Sum over the workers of gradients held by host code (one per worker)."""
        n = self.num_local_replicas
        return [self._host_reduce([g] + [np.zeros_like(g)] * (n - 1), CollectiveOperator.ADD,
                                  "apply_gradients") for g in grads]

    def _charge_host(self, nbytes: int) -> None:
        """Modelled host transfers: ``nbytes`` to the host and back, on every local IPU."""
        model = self._system.model
        if model is None:
            return
        for device_ipu in self._system.devices[0].ipus:
            seconds = host_transfer_time_s(model, device_ipu.id, nbytes)
            clock.timeline(device_ipu.id).add("host_io", 2 * seconds,
                                             "variables on host: gradients and updates")

    def broadcast(self, value: Any) -> Any:
        """Global replica 0's (instance 0's) ``value`` on every instance.

        ``value`` may be an array-like or a dict/list/tuple of them; the structure, dtypes
        and shapes must agree on every instance (else CollectiveMismatchError).
        """
        leaves, treedef = nest.flatten(value)
        out = []
        for leaf in leaves:
            result = self._host_broadcast(leaf, "")
            out.append(result if isinstance(leaf, np.ndarray) or result.ndim else result[()])
        return nest.unflatten(treedef, out)

    def _host_broadcast(self, leaf: Any, name: str) -> np.ndarray:
        """Instance 0's ``leaf`` (global replica 0's) on every local replica."""
        arr = as_collective_array(leaf, "strategy.broadcast")
        plan = host_plan(self._engine, "broadcast", "", arr.dtype, tuple(arr.shape), name,
                         ("broadcast", 0))
        return self._engine.host_call(plan, [arr] * self.num_local_replicas)[0]

    def _host_reduce(self, values: list, operator: CollectiveOperator, name: str) -> np.ndarray:
        """One array per local replica, reduced over every replica of the job."""
        arrs = [as_collective_array(v, "strategy.reduce", operator) for v in values]
        plan = host_plan(self._engine, "reduce", operator.value, arrs[0].dtype,
                         tuple(arrs[0].shape), name, ("allreduce", operator))
        return self._engine.host_call(plan, arrs)[0]

    def reduce(self, reduce_op: ReduceOp | str, per_replica_values: Sequence[Any] | PerReplica,
               axis: None = None) -> Any:
        """SUM or MEAN over every replica of the job of the local replicas' values, or over
        every worker of a plain per-worker value.

        Args:
            reduce_op: ``ReduceOp.SUM``/``MEAN`` or ``"SUM"``/``"MEAN"``.
            per_replica_values: one value (or nest) per local replica, as :meth:`run`
                returns (a list, tuple or :class:`PerReplica`); or one plain value of this
                worker (an array, a number, a dict), as the seeds' custom loop passes its
                ``per_worker_loss`` (seed 004:2046-2050): SUM adds the workers' values,
                MEAN averages them.

        Raises:
            ValueError: another reduce op ("Unsupported reduce op", as TF-IPU), a wrong number
                of values, or ``axis`` given.
        """
        if axis is not None:
            raise ValueError("strategy.reduce supports only axis=None")
        try:
            op = ReduceOp(reduce_op.value if isinstance(reduce_op, ReduceOp) else reduce_op)
        except ValueError:
            raise ValueError(f"Unsupported reduce op {reduce_op!r}: use SUM or MEAN") from None
        if not isinstance(per_replica_values, (PerReplica, list, tuple)):
            return self._reduce_per_worker(op, per_replica_values)
        values = list(per_replica_values.values if isinstance(per_replica_values, PerReplica)
                      else per_replica_values)
        if len(values) != self.num_local_replicas:
            raise ValueError(f"strategy.reduce got {len(values)} values for "
                             f"{self.num_local_replicas} local replicas")
        operator = CollectiveOperator.ADD if op is ReduceOp.SUM else CollectiveOperator.MEAN
        flat = [nest.flatten(v)[0] for v in values]
        treedef = nest.flatten(values[0])[1]
        out = []
        for leaf_index in range(len(flat[0])):
            result = self._host_reduce([f[leaf_index] for f in flat], operator, "")
            out.append(result if result.ndim else result[()])
        return nest.unflatten(treedef, out)


    def _reduce_per_worker(self, op: ReduceOp, value: Any) -> Any:
        """SUM or MEAN over the workers (instances) of this worker's ``value`` (a nest)."""
        leaves, treedef = nest.flatten(value)
        n, workers = self.num_local_replicas, self._system.process_count
        out = []
        for leaf in leaves:
            arr = np.asarray(leaf)
            total = self._host_reduce([arr] + [np.zeros_like(arr)] * (n - 1),
                                      CollectiveOperator.ADD, "per-worker value")
            if op is ReduceOp.MEAN:
                total = total / total.dtype.type(workers) if total.dtype.kind == "f" \
                    else total / workers
            out.append(total if total.ndim else total[()])
        return nest.unflatten(treedef, out)
