"""The transport seam the collective engine sits on: a :class:`Communicator` of a fixed set of
instances with four operations, each of which starts at once and returns a handle
(:class:`Work`, as torch's ``ProcessGroup`` operations return a ``Work`` and mpi4py's
nonblocking calls a ``Request``), and a record of what it can do beyond them
(:class:`Capabilities`).

Every buffer is a 1-D ``uint8`` numpy array (raw bytes); the engine reinterprets them with
the dtype and shape the descriptors agreed on, so nothing is pickled. The caller owns every
buffer it passes, result buffers included; a transport writes the bytes it receives into
them and keeps nothing of them past the operation's :meth:`Work.wait`.

The operations:

* :meth:`Communicator.agree`: the agreement that precedes every collective, every member's
  fingerprint compared in O(log P) rounds; the same answer on every member. With a
  :class:`Carry` (where :attr:`Capabilities.carries`) it also moves a small call's data:
  every member's payload (``gathered``), or each member's piece of every payload
  (``indexed``, where :attr:`Capabilities.index_limit_bytes` and :func:`takes_index` say
  so), which the caller has written into :meth:`Communicator.send_buffer`.
* :meth:`Communicator.allgatherv`: every member's bytes, concatenated in member order.
* :meth:`Communicator.alltoallv`: member j's part of every member's bytes.
* :meth:`Communicator.broadcast`: the root's bytes on every member.

Contract for implementations (local, MPI, gRPC; :mod:`collectives.testing` checks it):

* Only one thread of an instance calls a communicator at a time (the engine's leader).
* Every wait polls and backs off with the :class:`~collectives.waiting.Patience` its
  operation was started with (``patience.backoff()``, which raises
  ``CollectiveTimeoutError`` past the timeout): never an unbounded blocking call.
* While an agreement, or an all-gather of equal counts of at most
  :data:`NAMED_GATHER_MAX_BYTES` a member (the descriptors' exchange after a disagreement),
  waits, it reports the members whose part has not arrived with ``patience.waiting_for``,
  so a stall names the missing instances. The data operations run after every member has
  agreed (``patience.committed``) and need not report.
* Byte counts are exact: a member sends what the others expect to receive.
* ``posted=seq`` (where :attr:`Capabilities.posts`): the operation is call number ``seq``'s
  data, started before its agreement so that the bytes move while the fingerprints are
  compared. Its messages carry that call's own mark, so a call that does not agree leaves
  nothing a later call could take: the caller then calls :meth:`Work.withdraw` instead of
  :meth:`Work.wait`. Every member whose call agrees passes the same ``posted``; a
  transport that cannot start it yet starts it at :meth:`Work.wait`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from collectives.waiting import Patience

__all__ = ["AGREE_HEADER_BYTES", "CARRIED_MAX_BYTES", "NAMED_GATHER_MAX_BYTES", "Capabilities",
           "Carry", "Communicator", "Done", "Transport", "Work", "agree_block_bytes",
           "index_rounds", "index_sent_bytes", "takes_index"]

#: the most payload bytes per member an agreement carries (:class:`Carry`); a caller passes
#: a larger payload never (ipupod assumption: up to here moving every member's bytes to
#: every member in the agreement is cheaper than a second round, ``benchmarks/thresholds.py
#: --only carried``; the receive buffers are P times this)
CARRIED_MAX_BYTES = 64 << 10

#: an all-gather of equal counts of at most this many bytes a member reports who is missing
#: while it waits (it may be the descriptors' exchange after a disagreement, which runs
#: before every member is known to have arrived)
NAMED_GATHER_MAX_BYTES = 64 << 10

#: bytes of the header of an agreement block on the wire: the fingerprint and the payload
#: length, int64 each; the payload follows, padded to 8 bytes
AGREE_HEADER_BYTES = 16


def agree_block_bytes(payload_bytes: int) -> int:
    """Bytes of an agreement block carrying ``payload_bytes`` (header and padded
    payload)."""
    return AGREE_HEADER_BYTES + ((payload_bytes + 7) & -8)


def index_rounds(size: int) -> list[tuple[int, int, tuple[int, ...]]]:
    """Bruck's index rounds among ``size`` members (Bruck et al., "Efficient algorithms for
    all-to-all communications in multiport message-passing systems", IEEE TPDS 8(11),
    1997): per round ``(distance, count, slots)``, ``count`` the blocks of the all-gather
    agreement's round at that distance, ``slots`` the pieces that move in it (increasing;
    slot ``j`` of member ``r`` starts as its piece for member ``r - j``)."""
    rounds, dist = [], 1
    while dist < size:
        rounds.append((dist, min(dist, size - dist),
                       tuple(j for j in range(1, size) if j & dist)))
        dist <<= 1
    return rounds


def takes_index(size: int, piece: int, limit_bytes: int) -> bool:
    """Whether an agreement among ``size`` members carries pieces of ``piece`` bytes in
    Bruck's index rounds (:class:`Carry` ``indexed``) rather than gathering the whole
    payloads: when every index round's message is at most ``limit_bytes`` (a transport's
    :attr:`Capabilities.index_limit_bytes`; 0: never) and some round of the gathering
    agreement's is not. The same answer on every member."""
    if piece <= 0 or limit_bytes <= 0:
        return False
    plan = index_rounds(size)
    payload = agree_block_bytes(size * piece)
    return all(AGREE_HEADER_BYTES * count + agree_block_bytes(len(slots) * piece)
               - AGREE_HEADER_BYTES <= limit_bytes for _, count, slots in plan) and any(
        count * payload > limit_bytes for _, count, _ in plan)


