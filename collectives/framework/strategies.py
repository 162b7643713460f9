"""Distribution strategies: run a step function on every replica of the job.

One base, :class:`IPUStrategyBase`, and the seeds' strategies on it (seed 004:1957-2204):

* ``IPUMultiReplicaStrategy`` (seed 004:2188-2204) and ``PopDistStrategy`` (its TF2 name):
  GCL collectives between the replicas of a poprun job; a host broadcast of initial values
  from the first instance to all (the role Horovod plays there).
* ``IPUStrategy``: one instance and its local replicas.
* ``IPUMultiWorkerStrategy(cluster_resolver)``: the workers of a TF_CONFIG cluster over the
  gRPC transport (seed 004:1957-2067).
* ``IPUHorovodStrategy()``: the processes of an mpirun job, through
  :mod:`collectives.framework.horovod` (seed 004:2130-2187).

All have ``scope()``, ``run``/``experimental_run_v2``, ``reduce``, ``broadcast`` and
``update_ipu_config``, and the variable semantics of seed 004:1962-1977 through
:func:`Variable` (see :mod:`collectives.framework.distributed_variables`): inside ``scope()``, every
optimizer's ``apply_gradients`` sums the gradients of mirrored variables over the job.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from ipu_node import clock, current_replica_context, get_system, host_transfer_time_s, nest
from ipu_node.optimizers import set_gradient_aggregator
from ipu_node.replica import set_active_runner

from collectives.framework import horovod as hvd
from collectives._engine.dispatch import host_plan
from collectives.framework.distributed_variables import (MirroredVariable, SyncOnReadVariable,
                                               VariableAggregation, VariableSynchronization,
                                               aggregate_gradients)
from collectives.operators import CollectiveOperator
from collectives.ops import as_collective_array
from collectives._engine.runtime import get_engine

__all__ = ["IPUStrategyBase", "IPUStrategy", "IPUMultiReplicaStrategy", "PopDistStrategy",
           "IPUMultiWorkerStrategy", "IPUHorovodStrategy", "ReduceOp", "PerReplica",
           "ValueContext", "get_strategy", "VariableSynchronization", "VariableAggregation",
           "MirroredVariable", "SyncOnReadVariable"]

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


def get_strategy() -> "IPUStrategyBase | None":
    """The strategy whose ``scope()`` is active in this thread, if any."""
    return getattr(_scope, "strategy", None)


class IPUStrategyBase:
    """Data parallelism over all the replicas of a job (every instance's local replicas):
    what every strategy of this module shares.

    Args:
        ipu_device: the TF device the replicas run on; only ``"/device:IPU:0"``.
        variables_on_host: keep mirrored variables (and the slots of optimizers applied in
            host code) in host memory, not in IPU SRAM; their gradients and updates then
            cross the host link (modelled ``host_io`` time on every local replica's IPU).

    Raises:
        NotConfiguredError: no IPU system is configured (``configure_ipu_system()`` first).
        ValueError: another ``ipu_device``.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0", variables_on_host: bool = False):
        if ipu_device != "/device:IPU:0":
            raise ValueError(f"ipupod runs replicas on /device:IPU:0, not {ipu_device!r}")
        self._system = get_system()
        self._engine = get_engine(self._system)  # starts the transport in this thread
        self.variables_on_host = bool(variables_on_host)

    @property
    def num_replicas_in_sync(self) -> int:
        """Global replication factor."""
        return self._system.num_replicas

    @property
    def num_local_replicas(self) -> int:
        return self._system.num_local_replicas

    @contextlib.contextmanager
    def scope(self) -> Iterator["IPUStrategyBase"]:
        """Make this the current strategy in this thread (``get_strategy()``); inside,
        ``ipu_compiler.compile`` runs on every local replica (through ``self.run``) and
        every optimizer's ``apply_gradients`` sums the gradients of mirrored variables over
        the job (sync-on-write)."""
        previous = get_strategy()
        previous_runner = set_active_runner(self.run)
        previous_aggregator = set_gradient_aggregator(self._aggregate)
        _scope.strategy = self
        try:
            yield self
        finally:
            _scope.strategy = previous
            set_active_runner(previous_runner)
            set_gradient_aggregator(previous_aggregator)

    def experimental_run_v2(self, fn: Callable[..., Any], args: Sequence[Any] = (),
                            kwargs: dict | None = None) -> list:
        """The seeds' name of :meth:`run` (seed 004:2020)."""
        return self.run(fn, args, kwargs)

    def update_ipu_config(self, config):
        """Write this job's multi-replica distribution (process count and index, transport)
        into ``config`` (an ``IPUConfig``) and return it (seed 004:2195-2204)."""
        mrd = config.experimental.multi_replica_distribution
        mine = self._system.config.experimental.multi_replica_distribution
        mrd.process_count = self._system.process_count if self._system.process_count > 1 else 0
        mrd.process_index = self._system.process_index
        mrd.transport = mine.transport
        return config

    def _aggregate(self, pairs: list) -> list:
        return aggregate_gradients(pairs, self._host_sum, self._charge_host)

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

    def Variable(self, initial_value: Any, name: str | None = None, trainable: bool = True,
                 synchronization: VariableSynchronization = VariableSynchronization.AUTO,
                 aggregation: VariableAggregation = VariableAggregation.NONE):
        """A distributed Variable, initialised from worker 0 (every worker must create the
        same variables in the same order, in host code). See
        :mod:`collectives.framework.distributed_variables`.

        Returns:
            a :class:`MirroredVariable` (AUTO/ON_WRITE) or :class:`SyncOnReadVariable`
            (ON_READ, with aggregation SUM, MEAN or ONLY_FIRST_REPLICA).

        Raises:
            ValueError: called inside a replica function, ON_READ without an aggregation,
                or synchronization NONE.
            TypeError: ``synchronization``/``aggregation`` of the wrong type.
        """
        if current_replica_context() is not None:
            raise ValueError("create strategy Variables in host code (inside scope(), "
                             "outside run())")
        if not isinstance(synchronization, VariableSynchronization) or \
                not isinstance(aggregation, VariableAggregation):
            raise TypeError("synchronization and aggregation must be VariableSynchronization "
                            "and VariableAggregation members")
        value = self.broadcast(np.asarray(initial_value))
        if synchronization is VariableSynchronization.ON_READ:
            if aggregation is VariableAggregation.NONE:
                raise ValueError(f"Variable {name!r}: synchronization=ON_READ needs an "
                                 "aggregation (SUM, MEAN or ONLY_FIRST_REPLICA)")
            return SyncOnReadVariable(value, name, trainable, aggregation,
                                      self.num_local_replicas, self._read_sync_on_read)
        if synchronization is VariableSynchronization.NONE:
            raise ValueError(f"Variable {name!r}: synchronization=NONE has no meaning under a "
                             "distribution strategy")
        memories = [] if self.variables_on_host else [
            self._system.memory[ipus[0].id] for ipus in
            (self._system.replica_context(i).ipus for i in range(self.num_local_replicas))]
        return MirroredVariable(value, name, trainable, memories, aggregation,
                                self.num_local_replicas)

    def _read_sync_on_read(self, var: SyncOnReadVariable, copies: list) -> np.ndarray:
        label = f"sync-on-read Variable {var.name!r}"
        if var.aggregation is VariableAggregation.ONLY_FIRST_REPLICA:
            return self._host_broadcast(copies[0], label)
        operator = (CollectiveOperator.ADD if var.aggregation is VariableAggregation.SUM
                    else CollectiveOperator.MEAN)
        return self._host_reduce(copies, operator, label)

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
        treedef = nest.flatten(values[0])[1]
        out = []
        for leaf_index in range(len(flat[0])):
            result = self._host_reduce([f[leaf_index] for f in flat], operator, "")
            out.append(result if result.ndim else result[()])
        return nest.unflatten(treedef, out)


class IPUMultiReplicaStrategy(IPUStrategyBase):
    """TF-IPU's strategy for PopDist/poprun jobs (seed 004:2188-2204): GCL reductions over
    every replica of the job.

    Args:
        ipu_device: only ``"/device:IPU:0"``.
        add_ipu_cross_replica_reductions: kept for API compatibility (reductions are
            explicit, or implicit in ``apply_gradients`` under ``scope()``).
        variables_on_host: see :class:`IPUStrategyBase`.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0",
                 add_ipu_cross_replica_reductions: bool = True,
                 variables_on_host: bool = False):
        super().__init__(ipu_device, variables_on_host)


class PopDistStrategy(IPUMultiReplicaStrategy):
    """The TF2 API's popdist-driven strategy: :class:`IPUMultiReplicaStrategy` under its
    later name (anchors §4.1: "IPUMultiWorkerStrategy will be deprecated in favour of
    PopDistStrategy")."""


class IPUStrategy(IPUStrategyBase):
    """The replicas of one instance (no other instances).

    Raises:
        ValueError: the configured system belongs to a multi-instance job (use
            :class:`PopDistStrategy`, :class:`IPUMultiWorkerStrategy` or
            :class:`IPUHorovodStrategy`).
    """

    def __init__(self, ipu_device: str = "/device:IPU:0", variables_on_host: bool = False):
        super().__init__(ipu_device, variables_on_host)
        if self._system.process_count > 1:
            raise ValueError(f"IPUStrategy runs one instance, but this one is instance "
                             f"{self._system.process_index} of {self._system.process_count}")


class IPUMultiWorkerStrategy(IPUStrategyBase):
    """Synchronous training on the workers of a TF_CONFIG cluster (seed 004:1957-2067), over
    the gRPC transport that ``popdist.set_ipu_config`` configures from TF_CONFIG.

    Args:
        cluster_resolver: a ``TFConfigClusterResolver`` (``cluster_spec()``, ``task_type``,
            ``task_id``); its chief and worker tasks are the instances (ps and evaluator
            tasks are counted by TF but train nothing).
        ipu_device, variables_on_host: see :class:`IPUStrategyBase`.

    Raises:
        ValueError: the resolver's cluster does not match the configured system (worker
            count, this task's place).
    """

    def __init__(self, cluster_resolver, ipu_device: str = "/device:IPU:0",
                 variables_on_host: bool = False):
        super().__init__(ipu_device, variables_on_host)
        spec = cluster_resolver.cluster_spec().as_dict()
        workers = spec.get("chief", []) + spec.get("worker", [])
        task_type, task_id = cluster_resolver.task_type, cluster_resolver.task_id
        index = task_id if task_type == "chief" else len(spec.get("chief", [])) + task_id
        system = self._system
        if len(workers) != system.process_count or index != system.process_index:
            raise ValueError(
                f"the cluster resolver's cluster ({len(workers)} workers, this task "
                f"{task_type}:{task_id} = instance {index}) does not match the configured IPU "
                f"system (instance {system.process_index} of {system.process_count}): "
                "configure it with popdist.set_ipu_config(cfg) under the same TF_CONFIG")
        self.cluster_resolver = cluster_resolver

    def update_config_proto(self, config_proto):
        """TF1's session-config hook (seed 004:1994): nothing to add in ipupod; returns it."""
        return config_proto


class IPUHorovodStrategy(IPUStrategyBase):
    """Synchronous training on the processes of an mpirun job through
    :mod:`collectives.framework.horovod` (seed 004:2130-2187): no cluster resolver, no server; host
    reductions are ``hvd.allreduce`` and the initial broadcast ``hvd.broadcast(root_rank=0)``.

    Args:
        ipu_device, variables_on_host: see :class:`IPUStrategyBase`.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0", variables_on_host: bool = False):
        hvd.init()  # configures one IPU per process when the program has not
        super().__init__(ipu_device, variables_on_host)

    def _host_sum(self, grads: list[np.ndarray]) -> list[np.ndarray]:
        return hvd.grouped_allreduce(grads, op=hvd.Sum, name="apply_gradients")
