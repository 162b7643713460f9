"""Variables of a distribution strategy (seed 004:1962-1977): mirrored (sync-on-write) and
sync-on-read, and the gradient allreduce that strategies put in ``apply_gradients``.

ipupod's stand-in for ``tf.Variable`` inside ``strategy.scope()`` is
:func:`collectives.framework.strategies.Variable` (ipupod decision: ``ipu_node.Variable`` made
directly stays an ordinary, per-replica Variable; the strategy's factory makes the
distributed kinds):

* :class:`MirroredVariable` (``synchronization`` AUTO or ON_WRITE, the default): one value on
  every worker, initialised from worker 0's. When the replica layout is bound (the program
  set ``ipus_per_replica``, or the replicas ran already), the broadcast happens at creation
  and the bytes are counted in the SRAM of every local replica's first IPU; while it may
  still change (a pipeline may widen the replicas, ``ipu_node.system.widen_replicas``), each
  replica agrees on worker 0's value with a broadcast of the replicas and places its copy
  when it first uses it, on the IPU of its shard (a pipeline stage's IPU). Variables on the
  host (``variables_on_host=True``) take no SRAM. Writes stay in sync because every worker applies the
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
from ipu_node.execution.variables import Variable

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


def _free_placed(placed: dict, name: str) -> None:
    for memory in list(placed.values()):
        try:
            memory.free(name)
        except KeyError:
            pass


class _PerReplica(Variable):
    """A Variable with one copy per local replica: a replica function reads and assigns its
    own copy (made on its first use, from the agreed value, which only host code changes);
    host code reads :meth:`_host_value` and assigns every copy.

    ``agree(var, value, in_replica)`` returns worker 0's ``value`` (a broadcast over the
    job: a host collective, or a collective of the replicas when ``in_replica``); until it
    ran (``agreed`` False) the Variable holds this worker's initial value only.
    """

    def __init__(self, initial_value: Any, name: str | None, trainable: bool, agree,
                 agreed: bool):
        super().__init__(initial_value, name, trainable)
        if self.ipu_id is not None:  # made in a replica function: placed per replica instead
            _free_all([get_system().memory[self.ipu_id]], self._tensor_name)
            self.ipu_id = self.shard = None
        self._copies: dict[int, np.ndarray] = {}
        self._agree = agree
        self._agreed = agreed
        self._lock = threading.RLock()

    @staticmethod
    def _local() -> int | None:
        ctx = current_replica_context()
        return None if ctx is None else ctx.local_index

    def _agreed_value(self, in_replica: bool) -> np.ndarray:
        """Worker 0's value, agreed on first need (module docstring)."""
        if self._agreed:
            return self._value
        value = np.asarray(self._agree(self, self._value, in_replica)).astype(self.dtype)
        if not in_replica:   # (in a run, each replica agrees for itself: see _copy)
            self._value, self._agreed = value, True
        return value

    def _copy(self, i: int) -> np.ndarray:
        """Replica ``i``'s copy (in its replica function), made on its first use."""
        copy = self._copies.get(i)
        if copy is None:
            copy = np.array(self._agreed_value(in_replica=True), copy=True)
            self._place_copy(i)
            with self._lock:
                self._copies[i] = copy
        return copy

    def _place_copy(self, i: int) -> None:
        """Account replica ``i``'s copy in SRAM (subclasses that keep it on an IPU)."""

    @property
    def value(self) -> np.ndarray:
        i = self._local()
        return self._copy(i) if i is not None else self._host_value()

    def _host_value(self) -> np.ndarray:
        return self._copies[0] if 0 in self._copies else self._agreed_value(in_replica=False)

    def read_value(self) -> np.ndarray:
        """:attr:`value` (TF's name)."""
        return self.value

    def numpy(self) -> np.ndarray:
        return np.array(self.value, copy=True)

    def assign(self, value: Any) -> None:
        """Set the calling replica's copy (replica function) or every copy (host code:
        every worker must assign the same value, as TF's mirrored variables require).

        Raises:
            ValueError, TypeError: as :meth:`ipu_node.Variable.assign`.
        """
        i = self._local()
        arr = self._cast(value)  # (checks shape and dtype, casts)
        if i is not None:
            self._copy(i)  # (agreed and placed on first use)
            with self._lock:
                self._copies[i] = arr
            return
        with self._lock:   # host: the value new copies start from, and every copy
            self._value, self._agreed = arr, True
            self._copies = {k: arr.copy() for k in self._copies}

    def assign_add(self, delta: Any) -> None:
        """``assign(value + delta)`` on the calling replica's copy (host: on every copy)."""
        self.assign(self.value + np.asarray(delta, self.dtype))