def index_sent_bytes(size: int, piece: int) -> int:
    """Payload bytes a member sends in one indexed agreement among ``size`` members (a piece
    forwarded counts again; headers not counted): ``piece`` times the slots of every
    round."""
    return piece * sum(len(slots) for _, _, slots in index_rounds(size))


@dataclass(frozen=True)
class Capabilities:
    """What a communicator does beyond the four operations (all off by default).

    Attributes:
        carries: :meth:`Communicator.agree` carries a :class:`Carry` payload.
        posts: the data operations take ``posted=seq`` (started before the call's
            agreement).
        index_limit_bytes: the agreement carries ``indexed`` payloads where
            :func:`takes_index` says so with this limit (its messages' largest size); 0:
            never.
    """

    carries: bool = False
    posts: bool = False
    index_limit_bytes: int = 0


@dataclass(frozen=True)
class Carry:
    """The payload an agreement carries.

    Attributes:
        sizes: every member's payload bytes, in member order (each at most
            :data:`CARRIED_MAX_BYTES`; known to every member from the call's descriptor).
        piece: 0 (``gathered``): every member receives every member's payload. Else
            (``indexed``): every payload is ``len(sizes)`` pieces of ``piece`` bytes, piece
            j for member j, and member j receives only its piece of each.
    """

    sizes: tuple[int, ...]
    piece: int = 0

    @classmethod
    def gathered(cls, sizes: Sequence[int]) -> "Carry":
        return cls(tuple(int(s) for s in sizes))

    @classmethod
    def indexed(cls, size: int, piece: int) -> "Carry":
        return cls((size * piece,) * size, piece)

    def sent_bytes(self, rank: int) -> int:
        """Payload bytes member ``rank`` sends in one agreement (headers not counted): its
        payload to every other member, or, indexed, its pieces as often as they move
        (:func:`index_sent_bytes`)."""
        if self.piece:
            return index_sent_bytes(len(self.sizes), self.piece)
        return self.sizes[rank] * (len(self.sizes) - 1)


class Work(ABC):
    """A started operation of a communicator."""

    __slots__ = ()

    @abstractmethod
    def wait(self) -> Any:
        """Wait for the operation with the patience it was started with; its result (see
        the operation).

        Raises:
            CollectiveTimeoutError: past the patience's timeout.
            PeerLostError: a peer gave up on the job.
            TransportError: the transport failed (or a peer's message is malformed).
        """

    @abstractmethod
    def test(self) -> bool:
        """Whether the operation has completed (its :meth:`wait` would not wait)."""

    def withdraw(self) -> None:
        """Give up an operation started with ``posted=`` whose call did not agree (instead of
        :meth:`wait`): no later call can take its messages. Nothing for any other
        operation.

        Raises:
            TransportError: its messages cannot be withdrawn safely (the engine stops).
        """


class Done(Work):
    """The handle of an operation that completed when it started: ``result`` at once."""

    __slots__ = ("result",)

    def __init__(self, result: Any):
        self.result = result

    def wait(self) -> Any:
        return self.result

    def test(self) -> bool:
        return True


