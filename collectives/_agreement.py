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

from collectives.descriptor import Descriptor
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
        self._single = transport.process_count == 1

    def instance_name(self, i: int) -> str:
        """``"instance 1 (replicas 2..3)"``."""
        L = self.num_local_replicas
        if L == 1:
            return f"instance {i} (replica {i})"
        return f"instance {i} (replicas {i * L}..{i * L + L - 1})"

    def _instance_names(self, instances: Sequence[int]) -> str:
        return ", ".join(self.instance_name(i) for i in instances)

    def exchange_descriptors(self, desc: Descriptor) -> Descriptor:
        """Exchange the descriptors; raise on every instance if any differs or failed.

        Raises:
            CollectiveMismatchError: an instance called something else, or carries an error
                (``desc.error`` here included).
            CollectiveTimeoutError: an instance did not arrive in time.
        """
        self.exchange(desc)
        return desc

    def exchange(self, desc: Descriptor, payload: np.ndarray | None = None,
                 seq: int | None = None, fingerprint: int | None = None
                 ) -> list[np.ndarray] | None:
        """:meth:`exchange_descriptors` fused with the data of a small call: every
        instance's ``payload`` (uint8, at most ``EAGER_MAX_BYTES``; None: agree only), in
        instance order, when the transport carried them
        (:meth:`~collectives.transports.base.Communicator.agree_gather`), else None (the
        caller moves the data itself).

        Args:
            desc: the call's descriptor.
            payload: this instance's bytes, or None.
            seq: the call's number when it is not ``desc.seq`` (the engine's cached
                descriptors carry 0: the descriptor with ``seq`` is made only for a
                message).
            fingerprint: ``desc.with_seq(seq).fingerprint()``, when the caller has it.

        Raises:
            CollectiveMismatchError, CollectiveTimeoutError: as :meth:`exchange_descriptors`.
        """
        if self.transport.process_count == 1:
            if desc.error:
                raise CollectiveMismatchError(desc.error)
            return None
        if seq is None:
            seq = desc.seq
        elif seq != desc.seq and fingerprint is None:
            desc = desc.with_seq(seq)
        patience = self.arrival_patience(Arrival(self, desc, seq))
        # the common case, every instance agrees: one small all-gather or reduction of a
        # fingerprint (O(log P)), with the data of a small call; whole descriptors only to
        # name a difference (every instance sees the same answer, so every one takes the
        # same path)
        agreed, blocks = (self._comm or self._everyone()).agree_gather(
            desc.fingerprint() if fingerprint is None else fingerprint, payload, patience)
        if agreed:
            if desc.error:  # every instance failed alike
                raise CollectiveMismatchError(desc.error)
            return blocks
        self.disagree(desc if seq == desc.seq else desc.with_seq(seq), patience)
        return None

    def agree_gather(self, desc: Descriptor, seq: int, fingerprint: int,
                     payload: np.ndarray | None, patience: Patience
                     ) -> list[np.ndarray] | None:
        """:meth:`exchange` of call number ``seq`` of ``desc`` (a descriptor without an
        error, ``seq`` 0) whose ``fingerprint`` and ``patience`` the caller has (the path
        of :class:`~collectives._sole.SolePlan`, on every call).

        Raises:
            CollectiveMismatchError, CollectiveTimeoutError: as :meth:`exchange_descriptors`.
        """
        if self._single:
            return None
        agreed, blocks = (self._comm or self._everyone()).agree_gather(fingerprint, payload,
                                                                        patience)
        if agreed:
            return blocks
        self.disagree(desc.with_seq(seq), patience)
        return None

    def eager_exchange(self, sizes: Sequence[int]) -> tuple[np.ndarray, Callable]:
        """``(send, agree)`` of :meth:`agree_gather` among every instance, with ``sizes``
        (every instance's payload bytes) written in place
        (:meth:`~collectives.transports.base.Communicator.eager_exchange`): for a caller
        that makes the same call again and again (:class:`~collectives._sole.SolePlan`),
        which calls :meth:`disagree` itself when ``agree`` says the fingerprints differ."""
        return (self._comm or self._everyone()).eager_exchange(sizes)

    def eager_index_exchange(self, piece: int) -> tuple[np.ndarray, Callable, int] | None:
        """``(send, agree, sent)`` of an eager all-to-all among every instance, ``piece``
        bytes for each (:meth:`~collectives.transports.base.Communicator.eager_index_exchange`;
        ``sent``: the payload bytes this instance sends a call, ``index_sent_bytes``), for
        a caller like :meth:`eager_exchange`'s; None where the transport moves such pieces
        no faster than :meth:`eager_exchange` moves whole payloads (``takes_index``)."""
        comm = self._comm or self._everyone()
        if not comm.takes_index(piece):
            return None
        return (*comm.eager_index_exchange(piece), comm.index_sent_bytes(piece))

    def _everyone(self):
        """The communicator of every instance (made at the first agreement)."""
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
        gathered = self._comm.allgather(mine, patience)
        self.check_descriptors(desc, mine, gathered)

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
            return f"called {d.signature()}"

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
                           f"{first.signature()}, replica {b} called {other.signature()} "
                           f"({'; '.join(diff)})")
                return replace(first, error=message)
        return first
