"""Agreement between instances: every instance learns that all called the same collective.

:class:`Agreement` agrees on a call's descriptor before any data moves
(:meth:`Agreement.exchange_descriptors`: a fingerprint round, whole descriptors only when the
fingerprints differ, compared by :meth:`Agreement.check_descriptors`), names the instances
that have not arrived (:meth:`Agreement.arrival_patience`, :class:`Arrival`), and compares
the descriptors of the local replicas of one call (:meth:`Agreement.check_local`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from collectives._engine.descriptor import Descriptor
from collectives.errors import CollectiveMismatchError
from collectives.options import CollectiveOptions
from collectives.transports.base import Transport
from collectives.waiting import Patience

#: the op of the descriptor an instance sends when its program ends
END_OF_PROGRAM = "end of program"


class Text:
    """A message text made when first shown (most waits end without one)."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], str]):
        self._make = make

    def __str__(self) -> str:
        return self._make()

    def __format__(self, spec: str) -> str:
        return format(self._make(), spec)


def _other_instances() -> str:
    return "the other instances"


class Arrival:
    """The text of an agreement's wait, ``"cross_replica_sum #3 on instance 0 (replica
    0)"``, made when first shown (most waits end without one). ``seq``: the call's number
    (a plan's arrival is reused from call to call: the caller sets it)."""

    __slots__ = ("_agreement", "_desc", "seq")

    def __init__(self, agreement: "Agreement", desc: Descriptor, seq: int):
        self._agreement, self._desc, self.seq = agreement, desc, seq

    def __str__(self) -> str:
        desc, agreement = self._desc, self._agreement
        if desc.seq != self.seq:
            desc = desc.with_seq(self.seq)
        return f"{desc.label()} on {agreement.instance_name(agreement.transport.process_index)}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Agreement:
    """The descriptor checks of one instance.

    Args:
        transport: how this instance reaches the others.
        options: stall warning and timeout (wall seconds).
        num_local_replicas: replicas of each instance (for names in messages).
        replica_index_offset: global index of this instance's first replica.
    """

    def __init__(self, transport: Transport, options: CollectiveOptions,
                 num_local_replicas: int, replica_index_offset: int):
        self.transport = transport
        self.options = options
        self.num_local_replicas = num_local_replicas
        self.replica_index_offset = replica_index_offset
        #: every instance of the job, increasing (the members of every agreement)
        self.everyone = tuple(range(transport.process_count))
        self._comm = None  # the communicator of everyone, at the first agreement
        #: instances seen to have ended their program (an "end of program" descriptor in a
        #: disagreement) -> the collectives each had called
        self.ended: dict[int, int] = {}

    def instance_name(self, i: int) -> str:
        """``"instance 1 (replicas 2..3)"``."""
        L = self.num_local_replicas
        if L == 1:
            return f"instance {i} (replica {i})"
        return f"instance {i} (replicas {i * L}..{i * L + L - 1})"

    def _instance_names(self, instances: Sequence[int]) -> str:
        return ", ".join(self.instance_name(i) for i in instances)

    def exchange_descriptors(self, desc: Descriptor) -> Descriptor:
        """Agree on ``desc``'s fingerprint; raise on every instance if any differs or
        carries an error (``desc.error`` here included).

        Raises:
            CollectiveMismatchError: an instance called something else, or carries an error.
            CollectiveTimeoutError: an instance did not arrive in time.
        """
        if self.transport.process_count == 1:
            if desc.error:
                raise CollectiveMismatchError(desc.error)
            return desc
        patience = self.arrival_patience(Arrival(self, desc, desc.seq))
        # every instance sees the same answer, so every one takes the same path
        agreed, _ = self.communicator().agree(desc.fingerprint(), patience).wait()
        if not agreed:
            self.disagree(desc, patience)
        if desc.error:  # every instance failed alike
            raise CollectiveMismatchError(desc.error)
        return desc

    def communicator(self):
        """The communicator of every instance (the members of every agreement), made at
        the first call."""
        if self._comm is None:
            self._comm = self.transport.communicator(self.everyone)
        return self._comm

    def disagree(self, desc: Descriptor, patience: Patience) -> None:
        """The fingerprints of call ``desc`` (its ``seq`` the call's) differ: every instance
        all-gathers its whole descriptor and raises the difference
        (:meth:`check_descriptors`).

        Raises:
            CollectiveMismatchError: as :meth:`exchange_descriptors`.
        """
        mine = desc.encode()
        count = len(self.everyone)
        gathered = np.empty(count * mine.nbytes, np.uint8)
        self.communicator().allgatherv(mine, gathered, [mine.nbytes] * count,
                                       patience).wait()
        self.check_descriptors(desc, mine, gathered.reshape(count, mine.nbytes))

    def arrival_patience(self, arrival: Arrival) -> Patience:
        """The wait for the other instances' descriptors (``arrival``: the call waited
        for): names those not arrived."""
        return Patience(arrival, self.options, _other_instances,
                        name_absent=self._instance_names)

    def check_descriptors(self, desc: Descriptor, mine: np.ndarray,
                          gathered: np.ndarray) -> None:
        """Raise ``CollectiveMismatchError`` unless every row of ``gathered`` (one encoded
        descriptor per instance) is ``mine``, naming the first difference."""
        if not desc.error and gathered.tobytes() == mine.tobytes() * len(gathered):
            return  # the same bytes everywhere: nothing to decode
        descs = [Descriptor.decode(row) for row in gathered]
        for i, d in enumerate(descs):
            if d.op == END_OF_PROGRAM and i != self.transport.process_index:
                self.ended.setdefault(i, d.seq)
        errors = [d.error for d in descs if d.error]
        if errors:
            raise CollectiveMismatchError(errors[0])
        for i, other in enumerate(descs):
            diff = descs[0].differences(other)
            if diff:
                raise CollectiveMismatchError(self._mismatch_message(descs[0], other, i, diff))

    def _mismatch_message(self, first: Descriptor, other: Descriptor, i: int,
                          diff: list[str]) -> str:
        def what(d: Descriptor) -> str:
            if d.op == END_OF_PROGRAM:
                return f"ended its program after {d.seq} collectives"
            return f"called {d.describe()}"

        if END_OF_PROGRAM in (first.op, other.op):
            detail = "an instance stopped calling collectives (divergent control flow)"
        else:
            detail = "; ".join(diff)
        label = other.label() if first.op == END_OF_PROGRAM else first.label()
        return (f"replicas disagree on {label}: {self.instance_name(0)} {what(first)}, "
                f"{self.instance_name(i)} {what(other)} ({detail})")

    def check_local(self, descs: Sequence[Descriptor]) -> Descriptor:
        """The call's descriptor: the first replica's, carrying an error naming the first
        local replica whose descriptor differs from it (the other instances raise it too)."""
        first = descs[0]
        for i, other in enumerate(descs[1:], start=1):
            diff = first.differences(other)
            if diff:
                a, b = self.replica_index_offset, self.replica_index_offset + i
                message = (f"replicas disagree on {first.label()}: replica {a} called "
                           f"{first.describe()}, replica {b} called {other.describe()} "
                           f"({'; '.join(diff)})")
                return replace(first, error=message)
        return first