class Communicator(ABC):
    """A fixed set of instances that exchange data together (module docstring).

    Attributes:
        members: instance indices, increasing.
        rank: this instance's position in ``members``.
        capabilities: what it does beyond the operations (:class:`Capabilities`).
    """

    members: tuple[int, ...]
    rank: int
    capabilities: Capabilities = Capabilities()

    @property
    def size(self) -> int:
        return len(self.members)

    def send_buffer(self, carry: Carry) -> np.ndarray:
        """Where this member writes its payload of ``carry`` before :meth:`agree`
        (``uint8[carry.sizes[rank]]``; the same memory at every call with an equal carry;
        MPI hands its agreement's own send buffer, which saves a copy). Only a
        communicator whose :attr:`Capabilities.carries` has one.

        Raises:
            NotImplementedError: this communicator carries no payload.
        """
        raise NotImplementedError(f"{type(self).__name__} carries no payload in its "
                                  "agreement (Capabilities.carries is false)")

    def agree(self, fingerprint: int, patience: Patience, carry: Carry | None = None) -> Work:
        """Whether every member passed the same ``fingerprint`` (an int in ``[0, 2^63)``).

        Args:
            fingerprint: this member's.
            patience: the wait; it reports the members whose part has not arrived.
            carry: the payload to carry (in :meth:`send_buffer`), where
                :attr:`Capabilities.carries`; None: agree only. Members whose fingerprints
                agree pass equal carries.

        Returns:
            A :class:`Work` whose result is ``(agreed, blocks)``: ``agreed`` the same on
            every member; ``blocks`` (when agreed with a carry) every member's payload in
            member order (``gathered``), or every member's piece for this member
            (``indexed``), ``uint8`` views valid until the next agreement on this
            communicator, else None. A communicator may hand the same list again for an
            equal carry (MPI, while it reuses its agreement's layout): its views then hold
            that call's payloads (a plan keeps its typed rows of a list it has seen;
            :mod:`collectives.testing` checks the payloads of a reused agreement).

        This default all-gathers the fingerprints (8 bytes a member) and carries nothing;
        transports override it with rounds whose time grows with log P.
        """
        mine = np.array([fingerprint], "<i8").view(np.uint8)
        rows = np.empty(8 * self.size, np.uint8)
        self.allgatherv(mine, rows, [8] * self.size, patience).wait()
        return Done((bool((rows.view("<i8") == fingerprint).all()), None))

    @abstractmethod
    def allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts: Sequence[int],
                   patience: Patience, *, posted: int | None = None) -> Work:
        """Every member's bytes, ``counts[j]`` from member j, concatenated in member order
        into ``recv`` (``uint8[sum(counts)]``); this member's from ``send`` (copied into
        its place), or, when ``send`` is None, already in place at ``sum(counts[:rank])``.
        The :class:`Work`'s result is ``recv``."""

    @abstractmethod
    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int], patience: Patience, *,
                  posted: int | None = None) -> Work:
        """Send ``send``'s consecutive parts of ``send_counts[j]`` bytes to member j (this
        member's own part copied); receive ``recv_counts[j]`` bytes from member j, in
        member order, into ``recv`` (at least ``sum(recv_counts)`` bytes). The
        :class:`Work`'s result is ``recv[:sum(recv_counts)]``."""

    @abstractmethod
    def broadcast(self, data: np.ndarray, root: int, patience: Patience, *,
                  posted: int | None = None) -> Work:
        """Member ``root``'s ``data`` into ``data`` on every member (the same length on
        every member; its content matters on ``root`` only). The :class:`Work`'s result is
        ``data``."""


class Transport(ABC):
    """How the instances of one job reach each other.

    Attributes:
        process_index: this instance.
        process_count: instances of the job.
    """

    process_index: int
    process_count: int

    @abstractmethod
    def communicator(self, members: tuple[int, ...]) -> Communicator:
        """The communicator of ``members`` (this instance among them); created once, reused.
        Every member must ask for the same communicators in the same order."""

    def abandon(self, reason: str) -> None:
        """This instance gives up on the job's collectives (a timeout, a failure, or its
        program ends after one): tell the other instances, best effort and without waiting,
        so that a peer waiting for this one raises ``PeerLostError`` naming it within about
        a second instead of waiting for its own timeout. This default does nothing (a
        transport whose launcher or coordinator tells the others, or a single instance)."""

    def close(self) -> None:
        """Release the transport's resources."""
