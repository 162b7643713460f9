"""The base of the distribution strategies (:mod:`collectives.strategies`): running a step
function on every replica of the job, host reductions and broadcasts, the strategy's
Variables, and the deferred binding to the IPU system (a strategy made before
``configure_ipu_system`` finds the system when it first needs it; the first run may widen a
derived replica layout, :func:`ipu_node.system.widen_replicas`).
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from ipu_node import clock, current_replica_context, get_system, host_transfer_time_s, nest
from ipu_node.errors import WiderReplicasNeeded
from ipu_node.execution.optimizers import set_gradient_aggregator
from ipu_node.runtime.replica import set_active_runner
from ipu_node.runtime.system import add_configure_hook, current_system, widen_replicas

from collectives.framework.distributed_variables import (MirroredVariable, SyncOnReadVariable,
                                               VariableAggregation, VariableSynchronization,
                                               aggregate_gradients)
from collectives._engine.dispatch import host_plan
from collectives._engine.runtime import get_engine
from collectives.gcl_options import GCLOptions
from collectives.operators import CollectiveOperator
from collectives.ops import as_collective_array

__all__ = ["IPUStrategyBase", "ReduceOp", "PerReplica", "ValueContext", "get_strategy"]

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
        ValueError: another ``ipu_device``.
    """

    def __init__(self, ipu_device: str = "/device:IPU:0", variables_on_host: bool = False):
        if ipu_device != "/device:IPU:0":
            raise ValueError(f"ipupod runs replicas on /device:IPU:0, not {ipu_device!r}")
        self.variables_on_host = bool(variables_on_host)
        self._checked: Any = None    # the system _check_system last accepted
        system = current_system()
        if system is not None:
            self._check_system(system)
            self._checked = system
            if system.layout_bound_by is not None:
                get_engine(system)   # starts the transport in this thread
        # the next system the program configures gets this strategy's job (once)
        ref = weakref.ref(self)
        removers: list = []

        def hook(config, ref=ref):
            for remove in removers:
                remove()
            strategy = ref()
            if strategy is not None:
                strategy._distribute(config)
        removers.append(add_configure_hook(hook))
        weakref.finalize(self, removers[0])

    def _distribute(self, config) -> None:
        """Fill in ``config``'s multi-replica distribution for the job this strategy serves,
        when the program configures a system without one (strategies made before the
        system); the base strategy serves the instance as configured."""

    def _check_system(self, system) -> None:
        """Refuse a system this strategy cannot serve; called on first use (and at
        construction when the system exists).

        Raises:
            ValueError: bad GCL options (``IPUConfig.gcl_poplar_options``, ``GCL_OPTIONS``);
                subclasses: a system of another shape.
        """
        GCLOptions.parse(system.config.gcl_poplar_options)

    @property
    def _system(self):
        """The configured system (raises NotConfiguredError naming configure_ipu_system)."""
        system = get_system()
        if system is not self._checked:
            self._check_system(system)
            self._checked = system
        return system

    @property
    def _engine(self):
        return get_engine(self._system)

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
        into ``config`` (an ``IPUConfig``) and return it (seed 004:2195-2204): the configured
        system's, or before any, what this strategy knows of its job (TF_CONFIG's workers,
        the mpirun ranks)."""
        if current_system() is None:
            self._distribute(config)
            return config
        mrd = config.experimental.multi_replica_distribution
        mine = self._system.config.experimental.multi_replica_distribution
        mrd.process_count = self._system.process_count if self._system.process_count > 1 else 0
        mrd.process_index = self._system.process_index
        mrd.transport = mine.transport
        return config

    def _aggregate(self, pairs: list) -> list:
        return aggregate_gradients(pairs, self._host_sum, self._charge_host)

    def Variable(self, initial_value: Any, name: str | None = None, trainable: bool = True,
                 synchronization: VariableSynchronization = VariableSynchronization.AUTO,
                 aggregation: VariableAggregation = VariableAggregation.NONE):
        """A distributed Variable, initialised from worker 0 (every worker must create the
        same variables in the same order, in host code). When the system is configured and
        its replica layout bound, worker 0's value is broadcast now; otherwise (no system
        yet, or a layout a pipeline may still widen) each replica agrees on it when it
        first uses the Variable. See :mod:`collectives.framework.distributed_variables`.

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
        if synchronization is VariableSynchronization.ON_READ and \
                aggregation is VariableAggregation.NONE:
            raise ValueError(f"Variable {name!r}: synchronization=ON_READ needs an "
                             "aggregation (SUM, MEAN or ONLY_FIRST_REPLICA)")
        if synchronization is VariableSynchronization.NONE:
            raise ValueError(f"Variable {name!r}: synchronization=NONE has no meaning under a "
                             "distribution strategy")
        system = current_system()
        now = system is not None and system.layout_bound_by is not None
        value = self.broadcast(np.asarray(initial_value)) if now else np.asarray(initial_value)
        if synchronization is VariableSynchronization.ON_READ:
            return SyncOnReadVariable(value, name, trainable, aggregation,
                                      self._read_sync_on_read, self._agree, agreed=now)
        if self.variables_on_host:
            memories = []
        elif now:
            memories = [system.memory[system.replica_context(i).ipus[0].id]
                        for i in range(system.num_local_replicas)]
        else:
            memories = None   # placed by each replica on first use
        return MirroredVariable(value, name, trainable, memories, aggregation, self._agree,
                                agreed=now)

    def _agree(self, var, value: np.ndarray, in_replica: bool) -> np.ndarray:
        """Worker 0's ``value`` of ``var``: a broadcast of the replicas (in a replica
        function) or of the hosts."""
        if in_replica:
            from collectives.ops import broadcast
            return broadcast(value, 0, name=f"Variable {var.name!r}")
        return self._host_broadcast(value, f"Variable {var.name!r}")

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
        argument is shared (do not mutate it in place). When the replica layout is still
        derived and ``fn`` runs a pipeline of more shards than a replica has IPUs, the
        replicas are widened (:func:`ipu_node.system.widen_replicas`) and ``fn`` runs again
        from the start (nothing ran before the pipeline's checks but ``fn``'s own code).

        Returns:
            The per-replica results, in local replica order.

        Raises:
            NotConfiguredError: no IPU system is configured (names configure_ipu_system).
            The first exception any replica raised; ValueError when a PerReplica does not
            have one value per local replica.
        """
        system = self._system
        try:
            return self._run_on(system, fn, args, kwargs)
        except WiderReplicasNeeded as exc:
            system = widen_replicas(exc.shards)
            self._checked = None
            return self._run_on(self._system, fn, args, kwargs)

    def _run_on(self, system, fn, args, kwargs) -> list:
        n = system.num_local_replicas
        per_args = ([tuple(self._pick(a, i, n) for a in args) for i in range(n)] if args
                    else [()] * n)
        per_kwargs = ([{k: self._pick(v, i, n) for k, v in kwargs.items()} for i in range(n)]
                      if kwargs else [{}] * n)  # (one empty dict: ** never changes it)
        # The engine (and its transport) starts here, in the host thread, except the
        # transport of a multi-instance job while the layout may still be widened (it could
        # not be started again: IPUSystem.add_closer); MPI itself starts in this thread.
        if system.transport == "mpi":
            importlib.import_module("mpi4py.MPI")
        if system.layout_bound_by is not None or system.transport == "local":
            get_engine(system).run_started()
        result = system.run_replicas(self._tracked(fn, system), per_args, per_kwargs)
        system.bind_layout("a replica function ran on it")
        return result

    def _tracked(self, fn: Callable[..., Any], system) -> Callable[..., Any]:
        """``fn``, telling the engine when each replica leaves it (so replicas waiting for
        one that left get a divergence error, not a hang). A multi-instance engine that a
        collective starts during a first, unbound run binds the layout
        (``IPUSystem.add_closer``)."""

        def replica_fn(*args, **kwargs):
            local_index = current_replica_context().local_index
            try:
                return fn(*args, **kwargs)
            finally:
                if system.layout_bound_by is not None or system.transport == "local":
                    get_engine(system).replica_finished(local_index)

        return replica_fn

    @staticmethod
    def _pick(value: Any, i: int, n: int) -> Any:
        if isinstance(value, PerReplica):
            if len(value.values) != n:
                raise ValueError(f"PerReplica has {len(value.values)} values for {n} "
                                 "local replicas")
            return value.values[i]
        return value

    # -- host collectives: broadcast, reduce and the host sum of gradients held by host code
    # (each combines the local replicas in host memory and goes between the instances through
    # the engine's host plans: "host broadcast" / "host reduce" in the call records)

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
