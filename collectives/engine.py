"""The collective engine of one instance: local rendezvous, checks, then the algorithm.

Every local replica deposits its contribution for call number ``seq``; the last to arrive
(the leader) checks that all descriptors agree, all-gathers the descriptors with the other
instances (so every instance raises on a mismatch instead of waiting), runs the algorithm
(local combine in shared memory, exchange over the transport) and hands each replica its
result. Only the leader touches the transport, one call at a time.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from collectives.descriptor import Descriptor
from collectives.errors import (CollectiveAbortedError, CollectiveError,
                                CollectiveMismatchError)
from collectives.options import CollectiveOptions
from collectives.transports.base import Transport
from collectives.waiting import Patience

logger = logging.getLogger("collectives")

#: ``algorithm(engine, descriptor, values) -> results``: values and results per local replica.
Algorithm = Callable[["CollectiveEngine", Descriptor, Sequence[Any]], list]


class _Slot:
    """The rendezvous of the local replicas for one call number."""

    def __init__(self, n: int):
        self.descs: list[Descriptor | None] = [None] * n
        self.values: list[Any] = [None] * n
        self.arrived = 0
        self.picked = 0
        self.done = False
        self.results: list | None = None
        self.error: BaseException | None = None
        self.algorithm: Algorithm | None = None


class CollectiveEngine:
    """Runs collectives for the replicas of one instance.

    Args:
        num_replicas: global replication factor.
        num_local_replicas: replicas of this instance.
        replica_index_offset: global index of this instance's first replica.
        transport: how this instance reaches the others.
        options: stall warning and timeout.
    """

    def __init__(self, num_replicas: int, num_local_replicas: int, replica_index_offset: int,
                 transport: Transport, options: CollectiveOptions):
        self.num_replicas = num_replicas
        self.num_local_replicas = num_local_replicas
        self.replica_index_offset = replica_index_offset
        self.transport = transport
        self.options = options
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._seq = [0] * num_local_replicas
        self._host_seq = 0
        self._failure: BaseException | None = None

    # -- entry points -------------------------------------------------------------------

    def replica_call(self, local_index: int, desc: Descriptor, value: Any,
                     algorithm: Algorithm) -> Any:
        """Called by local replica ``local_index``; returns its share of the result.

        ``desc.seq`` is filled in here. Raises the collective's error on every replica.
        """
        with self._cond:
            self._raise_if_failed()
            seq = self._seq[local_index]
            self._seq[local_index] = seq + 1
            desc = replace(desc, seq=seq)
            slot = self._slots.get(seq)
            if slot is None:
                slot = self._slots[seq] = _Slot(self.num_local_replicas)
            slot.descs[local_index] = desc
            slot.values[local_index] = value
            slot.algorithm = slot.algorithm or algorithm
            slot.arrived += 1
            leader = slot.arrived == self.num_local_replicas
        if leader:
            self._lead(slot)
        else:
            self._wait(slot, desc, local_index)
        with self._cond:
            slot.picked += 1
            if slot.picked == self.num_local_replicas:
                del self._slots[seq]
        if slot.error is not None:
            raise slot.error
        return slot.results[local_index]

    def host_call(self, desc: Descriptor, values: Sequence[Any], algorithm: Algorithm) -> list:
        """A collective issued by the instance's host code (outside replica functions), with
        one value per local replica. Host calls have their own sequence numbers."""
        with self._cond:
            self._raise_if_failed()
            seq = self._host_seq
            self._host_seq += 1
        desc = replace(desc, seq=seq, op=f"host {desc.op}")
        return self._execute([desc] * self.num_local_replicas, list(values), algorithm)

    def abort(self, cause: BaseException) -> None:
        """A local replica failed: wake every waiting replica with an error."""
        with self._cond:
            if self._failure is None:
                self._failure = cause
            self._cond.notify_all()

    # -- internals ----------------------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise CollectiveAbortedError(
                f"collectives are unusable after a replica failed with "
                f"{type(self._failure).__name__}: {self._failure}") from self._failure

    def _lead(self, slot: _Slot) -> None:
        try:
            slot.results = self._execute(slot.descs, slot.values, slot.algorithm)
        except BaseException as exc:  # every replica re-raises it
            slot.error = exc
        with self._cond:
            slot.done = True
            self._cond.notify_all()

    def _wait(self, slot: _Slot, desc: Descriptor, local_index: int) -> None:
        def missing() -> str:
            absent = [self.replica_index_offset + i
                      for i, d in enumerate(slot.descs) if d is None]
            return f"replicas {absent}" if absent else "the other instances"

        patience = Patience(f"{desc.label()} on replica "
                            f"{self.replica_index_offset + local_index}",
                            self.options, missing)
        with self._cond:
            while not slot.done:
                if self._failure is not None and slot.arrived < self.num_local_replicas:
                    slot.error = CollectiveAbortedError(
                        f"{desc.label()}: abandoned because a replica of this instance failed "
                        f"({type(self._failure).__name__}: {self._failure})")
                    slot.error.__cause__ = self._failure
                    return
                self._cond.wait(patience.slice_s())
                if slot.arrived < self.num_local_replicas:
                    patience.check()

    def _execute(self, descs: Sequence[Descriptor], values: Sequence[Any],
                 algorithm: Algorithm) -> list:
        desc = self._check_local(descs)
        desc = self._check_instances(desc)
        return algorithm(self, desc, values)

    def _check_local(self, descs: Sequence[Descriptor]) -> Descriptor:
        first = descs[0]
        for i, other in enumerate(descs[1:], start=1):
            diff = first.differences(other)
            if diff:
                a, b = self.replica_index_offset, self.replica_index_offset + i
                message = (f"replicas disagree on {first.label()}: replica {a} called "
                           f"{first.signature()}, replica {b} called {other.signature()} "
                           f"({'; '.join(diff)})")
                return replace(first, error=message)
        return first

    def _check_instances(self, desc: Descriptor) -> Descriptor:
        """All-gather the descriptors; raise on every instance if any differs or failed."""
        if self.transport.process_count == 1:
            if desc.error:
                raise CollectiveMismatchError(desc.error)
            return desc
        comm = self.transport.communicator(tuple(range(self.transport.process_count)))
        patience = Patience(desc.label(), self.options, lambda: "the other instances")
        gathered = comm.allgather(desc.encode(), patience)
        descs = [Descriptor.decode(row) for row in gathered]
        errors = [d.error for d in descs if d.error]
        if errors:
            raise CollectiveMismatchError(errors[0])
        L = self.num_local_replicas
        for i, other in enumerate(descs):
            diff = descs[0].differences(other)
            if diff:
                raise CollectiveMismatchError(
                    f"replicas disagree on {descs[0].label()}: replicas {0}..{L - 1} "
                    f"(instance 0) called {descs[0].signature()}, replicas {i * L}.."
                    f"{i * L + L - 1} (instance {i}) called {other.signature()} "
                    f"({'; '.join(diff)})")
        return desc
