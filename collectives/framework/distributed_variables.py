"""Variables of a distribution strategy (seed 004:1962-1977): mirrored (sync-on-write) and
sync-on-read, and the gradient allreduce that strategies put in ``apply_gradients``.

ipupod's stand-in for ``tf.Variable`` inside ``strategy.scope()`` is
:func:`collectives.framework.strategies.Variable` (ipupod decision: ``ipu_node.Variable`` made
directly stays an ordinary, per-replica Variable; the strategy's factory makes the
distributed kinds):

* :class:`MirroredVariable` (``synchronization`` AUTO or ON_WRITE, the default): one value on
  every worker, initialised from worker 0's (a broadcast at creation). Its bytes are counted
  in the SRAM of every local replica's first IPU, unless the strategy keeps variables on the
  host (``variables_on_host=True``). Writes stay in sync because every worker applies the
  same update: the optimizer's ``apply_gradients`` first sums each gradient over every
  replica of the job (:func:`aggregate_gradients`), as TF-IPU's strategies do (a **sum**:
  the seeds' custom loop divides the loss by the global batch size).
* :class:`SyncOnReadVariable` (``synchronization=ON_READ`` with an aggregation SUM, MEAN or
  ONLY_FIRST_REPLICA): every local replica updates its own copy, on its IPU, without any
  exchange (even with ``variables_on_host``, as the seeds say); reading it in host code
  aggregates the copies of every replica of the job. Every worker must read it at the same
  time: a worker that reads while another does something else makes every worker raise
  ``CollectiveMismatchError`` naming the variable (a worker that has ended makes the readers
  raise too), never a hang.
"""

from __future__ import annotations

import enum
import threading
import weakref
from typing import Any

import numpy as np
from ipu_node import current_replica_context, get_system
from ipu_node.variables import Variable

from collectives._engine.fusion import fused_per_dtype

__all__ = ["VariableSynchronization", "VariableAggregation", "MirroredVariable",
           "SyncOnReadVariable", "aggregate_gradients"]


class VariableSynchronization(enum.Enum):
    """``tf.VariableSynchronization``."""

    AUTO = "AUTO"
    NONE = "NONE"
    ON_WRITE = "ON_WRITE"
    ON_READ = "ON_READ"


class VariableAggregation(enum.Enum):
    """``tf.VariableAggregation``."""

    NONE = "NONE"
    SUM = "SUM"
    MEAN = "MEAN"
    ONLY_FIRST_REPLICA = "ONLY_FIRST_REPLICA"


def _free_all(memories, name: str) -> None:
    for memory in memories:
        try:
            memory.free(name)
        except KeyError:
            pass


class _PerReplica(Variable):
    """A Variable with one copy per local replica: a replica function reads and assigns its
    own copy; host code reads :meth:`_host_value` and assigns every copy."""

    def __init__(self, initial_value: Any, name: str | None, trainable: bool,
                 num_local_replicas: int):
        super().__init__(initial_value, name, trainable)
        if self.ipu_id is not None:  # made in a replica function: the subclass places it
            _free_all([get_system().memory[self.ipu_id]], self._tensor_name)
            self.ipu_id = self.shard = None
        self._copies = [self._value.copy() for _ in range(num_local_replicas)]
        self._lock = threading.Lock()

    @staticmethod
    def _local() -> int | None:
        ctx = current_replica_context()
        return None if ctx is None else ctx.local_index

    @property
    def value(self) -> np.ndarray:
        i = self._local()
        return self._copies[i] if i is not None else self._host_value()

    def _host_value(self) -> np.ndarray:
        return self._copies[0]

    def read_value(self) -> np.ndarray:
        """:attr:`value` (TF's name)."""
        return self.value

    def numpy(self) -> np.ndarray:
        return np.array(self.value, copy=True)

    def assign(self, value: Any) -> None:
        """Set the calling replica's copy (replica function) or every copy (host code).

        Raises:
            ValueError, TypeError: as :meth:`ipu_node.Variable.assign`.
        """
        i = self._local()
        with self._lock:
            super().assign(value)  # (checks shape and dtype, casts)
            if i is None:
                self._copies = [self._value.copy() for _ in self._copies]
            else:
                self._copies[i] = self._value

    def assign_add(self, delta: Any) -> None:
        """``assign(value + delta)`` on the calling replica's copy (host: on every copy)."""
        i = self._local()
        current = self._copies[0 if i is None else i]
        self.assign(current + np.asarray(delta, self.dtype))


