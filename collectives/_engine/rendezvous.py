"""The local rendezvous: the replicas of one instance meet for each call number.

Every local replica deposits its descriptor and value for call number ``seq`` in a
:class:`Slot`; the last to arrive leads the call (the engine runs it) while the others wait
for the results. A replica that returns from its function (``strategy.run``) while others
wait for it in a collective is divergent control flow: one waiting replica takes the lead
and shares an error (the ``lead_error`` callback of :meth:`Rendezvous.wait`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from collectives._engine.descriptor import Descriptor
from collectives.errors import CollectiveAbortedError
from collectives.options import CollectiveOptions
from collectives.waiting import Patience


class Slot:
    """The rendezvous of the local replicas for one call number."""

    __slots__ = ("descs", "values", "arrived", "picked", "leading", "done", "results",
                 "error", "plan")

    def __init__(self, n: int):
        self.descs: list[Descriptor | None] = [None] * n
        self.values: list[Any] = [None] * n
        self.arrived = 0
        self.picked = 0
        self.leading = False
        self.done = False
        self.results: list | None = None
        self.error: BaseException | None = None
        self.plan: Any = None  # (the first arrival's: the call's plan)


class Rendezvous:
    """The call numbers and slots of the local replicas of one instance (thread-safe).

    Args:
        num_local_replicas: replicas of this instance.
        replica_index_offset: global index of this instance's first replica.
        options: stall warning and timeout (wall seconds) of a replica's wait.

    Attributes:
        failure: the error that made the collectives of this instance unusable (a transport
            failure or timeout, divergence, a replica that failed while others waited for
            it), or None.
    """

    def __init__(self, num_local_replicas: int, replica_index_offset: int,
                 options: CollectiveOptions):
        self.num_local_replicas = num_local_replicas
        self.replica_index_offset = replica_index_offset
        self.options = options
        self.cond = threading.Condition()
        self.failure: BaseException | None = None
        self.seq = [0] * num_local_replicas
        self.host_seq = 0
        self._slots: dict[int, Slot] = {}
        self._finished_at: list[int | None] = [None] * num_local_replicas

    # -- the failure state --------------------------------------------------------------

    def raise_if_failed(self) -> None:
        """Raise ``CollectiveAbortedError`` (caused by the failure) once the instance's
        collectives are unusable."""
        if self.failure is not None:
            raise CollectiveAbortedError(
                f"collectives are unusable after {type(self.failure).__name__}: "
                f"{self.failure}. This cannot be recovered in this process (the replicas' "
                f"calls no longer line up, or a transfer may be half done): end the program "
                f"and fix the first error (README: when a collective fails)") \
                from self.failure

    def abort(self, cause: BaseException) -> None:
        """Make the collectives unusable (the first cause is kept) and wake every waiting
        replica."""
        with self.cond:
            if self.failure is None:
                self.failure = cause
            self.cond.notify_all()

    # -- one call -----------------------------------------------------------------------

    def arrive(self, local_index: int, desc: Descriptor, value: Any, plan: Any
               ) -> tuple[Slot, int, bool]:
        """Deposit replica ``local_index``'s call (its descriptor, input and plan,
        :class:`~collectives._engine.plan.Plan`); returns ``(slot, seq, leads)``: the slot, the
        call number, and whether this replica arrived last and leads.

        Raises:
            CollectiveAbortedError: the collectives are unusable.
        """
        with self.cond:
            seq = self.seq[local_index]
            slot = self._slots.get(seq)
            if slot is None or not slot.leading:
                # a replica arriving at a call that already failed shares its error
                self.raise_if_failed()
            self.seq[local_index] = seq + 1
            desc = desc.with_seq(seq)
            if slot is None:
                slot = self._slots[seq] = Slot(self.num_local_replicas)
            slot.descs[local_index] = desc
            slot.values[local_index] = value
            slot.plan = slot.plan or plan
            slot.arrived += 1
            leader = slot.arrived == self.num_local_replicas and not slot.leading
            slot.leading = slot.leading or leader
        return slot, seq, leader

    def done(self, slot: Slot) -> None:
        """The leader has put the results (or the error) in ``slot``: wake the others."""
        with self.cond:
            slot.done = True
            self.cond.notify_all()

    def leave(self, slot: Slot, seq: int) -> None:
        """A replica has taken its result from ``slot``; the last one frees it."""
        with self.cond:
            slot.picked += 1
            if slot.picked == self.num_local_replicas:
                # (a slot abandoned for divergence stays: late replicas share its error)
                del self._slots[seq]

    def wait(self, slot: Slot, desc: Descriptor, local_index: int,
             lead_error: Callable[[Slot, Descriptor, str], None]) -> None:
        """Wait until ``slot`` is done. When a local replica that has not arrived has
        returned from its function, take the lead and call ``lead_error(slot, desc,
        message)`` (without the lock), which must finish the slot.

        Raises:
            CollectiveTimeoutError: replicas did not arrive within the timeout.
        """
        def missing() -> str:
            absent = [self.replica_index_offset + i
                      for i, d in enumerate(slot.descs) if d is None]
            return f"replicas {absent}" if absent else "the other instances"

        patience = Patience(f"{desc.label()} on replica "
                            f"{self.replica_index_offset + local_index}",
                            self.options, missing)
        cond = self.cond
        with cond:
            while not slot.done:
                if (self.failure is not None and slot.arrived < self.num_local_replicas
                        and not slot.leading):
                    slot.error = CollectiveAbortedError(
                        f"{desc.label()}: abandoned because a replica of this instance failed "
                        f"({type(self.failure).__name__}: {self.failure})")
                    slot.error.__cause__ = self.failure
                    return
                gone = [i for i, d in enumerate(slot.descs)
                        if d is None and self._finished_at[i] is not None]
                if gone and not slot.leading:
                    slot.leading = True
                    message = self._divergence_message(slot, desc, gone)
                    cond.release()
                    try:
                        lead_error(slot, desc, message)
                    finally:
                        cond.acquire()
                    continue
                cond.wait(patience.slice_s())
                if slot.arrived < self.num_local_replicas and not slot.leading:
                    patience.check()

    def _divergence_message(self, slot: Slot, desc: Descriptor, gone: list[int]) -> str:
        off = self.replica_index_offset
        here = [off + i for i, d in enumerate(slot.descs) if d is not None]
        names = ", ".join(f"replica {off + i} (after {self._finished_at[i]} collectives)"
                          for i in gone)
        return (f"divergent control flow at {desc.describe()}: {names} returned from its "
                f"function without calling it, while replicas {here} called it")

    # -- runs ---------------------------------------------------------------------------

    def run_started(self) -> None:
        """The local replicas are about to run a function; none has returned yet."""
        with self.cond:
            self._finished_at = [None] * self.num_local_replicas

    def replica_finished(self, local_index: int) -> None:
        """Local replica ``local_index`` returned from its function: replicas waiting for
        it are told (divergence)."""
        with self.cond:
            self._finished_at[local_index] = self.seq[local_index]
            self.cond.notify_all()

    def next_host_seq(self) -> int:
        """The next call number of the instance's host code.

        Raises:
            CollectiveAbortedError: the collectives are unusable.
        """
        with self.cond:
            self.raise_if_failed()
            seq = self.host_seq
            self.host_seq += 1
        return seq