class MirroredVariable(_PerReplica):
    """A Variable with the same value on every replica of the job (module docstring).

    Made by ``strategy.Variable``. ``memories``: the IPU memories that hold the local
    replicas' copies, placed now; None: placed when each replica first uses its copy, on
    the IPU of the replica's current shard (a pipeline moves it to its stage's IPU); empty:
    kept on the host. Every replica applies the same summed gradient to its own copy, so the
    copies stay equal; host code reads copy 0.
    """

    def __init__(self, initial_value: Any, name: str | None, trainable: bool, memories,
                 aggregation: VariableAggregation, agree=None, agreed: bool = True,
                 parent: "MirroredVariable | None" = None):
        super().__init__(initial_value, name, trainable, agree, agreed)
        self.aggregation = aggregation
        self.on_host = memories is not None and not memories
        self._parent = parent
        self._placed: dict[int, Any] = {}   # local replica -> IPUMemory holding its copy
        weakref.finalize(self, _free_placed, self._placed, self._tensor_name)
        for i, memory in enumerate(memories or ()):
            memory.allocate(self._tensor_name, self.nbytes)
            self._placed[i] = memory
            self._copies[i] = self._value.copy()
        if memories:
            self.ipu_id = memories[0].ipu_id

    def _place_copy(self, i: int) -> None:
        if self.on_host or i in self._placed:
            return
        from ipu_node.execution.scopes import current_shard
        from ipu_node.runtime.placement import _target

        parent = self._parent._placed.get(i) if self._parent is not None else None
        memory = parent if parent is not None else _target(
            f"Variable {self.name!r}", current_shard() or 0, None)
        memory.allocate(self._tensor_name, self.nbytes)
        self._placed[i] = memory
        if i == 0:
            self.ipu_id = memory.ipu_id

    def _relocate(self, shard: int) -> None:
        """Move the calling replica's copy to its IPU ``shard`` (a pipeline stage that uses
        the Variable runs there)."""
        i = self._local()
        if i is None or self.on_host:
            return
        self._copy(i)
        from ipu_node.runtime.placement import _target

        target = _target(f"Variable {self.name!r}", shard, None)
        old = self._placed.get(i)
        if old is target:
            return
        target.allocate(self._tensor_name, self.nbytes)
        if old is not None:
            _free_all([old], self._tensor_name)
        self._placed[i] = target
        if i == 0:
            self.ipu_id, self.shard = target.ipu_id, shard

    def make_slot(self, name: str) -> "MirroredVariable":
        """An optimizer's slot for this Variable (zeros, mirrored alike, kept where this
        Variable is kept: in host memory when it is on the host, else beside each replica's
        copy)."""
        return MirroredVariable(np.zeros(self.shape, self.dtype), name, False,
                                [] if self.on_host else None, VariableAggregation.NONE,
                                parent=self)

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
                 aggregation: VariableAggregation, reader, agree=None, agreed: bool = True):
        super().__init__(initial_value, name, trainable, agree, agreed)
        self.aggregation = aggregation
        self._reader = reader

    def _host_value(self) -> np.ndarray:
        n = get_system().num_local_replicas
        base = self._agreed_value(in_replica=False)
        copies = [self._copies.get(i, base) for i in range(n)]
        return self._reader(self, copies)

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