class MirroredVariable(_PerReplica):
    """A Variable with the same value on every replica of the job (module docstring).

    Made by ``strategy.Variable``; ``initial_value`` is already worker 0's. ``memories``:
    the IPU memories that hold a copy (empty: on the host). Every replica applies the same
    summed gradient to its own copy, so the copies stay equal; host code reads copy 0.
    """

    def __init__(self, initial_value: Any, name: str | None, trainable: bool, memories,
                 aggregation: VariableAggregation, num_local_replicas: int):
        super().__init__(initial_value, name, trainable, num_local_replicas)
        self.aggregation = aggregation
        self.on_host = not memories
        self._memories = list(memories)
        for memory in memories:
            memory.allocate(self._tensor_name, self.nbytes)
        if memories:
            self.ipu_id = memories[0].ipu_id
            weakref.finalize(self, _free_all, list(memories), self._tensor_name)

    def make_slot(self, name: str) -> "MirroredVariable":
        """An optimizer's slot for this Variable (zeros, mirrored alike, kept where this
        Variable is kept: in host memory when it is on the host)."""
        return MirroredVariable(np.zeros_like(self._copies[0]), name, False, self._memories,
                                VariableAggregation.NONE, len(self._copies))

    def __repr__(self) -> str:
        where = "host" if self.on_host else "every replica's IPU"
        return (f"<MirroredVariable {self.name!r} shape={self.shape} dtype={self.dtype} "
                f"on {where}>")


class SyncOnReadVariable(_PerReplica):
    """One copy per local replica, aggregated over the job when read in host code.

    Inside a replica function, :attr:`value` and :meth:`assign` use the calling replica's
    copy, with no exchange. In host code, :attr:`value`, :meth:`numpy` and
    :meth:`read_value` aggregate every replica's copy through ``reader(variable, copies)``,
    a collective of the strategy named after the variable; :meth:`assign` sets every local
    copy (ipupod keeps the value as given; TF divides a SUM variable's value by the
    replicas).
    """

    def __init__(self, initial_value: Any, name: str | None, trainable: bool,
                 aggregation: VariableAggregation, num_local_replicas: int, reader):
        super().__init__(initial_value, name, trainable, num_local_replicas)
        self.aggregation = aggregation
        self._reader = reader

    def _host_value(self) -> np.ndarray:
        return self._reader(self, list(self._copies))

    def __repr__(self) -> str:
        return (f"<SyncOnReadVariable {self.name!r} shape={self.shape} dtype={self.dtype} "
                f"aggregation={self.aggregation.value}>")


def aggregate_gradients(pairs: list, host_sum, charge_host) -> list:
    """The allreduce of ``apply_gradients`` under a strategy: every gradient of a
    :class:`MirroredVariable` becomes its **sum** over every replica of the job; gradients of
    other Variables pass unchanged. Inside a replica function the sum is a fused
    cross-replica sum (one exchange per dtype); in host code (variables on the host) it is
    ``host_sum(grads)`` over the workers, and ``charge_host(nbytes)`` charges the modelled
    host transfers of the gradients and of the updated variables.
    """
    from collectives.ops import cross_replica_sum

    idx = [i for i, (g, v) in enumerate(pairs) if g is not None
           and isinstance(v, MirroredVariable)]
    if not idx:
        return pairs
    grads = [np.asarray(pairs[i][0]) for i in idx]
    if current_replica_context() is not None:
        summed = fused_per_dtype(grads, lambda flat, dtype: cross_replica_sum(
            flat, name=f"apply_gradients:{dtype.name}"))
    else:
        summed = host_sum(grads)
        charge_host(sum(g.nbytes for g in grads) + sum(pairs[i][1].nbytes for i in idx))
    out = list(pairs)
    for i, s in zip(idx, summed):
        out[i] = (s, pairs[i][1])
    return out
