"""The transport interface the collective algorithms sit on.

Every buffer is a 1-D ``uint8`` numpy array (raw bytes); the engine reinterprets them with
the dtype and shape the descriptors agreed on, so nothing is pickled.

Contract for implementations (local, MPI, gRPC):

* Only one thread of an instance calls a transport at a time (the engine's leader).
* Every method waits with the :class:`~collectives.waiting.Patience` it is given: poll, then
  ``patience.backoff()`` (which raises ``CollectiveTimeoutError`` past the timeout) -- never
  an unbounded blocking call.
* :meth:`Communicator.allgather` is also the descriptor exchange after a disagreement.
  While it (or :meth:`Communicator.agree`) waits it must report the members whose data has
  not arrived with ``patience.waiting_for(members)``, so a stall names the missing instances
  (MPI does it with point-to-point messages for small all-gathers). The other methods run after every member has
  arrived (``patience.committed``) and need not report.
* Byte counts are exact: a member sends what the others expect to receive.
* :meth:`Communicator.agree` is the agreement that precedes every collective: one small
  reduction of a fingerprint, O(log P) in time (MPI: ``MPI_Iallreduce``; gRPC: dissemination
  rounds). Only when it finds a difference do the members all-gather whole descriptors (to
  name the op, the replicas and the difference); they all see the same answer, so they all
  take the same path.
* :meth:`Communicator.agree_gather` is the same agreement fused with the data of a small
  call (at most :data:`EAGER_MAX_BYTES` per member): a transport that carries the payload
  in the agreement's own messages saves the call its data round. The default does not
  carry it (it agrees, and the caller runs its ordinary algorithm); MPI carries it.
  :meth:`Communicator.eager_exchange` is its form for a caller that makes the same call
  again and again: it writes its payload in place, into the transport's own send buffer.
  :meth:`Communicator.eager_index_exchange` is the same for a payload of one piece per
  member of which each member needs only its own (a small reduce-scatter or all-to-all):
  the default all-gathers the payloads; MPI moves each piece towards its member only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import Callable, Sequence

import numpy as np

from collectives.waiting import Patience

#: the most payload bytes per member that :meth:`Communicator.agree_gather` carries; a
#: caller passes a larger payload never (ipupod assumption, measured on the 2-core VM with
#: two MPI ranks: a 64 KiB all-gather point-to-point costs about 17 us against 34 us for
#: MPI_Allreduce of the same bytes, so up to here moving every member's bytes to every
#: member is cheaper than a second round; the receive buffers are P times this)
EAGER_MAX_BYTES = 64 << 10

#: bytes of the header of an :meth:`Communicator.agree_gather` block on the wire: the
#: fingerprint and the payload length, int64 each; the payload follows, padded to 8 bytes
AGREE_HEADER_BYTES = 16


def agree_block_bytes(payload_bytes: int) -> int:
    """Bytes of an agree_gather block carrying ``payload_bytes`` (header and padded
    payload)."""
    return AGREE_HEADER_BYTES + ((payload_bytes + 7) & -8)


class Communicator(ABC):
    """A fixed set of instances that exchange data together.

    Attributes:
        members: instance indices, increasing.
        rank: this instance's position in ``members``.
    """

    members: tuple[int, ...]
    rank: int

    @property
    def size(self) -> int:
        return len(self.members)

    def agree(self, fingerprint: int, patience: Patience) -> bool:
        """Whether every member passed the same ``fingerprint`` (an int in ``[0, 2^63)``);
        the same answer on every member. While it waits it reports the members whose part
        has not arrived (``patience.waiting_for``), like :meth:`allgather`.

        This default all-gathers the fingerprints (8 bytes per member); transports
        override it with one reduction whose time grows with log P.

        Raises:
            CollectiveTimeoutError: a member did not arrive within the patience's timeout.
        """
        mine = np.array([fingerprint], dtype="<i8").view(np.uint8)
        gathered = self.allgather(mine, patience)
        return bool((gathered.view("<i8") == fingerprint).all())

    def agree_gather(self, fingerprint: int, payload: np.ndarray | None,
                     patience: Patience) -> tuple[bool, list[np.ndarray] | None]:
        """:meth:`agree` fused with an all-gather of a small ``payload``: the agreement and
        the data of a small call in one exchange (every member must call it, whatever its
        call: the agreement is the same, with or without payload).

        Args:
            fingerprint: as for :meth:`agree`.
            payload: this member's bytes (``uint8``, at most :data:`EAGER_MAX_BYTES`), or
                None: agree only. Members whose fingerprints agree pass a payload alike
                (all or none; their lengths may differ).
            patience: as for :meth:`agree`.

        Returns:
            ``(agreed, blocks)``: ``agreed`` as :meth:`agree` (the same on every member);
            ``blocks`` every member's payload (``uint8`` arrays in member order, this
            member's included; views valid until the next call on this communicator), or
            None: the payload was not carried (no payload, a disagreement, or a transport
            that does not fuse; this default), so the caller moves the data itself.

        Raises:
            CollectiveTimeoutError: a member did not arrive within the patience's timeout.
        """
        return self.agree(fingerprint, patience), None

    def eager_exchange(self, sizes: Sequence[int]) -> tuple[np.ndarray, Callable]:
        """:meth:`agree_gather` of the same payload sizes at every call, the payload written
        in place: ``(send, agree)``. ``sizes``: every member's payload bytes, in member
        order (known to every member from the call's descriptor). The caller writes its
        payload into ``send`` (``uint8[sizes[rank]]``, the same memory at every call) and
        calls ``agree(fingerprint, patience) -> (agreed, blocks)`` (as
        :meth:`agree_gather`; its blocks read only when agreed; a list of blocks handed
        again, the same object, holds the same views: callers keep views of them). This
        default keeps ``send`` here and calls :meth:`agree_gather` with it; MPI hands the
        send buffer of its agreement itself, which saves a copy and a layer a call."""
        send = np.zeros(sizes[self.rank], np.uint8)
        return send, partial(_agree_gather_of, self, send)

    def takes_index(self, piece: int) -> bool:
        """Whether :meth:`eager_index_exchange` of pieces of ``piece`` bytes is faster than
        :meth:`eager_exchange` of the whole payloads (the same answer on every member; a
        caller that gets False uses :meth:`eager_exchange`). This default: False (its
        :meth:`eager_index_exchange` all-gathers the whole payloads, as
        :meth:`eager_exchange` does)."""
        return False

    def index_sent_bytes(self, piece: int) -> int:
        """Payload bytes this member sends in one :meth:`eager_index_exchange` of pieces of
        ``piece`` bytes (headers not counted, as for :meth:`eager_exchange`: a payload to
        each other member). This default: its whole payload, ``size * piece``, that many
        times."""
        return self.size * piece * (self.size - 1)

    def eager_index_exchange(self, piece: int) -> tuple[np.ndarray, Callable]:
        """:meth:`eager_exchange` of an all-to-all: ``(send, agree)``. The caller writes one
        piece of ``piece`` bytes for every member into ``send`` (``uint8[size * piece]``,
        piece ``j`` for member ``j``; the same memory at every call; ``size * piece`` at
        most :data:`EAGER_MAX_BYTES`) and calls ``agree(fingerprint, patience) -> (agreed,
        pieces)``: ``agreed`` as :meth:`agree`, ``pieces[s]`` the piece member ``s`` wrote
        for this member (``uint8[piece]`` views, valid until the next call on this
        communicator, read only when agreed; a list handed again, the same object, holds
        the same views), or None. Members whose fingerprints agree pass the same ``piece``.
        This default all-gathers every member's whole ``send`` (:meth:`eager_exchange`)
        and keeps this member's piece of each; MPI sends each piece towards its member
        only (Bruck's index algorithm, :mod:`collectives.transports.mpi_index`).

        Raises (from ``agree``):
            CollectiveTimeoutError: as :meth:`agree`.
        """
        send, agree = self.eager_exchange((self.size * piece,) * self.size)
        return send, _PiecesOf(agree, self.rank * piece, piece)

    @abstractmethod
    def allgather(self, send: np.ndarray, patience: Patience) -> np.ndarray:
        """Every member's ``send`` (same length on all): ``uint8[size, len(send)]``."""

    @abstractmethod
    def alltoallv(self, send: np.ndarray, send_counts: Sequence[int],
                  recv_counts: Sequence[int], patience: Patience,
                  recv: np.ndarray | None = None) -> np.ndarray:
        """Send ``send[displ_j : displ_j + send_counts[j]]`` to member j; receive
        ``recv_counts[j]`` bytes from member j. Returns the received bytes concatenated in
        member order: in ``recv[:sum(recv_counts)]`` when given (a scratch buffer the caller
        reuses; a single member may return ``send`` instead)."""

    def alltoallv_parts(self, send_parts: Sequence[Sequence[np.ndarray]],
                        recv_parts: Sequence[Sequence[np.ndarray]],
                        patience: Patience) -> None:
        """:meth:`alltoallv` of scattered buffers, with no packing by the caller: the uint8
        arrays ``send_parts[j]`` (in order) go to member j, whose ``recv_parts[rank]`` have
        the same sizes in the same order; the bytes from member j land in the uint8 arrays
        ``recv_parts[j]``. This member's own lists are ignored (the caller reads its own
        parts in place). This default packs, runs :meth:`alltoallv` and unpacks; MPI sends
        every part as it lies (one message per part)."""
        me = self.rank
        empty = np.zeros(0, np.uint8)
        sends = [empty if j == me or not send_parts[j] else np.concatenate(send_parts[j])
                 for j in range(self.size)]
        recv_counts = [0 if j == me else sum(p.nbytes for p in recv_parts[j])
                       for j in range(self.size)]
        got = self.alltoallv(np.concatenate(sends) if sends else empty,
                             [s.nbytes for s in sends], recv_counts, patience)
        at = 0
        for j in range(self.size):
            for part in (() if j == me else recv_parts[j]):
                part[...] = got[at:at + part.nbytes]
                at += part.nbytes

    def alltoall_to(self, send: np.ndarray, recv: np.ndarray, patience: Patience) -> np.ndarray:
        """:meth:`alltoallv` with equal blocks (``len(send) / size`` bytes to and from every
        member) into ``recv`` (``uint8[len(send)]``, which the caller allocated for the
        result): returns ``recv`` filled in (MPI does this) or a new buffer (this default:
        :meth:`alltoallv`)."""
        counts = [send.nbytes // self.size] * self.size
        return self.alltoallv(send, counts, counts, patience)

    @abstractmethod
    def allgatherv(self, send: np.ndarray, recv_counts: Sequence[int],
                   patience: Patience) -> np.ndarray:
        """Every member's ``send`` (``recv_counts[j]`` bytes from member j), concatenated."""

    def allgatherv_into(self, recv: np.ndarray, recv_counts: Sequence[int],
                        patience: Patience) -> np.ndarray:
        """:meth:`allgatherv` with this member's bytes already in place: ``recv`` holds them
        at offset ``sum(recv_counts[:rank])``. Returns the gathered bytes: ``recv`` filled in
        (in place, no copy of the own part; MPI does this) or a new buffer (this default)."""
        start = sum(recv_counts[:self.rank])
        return self.allgatherv(recv[start:start + recv_counts[self.rank]], recv_counts,
                               patience)

    def allgatherv_to(self, send: np.ndarray, recv: np.ndarray, recv_counts: Sequence[int],
                      patience: Patience) -> np.ndarray:
        """:meth:`allgatherv` into ``recv`` (``uint8[sum(recv_counts)]``, which the caller
        allocated for the result): returns ``recv`` filled in, with this member's ``send``
        copied to its place while the others' bytes move (MPI does this), or a new buffer
        (this default: :meth:`allgatherv`)."""
        return self.allgatherv(send, recv_counts, patience)

    @abstractmethod
    def broadcast(self, data: np.ndarray, root: int, patience: Patience) -> np.ndarray:
        """Member ``root``'s ``data`` on every member. ``data`` has the same length on every
        member (its content matters on ``root`` only); returns the root's bytes (may be
        ``data`` itself, filled in)."""


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


def _agree_gather_of(comm: Communicator, send: np.ndarray, fingerprint: int,
                     patience: Patience) -> tuple[bool, list[np.ndarray] | None]:
    """``comm.agree_gather(fingerprint, send, patience)`` (the default
    :meth:`Communicator.eager_exchange`)."""
    return comm.agree_gather(fingerprint, send, patience)


class _PiecesOf:
    """The ``agree`` of the default :meth:`Communicator.eager_index_exchange`: every
    member's block of :meth:`~Communicator.eager_exchange`'s ``agree``, cut to this
    member's piece (bytes ``[at, at + piece)``; the views made again only for other
    blocks)."""

    __slots__ = ("_agree", "_at", "_piece", "_blocks", "_pieces")

    def __init__(self, agree: Callable, at: int, piece: int):
        self._agree, self._at, self._piece = agree, at, piece
        self._blocks: object = None
        self._pieces: list[np.ndarray] = []

    def __call__(self, fingerprint: int, patience: Patience
                 ) -> tuple[bool, list[np.ndarray] | None]:
        agreed, blocks = self._agree(fingerprint, patience)
        if not agreed or blocks is None:
            return agreed, None
        if blocks is not self._blocks:
            at, end = self._at, self._at + self._piece
            self._pieces = [b[at:end] for b in blocks]
            self._blocks = blocks
        return True, self._pieces
