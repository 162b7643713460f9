"""Distribution strategies: run a step function on every replica of the job.

``IPUMultiReplicaStrategy`` follows the TF-IPU class of that name (seed 004:2188-2204): GCL
collectives between the replicas, and a host broadcast of initial values from the first
instance to all (the role Horovod plays there).
"""

from __future__ import annotations

import contextlib
import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from ipu_node import current_replica_context, get_system

from collectives import _algorithms as algorithms, _movement as movement, _nest as nest
from collectives.descriptor import Descriptor
from collectives.groups import CommGroup
from collectives.operators import CollectiveOperator
from collectives.ops import as_collective_array
from collectives._runtime import get_engine

_scope = threading.local()


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


@dataclass(frozen=True)
class ValueContext:
    """What ``experimental_distribute_values_from_function`` tells its function."""

    replica_id_in_sync_group: int
    num_replicas_in_sync: int


def get_strategy() -> "IPUMultiReplicaStrategy | None":
    """The strategy whose ``scope()`` is active in this thread, if any."""
    return getattr(_scope, "strategy", None)


class IPUMultiReplicaStrategy:
    """Data parallelism over all the replicas of a job (every instance's local replicas).

    Args:
        ipu_device: the TF device the replicas run on; only ``"/device:IPU:0"``.
        add_ipu_cross_replica_reductions: kept for API compatibility (reductions are explicit).

    Raises:
        NotConfiguredError: no IPU system is configured (``configure_ipu_system()`` first).
        ValueError: another ``ipu_device``.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0",
                 add_ipu_cross_replica_reductions: bool = True):
        if ipu_device != "/device:IPU:0":
            raise ValueError(f"ipupod runs replicas on /device:IPU:0, not {ipu_device!r}")
        self._system = get_system()
        self._engine = get_engine(self._system)  # starts the transport in this thread

    @property
    def num_replicas_in_sync(self) -> int:
        """Global replication factor."""
        return self._system.num_replicas

    @property
    def num_local_replicas(self) -> int:
        return self._system.num_local_replicas

    @contextlib.contextmanager
    def scope(self) -> Iterator["IPUMultiReplicaStrategy"]:
        """Make this the current strategy in this thread (``get_strategy()``)."""
        previous = get_strategy()
        _scope.strategy = self
        try:
            yield self
        finally:
            _scope.strategy = previous

    def experimental_distribute_values_from_function(
            self, value_fn: Callable[[ValueContext], Any]) -> PerReplica:
        """``value_fn(ctx)`` for each local replica, as a :class:`PerReplica`."""
        offset, n = self._system.replica_index_offset, self._system.num_replicas
        return PerReplica([value_fn(ValueContext(offset + i, n))
                           for i in range(self.num_local_replicas)])

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (),
            kwargs: dict | None = None) -> list:
        """Call ``fn(*args, **kwargs)`` once per local replica, concurrently.

        A :class:`PerReplica` argument gives each replica its own value; every other
        argument is shared (do not mutate it in place).

        Returns:
            The per-replica results, in local replica order.

        Raises:
            The first exception any replica raised; ValueError when a PerReplica does not
            have one value per local replica.
        """
        n = self.num_local_replicas
        per_args = ([tuple(self._pick(a, i, n) for a in args) for i in range(n)] if args
                    else [()] * n)
        per_kwargs = ([{k: self._pick(v, i, n) for k, v in kwargs.items()} for i in range(n)]
                      if kwargs else [{}] * n)  # (one empty dict: ** never changes it)
        self._engine.run_started()
        return self._system.run_replicas(self._tracked(fn), per_args, per_kwargs)

    def _tracked(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, telling the engine when each replica leaves it (so replicas waiting for
        one that left get a divergence error, not a hang)."""
        engine = self._engine

        def replica_fn(*args, **kwargs):
            local_index = current_replica_context().local_index
            try:
                return fn(*args, **kwargs)
            finally:
                engine.replica_finished(local_index)

        return replica_fn

    @staticmethod
    def _pick(value: Any, i: int, n: int) -> Any:
        if isinstance(value, PerReplica):
            if len(value.values) != n:
                raise ValueError(f"PerReplica has {len(value.values)} values for {n} "
                                 "local replicas")
            return value.values[i]
        return value

    def broadcast(self, value: Any) -> Any:
        """Global replica 0's (instance 0's) ``value`` on every instance.

        ``value`` may be an array-like or a dict/list/tuple of them; the structure, dtypes
        and shapes must agree on every instance (else CollectiveMismatchError).
        """
        leaves, rebuild = nest.flatten(value)
        out = []
        for leaf in leaves:
            arr = as_collective_array(leaf, "strategy.broadcast")
            desc = Descriptor(0, "broadcast", "", arr.dtype.name, tuple(arr.shape), "ALL(0)")
            result = self._engine.host_call(desc, [arr] * self.num_local_replicas,
                                            movement.broadcast_from_instance0)[0]
            out.append(result if isinstance(leaf, np.ndarray) or result.ndim else result[()])
        return rebuild(out)

    def reduce(self, reduce_op: ReduceOp | str, per_replica_values: Sequence[Any] | PerReplica,
               axis: None = None) -> Any:
        """SUM or MEAN of the local replicas' values over every replica of the job.

        Args:
            reduce_op: ``ReduceOp.SUM``/``MEAN`` or ``"SUM"``/``"MEAN"``.
            per_replica_values: one value (or nest) per local replica, as :meth:`run` returns.

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
        values = list(per_replica_values.values if isinstance(per_replica_values, PerReplica)
                      else per_replica_values)
        if len(values) != self.num_local_replicas:
            raise ValueError(f"strategy.reduce got {len(values)} values for "
                             f"{self.num_local_replicas} local replicas")
        operator = CollectiveOperator.ADD if op is ReduceOp.SUM else CollectiveOperator.MEAN
        flat = [nest.flatten(v)[0] for v in values]
        rebuild = nest.flatten(values[0])[1]
        out = []
        for leaf_index in range(len(flat[0])):
            arrs = [as_collective_array(f[leaf_index], "strategy.reduce", operator)
                    for f in flat]
            desc = Descriptor(0, "reduce", operator.value, arrs[0].dtype.name,
                              tuple(arrs[0].shape), "ALL(0)")
            result = self._engine.host_call(
                desc, arrs, lambda e, d, v: algorithms.allreduce(e, d, v, operator, CommGroup()))
            out.append(result[0] if result[0].ndim else result[0][()])
        return rebuild(out)
